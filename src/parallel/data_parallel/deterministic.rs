//! Deterministic steps: losses and weights bit-for-bit identical whatever the device count.
//!
//! The global batch is cut into a fixed number of micro-shards that does not depend on the
//! devices. Each device computes whole micro-shards, each one's gradient separately, and
//! downloads it bucket by bucket as backward completes the buckets (each bucket's gradients
//! leave the device then). The host sums the micro-shard gradients (and scaled losses) with
//! [`crate::parallel::comm::tree_sum`] in a fixed tree over micro-shard index (gathering every
//! process's micro-shards first, under `mpirun`) and uploads the sum to every replica
//! that runs an update; under ZeRO-2/3 each device's pieces take their slices of it instead,
//! so no device ever holds the whole gradient.
//! So every floating-point operation, and its order, is the same on 1, 2 or 4 devices of one
//! backend. The price: no overlap of communication with backward, one full-gradient download
//! per micro-shard, and the host doing the additions.
//!
//! ZeRO-3 gathers unit by unit as in the overlapped step (`gather.rs`): in one process each
//! device on its own schedule ([`gather::serve`] reads the other devices' blocks), since
//! devices may compute different numbers of micro-shards; across processes, where every device
//! computes as many micro-shards (the caller's condition), with one all-gather per unit as in
//! the overlapped step. A gather copies values, so the results stay those of plain data
//! parallelism, bit for bit.
use super::buckets::{self, FailGuard, Msg};
use super::gather::{self, Gathers, Window};
use super::shard::Sharded;
use super::{joined, Computed, Replica, StepWork};
use crate::autograd::{self, no_grad};
use crate::parallel::comm::Communicator;
use crate::parallel::split::Part;
use crate::parallel::trace::Phase;
use crate::{Error, Result, Tensor};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Instant;

/// One micro-shard's result: its index, flat gradient (all parameters, state_dict order) and
/// scaled loss.
type ShardGrad = (usize, Vec<f32>, f32);

struct WorkerOut {
    grads: Vec<ShardGrad>,
    compute_s: f64,
    end: Instant,
    gathered: Option<gather::Finished>,
}

/// What a deterministic step works with.
pub(super) struct Plan<'a> {
    pub work: StepWork<'a>,
    /// Which replicas run an update (and so take the sum).
    pub updates: &'a [bool],
    /// ZeRO-2/3: the pieces take the sum (returned), not the replicas.
    pub sharded: Option<&'a Sharded>,
    /// ZeRO-3 unit by unit: each device's unit order of the previous step, what it
    /// prefetches.
    pub units: Option<Vec<Vec<usize>>>,
}

/// Each device's unit order, the gathers' cost and when each ran.
pub(super) type GatheredUnits = (Vec<Vec<usize>>, Gathers, Vec<(Instant, Instant)>);

/// What a deterministic step leaves.
pub(super) struct Outcome {
    pub computed: Computed,
    /// ZeRO-2/3: the summed gradient of every parameter (state_dict order), for the pieces.
    pub sum: Option<Vec<f32>>,
    /// ZeRO-3 unit by unit: each device's unit order, the gathers' cost and when each ran.
    pub gathered: Option<GatheredUnits>,
}

