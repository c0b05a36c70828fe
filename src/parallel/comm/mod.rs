//! Collective communication between devices: the `Communicator` trait and its two algorithms.
//!
//! A collective acts on a group of devices with one tensor per device: the i-th tensor lives on
//! the i-th device of the group. Two implementations, picked by [`for_devices`]:
//!
//! - [`HostStaged`]: download, combine on the host in a fixed order, upload. Works for any mix
//!   of backends and vendors (wgpu has no peer-to-peer path) and is deterministic.
//! - [`PeerRing`]: ring algorithms built on [`Tensor::to`], which copies device to device where
//!   the backend has a peer path (CUDA) and stages through the host elsewhere.
//!
// `Nccl` exists only with the feature: linked there, named without it (docs.rs's build).
#![cfg_attr(feature = "nccl", doc = "- [`Nccl`] (cargo feature `nccl`): NVIDIA's NCCL on the devices' own streams, for groups of")]
#![cfg_attr(not(feature = "nccl"), doc = "- `Nccl` (cargo feature `nccl`): NVIDIA's NCCL on the devices' own streams, for groups of")]
//!   distinct CUDA GPUs; preferred by [`for_devices`] whenever it can be created.
//! - [`Hierarchical`]: this process's devices and those of the other processes of a
//!   [`crate::dist::Group`] (`mpirun`): host staging inside the process, MPI between processes.
//!
//! Collectives are not recorded by autograd: they move values, not history.
mod hierarchical;
mod host_staged;
#[cfg(feature = "nccl")]
pub mod nccl;
#[cfg(feature = "nccl")]
mod nccl_dist;
mod peer_ring;

pub use hierarchical::Hierarchical;
pub use host_staged::HostStaged;
#[cfg(feature = "nccl")]
pub use nccl::Nccl;
pub use peer_ring::PeerRing;

use crate::backend::BackendKind;
use crate::{DType, Device, Error, Result, Tensor};

/// How `all_reduce` and `reduce_scatter` combine the devices' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    /// The sum divided by the number of devices.
    Mean,
}

