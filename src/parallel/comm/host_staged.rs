//! `HostStaged`: collectives through host memory, for any mix of backends and vendors.
//!
//! Every collective downloads what it needs (one thread per device, so slow links overlap),
//! combines on the host with [`tree_sum`] in a fixed order over device index, and uploads.
//! The result is bit-for-bit the same whatever the timing. Per device, an all-reduce of `S`
//! bytes moves `S` down and `S` up (`2nS` in all), against the ring's `2(n-1)/n · S` each way,
//! and the host does the `(n-1)·S/4` additions alone: fine for a few devices and for links
//! that go through the host anyway (wgpu).
use super::{check_group, check_root, even_ranges, per_device, tree_sum, Communicator, ReduceKind};
use crate::autograd::no_grad;
use crate::{Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// Collectives staged through host memory; see the module docs for the cost.
pub struct HostStaged {
    devices: Vec<Device>,
    bytes: AtomicU64,
    /// Every device is a CPU: a transfer is a copy that waits on nothing, so transfers run one
    /// after the other on the caller's thread instead of on a thread per device (whose start
    /// and join cost more than the copy, and take cores from backward during an overlap).
    inline: bool,
}

impl HostStaged {
    pub fn new(devices: &[Device]) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::invalid("HostStaged", "a communicator needs at least one device"));
        }
        let inline = devices.iter().all(|d| d.info().backend == crate::BackendKind::Cpu);
        Ok(HostStaged { devices: devices.to_vec(), bytes: AtomicU64::new(0), inline })
    }

    /// `per_device`, or a plain loop where every device is a CPU.
    fn each<T: Send>(&self, n: usize, f: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
        if self.inline {
            (0..n).map(f).collect()
        } else {
            per_device(n, f)
        }
    }

    /// Every tensor's values, downloaded in parallel.
    fn download_all(&self, tensors: &[Tensor]) -> Result<Vec<Vec<f32>>> {
        let out = self.each(tensors.len(), |i| tensors[i].to_vec())?;
        self.count(out.iter().map(Vec::len).sum());
        Ok(out)
    }

    /// Uploads `data[i]` with `shape[i]` to device i, in parallel.
    fn upload_all(&self, data: &[Vec<f32>], shapes: &[Vec<usize>]) -> Result<Vec<Tensor>> {
        let out = self.each(self.devices.len(), |i| Tensor::from_vec(data[i].clone(), shapes[i].clone(), &self.devices[i]))?;
        self.count(data.iter().map(Vec::len).sum());
        Ok(out)
    }

    /// Writes `values` into every tensor in place (one upload each).
    fn write_all(&self, tensors: &[Tensor], values: Vec<f32>) -> Result<()> {
        let n = tensors.len();
        self.each(n, |i| {
            let src = Tensor::from_vec(values.clone(), tensors[i].shape().clone(), &self.devices[i])?;
            tensors[i].assign(&src)
        })?;
        self.count(n * values.len());
        Ok(())
    }

    fn count(&self, elements: usize) {
        self.bytes.fetch_add(4 * elements as u64, Ordering::Relaxed);
    }
}

/// `sum`, or the mean over `n` devices (also `Hierarchical`'s last step, over every process's).
pub(super) fn finish(mut sum: Vec<f32>, op: ReduceKind, n: usize) -> Vec<f32> {
    finish_in_place(&mut sum, op, n);
    sum
}

/// [`finish`] on a buffer the caller keeps.
pub(super) fn finish_in_place(sum: &mut [f32], op: ReduceKind, n: usize) {
    if op == ReduceKind::Mean {
        let n = n as f32;
        sum.iter_mut().for_each(|x| *x /= n);
    }
}

impl Communicator for HostStaged {
    fn name(&self) -> &'static str {
        "host-staged"
    }
    fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Cost: `S` down and `S` up per device; `(n-1)·S/4` host additions.
    fn all_reduce(&self, tensors: &[Tensor], op: ReduceKind) -> Result<()> {
        check_group("all_reduce", &self.devices, tensors, true)?;
        no_grad(|| {
            let sum = tree_sum(self.download_all(tensors)?)?;
            self.write_all(tensors, finish(sum, op, tensors.len()))
        })
    }

    /// Cost: `S` down from the root, `S` up to each other device.
    fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<()> {
        check_group("broadcast", &self.devices, tensors, true)?;
        check_root("broadcast", root, tensors.len())?;
        no_grad(|| {
            let values = tensors[root].to_vec()?;
            self.count(values.len());
            let n = tensors.len();
            self.each(n, |i| {
                if i == root {
                    return Ok(());
                }
                tensors[i].assign(&Tensor::from_vec(values.clone(), tensors[i].shape().clone(), &self.devices[i])?)
            })?;
            self.count((n - 1) * values.len());
            Ok(())
        })
    }

    /// Cost: each device's part down once, the whole result (`n` parts) up to each device.
    fn all_gather(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        check_group("all_gather", &self.devices, tensors, false)?;
        no_grad(|| {
            let parts = self.download_all(tensors)?;
            let mut shape = tensors[0].dims().to_vec();
            shape[0] = tensors.iter().map(|t| t.dims()[0]).sum();
            let whole = parts.concat();
            let n = tensors.len();
            self.upload_all(&vec![whole; n], &vec![shape; n])
        })
    }

    /// Cost: `S` down per device, `S/n` up to each.
    fn reduce_scatter(&self, tensors: &[Tensor], op: ReduceKind) -> Result<Vec<Tensor>> {
        check_group("reduce_scatter", &self.devices, tensors, true)?;
        let n = tensors.len();
        let dims = tensors[0].dims().to_vec();
        if dims[0] < n {
            return Err(Error::shape("reduce_scatter", format!("{dims:?} has fewer rows than the {n} devices")));
        }
        no_grad(|| {
            let sum = finish(tree_sum(self.download_all(tensors)?)?, op, n);
            let row = sum.len() / dims[0];
            let blocks = even_ranges(dims[0], n);
            let data: Vec<Vec<f32>> = blocks.iter().map(|r| sum[r.start * row..r.end * row].to_vec()).collect();
            let shapes: Vec<Vec<usize>> = blocks
                .iter()
                .map(|r| {
                    let mut s = dims.clone();
                    s[0] = r.len();
                    s
                })
                .collect();
            self.upload_all(&data, &shapes)
        })
    }

    /// Cost: `S` down and `S` up.
    fn send_recv(&self, src: &Tensor, dst: &Device) -> Result<Tensor> {
        let values = src.to_vec()?;
        self.count(2 * values.len());
        Tensor::from_vec(values, src.shape().clone(), dst)
    }

    fn bytes_moved(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}
