//! Deterministic steps: losses and weights bit-for-bit identical whatever the device count.
//!
//! The global batch is cut into a fixed number of micro-shards that does not depend on the
//! devices. Each device computes whole micro-shards, each one's gradient separately, and
//! downloads it. The host sums the micro-shard gradients (and scaled losses) with
//! [`crate::parallel::comm::tree_sum`] in a fixed tree over micro-shard index (gathering every
//! process's micro-shards first, under `mpirun`) and uploads the sum to every replica
//! that runs an update.
//! So every floating-point operation, and its order, is the same on 1, 2 or 4 devices of one
//! backend. The price: no overlap of communication with backward, one full-gradient download
//! per micro-shard and one upload per device, and the host doing the additions.
use super::{joined, Computed, Replica};
use crate::parallel::split::Part;
use crate::parallel::comm::Communicator;
use crate::parallel::step::StepCore;
use crate::parallel::trace::{Phase, Trace};
use crate::{Result, Tensor};
use std::time::Instant;

/// One micro-shard's result: its index, flat gradient (all parameters, state_dict order) and
/// scaled loss.
type ShardGrad = (usize, Vec<f32>, f32);

struct WorkerOut {
    grads: Vec<ShardGrad>,
    compute_s: f64,
    end: Instant,
}

/// Computes every micro-shard (`shards[k]` are sample ranges of `batch`; device i takes the
/// micro-shards `owned[i]`) and leaves the summed gradient on every replica that `updates`
/// (the others own no parameter and would not read it).
/// Across processes `comm` gathers every process's micro-shards before the sum.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(replicas: &[Replica], parts: &[Vec<Part>], total: usize, updates: &[bool], run: &StepCore, comm: &dyn Communicator, trace: Option<&Trace>) -> Result<Computed> {
    let outs = std::thread::scope(|s| {
        let handles: Vec<_> = replicas
            .iter()
            .zip(parts)
            .map(|(r, ks)| s.spawn(move || worker(r, ks, total, run, trace)))
            .collect();
        handles.into_iter().zip(replicas).enumerate().map(|(i, (h, r))| joined(i, r, h.join())).collect::<Vec<_>>()
    });
    let outs = outs.into_iter().collect::<Result<Vec<_>>>()?;
    let backward_end = outs.iter().map(|o| o.end).max();
    let compute_s = outs.iter().map(|o| o.compute_s).collect();

    let t0 = Instant::now();
    // The loss rides as one more element: the tree sums every element on its own.
    let parts = outs.into_iter().flat_map(|o| o.grads).map(|(k, mut g, l)| { g.push(l); (k, g) }).collect();
    let mut sum = comm.sum_by_index(parts)?;
    let loss_sum = sum.pop().unwrap_or(0.0);
    std::thread::scope(|s| {
        let sum = &sum;
        let handles: Vec<_> = replicas.iter().zip(updates).map(|(r, &u)| s.spawn(move || if u { upload(r, sum) } else { Ok(()) })).collect();
        let results: Vec<Result<()>> = handles.into_iter().zip(replicas).enumerate().map(|(i, (h, r))| joined(i, r, h.join())).collect();
        results.into_iter().collect::<Result<()>>()
    })?;
    let t1 = Instant::now();
    if let Some(tr) = trace {
        for r in replicas {
            tr.span(&r.comm_track(), "host reduce", Phase::Comm, t0, (t1 - t0).as_secs_f64());
        }
    }
    Ok(Computed { loss: loss_sum, compute_s, comm: vec![(t0, t1)], backward_end, events: Vec::new(), overlap: None })
}

/// Micro-shards `ks` on replica `r`, each gradient on its own, keyed by the shard's index.
fn worker(r: &Replica, ks: &[Part], total: usize, run: &StepCore, trace: Option<&Trace>) -> Result<WorkerOut> {
    let t0 = Instant::now();
    let mut grads = Vec::with_capacity(ks.len());
    for part in ks {
        r.model.zero_grad();
        let tf = Instant::now();
        let scaled = run.part_loss(&*r.model, &part.batch, part.first, total, &r.device)?;
        let tb = Instant::now();
        scaled.backward()?;
        let mut flat = Vec::new();
        for (_, p) in &r.params {
            match p.grad() {
                Some(g) => flat.extend(g.to_vec()?),
                None => flat.resize(flat.len() + p.numel(), 0.0),
            }
        }
        grads.push((part.index, flat, scaled.to_scalar()?));
        if let Some(tr) = trace {
            tr.span(&r.track, &format!("forward shard {}", part.index), Phase::Forward, tf, (tb - tf).as_secs_f64());
            tr.span(&r.track, &format!("backward shard {}", part.index), Phase::Backward, tb, tb.elapsed().as_secs_f64());
        }
    }
    let end = Instant::now();
    Ok(WorkerOut { grads, compute_s: (end - t0).as_secs_f64(), end })
}

/// Sets every parameter's gradient on `r` from the host sum.
fn upload(r: &Replica, sum: &[f32]) -> Result<()> {
    let mut at = 0;
    for (_, p) in &r.params {
        let g = Tensor::from_vec(sum[at..at + p.numel()].to_vec(), p.shape().clone(), &r.device)?;
        p.set_grad(Some(g));
        at += p.numel();
    }
    Ok(())
}
