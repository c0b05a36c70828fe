//! Per-device memory budgets: a cap, set at run time, on the bytes a device's live buffers hold.
//!
//! Every backend's allocator asks its [`Budget`] before it hands out a buffer, so an 8 GB
//! Tesla M60 can be played by a CPU or lavapipe device here, and a run that would not fit fails
//! at the allocation that passes the cap, with the same message on every backend. What counts
//! is the bytes of live buffers as the allocator rounds them (its size classes); freed buffers
//! an allocator keeps for reuse do not count, because it gives them back before refusing.
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// One device's budget; `u64::MAX` inside means none.
#[derive(Debug)]
pub(crate) struct Budget(AtomicU64);

impl Default for Budget {
    fn default() -> Self {
        Budget(AtomicU64::new(u64::MAX))
    }
}

impl Budget {
    pub(crate) fn new(bytes: Option<u64>) -> Self {
        let b = Budget::default();
        b.set(bytes);
        b
    }
    pub(crate) fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX)
    }
    pub(crate) fn set(&self, bytes: Option<u64>) {
        self.0.store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }
    /// Whether `bytes` more on top of `in_use` stays within the budget.
    pub(crate) fn allows(&self, in_use: u64, bytes: u64) -> bool {
        self.get().is_none_or(|b| in_use.saturating_add(bytes) <= b)
    }
    /// `Ok` when `bytes` more (as the allocator rounds them) on top of `in_use` stays within the
    /// budget; else the `OutOfMemory` every backend reports: the device, the bytes `asked` (as
    /// the caller asked them), what is free under the budget, the budget and the bytes in use.
    pub(crate) fn check(&self, device: &str, in_use: u64, bytes: u64, asked: u64) -> Result<()> {
        match self.get() {
            Some(budget) if in_use.saturating_add(bytes) > budget => Err(over_budget(device, asked, in_use, budget)),
            _ => Ok(()),
        }
    }
}

/// The `OutOfMemory` of a request for `asked` bytes refused by `budget` with `in_use` held.
pub(crate) fn over_budget(device: &str, asked: u64, in_use: u64, budget: u64) -> Error {
    Error::OutOfMemory {
        device: device.into(),
        requested: asked,
        free: budget.saturating_sub(in_use),
        detail: format!("the device's memory budget is {}, of which live tensors hold {}", format_bytes(budget), format_bytes(in_use)),
    }
}

/// `8 GiB`, `1.50 MiB`, `512 bytes`: binary units, exact where whole.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut unit = 0;
    let mut scale = 1024u64;
    while unit + 1 < UNITS.len() && n >= scale * 1024 {
        unit += 1;
        scale *= 1024;
    }
    if n.is_multiple_of(scale) {
        format!("{} {}", n / scale, UNITS[unit])
    } else {
        format!("{:.2} {}", n as f64 / scale as f64, UNITS[unit])
    }
}

/// Parses a size as a user types it: `8GiB`, `8 GiB`, `512MiB`, `1.5GiB`, `8GB` (decimal),
/// `4096` (bytes). Units are case-insensitive; `K`, `M`, `G`, `T` alone are binary, as in
/// PyTorch's and the kernel's habits.
pub fn parse_bytes(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let value: f64 = num.parse().map_err(|_| format!("{text:?} is not a size (such as 8GiB, 512MiB or 4096)"))?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)")),
    };
    let n = value * scale;
    if !n.is_finite() || n >= u64::MAX as f64 {
        return Err(format!("{text:?} is more bytes than can be counted"));
    }
    if n.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_and_parse() {
        assert_eq!(format_bytes(512), "512 bytes");
        assert_eq!(format_bytes(8 << 30), "8 GiB");
        assert_eq!(format_bytes(3 << 19), "1.50 MiB");
        for (text, n) in [("8GiB", 8u64 << 30), ("8 GiB", 8 << 30), ("512mib", 512 << 20), ("1.5G", 3 << 29), ("8GB", 8_000_000_000), ("4096", 4096)]
        {
            assert_eq!(parse_bytes(text), Ok(n), "{text}");
        }
        for bad in ["", "GiB", "8 parsecs", "1.3 bytes", "1e30", "-1"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_budget_refuses_past_its_cap_and_says_by_how_much() {
        let b = Budget::new(Some(1 << 20));
        assert!(b.check("cpu", 0, 1 << 20, 1 << 20).is_ok());
        let e = b.check("cpu", 1000, 1 << 20, 1 << 20).unwrap_err();
        let Error::OutOfMemory { ref device, requested, free, ref detail } = e else { panic!("{e}") };
        assert_eq!((device.as_str(), requested, free), ("cpu", 1 << 20, (1 << 20) - 1000));
        assert!(detail.contains("1 MiB") && detail.contains("1000 bytes"), "{e}");
        b.set(None);
        assert!(b.check("cpu", u64::MAX - 1, 1, 1).is_ok());
    }
}
