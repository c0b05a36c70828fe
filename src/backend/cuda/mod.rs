//! CUDA backend on cudarc: NVRTC-compiled kernels from `kernels/*.cu`, cuBLAS matmul, a caching
//! allocator, pinned staging and peer copies. Libraries are loaded at run time, so a binary built
//! with `--features cuda` runs (and finds no CUDA device) where no NVIDIA driver is installed.
//!
//! Environment: `libcuda.so.1` comes with the driver. NVRTC and cuBLAS of CUDA 12 or CUDA 13
//! (`libnvrtc.so.13`/`.12`, `libcublas.so.13`/`.12`) and NCCL (`libnccl.so.2`) are looked for,
//! in order, in the directories of `TANDEM_CUDA_LIBS` (`:`-separated), of `LD_LIBRARY_PATH`,
//! in `$CUDA_HOME`/`$CUDA_PATH`/`$CUDA_ROOT` (`lib64`, `lib`), in the pip wheels' folders
//! (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`, `nvidia/cublas/lib`, `nvidia/nccl/lib`) of the
//! `site-packages` of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `~/.local`, `/usr/local`, `/usr` and of
//! every `python3` on `PATH`, in `/usr/local/cuda/lib64` and the system's library folders, then
//! through the dynamic loader. The lowest compute capability among the visible devices decides
//! the CUDA version: below 7.5 (Maxwell such as the Tesla M60, Pascal, Volta) only CUDA 12's
//! NVRTC and cuBLAS are taken, since CUDA 13's cannot compile for those devices nor run on them,
//! and finding only CUDA 13's is an error naming the device and what to install; from 7.5 on
//! the version of the driver's CUDA major comes first, then the newest. A failed search names
//! every file and directory tried ([`library_file`] shows what was loaded).
//! Without cuBLAS, matmul runs the tiled kernel in `kernels/matmul.cu`, and the device's
//! [`DeviceInfo::matmul`] says so and why; [`DeviceInfo::libraries`] names NVRTC's and NCCL's
//! versions and whether the kernels loaded as PTX or cubin.

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
pub(crate) mod libs;
mod marks;
mod memory;
mod nvrtc;
mod ops;
mod peer;
mod stub;
mod transfer;

pub use device::CudaBackend;

use crate::backend::{Backend, BackendKind, DeviceInfo, DeviceKind};
use crate::{Error, Result};
use cudarc::driver::{result, sys};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

/// Runs `f`, turning a panic inside cudarc (it panics when a library or symbol is missing) into
/// `Error::Unavailable`, so no panic reaches the caller, nor its message the terminal.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    quietly(f).unwrap_or_else(|payload| Err(Error::Unavailable { backend: "cuda", reason: format!("{what}: {}", panic_message(payload)) }))
}

thread_local! {
    /// How many [`quietly`] calls this thread is inside.
    static QUIET: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `catch_unwind` that prints nothing for the panic it catches: cudarc panics on a library or
/// symbol that is missing (a damaged or foreign `libcublas`), which tandem reports as an error
/// of its own, so the panic hook's message and backtrace would only alarm. The first call
/// installs a hook that stays silent on a thread inside `quietly` and otherwise runs the hook
/// that was set before it; panics on other threads print as ever.
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(std::cell::Cell::get) == 0 {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(q.get() + 1));
    let caught = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(q.get() - 1));
    caught
}

/// The panic message of a caught panic.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
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
        let present = quietly(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
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

/// The visible device of the lowest compute capability, which decides the CUDA version of the
/// NVRTC and cuBLAS loaded (see `libs::wanted_majors`); `None` without a driver or a device.
/// Queried once, from the driver alone: no context is made and no library loaded.
pub(crate) fn lowest_capability() -> Option<libs::Lowest> {
    static LOWEST: OnceLock<Option<libs::Lowest>> = OnceLock::new();
    LOWEST
        .get_or_init(|| {
            let n = probe().ok()?;
            let each = (0..n).filter_map(|i| guarded("device query", || capability(i)).ok());
            each.min_by_key(|l| l.cc)
        })
        .clone()
}

/// Device `ordinal`'s name and compute capability.
fn capability(ordinal: usize) -> Result<libs::Lowest> {
    let label = format!("cuda:{ordinal}");
    let dev = result::device::get(ordinal as i32).map_err(|e| backend_error(&label, "cuDeviceGet", e))?;
    let name = result::device::get_name(dev).map_err(|e| backend_error(&label, "cuDeviceGetName", e))?;
    // SAFETY: `dev` is a valid device handle from cuDeviceGet; the attributes are plain integers.
    let attr = |a| unsafe { result::device::get_attribute(dev, a) }.map_err(|e| backend_error(&label, "cuDeviceGetAttribute", e));
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(libs::Lowest { device: format!("{label} ({})", name.trim()), cc: (major.max(0) as u32, minor.max(0) as u32) })
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
        return Err(Error::NoSuchDevice { spec: format!("cuda:{ordinal}"), available: format!("{n} CUDA device(s)") });
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

/// The file `"nvrtc"`, `"cublas"` or `"nccl"` is loaded from in this process (found as the
/// `libs` module describes, once per process), or why there is none: the error names every
/// file and directory tried.
pub fn library_file(name: &str) -> Result<std::path::PathBuf> {
    let lib = match name {
        "nvrtc" => &libs::NVRTC,
        "cublas" => &libs::CUBLAS,
        #[cfg(feature = "nccl")]
        "nccl" => &libs::NCCL,
        _ => return Err(Error::invalid("library_file", format!("no CUDA library {name:?} (nvrtc, cublas or nccl)"))),
    };
    libs::load(lib).map(|l| l.path).map_err(|reason| Error::Unavailable { backend: "cuda", reason })
}

/// The version and file of the cuBLAS library this process loads, as
/// `cuBLAS 13.1.0 (libcublas.so.13)`; needs no device.
pub fn cublas_version() -> Result<String> {
    blas::version().map_err(|reason| Error::Unavailable { backend: "cuda", reason })
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
        matmul: matmul_line(&blas::version()),
        libraries: libraries_line(&nvrtc_line(), &[], nccl_line().as_ref()),
    })
}

