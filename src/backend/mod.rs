//! The `Backend` trait: the small set of primitives every device implements, generic over op enums.
//!
//! Tensors are always contiguous in their own buffer; strided reads (broadcast, narrow, permute)
//! are expressed by the `Layout` an op reads its inputs through. Outputs are contiguous.
//! Adding an elementwise op: one entry in `op_table.rs` and its kernel cases (CONTRIBUTING.md).
#![doc = include_str!("devices.md")]
pub(crate) mod budget;
mod buffer;
pub mod cache;
pub mod contract;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod fused;
pub(crate) mod host;
mod index;
pub mod op_table;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use budget::{format_bytes, parse_bytes};
pub use buffer::Buffer;
pub(crate) use buffer::Refill;
pub use fused::{ln_blocks, FusedOp, LN_ROW_BLOCK};
pub(crate) use fused::{GELU_BETA, GELU_KAPPA};
pub use index::{row_plan, CastOp, IndexOp};
pub use op_table::{BinaryOp, UnaryOp};

use crate::{DType, Layout, Result};
use std::any::Any;

/// Reductions along one axis. `ArgMax` writes I32 indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    ArgMax,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax];
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// A reduction over the middle axis of a contiguous `[outer, len, inner]` view; the output is
/// `[outer, inner]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceSpec {
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
}

/// `C[b] = op(A[b]) · op(B[b])` with `C[b]` m×n, `op(A)` m×k, `op(B)` k×n, all row-major.
/// With `trans_a`, A is stored k×m; with `trans_b`, B is stored n×k. A batch stride of 0 reuses
/// one matrix for every batch entry. Offsets are in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulSpec {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub a_offset: usize,
    pub b_offset: usize,
    pub a_batch_stride: usize,
    pub b_batch_stride: usize,
}

impl MatmulSpec {
    /// A plain (batched) product of contiguous operands.
    pub fn new(batch: usize, m: usize, n: usize, k: usize) -> Self {
        MatmulSpec { batch, m, n, k, trans_a: false, trans_b: false, a_offset: 0, b_offset: 0, a_batch_stride: m * k, b_batch_stride: k * n }
    }
}

/// Geometry of a 2-D convolution or pooling window over `[n, c, h, w]` input, producing
/// `[n, c_out, oh, ow]`. im2col columns are `[n, c*kh*kw, oh*ow]`, row index `(ci*kh + i)*kw + j`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: (usize, usize),
    pub pad: (usize, usize),
    pub oh: usize,
    pub ow: usize,
}

impl WindowSpec {
    /// The output size follows PyTorch's floor rule; errors when the window does not fit.
    pub fn new(op: &'static str, nchw: [usize; 4], kernel: (usize, usize), stride: (usize, usize), pad: (usize, usize)) -> Result<Self> {
        let [n, c, h, w] = nchw;
        if kernel.0 == 0 || kernel.1 == 0 || stride.0 == 0 || stride.1 == 0 {
            return Err(crate::Error::invalid(op, "kernel and stride must be positive"));
        }
        if h + 2 * pad.0 < kernel.0 || w + 2 * pad.1 < kernel.1 {
            return Err(crate::Error::shape(op, format!("window {kernel:?} does not fit input {:?} with padding {pad:?}", [n, c, h, w])));
        }
        let oh = (h + 2 * pad.0 - kernel.0) / stride.0 + 1;
        let ow = (w + 2 * pad.1 - kernel.1) / stride.1 + 1;
        Ok(WindowSpec { n, c, h, w, kh: kernel.0, kw: kernel.1, stride, pad, oh, ow })
    }
    pub fn col_rows(&self) -> usize {
        self.c * self.kh * self.kw
    }
    pub fn col_len(&self) -> usize {
        self.oh * self.ow
    }
}

/// Fused optimizer updates, an optional fast path over the composed update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimStep {
    /// PyTorch SGD; `state[0]` is the momentum buffer (ignored when momentum is 0).
    Sgd { lr: f32, momentum: f32, dampening: f32, nesterov: bool, weight_decay: f32, first: bool },
    /// PyTorch Adam (`decoupled` = AdamW); `state` is `[exp_avg, exp_avg_sq]`; `step` counts from 1.
    Adam { lr: f32, beta1: f32, beta2: f32, eps: f32, weight_decay: f32, decoupled: bool, step: u64 },
}

