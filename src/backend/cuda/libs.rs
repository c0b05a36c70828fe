//! Finding NVRTC, cuBLAS and NCCL of CUDA 12 or CUDA 13 by their versioned file names.
//!
//! cudarc opens libraries by bare names fixed when it was built (`libnvrtc.so`, `libnvrtc.so.12`,
//! ..., never `libnvrtc.so.13` nor `libnccl.so.2`, the names CUDA 13 and NCCL ship under). So
//! before cudarc's first call into a library, tandem looks for the file itself, in this order:
//!
//! 1. the directories of `TANDEM_CUDA_LIBS` (a `:`-separated list), then of `LD_LIBRARY_PATH`;
//! 2. `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT` (`lib64`, `lib`);
//! 3. the pip wheels' directories (`nvidia/cuda_nvrtc/lib`, `nvidia/cublas/lib`,
//!    `nvidia/nccl/lib`, `nvidia/cu13/lib`) in the `site-packages` of `$VIRTUAL_ENV`,
//!    `$CONDA_PREFIX`, `~/.local`, `/usr/local`, `/usr` and of every `python3` on `PATH`;
//! 4. `/usr/local/cuda/lib64` and the system library directories;
//! 5. the bare names, through the dynamic loader (`ld.so.cache`).
//!
//! Which CUDA versions of NVRTC and cuBLAS may serve is decided by the lowest compute capability
//! among the visible devices (queried from the driver before any library loads, no context
//! made; see [`wanted_majors`]). CUDA 13 dropped every architecture below 7.5 (its NVRTC cannot
//! compile `compute_52`, its cuBLAS has no Maxwell kernels), so with a device such as the Tesla
//! M60 (5.2) only CUDA 12's files are taken, and when only CUDA 13's are found the error names
//! the device, its capability and the CUDA 12 files and wheels to install. Otherwise the names
//! of the driver's CUDA major version come first (an NVRTC newer than the driver makes PTX it
//! rejects; cuBLAS 13 needs a CUDA 13 driver), then the newest. NCCL's one name
//! (`libnccl.so.2`) carries no CUDA version and is taken wherever it is found. The file
//! found is loaded with its companions (cuBLAS needs `libcublasLt` of the same version, which
//! the CUDA 13 wheel does not point to), then a stub of a few hundred bytes whose soname is the
//! name cudarc asks for first (`libnvrtc.so`) and which depends on that file: cudarc's
//! `dlopen` then gets the stub already loaded, and its symbol lookups resolve in the file found.
//! When nothing is found the error names every file and directory tried.
//!
//! cudarc's bindings are those of CUDA 12.8. The entry points tandem calls through them exist
//! with the same signatures in CUDA 13's libraries (NVRTC: program creation, compilation, log,
//! PTX and CUBIN, version; cuBLAS: `cublasCreate_v2`, `cublasSetStream_v2`,
//! `cublasSgemmStridedBatched`, `cublasGetVersion_v2`, `cublasDestroy_v2`; NCCL 2.x keeps its
//! ABI across CUDA versions).
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One library tandem loads for cudarc.
pub(crate) struct Lib {
    /// cudarc's name for it (`nvrtc` for `libnvrtc.so`).
    pub stem: &'static str,
    /// The versioned file names, newest first.
    pub names: &'static [&'static str],
    /// Whether the names end in the CUDA major version (`.so.13`, `.so.12`), which then follows
    /// [`wanted_majors`]; NCCL's (`.so.2`) is NCCL's own.
    by_cuda_major: bool,
    /// Libraries loaded first from the same directory, with the found name's version suffix.
    companions: &'static [&'static str],
    /// Where the pip wheels put it, below `site-packages`.
    wheel_dirs: &'static [&'static str],
    /// What to install when it is missing.
    advice: &'static str,
    /// What to install for a device CUDA 13 no longer supports.
    advice_12: &'static str,
    /// The entry points tandem calls through cudarc, which panics on a missing one: a file
    /// that lacks any is refused before cudarc sees it.
    symbols: &'static [&'static str],
}