/// NVRTC's version and file, as `NVRTC 12.9 (libnvrtc.so.12)`, or why it is unavailable.
fn nvrtc_line() -> std::result::Result<String, String> {
    let loaded = libs::load(&libs::NVRTC)?;
    let (major, minor) = nvrtc_version().map_err(|e| e.to_string())?;
    Ok(format!("NVRTC {major}.{minor} ({})", loaded.file_name()))
}

/// NCCL's version when the `nccl` feature is built in.
fn nccl_line() -> Option<std::result::Result<String, String>> {
    #[cfg(feature = "nccl")]
    return Some(nccl_version().map(|v| format!("NCCL {v}")).map_err(|e| e.to_string()));
    #[cfg(not(feature = "nccl"))]
    None
}

/// The NCCL version this process loads (`2.21.5`), or why NCCL cannot be used. Probed once,
/// before any cudarc NCCL call.
#[cfg(feature = "nccl")]
pub fn nccl_version() -> Result<String> {
    static PROBE: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let probed = PROBE.get_or_init(|| {
        let loaded = libs::load(&libs::NCCL)?;
        // SAFETY: is_culib_present only dlopens the candidate names and closes them again.
        let present = quietly(|| unsafe { cudarc::nccl::sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err(format!("{} was loaded but cudarc cannot open it", loaded.path.display()));
        }
        match quietly(cudarc::nccl::result::get_nccl_version) {
            Ok(Ok(code)) => {
                // NCCL >= 2.9 encodes major*10000 + minor*100 + patch, older ones major*1000 + ...
                let (major, rest) = if code >= 10000 { (code / 10000, code % 10000) } else { (code / 1000, code % 1000) };
                Ok(format!("{major}.{}.{}", rest / 100, rest % 100))
            }
            Ok(Err(e)) => Err(format!("ncclGetVersion: {e:?}")),
            Err(panic) => Err(format!("ncclGetVersion: {}", panic_message(panic))),
        }
    });
    probed.clone().map_err(|reason| Error::Unavailable { backend: "nccl", reason })
}

/// [`DeviceInfo::matmul`] of a CUDA device: cuBLAS's version, or the tiled kernel and why.
pub(crate) fn matmul_line(blas: &std::result::Result<String, String>) -> String {
    match blas {
        Ok(version) => version.clone(),
        Err(why) => format!("tiled kernel kernels/matmul.cu, not cuBLAS ({why})"),
    }
}

/// [`DeviceInfo::libraries`] of a CUDA device: NVRTC, the images its kernels loaded as
/// (`PTX compute_90`, `cubin sm_52`; none before the device opens) and NCCL.
pub(crate) fn libraries_line(
    nvrtc: &std::result::Result<String, String>,
    images: &[String],
    nccl: Option<&std::result::Result<String, String>>,
) -> String {
    let mut parts = vec![match nvrtc {
        Ok(v) => v.clone(),
        Err(why) => format!("no NVRTC ({why})"),
    }];
    let mut images = images.to_vec();
    images.dedup();
    if !images.is_empty() {
        parts.push(format!("kernels as {}", images.join(" and ")));
    }
    match nccl {
        Some(Ok(v)) => parts.push(v.clone()),
        Some(Err(why)) => parts.push(format!("no NCCL ({why})")),
        None => {}
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::{libraries_line, matmul_line};

    #[test]
    fn device_info_names_the_matmul_path_and_the_libraries() {
        assert_eq!(matmul_line(&Ok("cuBLAS 13.1.0 (libcublas.so.13)".into())), "cuBLAS 13.1.0 (libcublas.so.13)");
        let fallback = matmul_line(&Err("libcublas not found: looked for libcublas.so.13, libcublas.so.12".into()));
        assert!(fallback.starts_with("tiled kernel") && fallback.contains("not cuBLAS") && fallback.contains("libcublas.so.13"), "{fallback}");
        let images = vec!["PTX compute_90".to_string(), "PTX compute_90".to_string()];
        let line = libraries_line(&Ok("NVRTC 12.9 (libnvrtc.so.12)".into()), &images, Some(&Ok("NCCL 2.23.4".into())));
        assert_eq!(line, "NVRTC 12.9 (libnvrtc.so.12); kernels as PTX compute_90; NCCL 2.23.4");
        let mixed = vec!["PTX compute_90".to_string(), "cubin sm_90".to_string()];
        let line = libraries_line(&Ok("NVRTC 13.0 (libnvrtc.so.13)".into()), &mixed, Some(&Err("libnccl not found".into())));
        assert_eq!(line, "NVRTC 13.0 (libnvrtc.so.13); kernels as PTX compute_90 and cubin sm_90; no NCCL (libnccl not found)");
        assert_eq!(libraries_line(&Err("libnvrtc not found".into()), &[], None), "no NVRTC (libnvrtc not found)");
    }
}
