//! Runtime compilation of the kernel families with NVRTC for one GPU architecture, cached on disk.
//!
//! A target is either `compute_XY` (PTX, which the driver finishes for the device) or `sm_XY`
//! (a CUBIN, which needs no driver JIT and so also loads on a driver older than this NVRTC).
//! Cache entries live in `$TANDEM_CACHE_DIR`, else `$XDG_CACHE_HOME/tandem/ptx`, else
//! `~/.cache/tandem/ptx`; each file holds a SHA-256 of its image, so a torn or corrupt entry is
//! detected and recompiled.
//!
//! A driver older than NVRTC rejects its PTX (a newer PTX ISA); the device then loads the CUBIN.
//! That rejection is remembered by a marker file in the cache, per NVRTC version, driver version
//! and architecture, so later processes load the cached CUBIN first instead of compiling PTX
//! that will be rejected again.
use super::kernels::translation_unit;
use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};
use std::ffi::{c_char, CString};
use std::path::PathBuf;

/// Options every family is compiled with: IEEE division and square root and no flushing of
/// subnormals, so results track the CPU reference; `-default-device` would hide a missing
/// `__global__`, so it is not used.
const OPTIONS: &[&str] = &["--prec-div=true", "--prec-sqrt=true", "--ftz=false", "--std=c++14"];

/// Keeps `a * b + c` a rounded product then a rounded sum, as the CPU reference computes it
/// (Rust never contracts the two into a fused multiply-add): NVRTC fuses them by default, which
/// changes the last bits of an Adam update, a layer norm or an attention row against the CPU.
/// The elementwise and reduction families are memory-bound, so the extra instruction hardly
/// costs there; the attention kernels pay it for agreeing with the CPU's attention.
const NO_FMAD: &str = "--fmad=false";

/// The families that keep NVRTC's fused multiply-adds: the tiled matmul, whose reference (the
/// `gemm` crate's kernels, and cuBLAS, which it stands in for) fuses its multiply-adds too, and
/// whose sums run in another order anyway.
const FUSED_FAMILIES: &[&str] = &["matmul"];

/// The options `family` is compiled with for `target` (`compute_XY` or `sm_XY`).
pub(crate) fn options(family: &str, target: &str) -> Vec<String> {
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    if !FUSED_FAMILIES.contains(&family) {
        options.push(NO_FMAD.to_string());
    }
    options.push(format!("--gpu-architecture={target}"));
    options
}

/// The product of one compilation: the image to load and NVRTC's log (warnings live there).
pub(crate) struct Compiled {
    pub image: Vec<u8>,
    pub log: String,
}

/// Why NVRTC cannot be used at all in this process; `None` when `libnvrtc` loads (found as
/// `libs.rs` describes).
pub(crate) fn unavailable() -> Option<String> {
    if let Err(why) = super::libs::load(&super::libs::NVRTC) {
        return Some(why);
    }
    // SAFETY: is_culib_present only dlopens candidate names and closes them again.
    let present = super::quietly(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    (!present).then(|| "libnvrtc was found but cudarc cannot open it".to_string())
}

/// NVRTC's version as `(major, minor)`; part of every cache key.
pub(crate) fn version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| format!("nvrtcVersion: {e:?}"))?;
    Ok((major, minor))
}

/// Compiles one family's source for `target` (`compute_XY` or `sm_XY`), without the cache.
pub(crate) fn compile(family: &str, source: &str, target: &str) -> Result<Compiled, String> {
    compile_with(family, source, target, &options(family, target))
}

