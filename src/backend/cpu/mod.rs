//! The CPU reference backend: plain, obviously correct Rust; the oracle for every other backend.
mod kernels;

use crate::backend::*;
use crate::{DType, Error, Layout, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

/// Host memory as 32-bit words (f32 or i32 bit patterns), behind a lock so that ops can write
/// through a shared `Buffer`.
pub(crate) struct CpuBuffer {
    pub(crate) data: RwLock<Vec<u32>>,
    pool: Arc<Mutex<Pool>>,
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let data = std::mem::take(self.data.get_mut().unwrap_or_else(|e| e.into_inner()));
        self.pool.lock().unwrap().give_back(data);
    }
}

/// Freed vectors kept by length, so a training loop stops paying for fresh zeroed pages.
#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<u32>>>,
    in_use: u64,
    peak: u64,
    pooled: u64,
}

/// Most bytes kept for reuse; beyond it freed memory goes back to the system.
const POOL_CAP: u64 = 1 << 30;

impl Pool {
    fn take(&mut self, len: usize) -> Option<Vec<u32>> {
        let v = self.free.get_mut(&len)?.pop()?;
        self.pooled -= len as u64 * 4;
        Some(v)
    }
    fn give_back(&mut self, v: Vec<u32>) {
        let bytes = v.len() as u64 * 4;
        self.in_use -= bytes;
        if v.is_empty() || self.pooled + bytes > POOL_CAP {
            return;
        }
        self.pooled += bytes;
        self.free.entry(v.len()).or_default().push(v);
    }
    fn count(&mut self, len: usize) {
        self.in_use += len as u64 * 4;
        self.peak = self.peak.max(self.in_use);
    }
}

pub struct CpuBackend {
    info: DeviceInfo,
    pool: Arc<Mutex<Pool>>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            info: DeviceInfo {
                backend: BackendKind::Cpu,
                ordinal: 0,
                name: "CPU reference".into(),
                kind: DeviceKind::Cpu,
                memory: None,
                driver: format!("{} threads", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
            },
            pool: Arc::default(),
        }
    }

    fn make(&self, data: Vec<u32>, dtype: DType) -> Buffer {
        let len = data.len();
        self.pool.lock().unwrap().count(len);
        Buffer::new(CpuBuffer { data: RwLock::new(data), pool: self.pool.clone() }, len, dtype)
    }
}

fn raw(b: &Buffer) -> Result<&CpuBuffer> {
    b.downcast::<CpuBuffer>().ok_or_else(|| Error::invalid("cpu", "buffer belongs to another device"))
}

fn same(a: &Buffer, b: &Buffer) -> Result<bool> {
    Ok(std::ptr::eq(raw(a)?, raw(b)?))
}

/// Runs `f` on the input's elements as f32 without copying (unless the input is the output).
fn with_f32<R>(x: &Buffer, out: &Buffer, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    if same(x, out)? {
        let copy = raw(x)?.data.read().unwrap().clone();
        return Ok(f(bytemuck::cast_slice(&copy)));
    }
    let guard = raw(x)?.data.read().unwrap();
    Ok(f(bytemuck::cast_slice(&guard)))
}

fn read_i32(b: &Buffer) -> Result<Vec<i32>> {
    Ok(bytemuck::cast_slice(&raw(b)?.data.read().unwrap()).to_vec())
}

/// Runs `f` on the output's elements as mutable f32.
fn write_with<R>(out: &Buffer, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
    let mut guard = raw(out)?.data.write().unwrap();
    Ok(f(bytemuck::cast_slice_mut(&mut guard)))
}

fn write_i32(b: &Buffer, v: &[i32]) -> Result<()> {
    let mut d = raw(b)?.data.write().unwrap();
    d[..v.len()].copy_from_slice(bytemuck::cast_slice(v));
    Ok(())
}