/// Computes every micro-shard (`shards[k]` are sample ranges of the batch; device i takes the
/// micro-shards `parts[i]`) and leaves the summed gradient on every replica that updates (the
/// others own no parameter and would not read it), or returns it for the pieces.
/// Across processes `comm` gathers every process's micro-shards before the sum.
pub(super) fn run(replicas: &[Replica], parts: &[Vec<Part>], comm: &dyn Communicator, plan: &Plan) -> Result<Outcome> {
    let offsets = offsets(&replicas[0].params);
    let offsets = &offsets[..];
    let (tx, rx) = channel();
    let server_for = plan.sharded.filter(|_| plan.units.is_some());
    let windows: Vec<Option<Arc<Window>>> = match (server_for, &plan.units) {
        (Some(s), Some(previous)) => replicas
            .iter()
            .enumerate()
            .map(|(i, r)| Some(Window::new(i, &r.device, s.units_on(i, r), tx.clone(), previous.get(i).cloned().unwrap_or_default())))
            .collect(),
        _ => replicas.iter().map(|_| None).collect(),
    };
    // A worker that stops early tells the gathering thread, which lets go of the others.
    let guards: Vec<Option<Sender<Msg>>> = windows.iter().map(|w| w.as_ref().map(|_| tx.clone())).collect();
    // Only the windows' and guards' senders remain: the gathering ends with the last worker.
    drop(tx);
    let n = replicas.len();
    // Across processes the devices gather together, one collective per unit in device 0's
    // order (every device runs as many micro-shards: the caller checked); in one process
    // each on its own.
    let collective = comm.device_span().1 > n;
    let (outs, served) = std::thread::scope(|s| {
        let server = server_for.map(|sh| {
            s.spawn(move || {
                if collective {
                    Ok(buckets::exchange(comm, rx, plan.work.buckets.len(), n, None, true)?.gathers)
                } else {
                    Ok(gather::serve(sh, replicas, rx))
                }
            })
        });
        let handles: Vec<_> = replicas
            .iter()
            .zip(parts)
            .zip(windows)
            .zip(guards)
            .enumerate()
            .map(|(i, (((r, ks), w), guard))| {
                s.spawn(move || {
                    let mut guard = FailGuard(guard.map(|tx| (tx, i)));
                    let out = worker(r, ks, plan, offsets, w);
                    if out.is_ok() {
                        guard.0 = None;
                    }
                    out
                })
            })
            .collect();
        let outs: Vec<Result<WorkerOut>> = handles.into_iter().zip(replicas).enumerate().map(|(i, (h, r))| joined(i, r, h.join())).collect();
        let served: Option<Result<Vec<_>>> =
            server.map(|h| h.join().unwrap_or_else(|_| Err(Error::Panicked("the data-parallel gather thread panicked".into()))));
        (outs, served.transpose())
    });
    // A failed collective makes the workers fail to gather; report the cause, not the symptom.
    let spans = served?.unwrap_or_default();
    let outs = outs.into_iter().collect::<Result<Vec<_>>>()?;
    let backward_end = outs.iter().map(|o| o.end).max();
    let compute_s = outs.iter().map(|o| o.compute_s).collect();
    let gathered = match outs.iter().map(|o| o.gathered.clone()).collect::<Option<Vec<_>>>() {
        Some(g) if !g.is_empty() => {
            let n = g.len() as f64;
            let (orders, per_device) = g.into_iter().map(|(order, stats, _)| (order, stats)).unzip();
            // In one process each device gathers for itself: the seconds per device, on average.
            let per = if collective { 1.0 } else { n };
            let gather_s = spans.iter().map(|(_, s, e)| (*e - *s).as_secs_f64()).sum::<f64>() / per;
            Some((orders, Gathers { per_device, gather_s }, spans.iter().map(|&(_, s, e)| (s, e)).collect()))
        }
        _ => None,
    };

    let t0 = Instant::now();
    // The loss rides as one more element: the tree sums every element on its own.
    let parts = outs
        .into_iter()
        .flat_map(|o| o.grads)
        .map(|(k, mut g, l)| {
            g.push(l);
            (k, g)
        })
        .collect();
    let mut sum = comm.sum_by_index(parts)?;
    let loss_sum = sum.pop().unwrap_or(0.0);
    let sum = if plan.sharded.is_some() {
        Some(sum)
    } else {
        std::thread::scope(|s| {
            let sum = &sum;
            let handles: Vec<_> = replicas.iter().zip(plan.updates).map(|(r, &u)| s.spawn(move || if u { upload(r, sum) } else { Ok(()) })).collect();
            let results: Vec<Result<()>> = handles.into_iter().zip(replicas).enumerate().map(|(i, (h, r))| joined(i, r, h.join())).collect();
            results.into_iter().collect::<Result<()>>()
        })?;
        None
    };
    let t1 = Instant::now();
    if let Some(tr) = plan.work.trace {
        for r in replicas {
            tr.span(&r.comm_track(), "host reduce", Phase::Comm, t0, (t1 - t0).as_secs_f64());
        }
    }
    let computed = Computed { loss: loss_sum, compute_s, comm: vec![(t0, t1)], backward_end, events: Vec::new(), overlap: None };
    Ok(Outcome { computed, sum, gathered })
}

