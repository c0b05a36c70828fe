//! The CPU reference backend: plain, obviously correct Rust; the oracle for every other backend.
mod elementwise;
mod fused;
mod fused_halves;
mod gelu;
mod gemm_path;
mod halves;
mod index;
mod kernels;
mod pool;
mod threads;
pub(crate) use threads::on_pool;
#[cfg(feature = "openblas")]
pub mod openblas;
pub use gemm_path::{GemmChoice, OPENBLAS_FROM};
pub(crate) use halves::Spread;
pub use kernels::gemm_kernels;
pub(crate) use kernels::{binary, unary};
mod update;

use crate::backend::budget::Budget;
use crate::backend::contract;
use crate::backend::host;
use crate::backend::*;
use crate::{DType, Error, Layout, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Host memory as 32-bit words (f32 or i32 bit patterns, or two halves each), behind a lock so
/// that ops can write through a shared `Buffer`.
pub(crate) struct CpuBuffer {
    pub(crate) data: RwLock<Vec<u32>>,
    pool: Arc<Mutex<Pool>>,
    /// Its words went back to the pool (`Backend::release`): every op refuses it until
    /// `Backend::restore`, instead of indexing an empty vector.
    released: AtomicBool,
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let data = std::mem::take(self.data.get_mut().unwrap_or_else(|e| e.into_inner()));
        lock(&self.pool).give_back(data);
    }
}

/// Freed vectors kept by length, so a training loop stops paying for fresh zeroed pages.
#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<u32>>>,
    in_use: u64,
    peak: u64,
    pooled: u64,
    budget: Budget,
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
    gemm: gemm_path::GemmRule,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A CPU device whose products run where `TANDEM_CPU_GEMM` says (see [`GemmChoice`]).
    pub fn new() -> Self {
        Self::with_gemm(GemmChoice::from_env())
    }

    /// A CPU device whose products run where `choice` says, whatever the environment.
    pub fn with_gemm(choice: GemmChoice) -> Self {
        let gemm = gemm_path::GemmRule::new(choice);
        CpuBackend {
            info: DeviceInfo {
                backend: BackendKind::Cpu,
                ordinal: 0,
                name: "CPU reference".into(),
                kind: DeviceKind::Cpu,
                memory: None,
                driver: format!("{} threads", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)),
                matmul: gemm.describe(),
                libraries: String::new(),
            },
            pool: Arc::default(),
            gemm,
        }
    }

    /// How many products this device has given OpenBLAS (a batched product counts once): 0
    /// without the `openblas` feature, the library, or products big enough for it.
    pub fn openblas_products(&self) -> u64 {
        self.gemm.openblas_products()
    }

    /// A buffer of `len` elements of `dtype` over `data` (`dtype.words(len)` words).
    fn make(&self, data: Vec<u32>, len: usize, dtype: DType) -> Buffer {
        lock(&self.pool).count(data.len());
        Buffer::new(CpuBuffer { data: RwLock::new(data), pool: self.pool.clone(), released: AtomicBool::new(false) }, len, dtype)
    }

    /// `Ok` when `len` more words fit the device's memory budget.
    fn within_budget(&self, len: usize) -> Result<()> {
        let p = lock(&self.pool);
        let bytes = len as u64 * 4;
        p.budget.check("cpu", p.in_use, bytes, bytes)
    }
}

// A lock is poisoned only when a thread panicked while holding it; the words behind it are
// still plain memory (at worst half-written by that op), so later ops go on instead of panicking.
fn lock(p: &Mutex<Pool>) -> MutexGuard<'_, Pool> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}
fn read(b: &CpuBuffer) -> RwLockReadGuard<'_, Vec<u32>> {
    b.data.read().unwrap_or_else(|e| e.into_inner())
}
fn write(b: &CpuBuffer) -> RwLockWriteGuard<'_, Vec<u32>> {
    b.data.write().unwrap_or_else(|e| e.into_inner())
}

