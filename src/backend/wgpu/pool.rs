//! Device memory: storage buffers in size classes, recycled through a per-device pool.
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Freed buffers by size class, and the device's allocation statistics.
pub(crate) struct Pool {
    device: wgpu::Device,
    name: String,
    max_buffer: u64,
    budget: Option<u64>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    in_use: u64,
    peak: u64,
    pooled: u64,
}

/// A storage buffer of the wgpu backend; dropping it returns the memory to its device's pool.
/// Commands run in queue order, so a recycled buffer is never written before earlier reads of
/// it have executed.
pub(crate) struct WgpuBuffer {
    pub(crate) raw: wgpu::Buffer,
    pub(crate) pool: Arc<Pool>,
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        self.pool.release(self.raw.clone());
    }
}

/// Rounds a request up to one of four classes per power of two (at most 25% waste), so that
/// freed buffers fit later requests of similar size.
fn size_class(bytes: u64) -> u64 {
    let bytes = bytes.max(4);
    if bytes <= 256 {
        return 256;
    }
    let top = 63 - (bytes - 1).leading_zeros();
    let quarter = 1u64 << (top - 2);
    bytes.div_ceil(quarter) * quarter
}

impl Pool {
    pub(crate) fn new(device: wgpu::Device, name: String, max_buffer: u64, budget: Option<u64>) -> Self {
        Pool { device, name, max_buffer, budget, state: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn oom(&self, requested: u64, free: u64, detail: String) -> Error {
        Error::OutOfMemory { device: self.name.clone(), requested, free, detail }
    }

    /// A buffer of at least `bytes` bytes (4 at minimum, so empty tensors have a binding).
    pub(crate) fn alloc(self: &Arc<Self>, bytes: u64) -> Result<WgpuBuffer> {
        let exact = bytes.max(4).div_ceil(4) * 4;
        if exact > self.max_buffer {
            return Err(self.oom(bytes, self.max_buffer, "larger than the adapter's max_buffer_size".into()));
        }
        let class = size_class(exact);
        let class = if class > self.max_buffer { exact } else { class };
        {
            let mut s = self.lock();
            if let Some(raw) = s.free.get_mut(&class).and_then(Vec::pop) {
                s.pooled -= class;
                s.in_use += class;
                s.peak = s.peak.max(s.in_use);
                return Ok(WgpuBuffer { raw, pool: self.clone() });
            }
            if let Some(budget) = self.budget {
                if s.in_use + s.pooled + class > budget {
                    // Pooled buffers of other classes are dropped before giving up.
                    s.free.clear();
                    s.pooled = 0;
                }
                if s.in_use + class > budget {
                    let free = budget.saturating_sub(s.in_use);
                    return Err(self.oom(bytes, free, format!("memory budget of {budget} bytes")));
                }
            }
        }
        let raw = self.create(class)?;
        let mut s = self.lock();
        s.in_use += class;
        s.peak = s.peak.max(s.in_use);
        Ok(WgpuBuffer { raw, pool: self.clone() })
    }

    fn create(&self, size: u64) -> Result<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let raw = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            // Dropping the pool's spare buffers lets the caller retry into their memory.
            let mut s = self.lock();
            s.free.clear();
            s.pooled = 0;
            return Err(self.oom(size, 0, format!("the driver refused the allocation: {e}")));
        }
        Ok(raw)
    }

    fn release(&self, raw: wgpu::Buffer) {
        let class = raw.size();
        let mut s = self.lock();
        s.in_use = s.in_use.saturating_sub(class);
        s.pooled += class;
        s.free.entry(class).or_default().push(raw);
    }

    pub(crate) fn stats(&self) -> crate::MemoryStats {
        let s = self.lock();
        crate::MemoryStats { in_use: s.in_use, peak: s.peak, pooled: s.pooled }
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1280);
        for b in [300u64, 4097, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let c = size_class(b);
            assert!(c >= b && c <= b + b / 4 + 4, "{b} -> {c}");
            assert_eq!(c % 4, 0);
        }
    }
}
