//! The one way the device suites reach their devices (tests/common): `on_each_device` and
//! `on_every_device` run a check on every device under test, each device even when another
//! fails, and the failure names every device that failed; `device_families` gives one family
//! per backend under test.
mod common;

use std::sync::Mutex;
use tandem::{BackendKind, Error};

/// The panic message of `f`, which must panic.
fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let panic = std::panic::catch_unwind(f).expect_err("the check failed, so the run must fail");
    panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

#[test]
fn every_device_runs_and_each_failure_is_named() {
    let names: Vec<String> = common::every_device().iter().map(|d| d.to_string()).collect();
    let seen = Mutex::new(Vec::new());
    let msg = panic_message(|| {
        common::on_every_device(|dev| {
            seen.lock().unwrap().push(dev.to_string());
            if dev.info().backend == BackendKind::Cpu {
                panic!("a panic on {dev}");
            }
            Err(Error::invalid("check", format!("an error on {dev}")))
        })
    });
    assert_eq!(*seen.lock().unwrap(), names, "every device ran, in order, though the first failed");
    assert!(msg.contains(&format!("{} device(s) failed", names.len())), "{msg}");
    for name in &names {
        assert!(msg.contains(&format!("on {name} (")), "{name} is not named: {msg}");
    }
    assert!(msg.contains(&format!("panicked: a panic on {}", names[0])), "{msg}");
    assert!(names.len() < 2 || msg.contains(&format!("an error on {}", names[1])), "{msg}");
}

#[test]
fn on_each_device_leaves_out_the_reference_and_passes_it() {
    let want: Vec<String> = common::devices_under_test().iter().map(|d| d.to_string()).collect();
    let seen = Mutex::new(Vec::new());
    common::on_each_device(|dev, cpu| {
        assert_eq!(cpu.info().backend, BackendKind::Cpu);
        seen.lock().unwrap().push(dev.to_string());
        Ok(())
    });
    assert_eq!(*seen.lock().unwrap(), want);
}

#[test]
fn one_family_per_backend_under_test() {
    let mut backends = vec![BackendKind::Cpu];
    for dev in common::devices_under_test() {
        if !backends.contains(&dev.info().backend) {
            backends.push(dev.info().backend);
        }
    }
    let families = common::device_families(3);
    let got: Vec<BackendKind> = families.iter().map(|(_, devs)| devs[0].info().backend).collect();
    assert_eq!(got, backends);
    for (name, devs) in &families {
        assert_eq!(devs.len(), 3, "{name}");
        assert!(devs.iter().all(|d| d.info().backend == devs[0].info().backend && d.info().ordinal == devs[0].info().ordinal), "{name}");
    }
}
