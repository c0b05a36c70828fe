//! `--memory-limit`: per-device memory budgets from the command line.
use tandem::backend::{format_bytes, parse_bytes};
use tandem::{Device, Error, Result};

/// A budget for every device (`8GiB`), or per device spec (`cpu=2GiB,wgpu:0=8GiB`).
#[derive(Debug, PartialEq)]
pub struct MemoryLimits(Vec<(Option<String>, u64)>);

const FLAG: &str = "--memory-limit";

impl MemoryLimits {
    /// Checks the flag's text before any device is opened.
    pub fn parse(text: &str) -> Result<MemoryLimits> {
        let bad = |d: String| Error::invalid(FLAG, d);
        if !text.contains('=') {
            return Ok(MemoryLimits(vec![(None, parse_bytes(text).map_err(bad)?)]));
        }
        let mut out: Vec<(Option<String>, u64)> = Vec::new();
        for part in text.split(',').map(str::trim) {
            let (spec, size) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?}: give SPEC=SIZE for each device (cpu=2GiB,wgpu:0=8GiB) or one SIZE for all")))?;
            let spec = spec.trim().to_string();
            if out.iter().any(|(s, _)| s.as_ref() == Some(&spec)) {
                return Err(bad(format!("{spec} is given twice")));
            }
            out.push((Some(spec), parse_bytes(size).map_err(bad)?));
        }
        Ok(MemoryLimits(out))
    }

    /// Sets each budget on the devices it names (by spec: every opened device answering to
    /// it). A spec none of `devices` answers to is an error when `devices` are all the run's
    /// (one process); under a launcher another rank may hold it.
    pub fn apply(&self, devices: &[Device], all_devices: bool) -> Result<()> {
        for (spec, bytes) in &self.0 {
            let mut hit = false;
            for d in devices.iter().filter(|d| spec.as_ref().is_none_or(|s| *s == d.spec())) {
                d.set_memory_budget(Some(*bytes));
                hit = true;
            }
            if let Some(spec) = spec.as_ref().filter(|_| !hit && all_devices) {
                let opened: Vec<String> = devices.iter().map(Device::spec).collect();
                return Err(Error::invalid(FLAG, format!("{spec}={} names no device of --devices ({})", format_bytes(*bytes), opened.join(","))));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_size_or_one_per_spec() {
        assert_eq!(MemoryLimits::parse("8GiB").unwrap(), MemoryLimits(vec![(None, 8 << 30)]));
        assert_eq!(
            MemoryLimits::parse("cpu=1MiB, wgpu:0=2MiB").unwrap(),
            MemoryLimits(vec![(Some("cpu".into()), 1 << 20), (Some("wgpu:0".into()), 2 << 20)])
        );
        for bad in ["", "lots", "cpu=1MiB,8GiB", "cpu=1MiB,cpu=2MiB", "cpu=big"] {
            let e = MemoryLimits::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--memory-limit"), "{bad}: {e}");
        }
    }
}