/// Micro-shards `ks` on replica `r`, each gradient on its own, keyed by the shard's index.
fn worker(r: &Replica, ks: &[Part], plan: &Plan, offsets: &[usize], window: Option<Arc<Window>>) -> Result<WorkerOut> {
    let t0 = Instant::now();
    let _hooks = window.as_ref().map(|w| w.install());
    let _between = window.as_ref().map(|w| {
        let w = Arc::clone(w);
        crate::tensor::between_ops(std::rc::Rc::new(move || w.settle()))
    });
    let mut grads = Vec::with_capacity(ks.len());
    for part in ks {
        r.model.zero_grad();
        let tf = Instant::now();
        let scaled = plan.work.run.part_loss(&*r.model, &part.batch, part.first, plan.work.total, &r.device)?;
        let tb = Instant::now();
        let mut flat = vec![0.0f32; offsets[offsets.len() - 1]];
        let mut pending: Vec<usize> = plan.work.buckets.iter().map(Vec::len).collect();
        autograd::backward(&scaled, &mut |leaf| {
            let Some(&p) = r.index_of.get(&leaf.id()) else { return Ok(()) };
            let b = plan.work.bucket_of[p];
            pending[b] -= 1;
            if pending[b] == 0 {
                download(r, &plan.work.buckets[b], offsets, &mut flat)?;
                // Nothing left in this backward reads the bucket's parameters (see overlapped.rs).
                if let Some(w) = &window {
                    w.release(b)?;
                }
            }
            Ok(())
        })?;
        // Buckets backward did not complete (unused parameters): zeros where it reached none.
        for b in (0..plan.work.buckets.len()).filter(|&b| pending[b] > 0) {
            download(r, &plan.work.buckets[b], offsets, &mut flat)?;
        }
        grads.push((part.index, flat, scaled.to_scalar()?));
        if let Some(tr) = plan.work.trace {
            tr.span(&r.track, &format!("forward shard {}", part.index), Phase::Forward, tf, (tb - tf).as_secs_f64());
            tr.span(&r.track, &format!("backward shard {}", part.index), Phase::Backward, tb, tb.elapsed().as_secs_f64());
        }
    }
    let gathered = window.as_ref().map(|w| w.finish()).transpose()?;
    let end = Instant::now();
    Ok(WorkerOut { grads, compute_s: (end - t0).as_secs_f64(), end, gathered })
}

/// Where each parameter starts in the flat gradient, and its length at the end.
pub(super) fn offsets(params: &[(String, Tensor)]) -> Vec<usize> {
    let mut out = Vec::with_capacity(params.len() + 1);
    let mut at = 0;
    out.push(0);
    for (_, p) in params {
        at += p.numel();
        out.push(at);
    }
    out
}

/// Copies the gradients of a bucket's `members` into `flat` and drops them from the device.
fn download(r: &Replica, members: &[usize], offsets: &[usize], flat: &mut [f32]) -> Result<()> {
    for &p in members {
        let t = &r.params[p].1;
        if let Some(g) = t.grad() {
            flat[offsets[p]..offsets[p + 1]].copy_from_slice(&g.to_vec()?);
            t.set_grad(None);
        }
    }
    Ok(())
}

/// Sets every parameter's gradient on `r` from the host sum.
fn upload(r: &Replica, sum: &[f32]) -> Result<()> {
    let offsets = offsets(&r.params);
    for (p, (_, t)) in r.params.iter().enumerate() {
        t.set_grad(Some(Tensor::from_vec(sum[offsets[p]..offsets[p + 1]].to_vec(), t.shape().clone(), &r.device)?));
    }
    Ok(())
}

/// The squared norm of the host sum as plain deterministic mode takes it from replica `r`
/// holding it (uploaded, unscaled by `unscale`, squared and summed on `r`'s device), one
/// parameter at a time: the same bits without the whole gradient on the device.
pub(super) fn norm_sq(sum: &[f32], r: &Replica, unscale: Option<f32>) -> Result<f64> {
    let offsets = offsets(&r.params);
    crate::optim::grads_norm_sq(r.params.iter().enumerate().map(|(p, (_, t))| {
        let g = Tensor::from_vec(sum[offsets[p]..offsets[p + 1]].to_vec(), t.shape().clone(), &r.device)?;
        match unscale {
            Some(f) => no_grad(|| g.mul_scalar(f)),
            None => Ok(g),
        }
    }))
}
