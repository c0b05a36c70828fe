//! The default step: one worker thread per device runs forward and backward on its shard
//! while a communication thread all-reduces gradient buckets as they complete; each device's
//! timeline is marked around backward and each bucket's all-reduce (see `timing.rs`).
use super::buckets::{self, FailGuard, Msg, Ready};
use super::gather::{Finished, GatherStats, Gathers, UnitOnDevice, Window};
use super::timing::{self, DeviceStamps, Stamp};
use super::{joined, Computed, Replica, StepEvent, StepWork};
use crate::autograd;
use crate::parallel::comm::Communicator;
use crate::parallel::split::Part;
use crate::parallel::trace::Phase;
use crate::{Error, Result};
use std::sync::mpsc::{channel, Sender};
use std::time::Instant;

/// What one worker measured.
struct WorkerOut {
    loss: f32,
    compute_s: f64,
    backward_end: Instant,
    /// The last micro-batch's backward on the device's timeline.
    backward: (Stamp, Stamp),
    /// ZeRO-3 unit by unit: the order ops needed the units in, what the gathers cost, and the
    /// device's waits for them on its timeline.
    gathered: Option<Finished>,
}

/// ZeRO-3 unit by unit (see `gather.rs`): each device's units, and the previous step's order.
pub(super) struct UnitGathers {
    pub units: Vec<Vec<UnitOnDevice>>,
    pub previous: Vec<usize>,
}

/// What `run` leaves besides the computation: the reduced buckets (`[bucket][device]`, each
/// device's block under `Plan::scatter`) and, gathering unit by unit, the order the units were
/// needed in and the gathers' cost.
pub(super) struct Exchange {
    pub reduced: Vec<Vec<crate::Tensor>>,
    pub gathered: Option<(Vec<usize>, Gathers)>,
}

/// Everything the workers share.
pub(super) struct Plan<'a> {
    pub work: StepWork<'a>,
    /// ZeRO-2/3: reduce-scatter each bucket over this many devices instead of all-reducing it,
    /// each device's block kept in this type ([`DataParallelConfig::grad_dtype`](super::DataParallelConfig::grad_dtype)).
    pub scatter: Option<(usize, crate::DType)>,
    /// ZeRO-3: release a bucket's parameters as soon as backward completes its gradients.
    pub release: bool,
}

