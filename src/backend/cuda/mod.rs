//! CUDA backend on cudarc: NVRTC-compiled kernels from `kernels/*.cu`, cuBLAS matmul, a caching
//! allocator, pinned staging and peer copies. Libraries are loaded at run time, so a binary built
//! with `--features cuda` runs (and finds no CUDA device) where no NVIDIA driver is installed.
//!
//! Environment: `libcuda.so.1` comes with the driver; `libnvrtc.so.12` and `libcublas.so.12`
//! are searched by their standard names through the dynamic loader, so a pip wheel's
//! `nvidia/cuda_nvrtc/lib` (or `nvidia/cublas/lib`) directory on `LD_LIBRARY_PATH` works.
//! Without cuBLAS, matmul falls back to the tiled kernel in `kernels/matmul.cu`.

/// Launches kernel `$name` on `$self`'s stream; arguments must be local variables so that the
/// references the launcher keeps live until the launch.
macro_rules! launch {
    ($self:expr, $name:expr, $cfg:expr, $($arg:ident),* $(,)?) => {{
        let f = $self.func($name)?;
        let mut builder = $self.stream.launch_builder(f);
        $( builder.arg(&$arg); )*
        // SAFETY: the argument list matches the kernel's signature in kernels/*.cu, and every
        // buffer was checked to hold the elements the kernel addresses.
        unsafe { builder.launch($cfg) }.map(|_| ()).map_err(|e| $self.err($name, e))
    }};
}

mod blas;
mod device;
pub mod kernels;
mod marks;
mod memory;
mod nvrtc;
mod ops;
mod peer;
mod transfer;

pub use device::CudaBackend;

use crate::backend::{Backend, BackendKind, DeviceInfo, DeviceKind};
use crate::{Error, Result};
use cudarc::driver::{result, sys};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

/// Runs `f`, turning a panic inside cudarc (it panics when a library or symbol is missing) into
/// `Error::Unavailable`, so no panic reaches the caller.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::Unavailable { backend: "cuda", reason: format!("{what}: {msg}") })
    })
}

/// The one conversion of vendor errors (driver, cuBLAS) into tandem's error type.
pub(crate) fn backend_error(device: &str, what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend { backend: "cuda", device: device.to_string(), detail: format!("{what}: {e:?}") }
}

/// The number of CUDA devices, or why CUDA cannot be used in this process. Probed once: the
/// driver library is looked for before any cudarc call, and `cuInit` runs inside `guarded`.
pub fn probe() -> Result<usize> {
    static PROBE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    let probed = PROBE.get_or_init(|| {
        // SAFETY: is_culib_present only dlopens candidate names and closes them again.
        let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err("no NVIDIA driver library (libcuda.so.1) found".into());
        }
        guarded("cuInit", || {
            result::init().map_err(|e| backend_error("cuda", "cuInit", e))?;
            let n = result::device::get_count().map_err(|e| backend_error("cuda", "cuDeviceGetCount", e))?;
            Ok(n.max(0) as usize)
        })
        .map_err(|e| e.to_string())
    });
    probed.clone().map_err(|reason| Error::Unavailable { backend: "cuda", reason })
}

/// Every CUDA device the driver reports; empty when there is no driver or no device.
pub fn devices() -> Vec<DeviceInfo> {
    let Ok(n) = probe() else { return Vec::new() };
    (0..n).filter_map(|i| guarded("device query", || describe(i)).ok()).collect()
}

/// Opens CUDA device `ordinal` as a new logical device: a context and one stream of its own.
pub fn open(ordinal: usize) -> Result<Arc<dyn Backend>> {
    let n = probe()?;
    if ordinal >= n {
        return Err(Error::NoSuchDevice {
            spec: format!("cuda:{ordinal}"),
            available: format!("{n} CUDA device(s)"),
        });
    }
    let backend = guarded("opening the device", || CudaBackend::new(describe(ordinal)?))?;
    Ok(Arc::new(backend))
}

/// `m[i][j]`: whether device `i` can read device `j`'s memory directly (cuDeviceCanAccessPeer);
/// the diagonal is true. Empty without devices.
pub fn peer_matrix() -> Vec<Vec<bool>> {
    let n = probe().unwrap_or(0);
    (0..n).map(|i| (0..n).map(|j| i == j || peer::can_access(i, j)).collect()).collect()
}

/// Compiles every kernel family for `arch` (`compute_52`, `sm_90`, ...) with the same NVRTC path
/// the backend uses, uncached; a warning counts as a failure. Returns one line per family.
pub fn compile_check(arch: &str) -> Result<Vec<String>> {
    if let Some(reason) = nvrtc::unavailable() {
        return Err(Error::Unavailable { backend: "cuda", reason });
    }
    guarded("nvrtc", || {
        let (major, minor) = nvrtc::version().map_err(|e| backend_error("nvrtc", "version", e))?;
        let mut lines = Vec::new();
        for (family, source) in kernels::KERNELS {
            let out = nvrtc::compile(family, source, arch).map_err(|e| backend_error("nvrtc", "compile", e))?;
            if !out.log.is_empty() {
                return Err(backend_error("nvrtc", "compile", format!("{family}.cu for {arch} warned:\n{}", out.log)));
            }
            lines.push(format!("{family}.cu: {arch}, {} bytes (NVRTC {major}.{minor})", out.image.len()));
        }
        Ok(lines)
    })
}

/// The version of the NVRTC library this process loads, as `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if let Some(reason) = nvrtc::unavailable() {
        return Err(Error::Unavailable { backend: "cuda", reason });
    }
    guarded("nvrtc", || nvrtc::version().map_err(|e| backend_error("nvrtc", "version", e)))
}

fn describe(ordinal: usize) -> Result<DeviceInfo> {
    let label = format!("cuda:{ordinal}");
    let dev = result::device::get(ordinal as i32).map_err(|e| backend_error(&label, "cuDeviceGet", e))?;
    let name = result::device::get_name(dev).map_err(|e| backend_error(&label, "cuDeviceGetName", e))?;
    // SAFETY: `dev` is a valid device handle from cuDeviceGet.
    let memory = unsafe { result::device::total_mem(dev) }.ok().map(|b| b as u64);
    let attr = |a| unsafe { result::device::get_attribute(dev, a) }.unwrap_or(0);
    let cc_major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    let cc_minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    let mut version = 0;
    // SAFETY: plain out-parameter.
    let _ = unsafe { sys::cuDriverGetVersion(&mut version) };
    Ok(DeviceInfo {
        backend: BackendKind::Cuda,
        ordinal,
        name: name.trim().to_string(),
        kind: DeviceKind::Discrete,
        memory,
        driver: format!("CUDA driver {}.{}, sm_{cc_major}{cc_minor}", version / 1000, (version % 1000) / 10),
    })
}