/// Collectives over a fixed group of devices. Object safe, shared by threads.
///
/// Costs are per device, for a tensor of `S` bytes on `n` devices; "traffic" counts bytes that
/// leave or enter a device.
pub trait Communicator: Send + Sync {
    /// A short name for reports and traces (`host-staged`, `peer-ring`).
    fn name(&self) -> &'static str;
    /// The group, in rank order.
    fn devices(&self) -> &[Device];
    /// Replaces every tensor, in place, with the elementwise reduction over all of them.
    fn all_reduce(&self, tensors: &[Tensor], op: ReduceKind) -> Result<()>;
    /// Overwrites every tensor, in place, with the values of `tensors[root]`.
    fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<()>;
    /// The concatenation along dim 0 of all tensors (which may differ in dim 0), on every device.
    fn all_gather(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>>;
    /// The reduction over all tensors, split along dim 0 into `n` near-equal row blocks
    /// (the first `rows % n` blocks get one extra row); device i receives block i.
    /// Needs at least `n` rows so that no device receives an empty block.
    fn reduce_scatter(&self, tensors: &[Tensor], op: ReduceKind) -> Result<Vec<Tensor>>;
    /// A copy of `src` on `dst` (point to point).
    fn send_recv(&self, src: &Tensor, dst: &Device) -> Result<Tensor>;
    /// Total bytes this communicator has moved between devices (host staging counts each
    /// download and each upload).
    fn bytes_moved(&self) -> u64;

    /// Where this process's devices sit among every device the collectives span, across
    /// processes: the global index of `devices()[0]`, and the number of devices in all.
    /// A communicator inside one process spans its own devices: `(0, devices().len())`.
    fn device_span(&self) -> (usize, usize) {
        (0, self.devices().len())
    }

    /// The process group the collectives span, for what moves more than tensors of one shape
    /// (named state); `None` inside one process.
    fn process_group(&self) -> Option<&crate::dist::Group> {
        None
    }

    /// The elementwise sum of equally long host vectors, each keyed by an index unique across
    /// processes, over the parts of every process: sorted by index and summed with
    /// [`tree_sum`], so the result depends on the parts alone, not on which process or device
    /// made each one. Across processes every rank must call it (the parts are gathered).
    fn sum_by_index(&self, mut parts: Vec<(usize, Vec<f32>)>) -> Result<Vec<f32>> {
        parts.sort_by_key(|p| p.0);
        tree_sum(parts.into_iter().map(|p| p.1).collect())
    }
}

pub(crate) use crate::shape::even_ranges;
// The rank-order sum is the process layer's: an MPI all-reduce sums with it too.
pub use crate::dist::tree_sum;

/// The best communicator for `devices`: with the `nccl` feature, `Nccl` when every device is
/// CUDA and NCCL can be set up (the library loads, one device per GPU); else `PeerRing` when
/// every device is CUDA and each has a peer path to its ring neighbour; else `HostStaged`.
pub fn for_devices(devices: &[Device]) -> Result<Box<dyn Communicator>> {
    if devices.is_empty() {
        return Err(Error::invalid("for_devices", "a communicator needs at least one device"));
    }
    let n = devices.len();
    let all_cuda = devices.iter().all(|d| d.info().backend == BackendKind::Cuda);
    let peers = (0..n).all(|i| {
        let next = &devices[(i + 1) % n];
        n == 1 || next.backend().has_peer_path(devices[i].backend())
    });
    #[cfg(feature = "nccl")]
    if all_cuda {
        match Nccl::new(devices) {
            Ok(c) => return Ok(Box::new(c)),
            Err(e) => tracing::info!("not using NCCL: {e}"),
        }
    }
    if all_cuda && peers {
        Ok(Box::new(PeerRing::new(devices)?))
    } else {
        Ok(Box::new(HostStaged::new(devices)?))
    }
}

/// Checks a group: one f32 tensor per device, each on its device, all with the same shape
/// when `same_shape` (all_gather allows dim 0 to differ).
fn check_group(op: &'static str, devices: &[Device], tensors: &[Tensor], same_shape: bool) -> Result<()> {
    if tensors.len() != devices.len() {
        return Err(Error::invalid(op, format!("{} tensors for a group of {} devices", tensors.len(), devices.len())));
    }
    for (i, (t, d)) in tensors.iter().zip(devices).enumerate() {
        t.expect_dtype(op, DType::F32)?;
        if !t.device().same(d) {
            let (a, b) = Device::names_of(t.device(), d);
            return Err(Error::DeviceMismatch { op, a: format!("tensor {i} on {a}"), b: format!("rank {i} is {b}") });
        }
        if t.numel() == 0 {
            return Err(Error::shape(op, format!("tensor {i} is empty ({:?})", t.shape())));
        }
        let first = tensors[0].dims();
        let ok = if same_shape { t.dims() == first } else { t.rank() == first.len() && t.dims()[1..] == first[1..] };
        if !ok {
            let shapes: Vec<_> = tensors.iter().map(|t| t.shape().clone()).collect();
            return Err(Error::shape(op, format!("tensors of shapes {shapes:?} cannot be combined")));
        }
    }
    Ok(())
}

fn check_root(op: &'static str, root: usize, n: usize) -> Result<()> {
    if root >= n {
        return Err(Error::invalid(op, format!("root {root} is outside the group of {n} devices")));
    }
    Ok(())
}

/// Applies `f` to every element index on its own scoped thread, returning results in order.
/// Each device's transfers wait on that device only, so they run side by side.
fn per_device<T: Send>(n: usize, f: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
    if n == 1 {
        return Ok(vec![f(0)?]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let f = &f;
                s.spawn(move || f(i))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join().unwrap_or_else(|p| Err(Error::panicked(p).in_worker("collective transfer thread", i, format!("group device {i}"))))
            })
            .collect()
    })
}
