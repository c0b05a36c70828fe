//! `tandem devices`: every device of every compiled backend as a table, the one `auto` picks
//! marked, and a plain word about backends that are compiled in but found nothing.
use crate::{BackendKind, Device, DeviceInfo, Result};

pub fn run() -> Result<()> {
    let list = Device::list();
    let auto = Device::auto()?.spec();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            let spec = spec(i);
            let mark = if spec == auto { "*" } else { "" };
            vec![mark.to_string(), spec, i.backend.name().to_string(), i.name.clone(), format!("{:?}", i.kind).to_lowercase(), memory(i.memory), i.driver.clone()]
        })
        .collect();
    let header = ["", "SPEC", "BACKEND", "NAME", "KIND", "MEMORY", "DRIVER"];
    print_table(&header, &rows);
    println!("* = what --devices auto picks");
    for line in notes(&list) {
        println!("{line}");
    }
    Ok(())
}

/// The `--devices` spec of a listed device.
fn spec(i: &DeviceInfo) -> String {
    match i.backend {
        BackendKind::Cpu => "cpu".into(),
        b => format!("{}:{}", b.name(), i.ordinal),
    }
}

fn memory(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        None => "-".into(),
    }
}

/// Why a backend shows no device: not compiled in, or compiled in with nothing found.
fn notes(list: &[DeviceInfo]) -> Vec<String> {
    let found = |b: BackendKind| list.iter().any(|i| i.backend == b);
    let mut out = Vec::new();
    match (cfg!(feature = "cuda"), found(BackendKind::Cuda)) {
        (true, false) => out.push("CUDA support is compiled in, but no CUDA driver or device was found.".to_string()),
        (false, _) => out.push("CUDA support is not compiled in (build with --features cuda).".to_string()),
        (true, true) => {}
    }
    match (cfg!(feature = "wgpu"), found(BackendKind::Wgpu)) {
        (true, false) => out.push("wgpu support is compiled in, but found no adapter (Vulkan, Metal, DX12 or GL).".to_string()),
        (false, _) => out.push("wgpu support is not compiled in (build with --features wgpu).".to_string()),
        (true, true) => {}
    }
    out
}

/// Left-aligned columns two spaces apart.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}
