//! Tensors made without device memory: a model built under [`build_deferred`] holds every
//! tensor it made from host values (`from_vec`, `randn`, `zeros`, `ones`...) as a released
//! buffer whose values wait on the host, given to the device only when an op first reads it.
//!
//! Why: ZeRO-3 keeps only a shard of each parameter on a device, but a user's constructor
//! makes the whole model on the device it is given. Built deferred, a replica never holds
//! more than the parameter being sharded (PyTorch builds on its `meta` device and materialises
//! shard by shard for the same reason); anything the constructor made that no one shards
//! (buffers, constants) fills itself from its host values on first use, so the model works
//! unchanged. Values the constructor computes with ops on the device are made as usual.
use super::Tensor;
use crate::backend::{Buffer, Refill};
use crate::{DType, Device, Result, Shape};
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// The device whose host-made tensors this thread defers, inside `build_deferred`.
    static DEFERRED: RefCell<Option<Device>> = const { RefCell::new(None) };
}

/// Runs `build` (a model's constructor) with every tensor it makes on `device` from host values
/// deferred: released, its values kept on the host until an op reads it. Tensors it makes on
/// other devices, and those made by ops, are ordinary.
pub fn build_deferred<T>(device: &Device, build: impl FnOnce() -> T) -> T {
    struct Restore(Option<Device>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEFERRED.with(|d| *d.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(DEFERRED.with(|d| d.borrow_mut().replace(device.clone())));
    build()
}

/// The device whose host-made tensors this thread defers, inside [`build_deferred`].
pub(crate) fn deferring() -> Option<Device> {
    DEFERRED.with(|d| d.borrow().clone())
}

/// Sets the device whose host-made tensors this thread defers, returning the previous one.
pub(crate) fn replace_deferred(device: Option<Device>) -> Option<Device> {
    DEFERRED.with(|d| std::mem::replace(&mut *d.borrow_mut(), device))
}

/// What a deferred tensor's values are, on the host.
pub(super) enum HostValues {
    F32(Vec<f32>),
    Fill(f32),
}

/// Whether this thread defers the host-made tensors of `device` (inside `build_deferred`).
pub(crate) fn defers(device: &Device) -> bool {
    DEFERRED.with(|d| d.borrow().as_ref().is_some_and(|d| d.same(device)))
}

/// A tensor of `shape` on `device` in a released buffer whose first use fills it with
/// `values`.
pub(super) fn deferred(device: &Device, shape: Shape, values: HostValues) -> Result<Tensor> {
    let backend = device.backend();
    // One tensor's memory for a moment: the backends make buffers only through `alloc`.
    let buf = backend.alloc(shape.numel(), DType::F32)?;
    if !backend.release(&buf)? {
        // A backend that keeps memory it is asked to release: the values go in now.
        fill(device, &buf, &values)?;
        return Ok(Tensor::from_parts(buf, shape, device.clone(), None));
    }
    let dev = device.clone();
    let hook: Refill = Arc::new(move |buf: &Buffer| {
        dev.backend().restore(buf)?;
        fill(&dev, buf, &values)?;
        // Once filled the values are the device's; the host copy goes with the hook.
        buf.set_refill(None);
        Ok(())
    });
    buf.set_refill(Some(hook));
    Ok(Tensor::from_parts(buf, shape, device.clone(), None))
}

/// Drops the host values deferred tensor `t` waits on, for a tensor that is written whole
/// before anything reads it (a data-parallel replica's parameter, which replica 0's broadcast
/// overwrites): its first use only gives it its memory back. So a model built deferred on
/// several devices keeps one host copy of its parameters, not one per device. Does nothing to
/// a tensor that is not waiting on host values.
pub(crate) fn forget_host_values(t: &Tensor) {
    let buf = t.buffer();
    if !buf.has_refill() {
        return;
    }
    let dev = t.device().clone();
    let hook: Refill = Arc::new(move |buf: &Buffer| {
        dev.backend().restore(buf)?;
        buf.set_refill(None);
        Ok(())
    });
    buf.set_refill(Some(hook));
}

fn fill(device: &Device, buf: &Buffer, values: &HostValues) -> Result<()> {
    match values {
        HostValues::F32(v) => device.backend().write_at(buf, 0, bytemuck::cast_slice(v)),
        HostValues::Fill(x) => device.backend().fill(buf, *x),
    }
}
