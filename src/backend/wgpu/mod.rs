//! WGSL compute backend on wgpu: every adapter of every wgpu backend (Vulkan, Metal, DX12, GL).
mod adapters;
pub mod autotune;
mod bind_groups;
mod context;
mod fused;
mod gate;
mod halves;
mod nn;
mod ops;
mod pool;
mod reduce;
pub mod shaders;
mod tiled;
mod timestamps;

use crate::backend::{
    Backend, BinaryOp, Buffer, CastOp, DeviceInfo, DeviceKind, FusedOp, IndexOp, MatmulSpec, MemoryStats, OptimStep, ReduceOp, ReduceSpec, Tuning,
    UnaryOp, WindowSpec,
};
use crate::{DType, Error, Layout, Result};
use adapters::all;
pub use adapters::{
    adapters, has_subgroups_of_8, ordinal_of, qualified_spec, refusal, refused, Refused, NAMED_BACKENDS, NEED_INVOCATIONS, NEED_WORKGROUP_BYTES,
};
pub use autotune::{Autotune, AUTOTUNE_ENV};
use context::Ctx;
use pool::{Pool, Stored};
use std::path::PathBuf;
use std::sync::Arc;

/// Settings for opening a device; `Default` takes everything from the adapter.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Caps storage bindings below the adapter's limit, so that splitting large operands into
    /// sub-range dispatches can be exercised on small tensors.
    pub max_binding_bytes: Option<u64>,
    /// Bytes this device may hold in buffers; allocations beyond it fail with `OutOfMemory`
    /// (the starting value of [`Backend::set_memory_budget`]).
    pub memory_budget: Option<u64>,
    /// Forces the matmul kernel family instead of choosing by adapter kind or by measurement
    /// (no autotuning).
    pub matmul: Option<MatmulKernel>,
    /// Never uses subgroup operations, so that the kernels adapters without them run can be
    /// tested on one that has them.
    pub without_subgroups: bool,
    /// Runs the kernels a hardware GPU gets whatever the adapter: the `Tiled` matmul family,
    /// no subgroup-of-8 or uniform-operand kernels, so that the hardware path is tested on
    /// software adapters (lavapipe, llvmpipe). `TANDEM_WGPU_KERNELS=hardware` sets it for every
    /// device opened without explicit `Options`.
    pub hardware_profile: bool,
    /// Opens the device without timestamp queries even where the adapter has them, so that
    /// `Backend::mark`'s fallback (no device clock) can be tested on one that has them.
    pub without_timestamps: bool,
    /// When the matmul kernels are tuned by measurement (see `autotune`); `TANDEM_AUTOTUNE`
    /// sets it in `from_env`.
    pub autotune: Autotune,
    /// Where autotuning's cache file lives instead of `autotune::cache_dir()`.
    pub cache_dir: Option<PathBuf>,
}

/// The environment variable that forces `Options::hardware_profile` (value `hardware`) for
/// devices opened by `open` (so by `Device::open` and device specs); `auto` or unset chooses
/// by adapter. Any other value is an error naming it.
pub const KERNELS_ENV: &str = "TANDEM_WGPU_KERNELS";

impl Options {
    /// The default options with `KERNELS_ENV` applied.
    pub fn from_env() -> Result<Options> {
        let hardware_profile = match std::env::var(KERNELS_ENV).as_deref() {
            Err(_) | Ok("" | "auto") => false,
            Ok("hardware") => true,
            Ok(other) => {
                return Err(Error::invalid("open", format!("{KERNELS_ENV}={other:?}: expected `hardware` or `auto`")));
            }
        };
        Ok(Options { hardware_profile, autotune: Autotune::from_env()?, ..Options::default() })
    }
}

