//! Opening `cpu` probes no GPU backend: no Vulkan, GL or CUDA library is loaded, and a CPU-only
//! run prints none of their warnings ("XDG_RUNTIME_DIR is invalid or not set", Mesa's).
//! Its own test binary: the in-process check must see a process where nothing else opened a
//! device.
mod common;
use tandem::{BackendKind, Device, Result, Tensor};

/// Driver libraries that enumerating wgpu adapters or CUDA devices loads into the process.
const DRIVER_LIBRARIES: [&str; 4] = ["libvulkan", "libEGL", "libGL", "libcuda."];

/// Opening the CPU under each of its names, and computing on it, maps no driver library.
#[cfg(target_os = "linux")]
#[test]
fn opening_cpu_loads_no_gpu_driver() -> Result<()> {
    let mut devices = Device::parse("cpu")?;
    devices.extend(Device::parse("cpu,cpu:0")?);
    devices.push(Device::open(BackendKind::Cpu, 0)?);
    devices.push(Device::cpu());
    for d in &devices {
        assert_eq!(Tensor::from_vec(vec![1.0, 2.0], [2], d)?.sum_all()?.to_scalar()?, 3.0);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps reads");
    for lib in DRIVER_LIBRARIES {
        let mut loaded: Vec<&str> = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|path| path.contains(lib)).collect();
        loaded.dedup();
        assert!(loaded.is_empty(), "opening cpu loaded {lib}: {loaded:?}");
    }
    Ok(())
}

/// `tandem train --devices cpu` with `XDG_RUNTIME_DIR` unset and the drivers' own logging
/// turned up (the Vulkan loader's and Mesa's EGL), so that any driver it loads would speak:
/// stderr stays silent.
#[test]
fn a_cpu_training_run_prints_no_driver_noise() {
    let out = common::tandem()
        .args(["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--steps", "1"])
        .env_remove("XDG_RUNTIME_DIR")
        .env("VK_LOADER_DEBUG", "all")
        .env("EGL_LOG_LEVEL", "debug")
        .env("LIBGL_DEBUG", "verbose")
        .output()
        .expect("tandem runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tandem train failed:\n{err}");
    for noise in ["XDG_RUNTIME_DIR", "Vulkan", "LAYER", "EGL", "MESA", "libGL"] {
        assert!(!err.contains(noise), "stderr of a CPU-only run mentions {noise}:\n{err}");
    }
}
