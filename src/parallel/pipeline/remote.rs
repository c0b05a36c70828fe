//! Pipeline links between processes (cargo feature `mpi`): a stage whose neighbour runs on
//! another rank of the [`Group`] sends its activations forward and receives its gradients
//! back through MPI point-to-point messages, and the other way round.
//!
//! A message is one `f32` buffer: `[micro-batch, rank of the tensor, dims..., values...]`
//! (dims and micro-batch indices below 2^24 are exact in an `f32`). Its MPI tag is the
//! micro-batch and the direction, so each receive takes exactly the message it waits for,
//! and MPI's order between two ranks keeps the steps apart.
//!
//! Sends run on a thread per outgoing link: a blocking `MPI_Send` of a large buffer waits for
//! the matching receive, and under 1F1B two neighbours send to each other at the same time
//! (activation forward, gradient back), which would wait on each other forever.
use super::worker::{Inbox, Links, Msg, Outbox, STAGE};
use crate::dist::{Group, Order};
use crate::{Device, Error, Result, Tensor};
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;

/// Which way a link carries tensors; part of the tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    Activation = 0,
    Gradient = 1,
}

/// Micro-batches that fit the tag (two directions per micro-batch, below the reserved tag).
pub(super) const MAX_MICRO_BATCHES: usize = (u16::MAX as usize - 1) / 2;
/// The tag of [`forward_across`]'s messages, apart from training's.
const PREDICT_TAG: u16 = u16::MAX;

fn tag(mb: usize, dir: Dir) -> u16 {
    (mb * 2 + dir as usize) as u16
}

/// Largest integer every smaller one of which an `f32` holds exactly.
const EXACT: usize = 1 << 24;

/// `tensor` as a message body: the header, then its values.
fn encode(mb: usize, tensor: &Tensor) -> Result<Vec<f32>> {
    let dims = tensor.dims();
    if mb >= EXACT || dims.iter().any(|&d| d >= EXACT) {
        return Err(Error::shape(
            "pipeline send",
            format!("micro-batch {mb} or shape {dims:?} has a number over 2^24, which the message header cannot carry"),
        ));
    }
    let mut body = Vec::with_capacity(2 + dims.len() + tensor.numel());
    body.push(mb as f32);
    body.push(dims.len() as f32);
    body.extend(dims.iter().map(|&d| d as f32));
    body.extend(tensor.to_vec()?);
    Ok(body)
}

/// The micro-batch and tensor (on `device`) of a message body from rank `src`.
fn decode(body: Vec<f32>, src: usize, device: &Device) -> Result<(usize, Tensor)> {
    let bad = || Error::shape("pipeline recv", format!("a message of {} values from rank {src} is not a tensor message", body.len()));
    let rank = *body.get(1).ok_or_else(bad)? as usize;
    let dims: Vec<usize> = body.get(2..2 + rank).ok_or_else(bad)?.iter().map(|&d| d as usize).collect();
    let mb = body[0] as usize;
    if body.len() - 2 - rank != dims.iter().product::<usize>() {
        return Err(bad());
    }
    let values = body[2 + rank..].to_vec();
    Ok((mb, Tensor::from_vec(values, dims, device)?))
}

/// Receives from the neighbouring stage on rank `peer`, making tensors on the receiving
/// stage's `device`.
pub(super) struct RemoteIn {
    pub group: Group,
    pub peer: usize,
    pub dir: Dir,
    pub device: Device,
}

impl Inbox for RemoteIn {
    fn recv(&self, mb: usize, _what: &'static str, _stage: usize) -> Result<Msg> {
        let body = self.group.recv(self.peer, tag(mb, self.dir))?;
        let (got, tensor) = decode(body, self.peer, &self.device)?;
        Ok(Msg { mb: got, tensor })
    }
}

