//! Backend-qualified device names (`vulkan:N`, `gl:N`, `metal:N`, `dx12:N`): each names an
//! adapter of that wgpu backend or is an error, so that a missing driver cannot make a command
//! run on another backend's adapter; `tandem devices` shows both names.
#![cfg(feature = "wgpu")]
use tandem::{BackendKind, Device, Error};

/// The wgpu adapters' driver columns, which start with wgpu's backend name.
fn drivers() -> Vec<String> {
    Device::list().into_iter().filter(|i| i.backend == BackendKind::Wgpu).map(|i| i.driver).collect()
}

#[test]
fn qualified_names_open_that_backend_or_fail() {
    let drivers = drivers();
    for (name, prefix) in [("vulkan", "Vulkan"), ("gl", "Gl"), ("metal", "Metal"), ("dx12", "Dx12")] {
        let present = drivers.iter().filter(|d| d.starts_with(prefix)).count();
        for n in 0..present {
            let spec = format!("{name}:{n}");
            let dev = Device::parse(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert!(dev[0].info().driver.starts_with(prefix), "{spec} opened {} ({})", dev[0].spec(), dev[0].info().driver);
        }
        let missing = format!("{name}:{present}");
        match Device::parse(&missing) {
            Err(Error::NoSuchDevice { spec, available }) => {
                assert_eq!(spec, missing);
                assert!(drivers.is_empty() || available.contains(" = "), "the list names adapters both ways: {available}");
            }
            other => panic!("{missing} must be an error, got {other:?}"),
        }
    }
    // Backend names never fall back to another backend: on Linux there is no Metal adapter.
    if cfg!(target_os = "linux") {
        assert!(matches!(Device::parse("metal:0"), Err(Error::NoSuchDevice { .. })));
    }
    assert!(matches!(Device::parse("gl:first"), Err(Error::NoSuchDevice { .. })));
}

#[test]
fn devices_command_shows_both_names() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem")).arg("devices").output().expect("run tandem devices");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for (i, driver) in drivers().iter().enumerate() {
        let backend = driver.split_whitespace().next().unwrap_or_default().to_lowercase();
        assert!(text.contains(&format!("wgpu:{i} = {backend}:")), "wgpu:{i} ({driver}) without its {backend} name in:\n{text}");
    }
}

/// `tandem devices` and `Device::info()` say which matmul path each device takes: no device
/// may fall back to another kernel without a word.
#[test]
fn every_device_names_its_matmul_path() {
    let run = |kernels: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
            .arg("devices")
            .env("TANDEM_WGPU_KERNELS", kernels)
            .output()
            .expect("run tandem devices");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run("auto");
    let header = text.lines().next().unwrap_or_default();
    assert!(header.contains("MATMUL") && header.contains("LIBRARIES"), "{text}");
    let cpu = text.lines().find(|l| l.contains(" cpu ")).unwrap_or_else(|| panic!("no cpu line in:\n{text}"));
    assert!(cpu.contains("gemm crate"), "{cpu}");
    for info in Device::list() {
        assert!(!info.matmul.is_empty(), "{info:?}");
        if info.backend == BackendKind::Wgpu {
            let line = text
                .lines()
                .find(|l| l.contains(&format!("wgpu:{} ", info.ordinal)))
                .unwrap_or_else(|| panic!("no wgpu:{} in:\n{text}", info.ordinal));
            assert!(line.contains("WGSL") && line.contains("profile"), "{line}");
            let opened = Device::open(BackendKind::Wgpu, info.ordinal).unwrap();
            assert_eq!(opened.info().matmul, info.matmul, "the listed path is the one the device opens with");
        }
    }
    // Software adapters run the register-blocked kernels unless the hardware profile is forced.
    let software = Device::list()
        .into_iter()
        .find(|i| i.backend == BackendKind::Wgpu && matches!(i.kind, tandem::DeviceKind::Software | tandem::DeviceKind::Cpu));
    if let Some(i) = software {
        assert!(i.matmul.contains("register-blocked") && i.matmul.contains("software profile"), "{}", i.matmul);
        let forced = run("hardware");
        let line = forced.lines().find(|l| l.contains(&format!("wgpu:{} ", i.ordinal))).unwrap();
        assert!(line.contains("workgroup-tiled") && line.contains("hardware profile"), "{line}");
    }
}

/// `TANDEM_BACKENDS=cuda` gives a process that never enumerates the wgpu adapters (the GPU
/// check's CUDA-only step); a name that is no backend is an error naming it.
#[test]
fn the_backend_filter_leaves_out_the_wgpu_adapters() {
    let run = |filter: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
            .arg("devices")
            .env(tandem::BACKENDS_ENV, filter)
            .output()
            .expect("run tandem devices")
    };
    let out = run("cuda");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.lines().any(|l| l.contains("wgpu:")), "{text}");
    assert!(text.lines().any(|l| l.contains(" cpu ")), "the CPU reference stays: {text}");
    let out = run("cuda,vulkan");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("TANDEM_BACKENDS") && err.contains("\"vulkan\""), "{err}");
    if !drivers().is_empty() {
        let text = String::from_utf8_lossy(&run("wgpu").stdout).into_owned();
        assert!(text.contains("wgpu:0"), "{text}");
    }
}
