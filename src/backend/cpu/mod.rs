//! The CPU reference backend: plain, obviously correct Rust; the oracle for every other backend.
mod kernels;

use crate::backend::*;
use crate::{DType, Error, Layout, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Host memory as 32-bit words (f32 or i32 bit patterns), behind a lock so that ops can write
/// through a shared `Buffer`.
pub(crate) struct CpuBuffer {
    pub(crate) data: RwLock<Vec<u32>>,
    stats: Arc<Stats>,
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let bytes = self.data.get_mut().map(|d| d.len() as u64 * 4).unwrap_or(0);
        self.stats.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Stats {
    in_use: AtomicU64,
    peak: AtomicU64,
}

pub struct CpuBackend {
    info: DeviceInfo,
    stats: Arc<Stats>,
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
            stats: Arc::default(),
        }
    }

    fn make(&self, data: Vec<u32>, dtype: DType) -> Buffer {
        let bytes = data.len() as u64 * 4;
        let now = self.stats.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.stats.peak.fetch_max(now, Ordering::Relaxed);
        let len = data.len();
        Buffer::new(CpuBuffer { data: RwLock::new(data), stats: self.stats.clone() }, len, dtype)
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
/// Stores a freshly computed result: moves the vector in when it fills the buffer.
fn write(b: &Buffer, v: Vec<f32>) -> Result<()> {
    let mut guard = raw(b)?.data.write().unwrap();
    if v.len() == guard.len() {
        *guard = bytemuck::cast_vec(v);
    } else {
        bytemuck::cast_slice_mut::<u32, f32>(&mut guard)[..v.len()].copy_from_slice(&v);
    }
    Ok(())
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
        if bytes.len() % 4 != 0 {
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
        let s: Vec<u32> = raw(src)?.data.read().unwrap()[src_off..src_off + len].to_vec();
        raw(dst)?.data.write().unwrap()[dst_off..dst_off + len].copy_from_slice(&s);
        Ok(())
    }
    fn unary(&self, op: UnaryOp, x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
        let v = with_f32(x, out, |xs| kernels::strided_map(layout, xs, |a| kernels::unary(op, a)))?;
        write(out, v)
    }
    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        let v = with_f32(a, out, |av| with_f32(b, out, |bv| kernels::strided_zip(la, av, lb, bv, |x, y| kernels::binary(op, x, y))))??;
        write(out, v)
    }
    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
        let (vals, idx) = with_f32(x, out, |xs| kernels::reduce(op, xs, spec))?;
        match op {
            ReduceOp::ArgMax => write_i32(out, &idx),
            _ => write(out, vals),
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
        let v = with_f32(x, cols, |xs| kernels::im2col(xs, spec))?;
        write(cols, v)
    }
    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
        let v = with_f32(cols, x, |c| kernels::col2im(c, spec))?;
        write(x, v)
    }
    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
        let (v, idx) = with_f32(x, out, |xs| kernels::max_pool2d(xs, spec))?;
        write(out, v)?;
        write_i32(argmax, &idx)
    }
    fn max_pool2d_backward(&self, grad_out: &Buffer, argmax: &Buffer, grad_x: &Buffer, spec: WindowSpec) -> Result<()> {
        let arg = read_i32(argmax)?;
        let v = with_f32(grad_out, grad_x, |g| kernels::max_pool2d_backward(g, &arg, spec))?;
        write(grad_x, v)
    }
    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
        let is = read_i32(idx)?;
        let xs: Vec<f32> = with_f32(x, out, |v| v.to_vec())?;
        let in_range = |r: usize| (is[r] >= 0 && (is[r] as usize) < cols).then_some(is[r] as usize);
        match op {
            IndexOp::Gather => {
                let v: Vec<f32> = (0..rows).map(|r| in_range(r).map_or(0.0, |c| xs[r * cols + c])).collect();
                write(out, v)
            }
            IndexOp::Scatter => {
                let mut v = vec![0.0f32; rows * cols];
                for r in 0..rows {
                    if let Some(c) = in_range(r) {
                        v[r * cols + c] = xs[r];
                    }
                }
                write(out, v)
            }
        }
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn memory(&self) -> MemoryStats {
        MemoryStats {
            in_use: self.stats.in_use.load(Ordering::Relaxed),
            peak: self.stats.peak.load(Ordering::Relaxed),
            pooled: 0,
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
