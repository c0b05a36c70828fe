//! `CudaBackend`: one logical CUDA device (the GPU's primary context and one stream of its own)
//! implementing the `Backend` primitives with the kernels of `kernels/*.cu` and cuBLAS.
use super::blas::Blas;
use super::memory::{CudaBuf, Pool};
use super::transfer::Staging;
use super::{backend_error, kernels, nvrtc};
use crate::backend::*;
use crate::{DType, Error, Layout, Result, MAX_RANK};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;

/// A strided operand as kernels read it (`Layout6` in `kernels/common.cuh`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct LayoutArg {
    shape: [u32; MAX_RANK],
    strides: [u32; MAX_RANK],
    offset: u32,
    contiguous: u32,
}

/// `Window` in `kernels/common.cuh`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct WindowArg([u32; 12]);

/// `MatmulArgs` in `kernels/matmul.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MatmulArg {
    dims: [u64; 8],
    trans: [u32; 2],
}

// SAFETY: plain `repr(C)` structs of integers whose layouts match the CUDA structs field by field.
unsafe impl DeviceRepr for LayoutArg {}
// SAFETY: as above.
unsafe impl DeviceRepr for WindowArg {}
// SAFETY: as above.
unsafe impl DeviceRepr for MatmulArg {}

/// Threads per block of the elementwise kernels (and the fixed width of `reduce_rows_f32`).
pub(super) const THREADS: u32 = 256;

pub struct CudaBackend {
    pub(super) info: DeviceInfo,
    /// `cuda:N (name)`, the device as error messages name it.
    pub(super) label: String,
    pub(super) stream: Arc<CudaStream>,
    pub(super) pool: Arc<Pool>,
    pub(super) staging: Staging,
    pub(super) funcs: HashMap<&'static str, CudaFunction>,
    /// `None` without libcublas: matmul then runs `kernels/matmul.cu`.
    pub(super) blas: Option<Blas>,
    /// Timing events of `Backend::mark`.
    pub(super) marks: super::marks::Marks,
}

