//! The update phase of a step: who updates each parameter, and the copy of the owners' new
//! values to the other replicas (the optimizers step through `StepCore::update`).
//!
//! Every replica holds the same reduced gradients. Replicas whose devices run the same kernels
//! (one backend, adapter and driver) therefore compute the same update bit for bit, and each
//! updates its own copy with no traffic. Devices of different kernel families round the same
//! update differently (the CPU's and WGSL's Adam differ in the last bit of sqrt and division),
//! so their replicas would drift apart; there every parameter gets one owner, which alone
//! updates it and holds its optimizer state, and the new values are broadcast from the owner.
//!
//! The owner is replica 0 for every parameter unless ZeRO-1 balances them. Owners are global
//! device indices: across processes ZeRO-1 balances the state over every rank's devices, and
//! [`gather_owned`] all-gathers the updated parameters in one collective. On devices of
//! different kernel families one owner communicates less time than balanced owners though the
//! bytes are the same: one owner's broadcast waits on one download where balanced owners wait
//! on one per device (figures in benches/README.md).
use super::{buckets, joined, Replica};
use crate::autograd::no_grad;
use crate::parallel::comm::Communicator;
use crate::{Device, Error, Result, Tensor};

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

/// Across processes: every device's owned parameters (owners are global device indices),
/// flattened and ended by one pad value (a device may own nothing, and collectives refuse
/// empty tensors), go to every device in one all-gather; each then copies in the parameters
/// that others own. One collective per step, whatever the number of owners.
pub(super) fn gather_owned(replicas: &[Replica], owners: &[usize], comm: &dyn Communicator) -> Result<()> {
    let (first, world) = comm.device_span();
    let numel: Vec<usize> = replicas[0].params.iter().map(|p| p.1.numel()).collect();
    let mut at = vec![0; owners.len()];
    let mut offset = 0;
    for g in 0..world {
        for p in (0..owners.len()).filter(|&p| owners[p] == g) {
            at[p] = offset;
            offset += numel[p];
        }
        offset += 1;
    }
    no_grad(|| {
        let parts = replicas
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut parts =
                    (0..owners.len()).filter(|&p| owners[p] == first + i).map(|p| r.params[p].1.flatten_all()).collect::<Result<Vec<_>>>()?;
                parts.push(Tensor::zeros([1], &r.device)?);
                Tensor::cat(&parts, 0)
            })
            .collect::<Result<Vec<_>>>()?;
        let whole = comm.all_gather(&parts)?;
        for (i, (r, flat)) in replicas.iter().zip(&whole).enumerate() {
            if flat.numel() != offset {
                return Err(Error::shape(
                    "DataParallel::step",
                    format!("the gathered parameters hold {} values, not the {offset} the owners give", flat.numel()),
                ));
            }
            for (p, (_, t)) in r.params.iter().enumerate().filter(|(p, _)| owners[*p] != first + i) {
                t.assign(&flat.narrow(0, at[p], numel[p])?.reshape(t.shape().clone())?)?;
            }
        }
        Ok(())
    })
}

/// The optimizer state of every parameter, in `replica`'s parameter order, out of `all`
/// (every rank's owners' entries), on `replica`'s device.
pub(super) fn gathered_state(all: &[(String, Tensor)], replica: &Replica) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for (name, _) in &replica.params {
        let prefix = format!("{name}.");
        for (key, t) in all.iter().filter(|(k, _)| k.starts_with(&prefix)) {
            out.push((key.clone(), t.to(&replica.device)?));
        }
    }
    Ok(out)
}

/// ZeRO-1 ownership: parameters from largest to smallest, each to the device holding the
/// fewest bytes so far (lowest rank on ties), which balances state without splitting tensors.
pub(super) fn assign_owners(sizes: &[usize], devices: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; devices];
    let mut owner = vec![0; sizes.len()];
    for p in order {
        let d = (0..devices).min_by_key(|&d| (load[d], d)).unwrap_or(0);
        owner[p] = d;
        load[d] += sizes[p];
    }
    owner
}