/// Runs forward, backward and the bucketed all-reduce on every device (and with `gather`,
/// ZeRO-3's all-gathers unit by unit).
pub(super) fn run(
    replicas: &[Replica],
    shards: &[Vec<Part>],
    comm: &dyn Communicator,
    plan: &Plan,
    gather: Option<UnitGathers>,
) -> Result<(Computed, Exchange)> {
    let n = replicas.len();
    let (tx, rx) = channel::<Msg>();
    let (_, world) = comm.device_span();
    let ordered = world > n;
    let mut windows: Vec<Option<std::sync::Arc<Window>>> = match gather {
        Some(g) => g
            .units
            .into_iter()
            .enumerate()
            .map(|(i, units)| Some(Window::new(i, &replicas[i].device, units, tx.clone(), g.previous.clone())))
            .collect(),
        None => (0..n).map(|_| None).collect(),
    };
    let (workers, exchanged) = std::thread::scope(|s| {
        let comm_thread = s.spawn(move || buckets::exchange(comm, rx, plan.work.buckets.len(), n, plan.scatter, ordered));
        let handles: Vec<_> = replicas
            .iter()
            .zip(shards)
            .zip(windows.iter_mut())
            .enumerate()
            .map(|(i, ((r, shard), window))| {
                let tx = tx.clone();
                // Moved into the worker: a window holds a sender, and the exchange ends only
                // when every sender is gone.
                let window = window.take();
                s.spawn(move || {
                    let mut guard = FailGuard(Some((tx.clone(), i)));
                    let out = worker(i, r, shard, plan, tx, window);
                    if out.is_ok() {
                        guard.0 = None;
                    }
                    out
                })
            })
            .collect();
        // Only the workers' senders remain, so the exchange ends when the last worker does.
        drop(tx);
        let workers: Vec<Result<WorkerOut>> = handles.into_iter().zip(replicas).enumerate().map(|(i, (h, r))| joined(i, r, h.join())).collect();
        let comm_panicked = || Err(Error::Panicked("the data-parallel communication thread panicked".into()));
        (workers, comm_thread.join().unwrap_or_else(|_| comm_panicked()))
    });
    // A failed collective makes the workers fail to send; report the cause, not the symptom.
    let exchanged = exchanged?;
    if workers.iter().any(Result::is_err) {
        let errors: Vec<Error> = workers.into_iter().filter_map(Result::err).collect();
        let first = errors.iter().position(|e| !buckets::is_stopped(e)).unwrap_or(0);
        return Err(errors.into_iter().nth(first).unwrap_or_else(|| Error::Msg("data parallel: a worker failed".into())));
    }
    let workers = workers.into_iter().collect::<Result<Vec<_>>>()?;
    let reduced = exchanged
        .reduced
        .into_iter()
        .enumerate()
        .map(|(b, r)| r.ok_or_else(|| Error::Msg(format!("data parallel: bucket {b} was not reported by every device"))))
        .collect::<Result<Vec<_>>>()?;
    let mut events: Vec<StepEvent> = exchanged.launches.iter().map(|&(bucket, at, _)| StepEvent::BucketLaunched { bucket, at }).collect();
    events.extend(workers.iter().enumerate().map(|(device, w)| StepEvent::BackwardDone { device, at: w.backward_end }));
    events.sort_by_key(StepEvent::at);
    if let Some(tr) = plan.work.trace {
        for &(bucket, start, end) in &exchanged.launches {
            for r in replicas {
                tr.span(&r.comm_track(), &format!("all-reduce bucket {bucket}"), Phase::Comm, start, (end - start).as_secs_f64());
            }
        }
    }
    let stamps = workers
        .iter()
        .enumerate()
        .map(|(d, w)| {
            let buckets = exchanged.stamps.iter().map(|b| b.as_ref().map(|b| b[d])).collect::<Option<Vec<_>>>();
            let gather_waits = w.gathered.as_ref().map(|g| g.2.clone()).unwrap_or_default();
            buckets.map(|buckets| DeviceStamps { backward: w.backward, buckets, gather_waits })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Msg("data parallel: a bucket's all-reduce was not timed on every device".into()))?;
    let devices: Vec<crate::Device> = replicas.iter().map(|r| r.device.clone()).collect();
    let overlap = timing::measure(&devices, &stamps)?;
    let gathered = match workers.iter().map(|w| w.gathered.clone()).collect::<Option<Vec<_>>>() {
        Some(g) if !g.is_empty() => {
            let gather_s = exchanged.gathers.iter().map(|(_, s, e)| (*e - *s).as_secs_f64()).sum();
            if let Some(tr) = plan.work.trace {
                for &(unit, start, end) in &exchanged.gathers {
                    for r in replicas {
                        tr.span(&r.comm_track(), &format!("all-gather unit {unit}"), Phase::Comm, start, (end - start).as_secs_f64());
                    }
                }
            }
            let order = g[0].0.clone();
            // The waits on each device's own clock, where it keeps one.
            let per_device = g
                .into_iter()
                .enumerate()
                .map(|(d, (_, s, _))| GatherStats { waited_s: overlap.gather_wait_s[d], device_clock: overlap.device_clock[d], ..s })
                .collect();
            Some((order, Gathers { per_device, gather_s }))
        }
        _ => None,
    };
    let computed = Computed {
        // Summed in device order: the global mean, since each shard's loss carries its share.
        loss: workers.iter().map(|w| w.loss).sum(),
        compute_s: workers.iter().map(|w| w.compute_s).collect(),
        comm: exchanged.launches.iter().map(|&(_, s, e)| (s, e)).collect(),
        backward_end: workers.iter().map(|w| w.backward_end).max(),
        events,
        overlap: Some(overlap),
    };
    Ok((computed, Exchange { reduced, gathered }))
}

/// Forward + backward of every micro-batch of replica `i`'s shard; during the last
/// micro-batch's backward, each completed bucket is sent to the communication thread.
fn worker(i: usize, r: &Replica, micro: &[Part], plan: &Plan, tx: Sender<Msg>, window: Option<std::sync::Arc<Window>>) -> Result<WorkerOut> {
    let t0 = Instant::now();
    let _hooks = window.as_ref().map(|w| w.install());
    let _between = window.as_ref().map(|w| {
        let w = std::sync::Arc::clone(w);
        crate::tensor::between_ops(std::rc::Rc::new(move || w.settle()))
    });
    r.model.zero_grad();
    let mut pending: Vec<usize> = plan.work.buckets.iter().map(Vec::len).collect();
    let mut sent = vec![false; plan.work.buckets.len()];
    let mut loss = 0.0f32;
    let mut backward = None;
    for (j, part) in micro.iter().enumerate() {
        let last = j + 1 == micro.len();
        let tf = Instant::now();
        // Scaling by n_ij / N makes the sum over all devices and micro-batches the global mean.
        let scaled = plan.work.run.part_loss(&*r.model, &part.batch, part.first, plan.work.total, &r.device)?;
        loss += scaled.to_scalar()?;
        let tb = Instant::now();
        let start = if last { Some(Stamp::now(&r.device)?) } else { None };
        autograd::backward(&scaled, &mut |leaf| {
            let Some(&p) = r.index_of.get(&leaf.id()) else { return Ok(()) };
            if !last {
                return Ok(());
            }
            let b = plan.work.bucket_of[p];
            pending[b] -= 1;
            if pending[b] == 0 {
                sent[b] = true;
                let flat = buckets::pack(&r.params, &plan.work.buckets[b])?;
                if plan.scatter.is_some() {
                    // ZeRO-2/3 keeps only its block of the reduction: the full gradients go
                    // now, so that no more than the buckets in flight exist at once.
                    plan.work.buckets[b].iter().for_each(|&p| r.params[p].1.set_grad(None));
                }
                if plan.release {
                    // A leaf's gradient is complete once every node that reads it has run its
                    // backward, so nothing left in this backward reads these parameters.
                    match &window {
                        Some(w) => w.release(b)?,
                        None => plan.work.buckets[b].iter().try_for_each(|&p| r.params[p].1.release_storage().map(drop))?,
                    }
                }
                buckets::send(&tx, Msg::Ready(Ready { bucket: b, device: i, flat, ready: Stamp::now(&r.device)? }))?;
            }
            Ok(())
        })?;
        if let Some(start) = start {
            backward = Some((start, Stamp::now(&r.device)?));
        }
        if let Some(tr) = plan.work.trace {
            tr.span(&r.track, &format!("forward {j}"), Phase::Forward, tf, (tb - tf).as_secs_f64());
            tr.span(&r.track, &format!("backward {j}"), Phase::Backward, tb, tb.elapsed().as_secs_f64());
        }
    }
    r.device.sync()?;
    let backward_end = Instant::now();
    // Buckets whose parameters backward never reached (unused layers, an empty shard).
    for b in (0..plan.work.buckets.len()).filter(|&b| !sent[b]) {
        let flat = buckets::pack(&r.params, &plan.work.buckets[b])?;
        buckets::send(&tx, Msg::Ready(Ready { bucket: b, device: i, flat, ready: Stamp::now(&r.device)? }))?;
    }
    let gathered = window.as_ref().map(|w| w.finish()).transpose()?;
    // A device with no samples ran no backward: an empty one, when it was done.
    let backward = match backward {
        Some(b) => b,
        None => {
            let now = Stamp::now(&r.device)?;
            (now, now)
        }
    };
    Ok(WorkerOut { loss, compute_s: (backward_end - t0).as_secs_f64(), backward_end, backward, gathered })
}
