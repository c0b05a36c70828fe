//! Gradient buckets: which parameters are all-reduced together, and the exchange that
//! launches each bucket's all-reduce while the rest of backward is still running.
//!
//! Backward finishes the last layer's gradients first, so buckets are filled in reverse
//! parameter order (PyTorch DDP's rule). Each worker's autograd leaf hook counts down its
//! bucket; the moment a bucket is complete on one device, the worker packs its gradients into
//! one flat tensor and tells the communication thread. That thread all-reduces a bucket as soon
//! as every device has reported it, while backward continues on the workers. Under ZeRO-3 the
//! same thread runs the all-gathers of units the workers ask for (`gather.rs`).
use super::timing::Stamp;
use crate::autograd::no_grad;
use crate::parallel::comm::{Communicator, ReduceKind};
use crate::{DType, Error, Result, Tensor};
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

/// Groups parameters (given their sizes in bytes, in state_dict order) into buckets: taken in
/// reverse order, a bucket is closed before a parameter that would take it past `cap` bytes.
/// A parameter larger than `cap` therefore gets a bucket of its own; `cap` 0 gives one bucket
/// per parameter.
///
/// ```
/// use tandem::parallel::assign_buckets;
/// assert_eq!(assign_buckets(&[40, 4, 400, 8], 100), vec![vec![3], vec![2], vec![1, 0]]);
/// ```
pub fn assign_buckets(sizes: &[usize], cap: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let (mut cur, mut bytes) = (Vec::new(), 0usize);
    for p in (0..sizes.len()).rev() {
        if !cur.is_empty() && bytes + sizes[p] > cap {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        cur.push(p);
        bytes += sizes[p];
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The bucket of each parameter index.
pub(super) fn bucket_of(buckets: &[Vec<usize>], params: usize) -> Vec<usize> {
    let mut of = vec![0; params];
    for (b, members) in buckets.iter().enumerate() {
        for &p in members {
            of[p] = b;
        }
    }
    of
}

/// One bucket's gradients on one device, flattened and concatenated in bucket order.
pub(super) struct Ready {
    pub bucket: usize,
    pub device: usize,
    pub flat: Tensor,
    /// When the packed gradients were complete on the device.
    pub ready: Stamp,
}

/// Packs a bucket's gradients; a parameter backward never reached contributes zeros (so a
/// device with no samples, or an unused layer, still takes part in the all-reduce).
pub(super) fn pack(params: &[(String, Tensor)], members: &[usize]) -> Result<Tensor> {
    let parts = members
        .iter()
        .map(|&p| {
            let t = &params[p].1;
            match t.grad() {
                Some(g) => g.flatten_all(),
                None => Tensor::zeros([t.numel()], t.device()),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)
}

/// Sets each member's gradient from its slice of a reduced flat bucket.
pub(super) fn unpack(params: &[(String, Tensor)], members: &[usize], flat: &Tensor) -> Result<()> {
    let mut at = 0;
    for &p in members {
        let t = &params[p].1;
        let g = flat.narrow(0, at, t.numel())?.reshape(t.shape().clone())?;
        t.set_grad(Some(g));
        at += t.numel();
    }
    Ok(())
}

/// What a worker asks of the communication thread.
pub(super) enum Msg {
    /// A bucket's gradients, ready to be reduced.
    Ready(Ready),
    /// ZeRO-3: this device's block of a unit, to all-gather (see `gather.rs`).
    Gather(GatherAsk),
    /// The device's worker failed: it will ask for nothing more, so collectives still waiting
    /// for it never run, and the workers waiting for a gather must be let go.
    Failed(usize),
}

/// One device's part of a unit's all-gather; the whole unit comes back on `reply`.
pub(super) struct GatherAsk {
    pub unit: usize,
    pub device: usize,
    pub block: Tensor,
    pub reply: Sender<Result<Tensor>>,
}

impl Msg {
    fn device(&self) -> usize {
        match self {
            Msg::Ready(r) => r.device,
            Msg::Gather(g) => g.device,
            Msg::Failed(d) => *d,
        }
    }
    /// Which collective the message is a part of: the same on every device.
    fn key(&self) -> (bool, usize) {
        match self {
            Msg::Ready(r) => (false, r.bucket),
            Msg::Gather(g) => (true, g.unit),
            Msg::Failed(_) => (false, usize::MAX),
        }
    }
}

/// Tells the communication thread that its worker stopped early (an error or a panic), unless
/// disarmed: collectives that wait for it never run, and the workers waiting for one must go.
pub(super) struct FailGuard(pub Option<(Sender<Msg>, usize)>);

impl Drop for FailGuard {
    fn drop(&mut self) {
        if let Some((tx, d)) = self.0.take() {
            let _ = tx.send(Msg::Failed(d));
        }
    }
}

/// Hands a message to the communication thread; fails only when that thread has stopped.
pub(super) fn send(tx: &Sender<Msg>, msg: Msg) -> Result<()> {
    tx.send(msg).map_err(|_| stopped())
}

const STOPPED: &str = "data parallel: the communication thread stopped";

/// What a worker meets when the communication thread has gone (a failed collective, another
/// worker's failure): a symptom, whose cause is reported instead where there is one.
pub(super) fn stopped() -> Error {
    Error::Msg(STOPPED.into())
}

/// Whether `e` is [`stopped`] (inside any worker wrapping).
pub(super) fn is_stopped(e: &Error) -> bool {
    e.to_string().contains(STOPPED)
}

/// What the communication thread did: each bucket's reduced flat tensors (indexed
/// `[bucket][device]`; `None` when a worker failed before reporting it), and when each
/// all-reduce started and ended on the host, and on each device's timeline (`[bucket][device]`)
/// when the bucket was ready there and when its reduced values were back; and the host spans
/// of the ZeRO-3 all-gathers.
pub(super) struct Exchanged {
    pub reduced: Vec<Option<Vec<Tensor>>>,
    pub launches: Vec<(usize, Instant, Instant)>,
    pub stamps: Vec<Option<Vec<(Stamp, Stamp)>>>,
    pub gathers: Vec<(usize, Instant, Instant)>,
    /// The device whose worker failed, ending the exchange early.
    pub abandoned: Option<usize>,
}

/// The communication thread's loop: collects messages until every worker has hung up, and
/// runs each collective the moment all `devices` have asked for it: a bucket's all-reduce
/// (sum), or with `scatter: Some((world, dtype))` (ZeRO-2/3) its reduce-scatter, padded with
/// zeros to a multiple of `world` so that every device's block has the same length, keeping
/// each device's block, in `dtype` (summed in the gradients' f32 first); a unit's all-gather, whose result goes straight back to each device.
///
/// Collectives run in device 0's order, so that every process runs them in one order (each
/// process's first device runs the same program). Inside one process (`ordered` false) a
/// collective every device has asked for may also pass one that waits for a device: devices
/// of different kernel families may finish gradients in different orders.
pub(super) fn exchange(
    comm: &dyn Communicator,
    rx: Receiver<Msg>,
    buckets: usize,
    devices: usize,
    scatter: Option<(usize, DType)>,
    ordered: bool,
) -> Result<Exchanged> {
    let mut queues: Vec<VecDeque<Msg>> = (0..devices).map(|_| VecDeque::new()).collect();
    let mut out = Exchanged {
        reduced: vec![None; buckets],
        launches: Vec::with_capacity(buckets),
        stamps: vec![None; buckets],
        gathers: Vec::new(),
        abandoned: None,
    };
    for msg in rx {
        if let Msg::Failed(d) = msg {
            // Dropping the queues hangs up every waiting gather's reply: its worker stops with
            // an error, and the failed worker's own error is the one reported.
            out.abandoned = Some(d);
            return Ok(out);
        }
        let d = msg.device();
        let key = msg.key();
        if d >= devices || (!key.0 && key.1 >= buckets) {
            return Err(Error::Msg(format!("data parallel: message {key:?} from device {d} is out of range")));
        }
        queues[d].push_back(msg);
        while let Some(key) = next_ready(&queues, ordered) {
            let parts: Vec<Msg> = queues.iter_mut().filter_map(|q| q.iter().position(|m| m.key() == key).and_then(|at| q.remove(at))).collect();
            run_collective(comm, parts, scatter, &mut out)?;
        }
    }
    Ok(out)
}

/// The first collective in device 0's queue that every device has asked for (only the head's
/// when `ordered`).
fn next_ready(queues: &[VecDeque<Msg>], ordered: bool) -> Option<(bool, usize)> {
    let candidates = queues[0].iter().take(if ordered { 1 } else { usize::MAX });
    candidates.map(Msg::key).find(|k| queues[1..].iter().all(|q| q.iter().any(|m| m.key() == *k)))
}

/// One collective over every device's part.
fn run_collective(comm: &dyn Communicator, parts: Vec<Msg>, scatter: Option<(usize, DType)>, out: &mut Exchanged) -> Result<()> {
    let start = Instant::now();
    match parts[0].key() {
        (false, bucket) => {
            let (group, ready): (Vec<Tensor>, Vec<Stamp>) =
                parts.into_iter().filter_map(|m| if let Msg::Ready(r) = m { Some((r.flat, r.ready)) } else { None }).unzip();
            let group = match scatter {
                None => {
                    comm.all_reduce(&group, ReduceKind::Sum)?;
                    group
                }
                Some((world, dtype)) => {
                    let blocks = comm.reduce_scatter(&padded(group, world)?, ReduceKind::Sum)?;
                    blocks.into_iter().map(|b| if b.dtype() == dtype { Ok(b) } else { no_grad(|| b.to_dtype(dtype)) }).collect::<Result<Vec<_>>>()?
                }
            };
            let end = Instant::now();
            let landed = comm.devices().iter().map(Stamp::now).collect::<Result<Vec<_>>>()?;
            out.launches.push((bucket, start, end));
            out.stamps[bucket] = Some(ready.into_iter().zip(landed).collect());
            out.reduced[bucket] = Some(group);
        }
        (_, unit) => {
            let (blocks, replies): (Vec<Tensor>, Vec<Sender<Result<Tensor>>>) =
                parts.into_iter().filter_map(|m| if let Msg::Gather(g) = m { Some((g.block, g.reply)) } else { None }).unzip();
            let whole = comm.all_gather(&blocks)?;
            drop(blocks);
            // A worker that failed has hung up; the others still get their unit.
            for (reply, t) in replies.into_iter().zip(whole) {
                let _ = reply.send(Ok(t));
            }
            out.gathers.push((unit, start, Instant::now()));
        }
    }
    Ok(())
}

/// Each flat bucket followed by zeros up to a multiple of `world` elements.
pub(crate) fn padded(group: Vec<Tensor>, world: usize) -> Result<Vec<Tensor>> {
    group
        .into_iter()
        .map(|t| {
            let pad = t.numel().next_multiple_of(world) - t.numel();
            if pad == 0 {
                return Ok(t);
            }
            let zeros = Tensor::zeros([pad], t.device())?;
            Tensor::cat(&[t, zeros], 0)
        })
        .collect()
}