/// Matmul kernel families: register blocking without workgroup memory suits CPU rasterizers,
/// workgroup-memory tiles suit hardware GPUs. `Tiled64`, `Tiled128` and `SplitK` are what
/// autotuning chooses among on hardware GPUs (see `autotune`); each also serves as a forced
/// family, so that tests reach its edges on small shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    Registers,
    /// Workgroup-memory tiles of 64×64 or, for large products, 128×128 outputs: the untuned
    /// choice between `Tiled64` and `Tiled128`.
    Tiled,
    /// `Tiled` with the 64×64 tile for every product.
    Tiled64,
    /// `Tiled` with the 128×128 tile for every product whatever its size.
    Tiled128,
    /// For a single product with few output tiles for its K: K cut into slices whose products
    /// the 64×64 kernels compute side by side, then summed in slice order (`tiled::split_k`);
    /// other products run as `Tiled64`.
    SplitK,
}

impl MatmulKernel {
    /// Every family, in declaration order.
    pub const ALL: [MatmulKernel; 5] =
        [MatmulKernel::Registers, MatmulKernel::Tiled, MatmulKernel::Tiled64, MatmulKernel::Tiled128, MatmulKernel::SplitK];

    /// The name autotuning's cache and `Tuning` use.
    pub fn name(self) -> &'static str {
        match self {
            MatmulKernel::Registers => "registers",
            MatmulKernel::Tiled => "tiled",
            MatmulKernel::Tiled64 => "tiled64",
            MatmulKernel::Tiled128 => "tiled128",
            MatmulKernel::SplitK => "split-k",
        }
    }

    /// The family named `name` (see `name`).
    pub fn from_name(name: &str) -> Option<MatmulKernel> {
        MatmulKernel::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Opens a new logical device and queue on adapter `ordinal`, with `Options::from_env`.
pub fn open(ordinal: usize) -> Result<Arc<dyn Backend>> {
    open_with(ordinal, Options::from_env()?)
}

/// `open` with explicit `Options`.
pub fn open_with(ordinal: usize, options: Options) -> Result<Arc<dyn Backend>> {
    let (adapter, info, gate) = all().list.get(ordinal).ok_or_else(|| Error::NoSuchDevice {
        spec: format!("wgpu:{ordinal}"),
        available: adapters().iter().map(|i| format!("wgpu:{} ({})", i.ordinal, i.name)).collect::<Vec<_>>().join(", "),
    })?;
    let name = format!("wgpu:{ordinal} ({})", info.name);
    let limits = adapter.limits();
    // Opening and the first buffers take the adapter's GL context.
    let _held = gate.hold();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("tandem"),
        // Subgroups where the adapter has them: lavapipe's 8-wide ones serve `matmul_sg`.
        // Timestamp queries where the adapter has them: `Backend::mark` times on the device.
        required_features: adapter.features()
            & (wgpu::Features::SUBGROUP | if options.without_timestamps { wgpu::Features::empty() } else { timestamps::FEATURES }),
        required_limits: limits.clone(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| Error::Backend { backend: "wgpu", device: name.clone(), detail: format!("request_device: {e}") })?;
    let (matmul, hardware) = kernels_for(info.kind, &options);
    let bind_groups = Arc::new(bind_groups::BindGroups::default());
    let pool = Arc::new(Pool::new(device.clone(), name.clone(), limits.max_buffer_size, options.memory_budget, bind_groups.clone(), gate.clone()));
    let subgroup8 = has_subgroups_of_8(ordinal) && !options.without_subgroups && !options.hardware_profile;
    let timestamps = timestamps::Timestamps::new(&device, &queue, gate.clone());
    let subgroups = device.features().contains(wgpu::Features::SUBGROUP) && !options.without_subgroups;
    let ctx = Ctx::new(device, queue, name, options.max_binding_bytes, subgroup8, bind_groups, gate.clone()).with_kernels(subgroups, hardware);
    let clock = |marks| timestamps.as_ref().and_then(|_| timestamps::Timestamps::with_capacity(&ctx.device, &ctx.queue, gate.clone(), marks));
    // A forced family is what the caller asked for: nothing to tune.
    let mode = if options.matmul.is_some() { Autotune::Off } else { options.autotune };
    let tuner = autotune::Tuner::new(mode, info, hardware, options.cache_dir.as_deref(), clock);
    let tuned = if tuner.tunes() { ", tuned per shape class" } else { "" };
    let info = DeviceInfo { matmul: format!("{}{tuned}", matmul_label(matmul, hardware)), ..info.clone() };
    Ok(Arc::new(WgpuBackend { info, ctx, pool, matmul, timestamps, tuner }))
}

/// The matmul family and whether the hardware kernel profile runs, for an adapter of `kind`.
/// Only software rasterizers get the register-blocked kernels: real GPUs reached through GL or
/// as virtual GPUs (`Other`) have workgroup memory worth tiling into.
pub(crate) fn kernels_for(kind: DeviceKind, options: &Options) -> (MatmulKernel, bool) {
    let hardware = options.hardware_profile || !matches!(kind, DeviceKind::Software | DeviceKind::Cpu);
    let matmul = options.matmul.unwrap_or(if hardware { MatmulKernel::Tiled } else { MatmulKernel::Registers });
    (matmul, hardware)
}

/// `DeviceInfo::matmul` of a wgpu device: its kernel family and profile.
pub(crate) fn matmul_label(kernel: MatmulKernel, hardware: bool) -> String {
    let family = match kernel {
        MatmulKernel::Registers => "register-blocked",
        MatmulKernel::Tiled => "workgroup-tiled 64x64/128x128",
        MatmulKernel::Tiled64 => "workgroup-tiled 64x64",
        MatmulKernel::Tiled128 => "workgroup-tiled 128x128",
        MatmulKernel::SplitK => "split-K workgroup-tiled 64x64",
    };
    format!("WGSL {family} kernel, {} profile", if hardware { "hardware" } else { "software" })
}

/// One logical wgpu device.
pub struct WgpuBackend {
    info: DeviceInfo,
    ctx: Ctx,
    pool: Arc<Pool>,
    matmul: MatmulKernel,
    /// `None` without timestamp queries: marks then fall back to the caller's clock.
    timestamps: Option<timestamps::Timestamps>,
    /// Chooses the matmul kernel per shape class by measurement where it tunes.
    tuner: autotune::Tuner,
}

impl WgpuBackend {
    /// `matmul`, with `bias[row]` (and a ReLU when its flag is set) added in the epilogue when
    /// given (see `ops::matmul`).
    fn matmul_with(&self, a: &Buffer, b: &Buffer, bias: Option<(&Buffer, bool)>, out: &Buffer, s: MatmulSpec) -> Result<bool> {
        let extent = |off: usize, bs: usize, size: usize| {
            if s.batch == 0 || size == 0 {
                0
            } else {
                off + (s.batch - 1) * bs + size
            }
        };
        let ar = self.raw("matmul", a, extent(s.a_offset, s.a_batch_stride, s.m * s.k))?;
        let br = self.raw("matmul", b, extent(s.b_offset, s.b_batch_stride, s.k * s.n))?;
        let or = self.raw("matmul", out, s.batch * s.m * s.n)?;
        let bias = bias.map(|(x, relu)| self.raw("matmul", x, s.m).map(|r| (r, relu))).transpose()?;
        let bias = bias.as_ref().map(|(r, relu)| (r, *relu));
        let (ar, br, or) = (&ar, &br, &or);
        let run = |kernel| match kernel {
            MatmulKernel::SplitK => tiled::split_k(&self.ctx, &self.pool, ar, br, bias, or, s),
            _ => ops::matmul(&self.ctx, kernel, ar, br, bias, or, s),
        };
        run(self.tuner.choose(&self.ctx, &s, bias.is_some(), self.matmul, &run)?)
    }
    /// [`Backend::unary`] by kernel code and parameters (`UnaryOp::code`, `UnaryOp::params`): a
    /// code outside the op table writes NaN, as on every backend (`UnaryOp::reference`).
    pub fn unary_code(&self, code: u32, params: [f32; 2], x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
        super::contract::unary(&self.info, x, layout, out)?;
        let xr = self.raw("unary", x, 0)?;
        let or = self.raw("unary", out, 0)?;
        ops::unary(&self.ctx, code, params, &xr, layout, &or)
    }
    /// [`Backend::binary`] by kernel code (`BinaryOp::code`): a code outside the op table writes
    /// NaN, as on every backend (`BinaryOp::reference`).
    pub fn binary_code(&self, code: u32, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        super::contract::binary(&self.info, a, la, b, lb, out)?;
        let ar = self.raw("binary", a, 0)?;
        let br = self.raw("binary", b, 0)?;
        let or = self.raw("binary", out, 0)?;
        ops::binary(&self.ctx, code, &ar, la, &br, lb, &or)
    }
    /// This device's buffer behind `b`, holding at least `need` elements: a handle to its
    /// memory for the op's duration.
    fn raw(&self, op: &'static str, b: &Buffer, need: usize) -> Result<wgpu::Buffer> {
        let w = self.stored(op, b)?;
        if b.len() < need {
            return Err(Error::invalid(op, format!("buffer of {} elements, {need} needed", b.len())));
        }
        match w.raw() {
            Some(raw) => Ok(raw),
            None => {
                b.refill(op, &self.ctx.name)?;
                w.raw().ok_or_else(|| super::released(op, &self.ctx.name, b.len()))
            }
        }
    }
    fn stored<'a>(&self, op: &'static str, b: &'a Buffer) -> Result<&'a Stored> {
        b.downcast::<Stored>()
            .filter(|w| Arc::ptr_eq(&w.pool, &self.pool))
            .ok_or_else(|| Error::invalid(op, format!("buffer does not belong to {}", self.ctx.name)))
    }
}

impl Backend for WgpuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn alloc(&self, len: usize, dtype: DType) -> Result<Buffer> {
        super::contract::alloc(&self.info, len, dtype)?;
        let raw = self.pool.alloc(dtype.words(len) as u64 * 4)?;
        Ok(Buffer::new(Stored::new(raw), len, dtype))
    }
    fn upload(&self, bytes: &[u8], dtype: DType) -> Result<Buffer> {
        super::contract::upload(&self.info, bytes, dtype)?;
        let len = bytes.len() / dtype.size();
        let raw = self.pool.alloc(dtype.words(len) as u64 * 4)?;
        // Queue writes move whole words: an odd number of halves takes a padded copy.
        let (whole, tail) = bytes.split_at(bytes.len() / 4 * 4);
        self.ctx.write(&raw.raw, 0, whole);
        if !tail.is_empty() {
            self.ctx.write(&raw.raw, whole.len() as u64, &[tail, &[0, 0]].concat());
        }
        Ok(Buffer::new(Stored::new(raw), len, dtype))
    }
    fn download(&self, buf: &Buffer) -> Result<Vec<u8>> {
        let raw = self.raw("download", buf, 0)?;
        let mut bytes = self.ctx.read(&raw, 0, buf.dtype().words(buf.len()) as u64 * 4)?;
        bytes.truncate(buf.len() * buf.dtype().size());
        Ok(bytes)
    }
    /// Straight from `buf` into the staging buffer: no scratch copy.
    fn download_range(&self, buf: &Buffer, start: usize, len: usize) -> Result<Vec<u8>> {
        let raw = self.raw("download_range", buf, start.saturating_add(len))?;
        if buf.dtype().is_half() {
            // The words that hold the range, then the range's bytes within them.
            let (first, end) = (start / 2, (start + len).div_ceil(2));
            let words = self.ctx.read(&raw, first as u64 * 4, (end - first) as u64 * 4)?;
            let skip = (start % 2) * 2;
            return Ok(words[skip..skip + len * 2].to_vec());
        }
        self.ctx.read(&raw, start as u64 * 4, len as u64 * 4)
    }
    /// Through the queue's own staging straight into `buf`: no scratch buffer.
    fn write_at(&self, buf: &Buffer, start: usize, bytes: &[u8]) -> Result<()> {
        if buf.dtype().is_half() && !(start.is_multiple_of(2) && bytes.len().is_multiple_of(4)) {
            // Not whole words: a staged upload and the copy kernel keep the neighbouring halves.
            let up = self.upload(bytes, buf.dtype())?;
            return self.copy(&up, 0, buf, start, up.len());
        }
        if buf.dtype().is_half() {
            let raw = self.raw("write_at", buf, start.saturating_add(bytes.len() / 2))?;
            self.ctx.write(&raw, start as u64 * 2, bytes);
            return Ok(());
        }
        if !bytes.len().is_multiple_of(4) {
            return Err(Error::invalid("write_at", format!("{} bytes are not whole 4-byte elements on {}", bytes.len(), self.ctx.name)));
        }
        let raw = self.raw("write_at", buf, start.saturating_add(bytes.len() / 4))?;
        self.ctx.write(&raw, start as u64 * 4, bytes);
        Ok(())
    }
    fn fill(&self, buf: &Buffer, value: f32) -> Result<()> {
        super::contract::fill(&self.info, buf)?;
        let bits = CastOp::fill_word(buf.dtype(), value);
        ops::fill(&self.ctx, &self.raw("fill", buf, 0)?, buf.dtype().words(buf.len()), bits)
    }
    fn copy(&self, src: &Buffer, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<()> {
        super::contract::copy(&self.info, src, src_off, dst, dst_off, len)?;
        let (s, d) = (&self.raw("copy", src, 0)?, &self.raw("copy", dst, 0)?);
        if len == 0 {
            return Ok(());
        }
        if src.dtype().is_half() {
            if s != d {
                return halves::copy(&self.ctx, s, src_off, d, dst_off, len);
            }
            // The kernel reads and writes distinct buffers: the source words go to scratch first.
            let (first, end) = (src_off / 2, (src_off + len).div_ceil(2));
            let tmp = self.pool.alloc((end - first) as u64 * 4)?;
            self.ctx.encode(|e| e.copy_buffer_to_buffer(s, first as u64 * 4, &tmp.raw, 0, (end - first) as u64 * 4));
            return halves::copy(&self.ctx, &tmp.raw, src_off % 2, d, dst_off, len);
        }
        let bytes = len as u64 * 4;
        if s == d {
            // wgpu copies never read and write one buffer; go through a scratch buffer.
            let tmp = self.pool.alloc(bytes)?;
            self.ctx.encode(|e| {
                e.copy_buffer_to_buffer(s, src_off as u64 * 4, &tmp.raw, 0, bytes);
                e.copy_buffer_to_buffer(&tmp.raw, 0, d, dst_off as u64 * 4, bytes);
            });
        } else {
            self.ctx.encode(|e| e.copy_buffer_to_buffer(s, src_off as u64 * 4, d, dst_off as u64 * 4, bytes));
        }
        Ok(())
    }
    fn unary(&self, op: UnaryOp, x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
        self.unary_code(op.code(), op.params(), x, layout, out)
    }
    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
        self.binary_code(op.code(), a, la, b, lb, out)
    }
    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
        super::contract::reduce(&self.info, op, x, spec, out)?;
        let xr = self.raw("reduce", x, 0)?;
        let or = self.raw("reduce", out, 0)?;
        reduce::reduce(&self.ctx, &self.pool, op, &xr, spec, &or)
    }
    fn matmul(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()> {
        super::contract::matmul(&self.info, a, b, None, out, spec)?;
        self.matmul_with(a, b, None, out, spec).map(drop)
    }
    fn matmul_row_bias(&self, a: &Buffer, b: &Buffer, bias: &Buffer, out: &Buffer, spec: MatmulSpec, relu: bool) -> Result<bool> {
        super::contract::matmul(&self.info, a, b, Some(bias), out, spec)?;
        self.matmul_with(a, b, Some((bias, relu)), out, spec)
    }
    fn im2col(&self, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()> {
        super::contract::im2col(&self.info, x, cols, spec)?;
        let xr = self.raw("im2col", x, 0)?;
        let cr = self.raw("im2col", cols, 0)?;
        nn::im2col(&self.ctx, &xr, &cr, spec, true)
    }
    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
        super::contract::col2im(&self.info, cols, x, spec)?;
        let xr = self.raw("col2im", x, 0)?;
        let cr = self.raw("col2im", cols, 0)?;
        nn::im2col(&self.ctx, &xr, &cr, spec, false)
    }
    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
        super::contract::max_pool2d(&self.info, x, out, argmax, spec)?;
        let xr = self.raw("max_pool2d", x, 0)?;
        let or = self.raw("max_pool2d", out, 0)?;
        let ar = self.raw("max_pool2d", argmax, 0)?;
        nn::max_pool(&self.ctx, &xr, &or, &ar, spec, true)
    }
    fn max_pool2d_backward(&self, grad_out: &Buffer, argmax: &Buffer, grad_x: &Buffer, spec: WindowSpec) -> Result<()> {
        super::contract::max_pool2d_backward(&self.info, grad_out, argmax, grad_x, spec)?;
        let gx = self.raw("max_pool2d_backward", grad_x, 0)?;
        let go = self.raw("max_pool2d_backward", grad_out, 0)?;
        let ar = self.raw("max_pool2d_backward", argmax, 0)?;
        nn::max_pool(&self.ctx, &gx, &go, &ar, spec, false)
    }
    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
        super::contract::index(&self.info, op, x, idx, out, rows, cols)?;
        let xr = self.raw("index", x, 0)?;
        let ir = self.raw("index", idx, 0)?;
        let or = self.raw("index", out, 0)?;
        nn::index(&self.ctx, op, &xr, &ir, &or, rows, cols)
    }
    fn cast(&self, op: CastOp, x: &Buffer, out: &Buffer, len: usize) -> Result<()> {
        super::contract::cast(&self.info, op, x, out, len)?;
        let xr = self.raw("cast", x, 0)?;
        let or = self.raw("cast", out, 0)?;
        let (from, to) = op.dtypes();
        if from.is_half() || to.is_half() {
            return halves::cast(&self.ctx, op, &xr, &or, len);
        }
        nn::cast(&self.ctx, op, &xr, &or, len)
    }
    fn optim_step(&self, step: OptimStep, param: &Buffer, grad: &Buffer, state: &[&Buffer]) -> Result<bool> {
        super::contract::optim_step(&self.info, step, param, grad, state)?;
        let n = param.len();
        let p = self.raw("optim_step", param, 0)?;
        let g = self.raw("optim_step", grad, 0)?;
        let s = state.iter().map(|b| self.raw("optim_step", b, 0)).collect::<Result<Vec<_>>>()?;
        nn::optim(&self.ctx, step, &p, &g, &s.iter().collect::<Vec<_>>(), n)?;
        Ok(true)
    }
    fn fused(&self, op: FusedOp, bufs: &[&Buffer]) -> Result<bool> {
        super::contract::fused(&self.info, op, bufs)?;
        let raw = bufs.iter().map(|b| self.raw(op.name(), b, 0)).collect::<Result<Vec<_>>>()?;
        fused::fused(&self.ctx, op, &raw.iter().collect::<Vec<_>>(), matches!(self.matmul, MatmulKernel::Registers))
    }
    fn fuses(&self, op: &FusedOp) -> bool {
        // Elementwise: the composition's passes are already one dispatch each here.
        !matches!(op, FusedOp::GeluTanh { .. } | FusedOp::GeluTanhBackward { .. })
    }
    fn mark(&self) -> Result<Option<u32>> {
        Ok(self.timestamps.as_ref().and_then(|t| t.mark(&self.ctx)))
    }
    fn read_marks(&self) -> Result<Vec<f64>> {
        self.timestamps.as_ref().map_or(Ok(Vec::new()), |t| t.read(&self.ctx))
    }
    fn tuning(&self) -> Vec<Tuning> {
        self.tuner.tuning()
    }
    fn pin_kernels(&self) {
        self.tuner.pin();
    }
    fn sync(&self) -> Result<()> {
        self.ctx.wait()
    }
    fn release(&self, buf: &Buffer) -> Result<bool> {
        self.stored("release", buf)?.release();
        Ok(true)
    }
    fn restore(&self, buf: &Buffer) -> Result<bool> {
        self.stored("restore", buf)?.restore()?;
        Ok(true)
    }
    fn memory(&self) -> MemoryStats {
        self.pool.stats()
    }
    fn reset_peak_memory(&self) {
        self.pool.reset_peak();
    }
    fn set_memory_budget(&self, bytes: Option<u64>) {
        self.pool.set_budget(bytes);
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