pub(crate) const NVRTC: Lib = Lib {
    stem: "nvrtc",
    names: &["libnvrtc.so.13", "libnvrtc.so.12"],
    by_cuda_major: true,
    companions: &[],
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"],
    advice: "pip install nvidia-cuda-nvrtc (CUDA 13) or nvidia-cuda-nvrtc-cu12 (CUDA 12)",
    advice_12: "pip install nvidia-cuda-nvrtc-cu12, or a CUDA 12 toolkit",
    symbols: &[
        "nvrtcVersion",
        "nvrtcCreateProgram",
        "nvrtcCompileProgram",
        "nvrtcDestroyProgram",
        "nvrtcGetProgramLogSize",
        "nvrtcGetProgramLog",
        "nvrtcGetPTXSize",
        "nvrtcGetPTX",
        "nvrtcGetCUBINSize",
        "nvrtcGetCUBIN",
    ],
};

pub(crate) const CUBLAS: Lib = Lib {
    stem: "cublas",
    names: &["libcublas.so.13", "libcublas.so.12"],
    by_cuda_major: true,
    companions: &["libcublasLt"],
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cublas/lib"],
    advice: "pip install nvidia-cublas (CUDA 13) or nvidia-cublas-cu12 (CUDA 12)",
    advice_12: "pip install nvidia-cublas-cu12, or a CUDA 12 toolkit",
    symbols: &["cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSgemmStridedBatched", "cublasGetProperty"],
};

#[cfg(feature = "nccl")]
pub(crate) const NCCL: Lib = Lib {
    stem: "nccl",
    names: &["libnccl.so.2"],
    by_cuda_major: false,
    companions: &[],
    wheel_dirs: &["nvidia/nccl/lib", "nvidia/cu13/lib"],
    advice: "pip install nvidia-nccl-cu13 or nvidia-nccl-cu12, or the libnccl2 package",
    advice_12: "pip install nvidia-nccl-cu12",
    symbols: &["ncclGetVersion"],
};

/// A library found and loaded: the file, as the error messages and `tandem devices` name it.
#[derive(Clone, Debug)]
pub(crate) struct Loaded {
    pub path: PathBuf,
}