fn raw(b: &Buffer) -> Result<&CpuBuffer> {
    let cpu = b.downcast::<CpuBuffer>().ok_or_else(|| Error::invalid("cpu", "buffer belongs to another device"))?;
    if cpu.released.load(Ordering::Acquire) {
        b.refill("cpu", "cpu")?;
        if cpu.released.load(Ordering::Acquire) {
            return Err(crate::backend::released("cpu", "cpu", b.len()));
        }
    }
    Ok(cpu)
}

fn same(a: &Buffer, b: &Buffer) -> Result<bool> {
    Ok(std::ptr::eq(raw(a)?, raw(b)?))
}

/// Runs `f` on the input's elements as f32 without copying (unless the input is the output).
fn with_f32<R>(x: &Buffer, out: &Buffer, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    if same(x, out)? {
        let guard = read(raw(x)?);
        let mut copy = host::try_vec(guard.len(), "cpu", "a copy of an op's input")?;
        copy.extend_from_slice(&guard);
        drop(guard);
        return Ok(f(bytemuck::cast_slice(&copy)));
    }
    let guard = read(raw(x)?);
    Ok(f(bytemuck::cast_slice(&guard)))
}

fn read_i32(b: &Buffer) -> Result<Vec<i32>> {
    Ok(bytemuck::cast_slice(&read(raw(b)?)).to_vec())
}

/// Runs `f` on the output's elements as mutable f32.
fn write_with<R>(out: &Buffer, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
    let mut guard = write(raw(out)?);
    Ok(f(bytemuck::cast_slice_mut(&mut guard)))
}

fn write_i32(b: &Buffer, v: &[i32]) -> Result<()> {
    let mut d = write(raw(b)?);
    d[..v.len()].copy_from_slice(bytemuck::cast_slice(v));
    Ok(())
}