/// Compiles with exactly `options`, which name the target too.
fn compile_with(family: &str, source: &str, target: &str, options: &[String]) -> Result<Compiled, String> {
    let unit = CString::new(translation_unit(source)).map_err(|_| format!("{family}.cu contains a NUL byte"))?;
    let name = CString::new(format!("{family}.cu")).map_err(|_| "bad family name".to_string())?;
    let prog = result::create_program(&unit, Some(&name)).map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    let guard = Program(prog);
    // SAFETY: `prog` is live until `guard` drops; `unit` and `name` outlive it.
    let compiled = unsafe { result::compile_program(guard.0, options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(guard.0) }.map(|l| c_text(&l)).unwrap_or_default();
    let log = without_arch_notice(&log);
    if let Err(e) = compiled {
        return Err(format!("{family}.cu for {target}: {e:?}\n{log}"));
    }
    let image = if target.starts_with("sm_") { cubin(guard.0) } else { ptx(guard.0) }
        .map_err(|e| format!("{family}.cu for {target}: reading the image: {e}"))?;
    Ok(Compiled { image, log })
}

/// Compiles through the disk cache: a valid cached image is returned as is.
pub(crate) fn compile_cached(family: &str, source: &str, target: &str) -> Result<Vec<u8>, String> {
    let path = cache_path(family, source, target)?;
    if let Some(image) = path.as_deref().and_then(read_entry) {
        return Ok(image);
    }
    let image = compile(family, source, target)?.image;
    if let Some(p) = path {
        // A cache that cannot be written only costs a recompile next time.
        if let Err(e) = write_entry(&p, &image) {
            tracing::debug!("kernel cache {}: {e}", p.display());
        }
    }
    Ok(image)
}

/// Deletes the cache entry of one family and target, after the driver rejected its image.
pub(crate) fn evict(family: &str, source: &str, target: &str) {
    if let Ok(Some(p)) = cache_path(family, source, target) {
        let _ = std::fs::remove_file(p);
    }
}

/// The targets to try for a device of compute capability `(major, minor)` under driver
/// `driver` (`cuDriverGetVersion`): PTX first, unless this driver rejected this NVRTC's PTX for
/// the architecture before.
pub(crate) fn targets(driver: i32, (major, minor): (i32, i32)) -> [String; 2] {
    let nvrtc = version().ok();
    let remembered = cache_dir().zip(nvrtc).is_some_and(|(dir, nvrtc)| marker(&dir, nvrtc, driver, major * 10 + minor).exists());
    ordered_targets(remembered, major * 10 + minor)
}

fn ordered_targets(ptx_rejected: bool, arch: i32) -> [String; 2] {
    let (ptx, cubin) = (format!("compute_{arch}"), format!("sm_{arch}"));
    if ptx_rejected {
        [cubin, ptx]
    } else {
        [ptx, cubin]
    }
}

/// Records that `driver` rejected this NVRTC's PTX for `target` (`compute_XY`).
pub(crate) fn remember_ptx_rejected(driver: i32, target: &str) {
    let (Some(dir), Ok(nvrtc)) = (cache_dir(), version()) else { return };
    let Some(arch) = target.strip_prefix("compute_").and_then(|a| a.parse().ok()) else { return };
    let path = marker(&dir, nvrtc, driver, arch);
    // A marker that cannot be written only costs a rejected PTX load next time.
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, b"")) {
        tracing::debug!("kernel cache marker {}: {e}", path.display());
    }
}

/// The marker file of a PTX rejection.
fn marker(dir: &std::path::Path, (major, minor): (i32, i32), driver: i32, arch: i32) -> PathBuf {
    dir.join(format!("ptx-rejected-nvrtc{major}.{minor}-driver{driver}-compute_{arch}"))
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by create_program and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn ptx(prog: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    // SAFETY: the program compiled successfully. The PTX keeps its trailing NUL, which
    // cuModuleLoadData needs to find the end of the text.
    let raw = unsafe { result::get_ptx(prog) }.map_err(|e| format!("{e:?}"))?;
    Ok(raw.into_iter().map(|c| c as u8).collect())
}

fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: the program compiled successfully for a real `sm_XY` target.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result().map_err(|e| format!("{e:?}"))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds exactly the size NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char) }.result().map_err(|e| format!("{e:?}"))?;
    Ok(image)
}

/// NVRTC 12.8+ warns that targets below compute_75 are deprecated, and offers no option to
/// silence it. Maxwell (the M60) is a deliberate target, so that one line is not a warning
/// about our code; every other line of the log is kept.
fn without_arch_notice(log: &str) -> String {
    log.lines().filter(|l| !(l.contains("Architectures prior to") && l.contains("are deprecated"))).collect::<Vec<_>>().join("\n")
}