/// Sends to the neighbouring stage on another rank, from a thread of its own.
pub(super) struct RemoteOut {
    dir: Dir,
    queue: Option<Sender<(u16, Vec<f32>)>>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl RemoteOut {
    pub fn new(group: &Group, peer: usize, dir: Dir) -> Result<RemoteOut> {
        let (tx, rx) = channel::<(u16, Vec<f32>)>();
        let group = group.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tandem-pipeline-send-{dir:?}"))
            .spawn(move || rx.into_iter().try_for_each(|(tag, body)| group.send(&body, peer, tag)))
            .map_err(|e| Error::Msg(format!("pipeline: cannot start the thread that sends to rank {peer}: {e}")))?;
        Ok(RemoteOut { dir, queue: Some(tx), thread: Some(thread) })
    }

    fn join(&mut self) -> Result<()> {
        self.queue = None;
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|p| Err(Error::panicked(p))),
            None => Ok(()),
        }
    }
}

impl Outbox for RemoteOut {
    fn send(&self, msg: Msg, what: &'static str, stage: usize) -> Result<()> {
        let body = encode(msg.mb, &msg.tensor)?;
        let queue = self.queue.as_ref().ok_or(Error::ChannelClosed { role: STAGE, index: stage, what })?;
        // A closed queue means the send thread failed; `finish` returns its error.
        queue.send((tag(msg.mb, self.dir), body)).map_err(|_| Error::ChannelClosed { role: STAGE, index: stage, what })
    }
    fn finish(mut self: Box<Self>) -> Result<()> {
        self.join()
    }
}

impl Drop for RemoteOut {
    fn drop(&mut self) {
        // Without `finish` (the step failed): close the queue but do not wait, since the peer
        // may never receive what is queued; the thread sends what it can and ends, or the
        // group's watchdog ends the job.
        self.queue = None;
    }
}

/// A forward without gradients through stages spread over ranks: `x` enters on rank 0 (the
/// other ranks' `x` is unused), each rank runs `run_mine` on what the previous rank sent, and
/// the last rank's output is returned on every rank, on `device`.
pub(super) fn forward_across(group: &Group, x: &Tensor, device: &Device, run_mine: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (rank, size) = (group.rank(), group.size());
    let input = if rank == 0 { x.clone() } else { decode(group.recv(rank - 1, PREDICT_TAG)?, rank - 1, device)?.1 };
    let out = run_mine(&input)?;
    if rank + 1 < size {
        group.send(&encode(0, &out)?, rank + 1, PREDICT_TAG)?;
    }
    let body = if rank + 1 == size { encode(0, &out)? } else { Vec::new() };
    let mut all = group.all_gather(&body)?;
    let last = all.pop().unwrap_or_default();
    Ok(decode(last, size - 1, device)?.1)
}

/// Refuses what the pipeline does not do across processes: measuring the split (it would
/// need every rank's layers on every device) and more micro-batches than the message tags
/// tell apart.
pub(super) fn check_options(auto_split: bool, micro_batches: usize) -> Result<()> {
    if auto_split {
        return Err(Error::invalid(
            "Pipeline::across",
            "Split::Auto cannot balance stages across processes; give each rank its stages (Stages::Built) or a Split::At of its part",
        ));
    }
    if micro_batches > MAX_MICRO_BATCHES {
        return Err(Error::invalid("Pipeline::across", format!("{micro_batches} micro-batches; across processes at most {MAX_MICRO_BATCHES}")));
    }
    Ok(())
}

/// Where this process's stages sit in a pipeline spread over the ranks of a group: rank 0
/// holds the first stages, rank `size - 1` the last; every rank holds at least one.
pub(super) struct Across {
    pub group: Group,
    /// The global index of this rank's first stage.
    pub first: usize,
    /// Stages over all ranks.
    pub total: usize,
    /// How many stages each rank holds.
    counts: Vec<usize>,
}

impl Across {
    /// Places `local` stages of this rank among every rank's (collective).
    pub fn place(group: &Group, local: usize) -> Result<Across> {
        let counts: Vec<usize> = group.all_gather_u64(&[local as u64])?.iter().map(|c| c.first().map_or(0, |&n| n as usize)).collect();
        if let Some(r) = counts.iter().position(|&c| c == 0) {
            return Err(Error::invalid(
                "Pipeline",
                format!("rank {r} of {} has no stage; across processes every rank holds at least one", group.size()),
            ));
        }
        let first = counts[..group.rank()].iter().sum();
        Ok(Across { group: group.clone(), first, total: counts.iter().sum(), counts })
    }

