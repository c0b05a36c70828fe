//! Marks on a wgpu device's own timeline (`Backend::mark`): timestamp queries written between
//! the recorded commands, resolved and read back together.
//!
//! A mark goes into the shared command encoder in order with the dispatches and copies, so its
//! time is when the device got there, not when the host recorded it: with commands recorded
//! ahead of the device, host clocks would count the device's backlog as the time of whatever
//! waited for it. Vulkan writes the timestamp at the bottom of the pipe, after the commands
//! before it have finished.
use super::context::Ctx;
use super::gate::{Gate, Held};
use crate::Result;
use std::sync::{Mutex, MutexGuard};

/// Marks one step may hold between reads; more return `None` and the caller falls back to
/// host clocks. A data-parallel step takes two per bucket and device, plus two.
const CAPACITY: u32 = 1024;

/// The query set and the buffer its values are resolved into.
pub(crate) struct Timestamps {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    /// Marks the set holds.
    capacity: u32,
    /// Marks recorded since the last read; held while recording so numbers follow stream order.
    count: Mutex<u32>,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    /// The adapter's gate: on GL the query set and buffer are GL objects, so they must drop
    /// under it like every other wgpu object of the device.
    gate: Gate,
    /// Holds the gate while the fields drop; declared last.
    held: Option<Held>,
}

/// The device features marks need: timestamps written by the encoder between passes.
pub(crate) const FEATURES: wgpu::Features = wgpu::Features::TIMESTAMP_QUERY.union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS);

fn lock(m: &Mutex<u32>) -> MutexGuard<'_, u32> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Timestamps {
    /// Marks for `device`, or `None` when it was opened without [`FEATURES`].
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue, gate: Gate) -> Option<Timestamps> {
        Timestamps::with_capacity(device, queue, gate, CAPACITY)
    }

    /// `new` with room for `capacity` marks between reads (autotuning's own clock).
    pub(crate) fn with_capacity(device: &wgpu::Device, queue: &wgpu::Queue, gate: Gate, capacity: u32) -> Option<Timestamps> {
        if !device.features().contains(FEATURES) {
            return None;
        }
        let set = device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("tandem marks"), ty: wgpu::QueryType::Timestamp, count: capacity });
        let resolved = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tandem resolved marks"),
            size: u64::from(capacity) * wgpu::QUERY_SIZE as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Some(Timestamps { set, resolved, capacity, count: Mutex::new(0), period_ns: f64::from(queue.get_timestamp_period()), gate, held: None })
    }

    /// Records the next mark after everything recorded on `ctx` so far; `None` when full.
    pub(crate) fn mark(&self, ctx: &Ctx) -> Option<u32> {
        let mut count = lock(&self.count);
        if *count >= self.capacity {
            return None;
        }
        let index = *count;
        ctx.encode(|e| e.write_timestamp(&self.set, index));
        *count += 1;
        Some(index)
    }

    /// Seconds on the device clock of every mark so far, by number; then starts numbering again.
    pub(crate) fn read(&self, ctx: &Ctx) -> Result<Vec<f64>> {
        let mut count = lock(&self.count);
        let n = *count;
        if n == 0 {
            return Ok(Vec::new());
        }
        ctx.encode(|e| e.resolve_query_set(&self.set, 0..n, &self.resolved, 0));
        let bytes = ctx.read(&self.resolved, 0, u64::from(n) * wgpu::QUERY_SIZE as u64)?;
        *count = 0;
        Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()) as f64 * self.period_ns * 1e-9).collect())
    }
}

impl Drop for Timestamps {
    fn drop(&mut self) {
        self.held = Some(self.gate.hold());
    }
}
