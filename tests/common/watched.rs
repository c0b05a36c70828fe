//! A delegating test backend: the CPU reference under a `DeviceInfo` of the test's choosing,
//! showing a watcher each upload, unary op and matmul before it runs them, and declining every
//! fused op, so that tensors and optimizers compose those from plain ops.
// A test reads the calls it watches for and passes over the others.
#![allow(dead_code)]
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::backend::*;
use tandem::{DType, Device, Layout, Result};

/// A call a [`watched_cpu`] device is about to run.
pub enum Call<'a> {
    Upload(&'a [u8]),
    Unary(UnaryOp),
    Matmul(MatmulSpec),
}

struct Watched<F> {
    cpu: CpuBackend,
    info: DeviceInfo,
    watch: F,
}

/// The CPU reference as a device with the CPU's info as `edit_info` leaves it, calling `watch`
/// before each [`Call`]. The trait's defaults stand for every method with one (`cast`,
/// `matmul_row_bias`, `optim_step`, `fused`, ...).
pub fn watched_cpu(edit_info: impl FnOnce(&mut DeviceInfo), watch: impl Fn(Call) + Send + Sync + 'static) -> Device {
    let cpu = CpuBackend::new();
    let mut info = cpu.info().clone();
    edit_info(&mut info);
    Device::from_backend(Arc::new(Watched { cpu, info, watch }))
}

impl<F: Fn(Call) + Send + Sync + 'static> Backend for Watched<F> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn alloc(&self, len: usize, dtype: DType) -> Result<Buffer> {
        self.cpu.alloc(len, dtype)
    }
    fn upload(&self, bytes: &[u8], dtype: DType) -> Result<Buffer> {
        (self.watch)(Call::Upload(bytes));
        self.cpu.upload(bytes, dtype)
    }
    fn download(&self, buf: &Buffer) -> Result<Vec<u8>> {
        self.cpu.download(buf)
    }
    fn fill(&self, buf: &Buffer, value: f32) -> Result<()> {
        self.cpu.fill(buf, value)
    }
    fn copy(&self, src: &Buffer, so: usize, dst: &Buffer, d: usize, len: usize) -> Result<()> {
        self.cpu.copy(src, so, dst, d, len)
    }
    fn unary(&self, op: UnaryOp, x: &Buffer, l: &Layout, out: &Buffer) -> Result<()> {
        (self.watch)(Call::Unary(op));
        self.cpu.unary(op, x, l, out)
    }
    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        self.cpu.binary(op, a, la, b, lb, out)
    }
    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
        self.cpu.reduce(op, x, spec, out)
    }
    fn matmul(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()> {
        (self.watch)(Call::Matmul(spec));
        self.cpu.matmul(a, b, out, spec)
    }
    fn im2col(&self, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()> {
        self.cpu.im2col(x, cols, spec)
    }
    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
        self.cpu.col2im(cols, x, spec)
    }
    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
        self.cpu.max_pool2d(x, out, argmax, spec)
    }
    fn max_pool2d_backward(&self, g: &Buffer, argmax: &Buffer, gx: &Buffer, spec: WindowSpec) -> Result<()> {
        self.cpu.max_pool2d_backward(g, argmax, gx, spec)
    }
    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
        self.cpu.index(op, x, idx, out, rows, cols)
    }
    fn sync(&self) -> Result<()> {
        self.cpu.sync()
    }
    fn memory(&self) -> MemoryStats {
        self.cpu.memory()
    }
    fn reset_peak_memory(&self) {
        self.cpu.reset_peak_memory()
    }
    fn set_memory_budget(&self, bytes: Option<u64>) {
        self.cpu.set_memory_budget(bytes)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
