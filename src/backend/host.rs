//! Host memory whose size comes from user input (a shape, a flag, a file): allocated fallibly,
//! so that a request the machine cannot meet is `Error::OutOfMemory` naming the device, the
//! bytes asked and the bytes free, never an abort.
//!
//! "Free" is what the process can still get: the kernel's `MemAvailable` plus free swap, and
//! no more than the address space left under `ulimit -v` (`RLIMIT_AS`). A large request beyond
//! it is refused before the allocator is asked, because with overcommit the allocation itself
//! would succeed and the kernel's OOM killer would end the process once the pages are touched.
use crate::{Error, Result};

/// Requests at least this large are compared with the free memory first (reading `/proc`
/// costs microseconds; smaller requests only go through `try_reserve_exact`).
const CHECKED_BYTES: u64 = 16 << 20;

/// Bytes the process can still allocate on the host, when the system says (Linux).
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| meminfo.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
    let system = kib("MemAvailable:")?.saturating_add(kib("SwapFree:").unwrap_or(0)).saturating_mul(1024);
    Some(match address_space_left() {
        Some(left) => system.min(left),
        None => system,
    })
}

/// The address space left under the soft `RLIMIT_AS`, when one is set.
fn address_space_left() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let limit: u64 = limits.lines().find_map(|l| l.strip_prefix("Max address space")?.split_whitespace().next()?.parse().ok())?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used_kib: u64 = status.lines().find_map(|l| l.strip_prefix("VmSize:")?.trim().strip_suffix("kB")?.trim().parse().ok())?;
    Some(limit.saturating_sub(used_kib.saturating_mul(1024)))
}

/// The error for `requested` bytes on `device` that the host cannot give.
pub fn out_of_memory(device: &str, requested: u64, detail: impl Into<String>) -> Error {
    Error::OutOfMemory { device: device.into(), requested, free: available().unwrap_or(0), detail: detail.into() }
}

/// An empty vector with room for `len` values of `T`, for `what` on `device`; `OutOfMemory`
/// when the host cannot hold them.
pub fn try_vec<T>(len: usize, device: &str, what: &str) -> Result<Vec<T>> {
    let bytes = (len as u64).checked_mul(std::mem::size_of::<T>() as u64);
    let Some(bytes) = bytes.filter(|&b| b <= isize::MAX as u64) else {
        return Err(out_of_memory(device, u64::MAX, format!("{what}: {len} values overflow the address space")));
    };
    if bytes >= CHECKED_BYTES {
        if let Some(free) = available().filter(|&free| bytes > free) {
            return Err(Error::OutOfMemory { device: device.into(), requested: bytes, free, detail: format!("{what}: more than the host has free") });
        }
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| out_of_memory(device, bytes, format!("{what}: the host allocation failed")))?;
    Ok(v)
}

/// `len` copies of `value` (see [`try_vec`]).
pub fn try_filled<T: Clone>(len: usize, value: T, device: &str, what: &str) -> Result<Vec<T>> {
    let mut v = try_vec(len, device, what)?;
    v.resize(len, value);
    Ok(v)
}

/// The values of `iter`, exactly `len` of them expected (see [`try_vec`]).
pub fn try_collect<T>(len: usize, iter: impl IntoIterator<Item = T>, device: &str, what: &str) -> Result<Vec<T>> {
    let mut v = try_vec(len, device, what)?;
    v.extend(iter.into_iter().take(len));
    Ok(v)
}

/// `bytes` as words `T` (f32, i32, u32) in the host's byte order, copied into a fallible vector.
pub fn try_words<T: bytemuck::Pod>(bytes: &[u8], device: &str, what: &str) -> Result<Vec<T>> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v: Vec<T> = try_filled(n, T::zeroed(), device, what)?;
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(&bytes[..n * std::mem::size_of::<T>()]);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_past_the_address_space_is_out_of_memory() {
        let e = try_vec::<f32>(usize::MAX / 2, "cpu", "test").unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested: u64::MAX, .. }), "{e}");
    }

    #[test]
    fn a_request_past_the_free_memory_is_refused_before_allocating() {
        let Some(free) = available() else { return };
        let len = usize::try_from(free / 4 + (1 << 20)).unwrap_or(usize::MAX / 8);
        match try_vec::<f32>(len, "cpu", "test").unwrap_err() {
            Error::OutOfMemory { device, requested, free: f, .. } => {
                assert_eq!(device, "cpu");
                assert_eq!(requested, len as u64 * 4);
                assert!(f <= free + (64 << 20), "free {f} vs {free}");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn words_read_little_endian() {
        let v: Vec<f32> = try_words(&[0, 0, 128, 63, 0, 0, 0, 64], "cpu", "test").unwrap();
        assert_eq!(v, [1.0, 2.0]);
    }
}