/// What kind of processor a device is; `auto` prefers hardware over software.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DeviceKind {
    Discrete,
    Integrated,
    Software,
    Cpu,
    Other,
}

/// Which implementation drives a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum BackendKind {
    Cpu,
    Wgpu,
    Cuda,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// Static facts about an opened device.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    pub backend: BackendKind,
    /// Index among its backend's devices (`wgpu:1` has ordinal 1).
    pub ordinal: usize,
    pub name: String,
    pub kind: DeviceKind,
    /// Total device memory in bytes, when the driver says.
    pub memory: Option<u64>,
    pub driver: String,
    /// The matmul path the device takes: `cuBLAS 12.9.1 (libcublas.so.12)`, or the tiled
    /// kernel with the reason cuBLAS is not used, a wgpu kernel family and profile, the CPU's
    /// gemm. For a listed, unopened CUDA device it is the path opening it would take.
    pub matmul: String,
    /// The run-time libraries behind the kernels and their versions (CUDA: NVRTC and whether
    /// the kernels load as PTX or cubin, NCCL); empty where the backend uses none.
    pub libraries: String,
}

/// One kernel choice a device made by measurement (`Backend::tuning`): for an op family and a
/// class of shapes, the candidate kernels' times and the fastest, which that class then runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Tuning {
    /// The op family and shape class, as `matmul hardware m256 n256 k256 b1 NN` (sizes are the
    /// powers of two at or above the product's; `NN`: neither operand transposed).
    pub class: String,
    /// The kernel this class runs.
    pub kernel: String,
    /// Each candidate's best time per run in microseconds, in the order they were timed.
    pub times_us: Vec<(String, f64)>,
    /// `device` (timestamp queries) or `wall` (host clock around a wait).
    pub clock: String,
    /// Read from the on-disk cache rather than measured in this process.
    pub from_cache: bool,
}

/// Allocator statistics of one device, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryStats {
    pub in_use: u64,
    pub peak: u64,
    /// Freed buffers kept for reuse.
    pub pooled: u64,
    /// The cap on `in_use` set with [`Backend::set_memory_budget`], if any.
    pub budget: Option<u64>,
}

/// The primitives a device implements. Object safe; one `Arc<dyn Backend>` per logical device,
/// shared by every thread that uses it. Ops may run asynchronously: results are guaranteed
/// visible to `download` and after `sync`. All sizes and offsets count elements.
///
/// Every implementation calls the `contract` function of the same name first in each method,
/// so that a short buffer, a wrong dtype or a spec that reaches past a buffer is the same
/// error on every backend, before any kernel or `unsafe` runs.
pub trait Backend: Send + Sync {
    fn info(&self) -> &DeviceInfo;

