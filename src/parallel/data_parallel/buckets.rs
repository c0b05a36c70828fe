//! Gradient buckets: which parameters are all-reduced together, and the exchange that
//! launches each bucket's all-reduce while the rest of backward is still running.
//!
//! Backward finishes the last layer's gradients first, so buckets are filled in reverse
//! parameter order (PyTorch DDP's rule). Each worker's autograd leaf hook counts down its
//! bucket; the moment a bucket is complete on one device, the worker packs its gradients into
//! one flat tensor and tells the communication thread. That thread all-reduces a bucket as soon
//! as every device has reported it, while backward continues on the workers.
use super::timing::Stamp;
use crate::parallel::comm::{Communicator, ReduceKind};
use crate::{Error, Result, Tensor};
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

/// Hands a bucket to the communication thread; fails only when that thread has stopped.
pub(super) fn send(tx: &Sender<Ready>, msg: Ready) -> Result<()> {
    tx.send(msg).map_err(|_| Error::Msg("data parallel: the communication thread stopped".into()))
}

/// What the communication thread did: each bucket's reduced flat tensors (indexed
/// `[bucket][device]`; `None` when a worker failed before reporting it), and when each
/// all-reduce started and ended on the host, and on each device's timeline (`[bucket][device]`)
/// when the bucket was ready there and when its reduced values were back.
pub(super) struct Exchanged {
    pub reduced: Vec<Option<Vec<Tensor>>>,
    pub launches: Vec<(usize, Instant, Instant)>,
    pub stamps: Vec<Option<Vec<(Stamp, Stamp)>>>,
}

/// The communication thread's loop: collects `Ready` messages until every worker has hung up,
/// all-reducing (summing) each bucket the moment all `devices` have reported it; with
/// `scatter: Some(world)` (ZeRO-2/3) reduce-scattering it instead, padded with zeros to a
/// multiple of `world` so that every device's block has the same length, and keeping each
/// device's block.
pub(super) fn exchange(comm: &dyn Communicator, rx: Receiver<Ready>, buckets: usize, devices: usize, scatter: Option<usize>) -> Result<Exchanged> {
    let mut slots: Vec<Vec<Option<(Tensor, Stamp)>>> = vec![vec![None; devices]; buckets];
    let mut reduced: Vec<Option<Vec<Tensor>>> = vec![None; buckets];
    let mut stamps: Vec<Option<Vec<(Stamp, Stamp)>>> = vec![None; buckets];
    let mut launches = Vec::with_capacity(buckets);
    for msg in rx {
        let slot = slots
            .get_mut(msg.bucket)
            .and_then(|s| s.get_mut(msg.device))
            .ok_or_else(|| Error::Msg(format!("data parallel: bucket {} from device {} is out of range", msg.bucket, msg.device)))?;
        *slot = Some((msg.flat, msg.ready));
        if slots[msg.bucket].iter().all(Option::is_some) {
            let (group, ready): (Vec<Tensor>, Vec<Stamp>) = slots[msg.bucket].iter_mut().filter_map(Option::take).unzip();
            let start = Instant::now();
            let group = match scatter {
                None => {
                    comm.all_reduce(&group, ReduceKind::Sum)?;
                    group
                }
                Some(world) => comm.reduce_scatter(&padded(group, world)?, ReduceKind::Sum)?,
            };
            let end = Instant::now();
            let landed = comm.devices().iter().map(Stamp::now).collect::<Result<Vec<_>>>()?;
            launches.push((msg.bucket, start, end));
            stamps[msg.bucket] = Some(ready.into_iter().zip(landed).collect());
            reduced[msg.bucket] = Some(group);
        }
    }
    Ok(Exchanged { reduced, launches, stamps })
}

/// Each flat bucket followed by zeros up to a multiple of `world` elements.
fn padded(group: Vec<Tensor>, world: usize) -> Result<Vec<Tensor>> {
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
