//! Device memory: storage buffers in size classes, recycled through a per-device pool.
use super::bind_groups::BindGroups;
use super::gate::{Gate, Held};
use crate::backend::budget::Budget;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Freed buffers by size class, and the device's allocation statistics.
pub(crate) struct Pool {
    device: wgpu::Device,
    name: String,
    max_buffer: u64,
    budget: Budget,
    state: Mutex<State>,
    /// The device's cached bind groups, which keep their buffers alive: emptied with the pool.
    bind_groups: Arc<BindGroups>,
    /// The adapter's gate (see `gate.rs`), held around creating and dropping buffers.
    gate: Gate,
    /// Holds the gate while the fields (spare buffers, bind groups) drop; declared last.
    held: Option<Held>,
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
    /// Holds the gate while `raw` and `pool` drop (either may be the last reference); last.
    held: Option<Held>,
}

/// A buffer the backend hands out (`Backend::alloc`, `upload`): its memory, or none while
/// `Backend::release` has given it back (ZeRO-3 between uses of a parameter). Ops take a handle
/// to the memory for their own duration ([`Stored::raw`]); a released buffer's memory is in the
/// pool's free list, where the next allocation of its class takes it.
pub(crate) struct Stored {
    slot: Mutex<Option<WgpuBuffer>>,
    /// The buffer's size (its size class), asked for again on `restore`.
    bytes: u64,
    pub(crate) pool: Arc<Pool>,
}

impl Stored {
    pub(crate) fn new(buf: WgpuBuffer) -> Stored {
        Stored { pool: buf.pool.clone(), bytes: buf.raw.size(), slot: Mutex::new(Some(buf)) }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<WgpuBuffer>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A handle to the memory, `None` while released.
    pub(crate) fn raw(&self) -> Option<wgpu::Buffer> {
        self.slot().as_ref().map(|b| b.raw.clone())
    }

    /// Gives the memory back to the pool (queue order keeps work already recorded on it ahead of
    /// any later use of the memory); releasing a released buffer does nothing.
    pub(crate) fn release(&self) {
        let old = self.slot().take();
        drop(old);
    }

    /// Memory of the same size again, contents unspecified; nothing for a buffer that has it.
    pub(crate) fn restore(&self) -> Result<()> {
        let mut slot = self.slot();
        if slot.is_none() {
            *slot = Some(self.pool.alloc(self.bytes)?);
        }
        Ok(())
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        self.held = Some(self.pool.gate.hold());
        self.pool.release(self.raw.clone());
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.held = Some(self.gate.hold());
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
    pub(crate) fn new(device: wgpu::Device, name: String, max_buffer: u64, budget: Option<u64>, bind_groups: Arc<BindGroups>, gate: Gate) -> Self {
        Pool { device, name, max_buffer, budget: Budget::new(budget), state: Mutex::default(), bind_groups, gate, held: None }
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
        let _held = self.gate.hold();
        {
            let mut s = self.lock();
            if let Some(raw) = s.free.get_mut(&class).and_then(Vec::pop) {
                s.pooled -= class;
                s.in_use += class;
                s.peak = s.peak.max(s.in_use);
                return Ok(WgpuBuffer { raw, pool: self.clone(), held: None });
            }
            if !self.budget.allows(s.in_use + s.pooled, class) {
                // Pooled buffers of other classes are dropped before giving up.
                self.drop_spares(&mut s);
            }
            self.budget.check(&self.name, s.in_use, class, bytes)?;
        }
        let raw = self.create(class)?;
        let mut s = self.lock();
        s.in_use += class;
        s.peak = s.peak.max(s.in_use);
        Ok(WgpuBuffer { raw, pool: self.clone(), held: None })
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
            self.drop_spares(&mut self.lock());
            return Err(self.oom(size, 0, format!("the driver refused the allocation: {e}")));
        }
        Ok(raw)
    }

    /// Frees the pooled buffers, and the cached bind groups that would keep them alive.
    fn drop_spares(&self, s: &mut State) {
        s.free.clear();
        s.pooled = 0;
        self.bind_groups.clear();
    }

    fn release(&self, raw: wgpu::Buffer) {
        let class = raw.size();
        let mut s = self.lock();
        s.in_use = s.in_use.saturating_sub(class);
        s.pooled += class;
        s.free.entry(class).or_default().push(raw);
    }

    pub(crate) fn set_budget(&self, bytes: Option<u64>) {
        self.budget.set(bytes);
    }

    pub(crate) fn reset_peak(&self) {
        let mut s = self.lock();
        s.peak = s.in_use;
    }

    pub(crate) fn stats(&self) -> crate::MemoryStats {
        let s = self.lock();
        crate::MemoryStats { in_use: s.in_use, peak: s.peak, pooled: s.pooled, budget: self.budget.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    /// Cached bind groups hold their buffers: when the pool drops its spare buffers to stay in
    /// budget, the cache must go too, or the memory is not given back.
    #[test]
    fn freeing_pooled_memory_empties_the_bind_group_cache() {
        use super::super::bind_groups::BindGroups;
        use super::super::context::{Bind, SLOT};
        use std::sync::Arc;
        let Some((adapter, _, _)) = super::super::all().list.first() else {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but no wgpu adapter was found");
            eprintln!("skipping: no wgpu adapter");
            return;
        };
        let (device, _queue) = pollster::block_on(adapter.request_device(&Default::default())).expect("device");
        let groups = Arc::new(BindGroups::default());
        let pool = Arc::new(super::Pool::new(device.clone(), "test".into(), 1 << 30, Some(1 << 20), groups.clone(), Default::default()));
        let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: binding == 0, min_binding_size: None },
            count: None,
        };
        let entries = [entry(0, wgpu::BufferBindingType::Uniform), entry(1, wgpu::BufferBindingType::Storage { read_only: false })];
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries });
        let usage = wgpu::BufferUsages::UNIFORM;
        let uniform = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: SLOT, usage, mapped_at_creation: false });
        let a = pool.alloc(600_000).expect("first allocation");
        let _ = groups.get(&device, &layout, &uniform, &[Bind { buf: &a.raw, offset: 0, size: 600_000 }]);
        let _ = groups.get(&device, &layout, &uniform, &[Bind { buf: &a.raw, offset: 0, size: 600_000 }]);
        assert_eq!(groups.len(), 1, "the same ranges reuse one group");
        drop(a);
        // Another size class does not fit next to the pooled buffer: the pool frees it.
        let _b = pool.alloc(800_000).expect("second allocation");
        assert_eq!(groups.len(), 0, "the pool freed memory but the cache still holds its buffer");
    }

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
