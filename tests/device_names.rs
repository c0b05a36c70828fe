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
