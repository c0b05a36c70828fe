//! Bind groups kept for reuse by later dispatches over the same buffer ranges.
use super::context::{Bind, SLOT};
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Mutex, MutexGuard};

/// Groups kept at most; past it the cache starts over (sub-range bindings can make many keys).
const KEPT: usize = 4096;

/// The layout and the bound buffer ranges. The parameters are bound at a dynamic offset into the
/// uniform ring, so they are not part of it.
type Key = (wgpu::BindGroupLayout, Vec<(wgpu::Buffer, u64, u64)>);

/// Creating a group is a large part of what a dispatch costs the host on lavapipe, and chains
/// of ops bind the same pooled buffers again and again, so groups are cached (the figures are
/// in benches/README.md). A cached group keeps its
/// buffers alive, so the pool empties the cache whenever it frees memory.
#[derive(Default)]
pub(crate) struct BindGroups(Mutex<HashMap<Key, wgpu::BindGroup>>);

impl BindGroups {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, wgpu::BindGroup>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The group binding `uniform` (parameters, dynamic offset) and `binds` under `layout`,
    /// created on first use.
    pub(crate) fn get(&self, device: &wgpu::Device, layout: &wgpu::BindGroupLayout, uniform: &wgpu::Buffer, binds: &[Bind]) -> wgpu::BindGroup {
        let key: Key = (layout.clone(), binds.iter().map(|b| (b.buf.clone(), b.offset, b.size)).collect());
        let mut groups = self.lock();
        if let Some(g) = groups.get(&key) {
            return g.clone();
        }
        let range = |buffer, offset, size| wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset, size: NonZeroU64::new(size) });
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: range(uniform, 0, SLOT) }];
        entries
            .extend(binds.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32 + 1, resource: range(b.buf, b.offset, b.size) }));
        let g = device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout, entries: &entries });
        if groups.len() >= KEPT {
            groups.clear();
        }
        groups.insert(key, g.clone());
        g
    }

    /// Drops every cached group, and with them the last references to freed buffers.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}
