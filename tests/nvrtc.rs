//! Compiles every CUDA kernel family with NVRTC (no GPU needed) through the library's own path.
//!
//! Needs `libnvrtc.so.12` on the loader path, e.g.
//! `LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0] + "/lib")')`.
//! Without it the test prints why it is skipped, or fails when `CI=true`.
#![cfg(feature = "cuda")]

use tandem::backend::cuda::{compile_check, kernels::KERNELS, nvrtc_version};
use tandem::Error;

/// The oldest target (Tesla M60, Maxwell) and a current one (Hopper), as PTX and as the CUBIN
/// the backend falls back to when the driver is older than NVRTC.
const ARCHES: &[&str] = &["compute_52", "compute_90", "sm_52", "sm_90"];

#[test]
fn every_kernel_compiles_without_warnings() {
    let (major, minor) = match nvrtc_version() {
        Ok(v) => v,
        Err(Error::Unavailable { reason, .. }) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            assert!(!ci, "CI=true but NVRTC is unavailable: {reason}");
            println!("skipped: {reason}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    for arch in ARCHES {
        // CUDA 13 removed Maxwell; such machines need an NVRTC 12 to serve an M60.
        if major >= 13 && arch.ends_with("_52") {
            println!("{arch}: skipped: NVRTC {major}.{minor} no longer targets Maxwell");
            continue;
        }
        let lines = compile_check(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(lines.len(), KERNELS.len());
        for line in lines {
            println!("{line}");
        }
    }
}