impl Backend for CpuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn alloc(&self, len: usize, dtype: DType) -> Result<Buffer> {
        let reused = self.pool.lock().unwrap().take(len);
        if let Some(v) = reused {
            return Ok(self.make(v, dtype));
        }
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
            device: "cpu".into(),
            requested: len as u64 * 4,
            free: 0,
            detail: "host allocation failed".into(),
        })?;
        v.resize(len, 0);
        Ok(self.make(v, dtype))
    }
    fn upload(&self, bytes: &[u8], dtype: DType) -> Result<Buffer> {
        if !bytes.len().is_multiple_of(4) {
            return Err(Error::invalid("upload", format!("{} bytes is not a whole number of elements", bytes.len())));
        }
        let v = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(self.make(v, dtype))
    }
    fn download(&self, buf: &Buffer) -> Result<Vec<u8>> {
        Ok(raw(buf)?.data.read().unwrap().iter().flat_map(|u| u.to_le_bytes()).collect())
    }
    fn fill(&self, buf: &Buffer, value: f32) -> Result<()> {
        let bits = match buf.dtype() {
            DType::F32 => value.to_bits(),
            DType::I32 => value as i32 as u32,
        };
        raw(buf)?.data.write().unwrap().iter_mut().for_each(|x| *x = bits);
        Ok(())
    }
    fn copy(&self, src: &Buffer, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<()> {
        let check = |b: &Buffer, off: usize| {
            if off + len > b.len() {
                return Err(Error::invalid("copy", format!("range {off}..{} of a buffer of {}", off + len, b.len())));
            }
            Ok(())
        };
        check(src, src_off)?;
        check(dst, dst_off)?;
        if same(src, dst)? {
            raw(dst)?.data.write().unwrap().copy_within(src_off..src_off + len, dst_off);
            return Ok(());
        }
        let s = raw(src)?.data.read().unwrap();
        raw(dst)?.data.write().unwrap()[dst_off..dst_off + len].copy_from_slice(&s[src_off..src_off + len]);
        Ok(())
    }
    fn unary(&self, op: UnaryOp, x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
        with_f32(x, out, |xs| write_with(out, |o| kernels::strided_map(layout, xs, o, |a| kernels::unary(op, a))))?
    }
    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        with_f32(a, out, |av| {
            with_f32(b, out, |bv| write_with(out, |o| kernels::strided_zip(la, av, lb, bv, o, |x, y| kernels::binary(op, x, y))))
        })??
    }
    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
        let (vals, idx) = with_f32(x, out, |xs| kernels::reduce(op, xs, spec))?;
        match op {
            ReduceOp::ArgMax => write_i32(out, &idx),
            _ => write_with(out, |o| o[..vals.len()].copy_from_slice(&vals)),
        }
    }
    fn matmul(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()> {
        if same(a, out)? || same(b, out)? {
            return Err(Error::invalid("matmul", "the output must not alias an input"));
        }
        let ga = raw(a)?.data.read().unwrap();
        let gb = raw(b)?.data.read().unwrap();
        write_with(out, |c| kernels::matmul(bytemuck::cast_slice(&ga), bytemuck::cast_slice(&gb), c, spec))
    }
    fn im2col(&self, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()> {
        with_f32(x, cols, |xs| write_with(cols, |c| kernels::im2col(xs, spec, c)))?
    }
    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
        with_f32(cols, x, |c| write_with(x, |xs| kernels::col2im(c, spec, xs)))?
    }
    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
        let mut arg = vec![0i32; argmax.len()];
        with_f32(x, out, |xs| write_with(out, |o| kernels::max_pool2d(xs, spec, o, &mut arg)))??;
        write_i32(argmax, &arg)
    }
    fn max_pool2d_backward(&self, grad_out: &Buffer, argmax: &Buffer, grad_x: &Buffer, spec: WindowSpec) -> Result<()> {
        let arg = read_i32(argmax)?;
        with_f32(grad_out, grad_x, |g| write_with(grad_x, |gx| kernels::max_pool2d_backward(g, &arg, spec, gx)))?
    }
    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
        let is = read_i32(idx)?;
        let in_range = |r: usize| (is[r] >= 0 && (is[r] as usize) < cols).then_some(is[r] as usize);
        with_f32(x, out, |xs| {
            write_with(out, |o| match op {
                IndexOp::Gather => (0..rows).for_each(|r| o[r] = in_range(r).map_or(0.0, |c| xs[r * cols + c])),
                IndexOp::Scatter => {
                    o[..rows * cols].fill(0.0);
                    for r in 0..rows {
                        if let Some(c) = in_range(r) {
                            o[r * cols + c] = xs[r];
                        }
                    }
                }
            })
        })?
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn memory(&self) -> MemoryStats {
        let p = self.pool.lock().unwrap();
        MemoryStats { in_use: p.in_use, peak: p.peak, pooled: p.pooled }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
