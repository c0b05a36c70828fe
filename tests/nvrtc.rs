//! Compiles every CUDA kernel family with NVRTC (no GPU needed) through the library's own path.
//!
//! Needs `libnvrtc.so.12` on the loader path, e.g.
//! `LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.dirname(nvidia.cuda_nvrtc.__file__))')/lib`.
//! Without it the test prints why it is skipped, or fails when `CI=true`.
#![cfg(feature = "cuda")]

use tandem::backend::cuda::compile_check;
use tandem::Error;

/// The oldest target (Tesla M60, Maxwell) and a current one (Hopper), as PTX and as the CUBIN
/// the backend falls back to when the driver is older than NVRTC.
const ARCHES: &[&str] = &["compute_52", "compute_90", "sm_52", "sm_90"];

#[test]
fn every_kernel_compiles_without_warnings() {
    for arch in ARCHES {
        match compile_check(arch) {
            Ok(lines) => {
                assert_eq!(lines.len(), tandem::backend::cuda::kernels::KERNELS.len());
                for line in lines {
                    println!("{line}");
                }
            }
            Err(Error::Unavailable { reason, .. }) => {
                let ci = std::env::var("CI").is_ok_and(|v| v == "true");
                assert!(!ci, "CI=true but NVRTC is unavailable: {reason}");
                println!("skipped: {reason}");
                return;
            }
            Err(e) => panic!("{arch}: {e}"),
        }
    }
}