/// `copy` of half elements: the words viewed as little-endian `u16`s, element `2k` in the low
/// half of word `k` (this backend runs on little-endian hosts only, as every `bytemuck` view here).
fn copy_halves(src: &Buffer, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<()> {
    if same(src, dst)? {
        let mut d = write(raw(dst)?);
        bytemuck::cast_slice_mut::<u32, u16>(&mut d).copy_within(src_off..src_off + len, dst_off);
        return Ok(());
    }
    let s = read(raw(src)?);
    let mut d = write(raw(dst)?);
    bytemuck::cast_slice_mut::<u32, u16>(&mut d)[dst_off..dst_off + len]
        .copy_from_slice(&bytemuck::cast_slice::<u32, u16>(&s)[src_off..src_off + len]);
    Ok(())
}

impl Backend for CpuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn alloc(&self, len: usize, dtype: DType) -> Result<Buffer> {
        contract::alloc(&self.info, len, dtype)?;
        let words = dtype.words(len);
        self.within_budget(words)?;
        let reused = lock(&self.pool).take(words);
        if let Some(v) = reused {
            return Ok(self.make(v, len, dtype));
        }
        Ok(self.make(host::try_filled(words, 0, "cpu", "alloc")?, len, dtype))
    }
    fn upload(&self, bytes: &[u8], dtype: DType) -> Result<Buffer> {
        contract::upload(&self.info, bytes, dtype)?;
        let len = bytes.len() / dtype.size();
        let words = dtype.words(len);
        self.within_budget(words)?;
        let mut data = host::try_filled(words, 0u32, "cpu", "upload")?;
        bytemuck::cast_slice_mut::<u32, u8>(&mut data)[..bytes.len()].copy_from_slice(bytes);
        Ok(self.make(data, len, dtype))
    }
    fn download(&self, buf: &Buffer) -> Result<Vec<u8>> {
        let words = read(raw(buf)?);
        let n = buf.len() * buf.dtype().size();
        let mut bytes = host::try_vec(n, "cpu", "download")?;
        bytes.extend_from_slice(&bytemuck::cast_slice::<u32, u8>(&words)[..n]);
        Ok(bytes)
    }
    fn fill(&self, buf: &Buffer, value: f32) -> Result<()> {
        contract::fill(&self.info, buf)?;
        let bits = CastOp::fill_word(buf.dtype(), value);
        write(raw(buf)?).iter_mut().for_each(|x| *x = bits);
        Ok(())
    }
    fn copy(&self, src: &Buffer, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<()> {
        contract::copy(&self.info, src, src_off, dst, dst_off, len)?;
        if src.dtype().is_half() {
            return copy_halves(src, src_off, dst, dst_off, len);
        }
        if same(src, dst)? {
            write(raw(dst)?).copy_within(src_off..src_off + len, dst_off);
            return Ok(());
        }
        let s = read(raw(src)?);
        write(raw(dst)?)[dst_off..dst_off + len].copy_from_slice(&s[src_off..src_off + len]);
        Ok(())
    }
    fn unary(&self, op: UnaryOp, x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
        contract::unary(&self.info, x, layout, out)?;
        with_f32(x, out, |xs| write_with(out, |o| elementwise::unary_pass(op, layout, xs, o)))?
    }
    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        contract::binary(&self.info, a, la, b, lb, out)?;
        with_f32(a, out, |av| with_f32(b, out, |bv| write_with(out, |o| elementwise::binary_pass(op, la, av, lb, bv, o))))??
    }
    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
        contract::reduce(&self.info, op, x, spec, out)?;
        let (vals, idx) = with_f32(x, out, |xs| kernels::reduce(op, xs, spec))?;
        match op {
            ReduceOp::ArgMax => write_i32(out, &idx),
            _ => write_with(out, |o| o[..vals.len()].copy_from_slice(&vals)),
        }
    }
    fn matmul(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()> {
        contract::matmul(&self.info, a, b, None, out, spec)?;
        let ga = read(raw(a)?);
        let gb = read(raw(b)?);
        write_with(out, |c| kernels::matmul(bytemuck::cast_slice(&ga), bytemuck::cast_slice(&gb), c, spec, self.gemm.path(&spec)))
    }
    fn matmul_row_bias(&self, a: &Buffer, b: &Buffer, bias: &Buffer, out: &Buffer, spec: MatmulSpec, relu: bool) -> Result<bool> {
        contract::matmul(&self.info, a, b, Some(bias), out, spec)?;
        let ga = read(raw(a)?);
        let gb = read(raw(b)?);
        with_f32(bias, out, |bias| {
            let bias = &bias[..spec.m];
            write_with(out, |c| {
                kernels::matmul_then(bytemuck::cast_slice(&ga), bytemuck::cast_slice(&gb), c, spec, self.gemm.path(&spec), |o| {
                    kernels::row_bias(o, bias, relu)
                })
            })
        })??;
        Ok(true)
    }
    fn optim_step(&self, step: OptimStep, param: &Buffer, grad: &Buffer, state: &[&Buffer]) -> Result<bool> {
        contract::optim_step(&self.info, step, param, grad, state)?;
        let reads = match step {
            OptimStep::Sgd { momentum: 0.0, .. } => {
                // A momentum buffer loaded from a checkpoint is still read by the composition.
                if !state.is_empty() {
                    return Ok(false);
                }
                0
            }
            OptimStep::Sgd { .. } => 1,
            OptimStep::Adam { .. } => 2,
        };
        let bufs: Vec<&Buffer> = [param, grad].into_iter().chain(state[..reads].iter().copied()).collect();
        for (i, x) in bufs.iter().enumerate() {
            for y in &bufs[..i] {
                if same(x, y)? {
                    // One lock cannot be held twice; the composition copies instead.
                    return Ok(false);
                }
            }
        }
        let g = read(raw(grad)?);
        let mut p = write(raw(param)?);
        let mut guards = state[..reads].iter().map(|s| Ok(write(raw(s)?))).collect::<Result<Vec<_>>>()?;
        let mut views: Vec<&mut [f32]> = guards.iter_mut().map(|s| bytemuck::cast_slice_mut(&mut s[..])).collect();
        Ok(update::optim_step(step, bytemuck::cast_slice_mut(&mut p), bytemuck::cast_slice(&g), &mut views))
    }
    fn fused(&self, op: FusedOp, bufs: &[&Buffer]) -> Result<bool> {
        contract::fused(&self.info, op, bufs)?;
        let (_, inputs) = op.operands().ok_or_else(|| Error::invalid(op.name(), "sizes overflow"))?;
        // One read lock per distinct input (self-attention passes one buffer as q and k, and a
        // lock is not taken twice); the contract keeps outputs apart from everything.
        let mut held: Vec<(&CpuBuffer, RwLockReadGuard<'_, Vec<u32>>)> = Vec::new();
        for b in &bufs[..inputs] {
            let b = raw(b)?;
            if !held.iter().any(|(h, _)| std::ptr::eq(*h, b)) {
                held.push((b, read(b)));
            }
        }
        let find = |b: &Buffer| -> Result<&[f32]> {
            let b = raw(b)?;
            let (_, g) = held.iter().find(|(h, _)| std::ptr::eq(*h, b)).ok_or_else(|| Error::invalid(op.name(), "an input was not read"))?;
            Ok(bytemuck::cast_slice(&g[..]))
        };
        let ins: Vec<&[f32]> = bufs[..inputs].iter().map(|b| find(b)).collect::<Result<_>>()?;
        let mut guards: Vec<RwLockWriteGuard<'_, Vec<u32>>> = bufs[inputs..].iter().map(|b| Ok(write(raw(b)?))).collect::<Result<_>>()?;
        let mut outs: Vec<&mut [f32]> = guards.iter_mut().map(|g| bytemuck::cast_slice_mut(&mut g[..])).collect();
        fused::run(op, &ins, &mut outs)?;
        Ok(true)
    }
    fn im2col(&self, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::im2col(&self.info, x, cols, spec)?;
        with_f32(x, cols, |xs| write_with(cols, |c| kernels::im2col(xs, spec, c)))?
    }
    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::col2im(&self.info, cols, x, spec)?;
        with_f32(cols, x, |c| write_with(x, |xs| kernels::col2im(c, spec, xs)))?
    }
    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::max_pool2d(&self.info, x, out, argmax, spec)?;
        let mut arg = vec![0i32; argmax.len()];
        with_f32(x, out, |xs| write_with(out, |o| pool::max_pool2d(xs, spec, o, &mut arg)))??;
        write_i32(argmax, &arg)
    }
    fn max_pool2d_backward(&self, grad_out: &Buffer, argmax: &Buffer, grad_x: &Buffer, spec: WindowSpec) -> Result<()> {
        contract::max_pool2d_backward(&self.info, grad_out, argmax, grad_x, spec)?;
        let arg = read_i32(argmax)?;
        // The GPU kernels only compare positions; here a position indexes the plane.
        let plane = spec.h * spec.w;
        if let Some(i) = arg[..spec.n * spec.c * spec.oh * spec.ow].iter().position(|&a| a >= 0 && a as usize >= plane) {
            return Err(Error::invalid("max_pool2d_backward", format!("argmax[{i}] = {} is outside a {}x{} plane", arg[i], spec.h, spec.w)));
        }
        with_f32(grad_out, grad_x, |g| write_with(grad_x, |gx| pool::max_pool2d_backward(g, &arg, spec, gx)))?
    }
    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
        contract::index(&self.info, op, x, idx, out, rows, cols)?;
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
                IndexOp::GatherRows { table_rows } => index::gather_rows(&xs[..table_rows * cols], &is[..rows], &mut o[..rows * cols], cols),
                IndexOp::ScatterAddRows { table_rows } => {
                    let plan = &is[..table_rows + 1 + rows];
                    index::scatter_add_rows(&xs[..rows * cols], plan, &mut o[..table_rows * cols], rows, cols)
                }
            })
        })?
    }
    fn cast(&self, op: CastOp, x: &Buffer, out: &Buffer, len: usize) -> Result<()> {
        contract::cast(&self.info, op, x, out, len)?;
        let xs = read(raw(x)?);
        let mut o = write(raw(out)?);
        // Half casts go through the vectorised `halves::narrow` and `widen` (the same bits as
        // `CastOp::to_half` and `from_half`), in chunks over threads: autocast casts every
        // product's F32 operands and their gradients back, a large share of a bf16 step.
        match op.dtypes() {
            (_, to) if to.is_half() => {
                let o: &mut [u16] = &mut bytemuck::cast_slice_mut(&mut o)[..len];
                let xs: &[f32] = &bytemuck::cast_slice(&xs)[..len];
                by_chunks(o, xs, |o, x| halves::narrow(x, to, o));
            }
            (from, _) if from.is_half() => {
                let xs: &[u16] = &bytemuck::cast_slice(&xs)[..len];
                let o: &mut [f32] = &mut bytemuck::cast_slice_mut(&mut o)[..len];
                by_chunks(o, xs, |o, x| halves::widen(x, from, o));
            }
            _ => o[..len].iter_mut().zip(&xs[..len]).for_each(|(o, &w)| *o = op.word(w)),
        }
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn release(&self, buf: &Buffer) -> Result<bool> {
        let cpu = buf.downcast::<CpuBuffer>().ok_or_else(|| Error::invalid("cpu", "buffer belongs to another device"))?;
        if cpu.released.load(Ordering::Acquire) {
            return Ok(true);
        }
        let words = std::mem::take(&mut *write(cpu));
        cpu.released.store(true, Ordering::Release);
        lock(&self.pool).give_back(words);
        Ok(true)
    }
    fn restore(&self, buf: &Buffer) -> Result<bool> {
        let cpu = buf.downcast::<CpuBuffer>().ok_or_else(|| Error::invalid("cpu", "buffer belongs to another device"))?;
        if !cpu.released.load(Ordering::Acquire) {
            return Ok(true);
        }
        let n = buf.dtype().words(buf.len());
        self.within_budget(n)?;
        let reused = lock(&self.pool).take(n);
        let words = match reused {
            Some(v) => v,
            None => host::try_filled(n, 0, "cpu", "restore")?,
        };
        lock(&self.pool).count(words.len());
        *write(cpu) = words;
        cpu.released.store(false, Ordering::Release);
        Ok(true)
    }
    fn memory(&self) -> MemoryStats {
        let p = lock(&self.pool);
        MemoryStats { in_use: p.in_use, peak: p.peak, pooled: p.pooled, budget: p.budget.get() }
    }
    fn reset_peak_memory(&self) {
        let mut p = lock(&self.pool);
        p.peak = p.in_use;
    }
    fn pin_kernels(&self) {
        self.gemm.pin();
    }
    fn set_memory_budget(&self, bytes: Option<u64>) {
        lock(&self.pool).budget.set(bytes);
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `f(out chunk, the matching chunk of xs)` over chunks of `kernels::CHUNK` elements, on several
/// threads when there are at least two chunks.
fn by_chunks<O: Send, X: Sync>(out: &mut [O], xs: &[X], f: impl Fn(&mut [O], &[X]) + Sync) {
    use rayon::prelude::*;
    let chunk = kernels::CHUNK;
    if out.len() >= 2 * chunk {
        out.par_chunks_mut(chunk).zip(xs.par_chunks(chunk)).for_each(|(o, x)| f(o, x));
    } else {
        f(out, xs);
    }
}