fn c_text(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

fn cache_dir() -> Option<PathBuf> {
    crate::backend::cache::cache_dir("ptx")
}

/// `<family>-<target>-<hash>.bin`, the hash covering the source, the options and NVRTC's
/// version; `Ok(None)` when there is no cache directory.
fn cache_path(family: &str, source: &str, target: &str) -> Result<Option<PathBuf>, String> {
    let Some(dir) = cache_dir() else { return Ok(None) };
    let (major, minor) = version()?;
    let mut h = Sha256::new();
    h.update(translation_unit(source).as_bytes());
    h.update(options(family, target).join(" ").as_bytes());
    h.update(format!("nvrtc {major}.{minor} {target}").as_bytes());
    let hex: String = h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect();
    Ok(Some(dir.join(format!("{family}-{target}-{hex}.bin"))))
}

/// A cache entry larger than this is not a kernel family's image.
const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// The image in a cache file laid out as `sha256(image) ++ image`, if the checksum holds (and
/// the file is a regular one: never a link followed, nor a FIFO waited on).
fn read_entry(path: &std::path::Path) -> Option<Vec<u8>> {
    let data = crate::backend::cache::read_regular(path, MAX_ENTRY_BYTES).ok()??;
    if data.len() <= 32 {
        return None;
    }
    let (sum, image) = data.split_at(32);
    (Sha256::digest(image).as_slice() == sum).then(|| image.to_vec())
}

/// Writes atomically (a new temporary file and a rename), so readers never see half an entry.
fn write_entry(path: &std::path::Path, image: &[u8]) -> std::io::Result<()> {
    let mut data = Sha256::digest(image).to_vec();
    data.extend_from_slice(image);
    crate::backend::cache::write_atomic(path, &data).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::{compile, compile_with, marker, options, ordered_targets, read_entry, unavailable, write_entry};
    use crate::backend::cuda::kernels::KERNELS;

    #[test]
    fn every_family_but_matmul_is_compiled_without_fused_multiply_adds() {
        for (family, _) in KERNELS {
            let opts = options(family, "compute_90");
            assert_eq!(opts.iter().any(|o| o == "--fmad=false"), *family != "matmul", "{family}: {opts:?}");
            assert_eq!(opts.last().map(String::as_str), Some("--gpu-architecture=compute_90"), "{family}: {opts:?}");
            for ieee in ["--prec-div=true", "--prec-sqrt=true", "--ftz=false"] {
                assert!(opts.iter().any(|o| o == ieee), "{family}: {opts:?}");
            }
        }
    }

    /// Adam's moments are `beta * m + (1 - beta) * g`: NVRTC fuses those into `fma.rn.f32`
    /// unless told not to, which the same source compiled with `--fmad=true` shows. Needs
    /// NVRTC (skipped without it, failed without it when `CI=true`).
    #[test]
    fn the_optimizer_ptx_has_no_fused_multiply_add() {
        if let Some(why) = unavailable() {
            assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI=true but NVRTC is unavailable: {why}");
            println!("skipped: {why}");
            return;
        }
        let (_, source) = KERNELS.iter().find(|(f, _)| *f == "optim").unwrap();
        let text = |image: Vec<u8>| String::from_utf8_lossy(&image).into_owned();
        let ptx = text(compile("optim", source, "compute_90").unwrap().image);
        assert!(ptx.contains("adam_f32") && ptx.contains("mul.rn.f32"), "PTX of optim.cu:\n{ptx}");
        assert!(!ptx.contains("fma.rn"), "optim.cu fused a multiply-add:\n{ptx}");
        let fused: Vec<String> = options("optim", "compute_90").into_iter().map(|o| o.replace("--fmad=false", "--fmad=true")).collect();
        let ptx = text(compile_with("optim", source, "compute_90", &fused).unwrap().image);
        assert!(ptx.contains("fma.rn.f32"), "with --fmad=true NVRTC fuses optim.cu's multiply-adds:\n{ptx}");
    }

    #[test]
    fn a_ptx_rejection_is_remembered_per_nvrtc_driver_and_architecture() {
        let dir = std::env::temp_dir().join(format!("tandem-ptx-marker-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let remembered = |nvrtc, driver, arch| marker(&dir, nvrtc, driver, arch).exists();
        assert_eq!(ordered_targets(remembered((13, 0), 12080, 90), 90), ["compute_90", "sm_90"], "PTX first by default");
        std::fs::write(marker(&dir, (13, 0), 12080, 90), b"").unwrap();
        assert_eq!(ordered_targets(remembered((13, 0), 12080, 90), 90), ["sm_90", "compute_90"], "the cached CUBIN first");
        assert!(!remembered((13, 0), 13000, 90), "a newer driver tries PTX again");
        assert!(!remembered((12, 9), 12080, 90), "another NVRTC tries PTX again");
        assert!(!remembered((13, 0), 12080, 52), "another architecture tries PTX again");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cache_entries_round_trip_and_reject_corruption() {
        let dir = std::env::temp_dir().join(format!("tandem-ptx-cache-test-{}", std::process::id()));
        let path = dir.join("unary-compute_52-0.bin");
        write_entry(&path, b"// ptx text\0").unwrap();
        assert_eq!(read_entry(&path).as_deref(), Some(&b"// ptx text\0"[..]));
        let mut data = std::fs::read(&path).unwrap();
        *data.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &data).unwrap();
        assert_eq!(read_entry(&path), None, "a corrupt entry reads as a miss");
        std::fs::write(&path, b"short").unwrap();
        assert_eq!(read_entry(&path), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
