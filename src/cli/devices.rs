//! `tandem devices`: every device of every compiled backend as a table (with the matmul path
//! each takes and the libraries behind its kernels, or why a library is not used), the one
//! `auto` picks marked (or why `auto` fails), adapters refused for want of compute with the
//! reason, and a plain word about backends that are compiled in but found nothing (with the
//! driver's reason) or lack the platform's usual driver.
use super::ranks::Ranks;
use tandem::{BackendKind, Device, DeviceInfo, Result};

pub fn run(ranks: &Ranks) -> Result<()> {
    if ranks.many() {
        return per_rank(ranks);
    }
    let list = Device::list();
    // A device that is listed but cannot open (a CUDA GPU whose libraries are broken) fails
    // `auto`; the table still shows every device, and the line below it says why.
    let auto = Device::auto().map(|d| d.spec());
    // A TANDEM_BACKENDS that names no backend is the caller's mistake, not a device's: it ends
    // the command rather than being shown as why `auto` fails.
    if let Err(e @ tandem::Error::Invalid { .. }) = auto {
        return Err(e);
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            let mark = if auto.as_ref().is_ok_and(|a| spec(i) == *a) { "*" } else { "" };
            let libraries = if i.libraries.is_empty() { "-".to_string() } else { i.libraries.clone() };
            vec![
                mark.to_string(),
                i.spec_names(),
                i.backend.name().to_string(),
                i.name.clone(),
                format!("{:?}", i.kind).to_lowercase(),
                memory(i.memory),
                i.driver.clone(),
                i.matmul.clone(),
                libraries,
            ]
        })
        .collect();
    let header = ["", "SPEC", "BACKEND", "NAME", "KIND", "MEMORY", "DRIVER", "MATMUL", "LIBRARIES"];
    print_table(&header, &rows);
    match &auto {
        Ok(_) => out!("* = what --devices auto picks"),
        Err(e) => out!("--devices auto fails here: {e}"),
    }
    #[cfg(feature = "wgpu")]
    for r in tandem::backend::wgpu::refused() {
        out!("refused: {} ({}): {}", r.name, r.driver, r.reason);
    }
    for line in notes(&list) {
        out!("{line}");
    }
    Ok(())
}

/// Under mpirun: one line per rank (its place in the job, its machine, the devices it sees and
/// the one `auto` picks there), gathered and printed by rank 0 in rank order.
fn per_rank(ranks: &Ranks) -> Result<()> {
    let g = ranks.group();
    let seen: Vec<String> = Device::list().iter().map(|i| format!("{} ({})", spec(i), i.name)).collect();
    // The kernel's name for the machine; only for the reader, so a missing file is left out.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| format!(" on {}", h.trim())).unwrap_or_default();
    let line = format!(
        "rank {} of {} (local rank {} of {}{host}): auto = {}; devices: {}",
        g.rank(),
        g.size(),
        g.local_rank(),
        g.local_size(),
        Device::auto().map_or_else(|e| format!("none ({e})"), |d| d.spec()),
        seen.join(", ")
    );
    for bytes in tandem::train::ranks::gather_bytes(ranks.group(), line.as_bytes())? {
        if ranks.leader() {
            out!("{}", String::from_utf8_lossy(&bytes));
        }
    }
    Ok(())
}

/// The warning for a platform whose usual wgpu backend (`expected`, such as `vulkan` on Linux)
/// found no adapter while others did: a missing or broken driver, under which `wgpu:N` names
/// another backend's adapter than on a machine with that driver.
fn missing_backend(expected: &str, found: &[String]) -> Option<String> {
    if found.is_empty() || found.iter().any(|b| b == expected) {
        return None;
    }
    let others = found.join(", ");
    Some(format!(
        "warning: no {expected} adapter was found, only {others}: is the {expected} driver missing or broken? \
         wgpu:N now names a {others} adapter; name one as {expected}:N or {}:N to be sure which runs.",
        found[0]
    ))
}

/// The wgpu backend a platform's GPUs are normally reached through.
fn expected_backend() -> Option<&'static str> {
    if cfg!(target_os = "macos") || cfg!(target_os = "ios") {
        Some("metal")
    } else if cfg!(windows) {
        Some("dx12")
    } else if cfg!(unix) {
        Some("vulkan")
    } else {
        None
    }
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
        (true, false) => out.push(format!("CUDA support is compiled in, but no CUDA device was found: {}.", cuda_absent())),
        (false, _) => out.push("CUDA support is not compiled in (build with --features cuda).".to_string()),
        (true, true) => {}
    }
    match (cfg!(feature = "wgpu"), found(BackendKind::Wgpu)) {
        (true, false) => out.push("wgpu support is compiled in, but found no adapter (Vulkan, Metal, DX12 or GL).".to_string()),
        (false, _) => out.push("wgpu support is not compiled in (build with --features wgpu).".to_string()),
        (true, true) => {}
    }
    #[cfg(feature = "wgpu")]
    if let Some(expected) = expected_backend() {
        let mut found: Vec<String> = Vec::new();
        for i in list.iter().filter(|i| i.backend == BackendKind::Wgpu) {
            let b = tandem::backend::wgpu::qualified_spec(i.ordinal).and_then(|q| q.split(':').next().map(str::to_string));
            if let Some(b) = b.filter(|b| !found.contains(b)) {
                found.push(b);
            }
        }
        out.extend(missing_backend(expected, &found));
    }
    out
}

/// Why the CUDA backend lists no device: the driver's answer, or its absence.
fn cuda_absent() -> String {
    #[cfg(feature = "cuda")]
    return match tandem::backend::cuda::probe() {
        Ok(0) => "the driver reports none".into(),
        Ok(n) => format!("the driver reports {n}, and none could be described"),
        Err(tandem::Error::Unavailable { reason, .. }) => reason,
        Err(e) => e.to_string(),
    };
    #[cfg(not(feature = "cuda"))]
    String::new()
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
        out!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::missing_backend;

    #[test]
    fn warns_when_the_usual_backend_is_missing() {
        let v = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let w = missing_backend("vulkan", &v(&["gl"])).expect("a warning when only GL is found");
        assert!(w.contains("no vulkan adapter") && w.contains("vulkan:N or gl:N"), "{w}");
        assert_eq!(missing_backend("vulkan", &v(&["vulkan", "gl"])), None);
        assert_eq!(missing_backend("vulkan", &v(&[])), None, "no adapter at all has its own note");
    }
}