    /// A buffer of `len` elements with unspecified contents.
    fn alloc(&self, len: usize, dtype: DType) -> Result<Buffer>;
    /// A buffer holding `bytes` (little-endian elements of `dtype`).
    fn upload(&self, bytes: &[u8], dtype: DType) -> Result<Buffer>;
    /// The buffer's elements as little-endian bytes; waits for pending work.
    fn download(&self, buf: &Buffer) -> Result<Vec<u8>>;
    /// The bytes of elements `start..start + len` of `buf`; waits for pending work. A device
    /// that can read a part of a buffer overrides this copy through a scratch buffer.
    fn download_range(&self, buf: &Buffer, start: usize, len: usize) -> Result<Vec<u8>> {
        let part = self.alloc(len, buf.dtype())?;
        self.copy(buf, start, &part, 0, len)?;
        self.download(&part)
    }
    /// Writes `bytes` (whole elements) into `buf` from element `start` on, after the work
    /// recorded so far. A device that can write a part of a buffer overrides this upload and copy.
    fn write_at(&self, buf: &Buffer, start: usize, bytes: &[u8]) -> Result<()> {
        let up = self.upload(bytes, buf.dtype())?;
        self.copy(&up, 0, buf, start, up.len())
    }
    /// Sets every element to `value` (cast to the buffer's dtype).
    fn fill(&self, buf: &Buffer, value: f32) -> Result<()>;
    /// Copies `len` elements from `src[src_off..]` to `dst[dst_off..]`.
    fn copy(&self, src: &Buffer, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<()>;

    /// `out[i] = op(x[layout(i)])`, with `out` contiguous of `layout.shape`.
    fn unary(&self, op: UnaryOp, x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()>;
    /// `out[i] = op(a[la(i)], b[lb(i)])`; `la` and `lb` share the output's shape.
    fn binary(&self, op: BinaryOp, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()>;
    /// Reduction over the middle axis of contiguous `x` viewed as `spec`.
    fn reduce(&self, op: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()>;
    /// `out = A · B` per `spec`; `out` is `[batch, m, n]` contiguous.
    fn matmul(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()>;
    /// Unfolds `[n, c, h, w]` into `[n, c*kh*kw, oh*ow]` columns (zero padding).
    fn im2col(&self, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()>;
    /// Folds columns back, summing overlaps: the adjoint of `im2col`. Overwrites `x`.
    fn col2im(&self, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()>;
    /// Max pooling over `[n, c, h, w]` (`spec.c` channels in and out); `argmax` (I32) records
    /// each output's source position `y*w + x` in its plane, or -1 if the window is all padding.
    fn max_pool2d(&self, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()>;
    /// Gradient of `max_pool2d` into `[n, c, h, w]`; overwrites `grad_x`.
    fn max_pool2d_backward(&self, grad_out: &Buffer, argmax: &Buffer, grad_x: &Buffer, spec: WindowSpec) -> Result<()>;
    /// See `IndexOp`; `x` is `[rows, cols]` for gather, `out` is `[rows, cols]` for scatter.
    fn index(&self, op: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()>;
    /// `out[i] = op(x[i])` for `i < len`, converting between dtypes (see `CastOp`): no other
    /// primitive writes I32 from values or reads I32 as numbers. The default converts on the
    /// host (a download and an upload); the built-in backends run a kernel.
    fn cast(&self, op: CastOp, x: &Buffer, out: &Buffer, len: usize) -> Result<()> {
        contract::cast(self.info(), op, x, out, len)?;
        let converted = self.upload(&op.host(&self.download(x)?, len), out.dtype())?;
        self.copy(&converted, 0, out, 0, len)
    }

    /// Fused `out[z] = A·B[z] + bias[row]` (`bias` has `m` values, one per row of each output
    /// matrix), then `max(0, ·)` when `relu`: a convolution, its bias and a following ReLU in one
    /// pass. `Ok(false)` means "not fused here": the caller multiplies, adds and clamps.
    fn matmul_row_bias(&self, a: &Buffer, b: &Buffer, bias: &Buffer, out: &Buffer, spec: MatmulSpec, _relu: bool) -> Result<bool> {
        contract::matmul(self.info(), a, b, Some(bias), out, spec)?;
        Ok(false)
    }
    /// Fused optimizer update of `param` in place; `Ok(false)` means "not fused here, compose it".
    fn optim_step(&self, step: OptimStep, param: &Buffer, grad: &Buffer, state: &[&Buffer]) -> Result<bool> {
        contract::optim_step(self.info(), step, param, grad, state)?;
        Ok(false)
    }
    /// One fused transformer kernel (see `FusedOp` for the buffers, in order); `Ok(false)`
    /// means "not fused here": the caller composes the op from the primitives above.
    fn fused(&self, op: FusedOp, bufs: &[&Buffer]) -> Result<bool> {
        contract::fused(self.info(), op, bufs)?;
        Ok(false)
    }
    /// `false` when `fused` always declines this kind of op here, so that the caller composes it
    /// without allocating the fused kernel's outputs first; `true` means "ask `fused`".
    fn fuses(&self, _op: &FusedOp) -> bool {
        true
    }
    /// A direct copy from a buffer on another device of this backend (CUDA peer access);
    /// `Ok(None)` means the caller stages through host memory.
    fn copy_from_peer(&self, _src_device: &dyn Backend, _src: &Buffer) -> Result<Option<Buffer>> {
        Ok(None)
    }
    /// Whether `copy_from_peer` from `other` is a direct device-to-device path.
    fn has_peer_path(&self, _other: &dyn Backend) -> bool {
        false
    }

    /// Records a mark on the device's own timeline, after every op recorded so far, and
    /// returns its number (from 0 after each `read_marks`); `Ok(None)` where the device keeps
    /// no clock of its own (the CPU runs ops on the caller's thread, whose host clock is the
    /// device's) or has no room or feature for one (wgpu adapters without timestamp queries).
    fn mark(&self) -> Result<Option<u32>> {
        Ok(None)
    }
    /// The device-clock seconds of every mark since the last read, by number, once the device
    /// has reached them; numbering starts again at 0.
    fn read_marks(&self) -> Result<Vec<f64>> {
        Ok(Vec::new())
    }

    /// Frees the memory behind `buf` while its handle lives on, so that ZeRO-3 can drop a
    /// parameter's values between steps without the model losing the tensor; every op on it
    /// is an error until [`Backend::restore`]. Releasing a released buffer does nothing.
    /// `Ok(false)`: this backend keeps the memory (the values stay valid, nothing is saved).
    fn release(&self, _buf: &Buffer) -> Result<bool> {
        Ok(false)
    }
    /// Gives a released buffer memory again (contents unspecified); `Ok(true)` for a buffer
    /// that was never released. `Ok(false)` where `release` is not supported.
    fn restore(&self, _buf: &Buffer) -> Result<bool> {
        Ok(false)
    }
    /// The kernel choices this device made by measurement (see `Tuning`); empty where it
    /// chooses by rule alone (the CPU, CUDA, wgpu with autotuning off).
    fn tuning(&self) -> Vec<Tuning> {
        Vec::new()
    }
    /// Stops choosing kernels by measurement: every later op runs the kernel this device takes
    /// untuned, so that results do not depend on timings (deterministic data parallelism).
    fn pin_kernels(&self) {}

    /// Waits until every recorded op has finished.
    fn sync(&self) -> Result<()>;
    fn memory(&self) -> MemoryStats;
    /// Starts the peak of [`MemoryStats`] again from the bytes in use now (PyTorch's
    /// `reset_peak_memory_stats`), so that a step's peak can be told from a setup's.
    fn reset_peak_memory(&self);
    /// Caps the bytes this device's live buffers may hold (`None`: only the hardware's limit).
    /// An allocation past it fails with `OutOfMemory` naming the device, the bytes asked, the
    /// budget and the bytes in use; buffers already held stay valid when the cap is lowered
    /// below them. This is how a smaller device (an 8 GB M60) is played by a larger one.
    fn set_memory_budget(&self, bytes: Option<u64>);
    /// Lets backends downcast a peer (`copy_from_peer`).
    fn as_any(&self) -> &dyn Any;
}

/// The error of an op on a buffer that [`Backend::release`] gave back and nothing restored (a
/// ZeRO-3 parameter between uses), as every backend words it. A buffer with a refill hook
/// ([`Buffer::refill`]) is refilled instead.
pub(crate) fn released(op: &'static str, device: &str, len: usize) -> crate::Error {
    crate::Error::invalid(op, format!("a buffer of {len} elements on {device} was released (a ZeRO-3 parameter between uses) and not restored"))
}

/// The error function as every backend without a builtin computes it (the CPU reference in
/// f64, `shaders/unary.wgsl` in f32): the odd Taylor polynomial below 0.5 (terms to x¹³, so
/// the remainder is under 1e-9 relative), where `1 - erfc` would cancel; above, `1 - erfc`
/// with Numerical Recipes' Chebyshev fit of erfc (relative error under 1.2e-7).
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 0.5 {
        let z = a * a;
        let c = [std::f64::consts::FRAC_2_SQRT_PI, -0.3761263890, 0.1128379167, -0.0268661706, 0.0052239776, -0.0008548327, 0.0001205533];
        a * c.iter().rev().fold(0.0, |acc, &k| acc * z + k)
    } else {
        let t = 1.0 / (1.0 + 0.5 * a);
        let c = [-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277];
        let poly = c.iter().rev().fold(0.0, |acc, &k| acc * t + k);
        1.0 - t * (-a * a + poly).exp()
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}