impl Loaded {
    /// The file name, such as `libcublas.so.13`.
    pub fn file_name(&self) -> String {
        self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// Finds and loads `lib` once per process; the error says what was tried.
pub(crate) fn load(lib: &'static Lib) -> Result<Loaded, String> {
    static NVRTC_LIB: OnceLock<Result<Loaded, String>> = OnceLock::new();
    static CUBLAS_LIB: OnceLock<Result<Loaded, String>> = OnceLock::new();
    #[cfg(feature = "nccl")]
    static NCCL_LIB: OnceLock<Result<Loaded, String>> = OnceLock::new();
    let cell = match lib.stem {
        "nvrtc" => &NVRTC_LIB,
        "cublas" => &CUBLAS_LIB,
        #[cfg(feature = "nccl")]
        "nccl" => &NCCL_LIB,
        other => unreachable!("no library {other}"),
    };
    cell.get_or_init(|| {
        let dirs = search_dirs(lib);
        let lowest = super::lowest_capability();
        let majors = wanted_majors(lowest.as_ref().map(|l| l.cc), driver_major());
        let files = find(lib, &dirs, &majors);
        let mut failures = Vec::new();
        for file in &files {
            match open(lib, file) {
                Ok(()) => return Ok(Loaded { path: file.clone() }),
                Err(e) => failures.push(format!("{}: {e}", file.display())),
            }
        }
        if let Some(device) = lowest.filter(|_| lib.by_cuda_major && !majors.contains(&13)) {
            let newer = existing(lib, &dirs, &[13]);
            if !newer.is_empty() {
                return Err(only_too_new(lib, &device, &newer, &failures));
            }
        }
        Err(not_found(lib, &dirs, &failures))
    })
    .clone()
}

/// The device of the lowest compute capability among those visible (the first of them on a
/// tie), which decides the CUDA version of NVRTC and cuBLAS.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Lowest {
    /// `cuda:N (name)`, as errors name it.
    pub device: String,
    /// The compute capability, `(5, 2)` for the Tesla M60.
    pub cc: (u32, u32),
}

/// The oldest compute capability CUDA 13's libraries support: it dropped Maxwell (5.x),
/// Pascal (6.x) and Volta (7.0, 7.2).
pub(crate) const CUDA_13_OLDEST: (u32, u32) = (7, 5);

/// The CUDA major versions whose NVRTC and cuBLAS may serve devices whose lowest compute
/// capability is `lowest_cc`, under a driver of CUDA major version `driver`, preferred first:
/// below 7.5 only CUDA 12 (CUDA 13 cannot compile for those devices nor run cuBLAS on them);
/// otherwise the driver's version first, then the newest. Without a device or a driver, the
/// newest first.
pub(crate) fn wanted_majors(lowest_cc: Option<(u32, u32)>, driver: Option<u32>) -> Vec<u32> {
    if lowest_cc.is_some_and(|cc| cc < CUDA_13_OLDEST) {
        return vec![12];
    }
    let mut majors = vec![13, 12];
    if let Some(driver) = driver {
        majors.sort_by_key(|&m| m != driver);
    }
    majors
}

/// The candidate files of `lib` that exist in `dirs`, of the CUDA versions `majors` in that
/// order, then its bare names of those versions for the dynamic loader to search.
pub(crate) fn find(lib: &Lib, dirs: &[PathBuf], majors: &[u32]) -> Vec<PathBuf> {
    let mut out = existing(lib, dirs, majors);
    out.extend(names(lib, majors).iter().map(PathBuf::from));
    out
}

/// The files of `lib` of the CUDA versions `majors` that exist in `dirs`, each once.
fn existing(lib: &Lib, dirs: &[PathBuf], majors: &[u32]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for name in names(lib, majors) {
        for dir in dirs {
            let p = dir.join(name);
            if p.is_file() {
                let p = std::fs::canonicalize(&p).unwrap_or(p);
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// The names of `lib` of the CUDA versions `majors`, in their order (all of NCCL's).
fn names(lib: &Lib, majors: &[u32]) -> Vec<&'static str> {
    if !lib.by_cuda_major {
        return lib.names.to_vec();
    }
    majors.iter().flat_map(|m| lib.names.iter().copied().filter(move |n| n.ends_with(&format!(".so.{m}")))).collect()
}

/// The error for a device CUDA 13 no longer supports where only CUDA 13's `lib` was found
/// (`newer`): the device, its capability, the files passed over and what to install.
fn only_too_new(lib: &Lib, lowest: &Lowest, newer: &[PathBuf], failures: &[String]) -> String {
    let (major, minor) = lowest.cc;
    let newer: Vec<String> = newer.iter().map(|p| p.display().to_string()).collect();
    let wanted = names(lib, &[12]).join(", ");
    format!(
        "lib{} of CUDA 12 not found, and {} has compute capability {major}.{minor}, below the {}.{} CUDA 13 supports, so \
         CUDA 13's {} cannot serve it; {}. Install CUDA 12's {wanted} ({}), or put the directory holding it on \
         TANDEM_CUDA_LIBS or LD_LIBRARY_PATH",
        lib.stem,
        lowest.device,
        CUDA_13_OLDEST.0,
        CUDA_13_OLDEST.1,
        newer.join(", "),
        failures.join("; "),
        lib.advice_12
    )
}

/// The error for a library not found: every name, every directory and every load failure.
pub(crate) fn not_found(lib: &Lib, dirs: &[PathBuf], failures: &[String]) -> String {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!(
        "lib{} not found: looked for {} in {} and through the dynamic loader; {}. Put the directory \
         holding one on TANDEM_CUDA_LIBS or LD_LIBRARY_PATH, or {}",
        lib.stem,
        lib.names.join(", "),
        if dirs.is_empty() { "no directory".to_string() } else { dirs.join(", ") },
        failures.join("; "),
        lib.advice
    )
}

/// The directories searched, in order, each once.
pub(crate) fn search_dirs(lib: &Lib) -> Vec<PathBuf> {
    let var = |name: &str| std::env::var_os(name).map(|v| std::env::split_paths(&v).collect::<Vec<_>>()).unwrap_or_default();
    let mut dirs: Vec<PathBuf> = var("TANDEM_CUDA_LIBS");
    dirs.extend(var("LD_LIBRARY_PATH"));
    for root in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"].iter().filter_map(std::env::var_os) {
        let root = PathBuf::from(root);
        dirs.extend([root.join("lib64"), root.join("lib")]);
    }
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"].iter().filter_map(std::env::var_os).map(PathBuf::from).collect();
    prefixes.extend(std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local")));
    prefixes.extend(var("PATH").into_iter().filter(|d| d.join("python3").is_file()).filter_map(|d| d.parent().map(Path::to_path_buf)));
    prefixes.extend([PathBuf::from("/usr/local"), PathBuf::from("/usr")]);
    for prefix in prefixes {
        for packages in site_packages(&prefix) {
            dirs.extend(lib.wheel_dirs.iter().map(|w| packages.join(w)));
        }
    }
    dirs.extend(
        ["/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
            .map(PathBuf::from),
    );
    let mut seen = Vec::new();
    dirs.retain(|d| {
        !d.as_os_str().is_empty() && !seen.contains(d) && {
            seen.push(d.clone());
            true
        }
    });
    dirs
}

/// `prefix/lib/python3*/{site,dist}-packages` that exist.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else { return Vec::new() };
    let mut pythons: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .flat_map(|e| [e.path().join("site-packages"), e.path().join("dist-packages")])
        .filter(|p| p.is_dir())
        .collect();
    pythons.sort();
    pythons
}

/// The CUDA major version of the installed driver, when there is one.
fn driver_major() -> Option<u32> {
    super::quietly(|| {
        // SAFETY: is_culib_present only dlopens candidate names; cuDriverGetVersion needs no
        // cuInit and writes one integer.
        unsafe {
            if !cudarc::driver::sys::is_culib_present() {
                return None;
            }
            let mut v = 0;
            (cudarc::driver::sys::cuDriverGetVersion(&mut v) == cudarc::driver::sys::CUresult::CUDA_SUCCESS && v > 0).then_some(v as u32 / 1000)
        }
    })
    .ok()
    .flatten()
}

/// Loads `file` (a path, or a bare name for the dynamic loader) with its companions, then the
/// stub cudarc will find under its own name. Loaded libraries stay loaded for the process.
fn open(lib: &Lib, file: &Path) -> Result<(), String> {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    for companion in lib.companions {
        let names = companion_names(companion, &name);
        let dir = file.parent().filter(|d| !d.as_os_str().is_empty());
        let beside = dir.and_then(|d| names.iter().map(|n| d.join(n)).find(|p| p.is_file()));
        let target = beside.unwrap_or_else(|| PathBuf::from(&names[1]));
        keep(&target, &[]).map_err(|e| format!("{}, which it needs: {e}", names[1]))?;
    }
    keep(file, lib.symbols)?;
    super::stub::install(&format!("lib{}.so", lib.stem), file)
}

/// The file names of `companion` for a library file `name`: of the same full version (a file
/// found through its `.so.13` link may be `.so.13.1.0.3`), then of the same major version.
fn companion_names(companion: &str, name: &str) -> [String; 2] {
    let version = name.split_once(".so").map(|(_, v)| v).unwrap_or_default();
    let major = version.split('.').take(2).collect::<Vec<_>>().join(".");
    [format!("{companion}.so{version}"), format!("{companion}.so{major}")]
}

/// `dlopen`s `file` for the rest of the process, when it holds every one of `symbols`;
/// otherwise closes it again and says which it lacks.
fn keep(file: &Path, symbols: &[&str]) -> Result<(), String> {
    // SAFETY: loading a library runs its initialisers; these are NVIDIA's CUDA libraries, which
    // cudarc would load the same way.
    let lib = unsafe { libloading::Library::new(file) }.map_err(|e| e.to_string())?;
    let missing = missing_symbols(&lib, symbols);
    if !missing.is_empty() {
        return Err(format!("it lacks {} of the entry points tandem calls ({}): a damaged or other library", missing.len(), missing.join(", ")));
    }
    std::mem::forget(lib);
    Ok(())
}

/// The names of `symbols` that `lib` does not define.
fn missing_symbols<'a>(lib: &libloading::Library, symbols: &[&'a str]) -> Vec<&'a str> {
    // SAFETY: the symbols are only looked up, never called or read.
    symbols.iter().copied().filter(|name| unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tandem-libs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn finds_the_versioned_names_cudarc_never_tries() {
        let dir = temp("found");
        for name in ["libnvrtc.so.13", "libcublas.so.13"] {
            std::fs::write(dir.join(name), b"not an ELF").unwrap();
        }
        let dirs = vec![PathBuf::from("/nonexistent/tandem"), dir.clone()];
        let nvrtc = find(&NVRTC, &dirs, &wanted_majors(None, None));
        assert_eq!(nvrtc[0], std::fs::canonicalize(dir.join("libnvrtc.so.13")).unwrap());
        assert_eq!(find(&CUBLAS, &dirs, &wanted_majors(None, Some(13)))[0], std::fs::canonicalize(dir.join("libcublas.so.13")).unwrap());
        // Both present: the driver's major version decides.
        std::fs::write(dir.join("libnvrtc.so.12"), b"not an ELF").unwrap();
        assert_eq!(find(&NVRTC, &dirs, &wanted_majors(None, Some(12)))[0].file_name().unwrap(), "libnvrtc.so.12");
        assert_eq!(find(&NVRTC, &dirs, &wanted_majors(None, Some(13)))[0].file_name().unwrap(), "libnvrtc.so.13");
        assert_eq!(find(&NVRTC, &dirs, &wanted_majors(None, None))[0].file_name().unwrap(), "libnvrtc.so.13", "newest first without a driver");
        #[cfg(feature = "nccl")]
        {
            std::fs::write(dir.join("libnccl.so.2"), b"not an ELF").unwrap();
            assert_eq!(find(&NCCL, &dirs, &wanted_majors(None, Some(12)))[0], std::fs::canonicalize(dir.join("libnccl.so.2")).unwrap());
            let m60 = find(&NCCL, &dirs, &wanted_majors(Some((5, 2)), Some(13)));
            assert_eq!(m60[0].file_name().unwrap(), "libnccl.so.2", "NCCL's name is no CUDA version");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_lowest_compute_capability_decides_the_cuda_version() {
        // Below 7.5 CUDA 13 can serve no device, whatever the driver.
        assert_eq!(wanted_majors(Some((5, 2)), Some(13)), [12], "an M60 under a CUDA 13 driver");
        assert_eq!(wanted_majors(Some((5, 2)), Some(12)), [12]);
        assert_eq!(wanted_majors(Some((5, 2)), None), [12]);
        assert_eq!(wanted_majors(Some((7, 0)), Some(13)), [12], "Volta");
        // From 7.5 on: the driver's version first, then the newest; as without a device.
        assert_eq!(wanted_majors(Some((7, 5)), Some(13)), [13, 12], "Turing");
        assert_eq!(wanted_majors(Some((9, 0)), Some(13)), [13, 12], "an H100 under a CUDA 13 driver");
        assert_eq!(wanted_majors(Some((9, 0)), Some(12)), [12, 13], "an H100 under a CUDA 12 driver");
        assert_eq!(wanted_majors(None, Some(13)), [13, 12]);
        assert_eq!(wanted_majors(None, Some(12)), [12, 13]);
        assert_eq!(wanted_majors(None, None), [13, 12]);
    }

    #[test]
    fn a_device_below_7_5_takes_only_cuda_12_files_and_names_what_to_install_without_them() {
        let dir = temp("maxwell");
        let dirs = vec![dir.clone()];
        for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libcublas.so.13", "libcublas.so.12"] {
            std::fs::write(dir.join(name), b"not an ELF").unwrap();
        }
        let m60 = wanted_majors(Some((5, 2)), Some(13));
        let h100 = wanted_majors(Some((9, 0)), Some(13));
        let file = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
        let canonical = |n: &str| std::fs::canonicalize(dir.join(n)).unwrap();
        assert_eq!(find(&NVRTC, &dirs, &m60), [canonical("libnvrtc.so.12"), PathBuf::from("libnvrtc.so.12")]);
        assert_eq!(find(&CUBLAS, &dirs, &m60), [canonical("libcublas.so.12"), PathBuf::from("libcublas.so.12")]);
        let h100_files: Vec<String> = find(&NVRTC, &dirs, &h100).iter().map(file).collect();
        assert_eq!(h100_files, ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so.12"]);
        // Only CUDA 13's: nothing of it is tried for the M60, and the error says why.
        std::fs::remove_file(dir.join("libnvrtc.so.12")).unwrap();
        assert_eq!(find(&NVRTC, &dirs, &m60), [PathBuf::from("libnvrtc.so.12")], "only the bare CUDA 12 name is left");
        let newer = existing(&NVRTC, &dirs, &[13]);
        assert_eq!(newer, [canonical("libnvrtc.so.13")]);
        let m60_device = Lowest { device: "cuda:1 (Tesla M60)".into(), cc: (5, 2) };
        let text = only_too_new(&NVRTC, &m60_device, &newer, &["libnvrtc.so.12: cannot open shared object file".into()]);
        for part in [
            "cuda:1 (Tesla M60)",
            "compute capability 5.2",
            "below the 7.5 CUDA 13 supports",
            &canonical("libnvrtc.so.13").display().to_string(),
            "libnvrtc.so.12: cannot open",
            "Install CUDA 12's libnvrtc.so.12",
            "nvidia-cuda-nvrtc-cu12",
            "TANDEM_CUDA_LIBS",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        let text = only_too_new(&CUBLAS, &m60_device, &existing(&CUBLAS, &dirs, &[13]), &[]);
        assert!(text.contains("libcublas.so.12") && text.contains("nvidia-cublas-cu12") && !text.contains("nvrtc"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_file_only_the_bare_names_remain_and_the_error_names_everything_tried() {
        let dir = temp("empty");
        let dirs = vec![dir.clone()];
        let files = find(&CUBLAS, &dirs, &wanted_majors(None, None));
        assert_eq!(files, vec![PathBuf::from("libcublas.so.13"), PathBuf::from("libcublas.so.12")]);
        let text = not_found(&CUBLAS, &dirs, &["libcublas.so.13: cannot open shared object file".into()]);
        for part in ["libcublas.so.13", "libcublas.so.12", &dir.display().to_string(), "dynamic loader", "TANDEM_CUDA_LIBS", "nvidia-cublas-cu12"] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_library_without_the_entry_points_tandem_calls_is_refused_naming_them() {
        // The C library stands in for a damaged libcublas: it loads, and lacks every symbol.
        let libc = Path::new("libc.so.6");
        let err = keep(libc, CUBLAS.symbols).expect_err("libc is no cuBLAS");
        assert!(err.contains("lacks 5 of the entry points") && err.contains("cublasCreate_v2, cublasDestroy_v2"), "{err}");
        keep(libc, &["malloc"]).expect("libc has malloc");
    }

    #[test]
    fn companions_match_the_version_of_the_file_found() {
        assert_eq!(companion_names("libcublasLt", "libcublas.so.13"), ["libcublasLt.so.13", "libcublasLt.so.13"]);
        assert_eq!(companion_names("libcublasLt", "libcublas.so.12.9.1.4"), ["libcublasLt.so.12.9.1.4", "libcublasLt.so.12"]);
    }

    #[test]
    fn search_dirs_start_with_tandem_cuda_libs_and_hold_the_wheel_dirs() {
        // Read-only use of the environment: TANDEM_CUDA_LIBS is unset in the test run unless the
        // caller sets it, in which case it must come first.
        let dirs = search_dirs(&NVRTC);
        if let Some(v) = std::env::var_os("TANDEM_CUDA_LIBS") {
            assert_eq!(Some(&dirs[0]), std::env::split_paths(&v).next().as_ref());
        }
        assert!(dirs.iter().any(|d| d == Path::new("/usr/local/cuda/lib64")));
        let mut seen = std::collections::HashSet::new();
        assert!(dirs.iter().all(|d| seen.insert(d)), "each directory once: {dirs:?}");
    }
}