    /// The rank that holds global stage `s` (the last rank for a stage past the end).
    pub fn rank_of(&self, s: usize) -> usize {
        let mut end = 0;
        for (r, &c) in self.counts.iter().enumerate() {
            end += c;
            if s < end {
                return r;
            }
        }
        self.counts.len() - 1
    }

    /// Links this rank's end stages to the neighbouring ranks': the first stage receives
    /// activations from and sends gradients to rank - 1, the last the other way with rank + 1.
    pub fn link_ends(&self, links: &mut [Links], first_device: &Device, last_device: &Device) -> Result<()> {
        let (rank, size) = (self.group.rank(), self.group.size());
        if rank > 0 {
            links[0].act_in =
                Some(Box::new(RemoteIn { group: self.group.clone(), peer: rank - 1, dir: Dir::Activation, device: first_device.clone() }));
            links[0].grad_out = Some(Box::new(RemoteOut::new(&self.group, rank - 1, Dir::Gradient)?));
        }
        if rank + 1 < size {
            let last = links.len() - 1;
            links[last].act_out = Some(Box::new(RemoteOut::new(&self.group, rank + 1, Dir::Activation)?));
            links[last].grad_in =
                Some(Box::new(RemoteIn { group: self.group.clone(), peer: rank + 1, dir: Dir::Gradient, device: last_device.clone() }));
        }
        Ok(())
    }

    /// The batch loss, which the last rank computed, on every rank.
    pub fn share_loss(&self, loss: f32) -> Result<f32> {
        let mut v = [loss];
        self.group.broadcast(&mut v, self.group.size() - 1)?;
        Ok(v[0])
    }

    /// Loads the entries of `state` that this rank's stages hold; an entry no rank holds is an
    /// error on every rank (collective: the names are gathered).
    pub fn load(&self, mine: &[String], state: &[(String, Tensor)], load: impl FnOnce(&[(String, Tensor)]) -> Result<()>) -> Result<()> {
        let all = self.group.all_gather_names(mine)?;
        let unexpected: Vec<&str> = state.iter().map(|s| s.0.as_str()).filter(|n| !all.iter().any(|a| a == n)).collect();
        if !unexpected.is_empty() {
            return Err(Error::invalid(
                "load_state_dict",
                format!("unexpected [{}] (no rank's stage holds them)", crate::error::capped_list(unexpected)),
            ));
        }
        let own: Vec<(String, Tensor)> = state.iter().filter(|(n, _)| mine.contains(n)).cloned().collect();
        load(&own)
    }
}

/// A sum of squared gradients over every rank's stages, the same on every rank (in rank order).
pub(super) fn sum_over_ranks(group: &Group, sq: f64) -> Result<f64> {
    let mut all = [sq as f32];
    group.all_reduce(&mut all, Order::Ranks)?;
    Ok(f64::from(all[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_the_micro_batch_and_shape() {
        let dev = Device::cpu();
        let t = Tensor::from_vec(vec![1.0, -2.0, 3.5, 0.25, 5.0, 6.0], [1, 2, 3], &dev).unwrap();
        let (mb, back) = decode(encode(7, &t).unwrap(), 0, &dev).unwrap();
        assert_eq!((mb, back.dims().to_vec(), back.to_vec().unwrap()), (7, vec![1, 2, 3], t.to_vec().unwrap()));
        assert!(decode(vec![0.0, 2.0, 3.0], 1, &dev).is_err());
        assert_ne!(tag(3, Dir::Activation), tag(3, Dir::Gradient));
        assert!(tag(MAX_MICRO_BATCHES - 1, Dir::Gradient) < PREDICT_TAG);
        // Ties across processes send on a tag of their own, between training's and prediction's.
        let tie = super::super::tied_across::TIE_TAG;
        assert!(tag(MAX_MICRO_BATCHES - 1, Dir::Gradient) < tie && tie < PREDICT_TAG);
    }
}