/// Elementwise launch shape: a grid-stride loop, so the grid is capped and any `n` works.
pub(super) fn grid(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as u64).clamp(1, 65535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// The window geometry as the kernels read it, in 32 bits; a value past that is a shape error
/// naming `op`, never a truncation.
pub(super) fn window(op: &'static str, s: &WindowSpec) -> Result<WindowArg> {
    let v = [s.n, s.c, s.h, s.w, s.kh, s.kw, s.stride.0, s.stride.1, s.pad.0, s.pad.1, s.oh, s.ow];
    let mut out = [0u32; 12];
    for (o, &x) in out.iter_mut().zip(&v) {
        *o = u32::try_from(x).map_err(|_| Error::shape(op, format!("window {s:?} exceeds the kernels' 32-bit sizes")))?;
    }
    Ok(WindowArg(out))
}

impl CudaBackend {
    /// Creates the context and stream of device `info.ordinal` and loads every kernel family.
    pub(crate) fn new(mut info: DeviceInfo) -> Result<Self> {
        let label = format!("cuda:{} ({})", info.ordinal, info.name);
        if let Some(reason) = nvrtc::unavailable() {
            return Err(Error::Unavailable { backend: "cuda", reason });
        }
        let err = |what: &str, e: cudarc::driver::DriverError| backend_error(&label, what, e);
        let ctx = CudaContext::new(info.ordinal).map_err(|e| err("creating the context", e))?;
        // Ordering is by the one stream (see memory.rs), so cudarc's per-slice events are unused.
        // SAFETY: no CudaSlice of this context relies on event tracking.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| err("cuStreamCreate", e))?;
        let cc = ctx.compute_capability().map_err(|e| err("compute capability", e))?;
        let mut driver = 0;
        // SAFETY: plain out-parameter.
        let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
        let mut funcs = HashMap::new();
        let mut images = Vec::new();
        for (family, source) in kernels::KERNELS {
            let names = kernels::functions(family);
            let (module, image) = load_family(&ctx, family, source, cc, driver).map_err(|e| backend_error(&label, "loading kernels", e))?;
            images.push(image);
            for name in names.iter() {
                let f = module.load_function(name).map_err(|e| err(name, e))?;
                funcs.insert(*name, f);
            }
        }
        let blas = Blas::new(&stream).and_then(|b| super::blas::version().map(|v| (b, v)));
        let blas = match blas {
            Ok((blas, version)) => {
                info.matmul = super::matmul_line(&Ok(version));
                Some(blas)
            }
            Err(why) => {
                tracing::warn!("{label}: {why}; matmul uses the tiled kernel");
                info.matmul = super::matmul_line(&Err(why));
                None
            }
        };
        info.libraries = super::libraries_line(&super::nvrtc_line(), &images, super::nccl_line().as_ref());
        Ok(CudaBackend {
            pool: Arc::new(Pool::new(stream.clone(), label.clone())),
            staging: Staging::new(stream.clone(), label.clone()),
            info,
            label,
            stream,
            funcs,
            blas,
            marks: Default::default(),
        })
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }
    pub(crate) fn info_ref(&self) -> &DeviceInfo {
        &self.info
    }
    /// `cuda:N (name)`, as error messages name this device.
    #[cfg(feature = "nccl")]
    pub(crate) fn label(&self) -> &str {
        &self.label
    }
    /// The device address of `b`, checked to be this device's buffer of at least `need` elements
    /// of `dtype`; for libraries that take raw pointers on [`Self::stream`] (NCCL).
    #[cfg(feature = "nccl")]
    pub(crate) fn device_ptr(&self, op: &'static str, b: &Buffer, need: usize, dtype: DType) -> Result<u64> {
        self.ptr(op, b, need, dtype)
    }

    pub(super) fn err(&self, what: &str, e: impl std::fmt::Debug) -> Error {
        backend_error(&self.label, what, e)
    }

    pub(super) fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs.get(name).ok_or_else(|| self.err("kernel lookup", format!("{name} is not loaded")))
    }

    pub(super) fn bind(&self) -> Result<()> {
        self.context().bind_to_thread().map_err(|e| self.err("binding the context", e))
    }

    /// This device's buffer `b`, released or not.
    pub(super) fn own<'a>(&self, op: &'static str, b: &'a Buffer) -> Result<&'a CudaBuf> {
        b.downcast::<CudaBuf>()
            .filter(|m| Arc::ptr_eq(&m.pool, &self.pool))
            .ok_or_else(|| Error::invalid(op, format!("buffer does not belong to {}", self.label)))
    }

    /// This device's memory behind `b`, checked to hold at least `need` elements of `dtype`.
    pub(super) fn mem<'a>(&self, op: &'static str, b: &'a Buffer, need: usize, dtype: DType) -> Result<&'a CudaBuf> {
        let m = self.own(op, b)?;
        if b.dtype() != dtype {
            return Err(Error::DType { op, expected: dtype, got: b.dtype() });
        }
        if b.len() < need {
            return Err(Error::shape(op, format!("buffer of {} elements, the op addresses {need}", b.len())));
        }
        if m.is_released() {
            b.refill(op, &self.label)?;
            if m.is_released() {
                return Err(crate::backend::released(op, &self.label, b.len()));
            }
        }
        Ok(m)
    }

    pub(super) fn ptr(&self, op: &'static str, b: &Buffer, need: usize, dtype: DType) -> Result<u64> {
        self.mem(op, b, need, dtype).map(CudaBuf::ptr)
    }

    pub(super) fn layout(&self, op: &'static str, b: &Buffer, l: &Layout) -> Result<(u64, LayoutArg)> {
        // `contract` checked the buffer holds every element `l` reaches.
        let ptr = self.ptr(op, b, 0, DType::F32)?;
        // A contiguous operand is read as `offset + i` with a 64-bit `i`: its sizes are not read,
        // so a tensor of more than 2^32 - 1 elements needs no 32-bit shape.
        let contiguous = l.is_contiguous();
        let (shape, strides) = if contiguous { ([1; MAX_RANK], [0; MAX_RANK]) } else { l.padded(op)? };
        let offset = u32::try_from(l.offset).map_err(|_| Error::shape(op, format!("layout offset {} exceeds 32 bits", l.offset)))?;
        Ok((ptr, LayoutArg { shape, strides, offset, contiguous: contiguous as u32 }))
    }

    pub(super) fn matmul_kernel(&self, a: u64, b: u64, c: u64, s: &MatmulSpec) -> Result<()> {
        const TILE: usize = 16;
        let (gx, gy) = (s.n.div_ceil(TILE), s.m.div_ceil(TILE));
        if gy > 65535 {
            return Err(Error::invalid("matmul", format!("m = {} exceeds the fallback kernel's grid", s.m)));
        }
        let cfg = LaunchConfig {
            grid_dim: (gx as u32, gy as u32, s.batch.min(65535) as u32),
            block_dim: (TILE as u32, TILE as u32, 1),
            shared_mem_bytes: 0,
        };
        let dims = [s.batch, s.m, s.n, s.k, s.a_offset, s.b_offset, s.a_batch_stride, s.b_batch_stride];
        let args = MatmulArg { dims: dims.map(|v| v as u64), trans: [s.trans_a as u32, s.trans_b as u32] };
        launch!(self, "matmul_f32", cfg, a, b, c, args)
    }
}

/// Loads one family, preferring PTX for the device's `compute_XY` and falling back to a CUBIN for
/// `sm_XY` (the driver may be older than NVRTC and reject its PTX, which is then remembered in
/// the cache, see `nvrtc::targets`); a rejected cache entry is evicted so that the next process
/// recompiles it. Returns the module and what it was loaded from (`PTX compute_90`).
fn load_family(
    ctx: &Arc<CudaContext>,
    family: &str,
    source: &str,
    cc: (i32, i32),
    driver: i32,
) -> Result<(Arc<cudarc::driver::CudaModule>, String), String> {
    let mut failures = Vec::new();
    for target in nvrtc::targets(driver, cc) {
        let image = match nvrtc::compile_cached(family, source, &target) {
            Ok(image) => image,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        match ctx.load_module(Ptx::from_binary(image)) {
            Ok(m) => return Ok((m, format!("{} {target}", if target.starts_with("sm_") { "cubin" } else { "PTX" }))),
            Err(e) => {
                nvrtc::evict(family, source, &target);
                if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                    nvrtc::remember_ptx_rejected(driver, &target);
                }
                failures.push(format!("{family}.cu for {target}: cuModuleLoadData: {e:?}"));
            }
        }
    }
    Err(failures.join("; "))
}
