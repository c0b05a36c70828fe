//! The update phase of a step: who updates each parameter, the optimizer threads, and the
//! copy of the owners' new values to the other replicas.
//!
//! Every replica holds the same reduced gradients. Replicas whose devices run the same kernels
//! (one backend, adapter and driver) therefore compute the same update bit for bit, and each
//! updates its own copy with no traffic. Devices of different kernel families round the same
//! update differently (the CPU's and WGSL's Adam differ in the last bit of sqrt and division),
//! so their replicas would drift apart; there every parameter gets one owner, which alone
//! updates it and holds its optimizer state, and the new values are broadcast from the owner.
//!
//! The owner is replica 0 for every parameter unless ZeRO-1 balances them. Measured on the seed
//! CNN (Adam, batch 64, deterministic mode, cpu,wgpu:0,wgpu:1, medians of 81 steps), a step
//! communicates for 1.0 ms with local updates, 1.5 ms with one owner and 6.0-6.4 ms with
//! balanced owners: the bytes are the same, but one owner's broadcast waits on one download
//! where balanced owners wait on one per device.
use super::{buckets, joined, Replica};
use crate::autograd::no_grad;
use crate::optim::Optimizer;
use crate::parallel::comm::Communicator;
use crate::optim::scale_grads;
use crate::parallel::trace::{Phase, Trace};
use crate::{Device, Result, Tensor};
use std::time::Instant;

/// Whether every device runs the same kernels: same backend, adapter name and driver. (The
/// driver string names wgpu's API, Vulkan or GL, and CUDA's compute capability, which is what
/// picks a kernel variant.)
pub(super) fn one_kernel_family(devices: &[Device]) -> bool {
    let key = |d: &Device| {
        let i = d.info();
        (i.backend, i.name.clone(), i.driver.clone())
    };
    devices.iter().all(|d| key(d) == key(&devices[0]))
}

/// Sets each replica's gradients from the reduced buckets (`[bucket][device]`, overlapped
/// mode; deterministic mode has set them already), all replicas at once.
pub(super) fn unpack(replicas: &[Replica], buckets: &[Vec<usize>], reduced: &[Vec<Tensor>]) -> Result<()> {
    each_replica(replicas, |i, r| {
        for (b, members) in buckets.iter().enumerate() {
            buckets::unpack(&r.params, members, &reduced[b][i])?;
        }
        Ok(())
    })
    .map(drop)
}

/// Runs `f` on every replica, each on its own thread; the first error by replica order.
fn each_replica<T: Send>(replicas: &[Replica], f: impl Fn(usize, &Replica) -> Result<T> + Sync) -> Result<Vec<T>> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = replicas.iter().enumerate().map(|(i, r)| s.spawn(move || f(i, r))).collect();
        let results: Vec<Result<T>> = handles.into_iter().zip(replicas).enumerate().map(|(i, (h, r))| joined(i, r, h.join())).collect();
        results.into_iter().collect()
    })
}

/// Multiplies every replica's gradients by the clipping `scale` (when there is one) and runs
/// its optimizer, all replicas at once; returns each one's seconds.
pub(super) fn apply(replicas: &[Replica], opts: &mut [Box<dyn Optimizer>], scale: Option<f32>, trace: Option<&Trace>) -> Result<Vec<f64>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = replicas
            .iter()
            .zip(opts.iter_mut())
            .map(|(r, opt)| {
                s.spawn(move || -> Result<f64> {
                    let t = Instant::now();
                    if let Some(scale) = scale {
                        scale_grads(&r.params, scale)?;
                    }
                    opt.step()?;
                    r.device.sync()?;
                    if let Some(tr) = trace {
                        tr.span(&r.track, "optimizer", Phase::Optimizer, t, t.elapsed().as_secs_f64());
                    }
                    Ok(t.elapsed().as_secs_f64())
                })
            })
            .collect();
        let results: Vec<Result<f64>> = handles.into_iter().zip(replicas).enumerate().map(|(i, (h, r))| joined(i, r, h.join())).collect();
        results.into_iter().collect()
    })
}

/// Overwrites every parameter on every replica with its owner's value: per owner, its
/// parameters go as one flat tensor in one broadcast, so a step costs one collective per
/// owning device, not one per parameter.
pub(super) fn share_owned(replicas: &[Replica], owners: &[usize], comm: &dyn Communicator) -> Result<()> {
    no_grad(|| {
        for owner in 0..replicas.len() {
            let mine: Vec<usize> = (0..owners.len()).filter(|&p| owners[p] == owner).collect();
            if mine.is_empty() {
                continue;
            }
            let numel: usize = mine.iter().map(|&p| replicas[owner].params[p].1.numel()).sum();
            let group = replicas
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    if i != owner {
                        return Tensor::zeros([numel], &r.device);
                    }
                    let parts = mine.iter().map(|&p| r.params[p].1.flatten_all()).collect::<Result<Vec<_>>>()?;
                    Tensor::cat(&parts, 0)
                })
                .collect::<Result<Vec<_>>>()?;
            comm.broadcast(&group, owner)?;
            for (i, (r, flat)) in replicas.iter().zip(&group).enumerate() {
                if i == owner {
                    continue;
                }
                let mut at = 0;
                for &p in &mine {
                    let t = &r.params[p].1;
                    t.assign(&flat.narrow(0, at, t.numel())?.reshape(t.shape().clone())?)?;
                    at += t.numel();
                }
            }
        }
        Ok(())
    })
}
