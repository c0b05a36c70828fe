//! One pipeline stage's worker: runs its action list on its own thread, receiving activations
//! from the previous stage and gradients from the next over its links: channels to the stage
//! threads of this process, or messages to another process (`remote.rs`).
//!
//! Autograd graphs never cross threads: an activation is sent detached, and the receiving
//! stage makes it a leaf that requires grad; after backward that leaf's gradient is what goes
//! back to the sender, which seeds its own backward with it.
use super::schedule::Action;
use crate::autograd::{no_grad, GradOp};
use crate::backend::Buffer;
use crate::data::Batch;
use crate::nn::Module;
use crate::parallel::batch_to_device;
use crate::parallel::stages::Stage;
use crate::parallel::step::StepCore;
use crate::parallel::trace::{Phase, Trace};
use crate::{Error, Result, Tensor};
use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

/// A tensor for micro-batch `mb`, sent between neighbouring stages.
pub(super) struct Msg {
    pub mb: usize,
    pub tensor: Tensor,
}

/// Where a stage's activations or gradients come from. `mb` is the micro-batch the stage
/// waits for (a channel delivers in order; a remote link selects by it); `what` and `stage`
/// name the link in errors.
pub(super) trait Inbox: Send {
    fn recv(&self, mb: usize, what: &'static str, stage: usize) -> Result<Msg>;
}

/// Where a stage sends its activations or gradients.
pub(super) trait Outbox: Send {
    fn send(&self, msg: Msg, what: &'static str, stage: usize) -> Result<()>;
    /// Waits until every message has left this process (a remote send completes in the
    /// background, so that two neighbours sending to each other do not wait on each other).
    fn finish(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

impl Inbox for Receiver<Msg> {
    fn recv(&self, _mb: usize, what: &'static str, stage: usize) -> Result<Msg> {
        Receiver::recv(self).map_err(|_| Error::ChannelClosed { role: STAGE, index: stage, what })
    }
}

impl Outbox for Sender<Msg> {
    fn send(&self, msg: Msg, what: &'static str, stage: usize) -> Result<()> {
        Sender::send(self, msg).map_err(|_| Error::ChannelClosed { role: STAGE, index: stage, what })
    }
}

/// The link ends a stage holds; `None` at the pipeline's ends.
#[derive(Default)]
pub(super) struct Links {
    pub act_in: Option<Box<dyn Inbox>>,
    pub act_out: Option<Box<dyn Outbox>>,
    pub grad_in: Option<Box<dyn Inbox>>,
    pub grad_out: Option<Box<dyn Outbox>>,
}

impl Links {
    /// Waits for both outgoing links to finish sending.
    fn finish(self) -> Result<()> {
        let act = self.act_out.map_or(Ok(()), Outbox::finish);
        let grad = self.grad_out.map_or(Ok(()), Outbox::finish);
        act.and(grad)
    }
}

/// What a stage's run measured.
pub(super) struct Outcome {
    /// Seconds computing forwards and backwards.
    pub compute_s: f64,
    /// The forwards' share of `compute_s` (a recomputed forward counts as backward).
    pub forward_s: f64,
    /// Seconds copying activations and gradients onto this stage's device (on the first stage,
    /// uploading its micro-batches).
    pub comm_s: f64,
    /// When the stage finished its last action.
    pub end: Instant,
    /// Sum of this stage's scaled micro-batch losses (the last stage's is the batch loss).
    pub loss: f32,
    /// Most bytes of saved activations (graph tensors kept for backward) alive at once.
    pub peak_activation_bytes: u64,
}

/// Everything one stage's thread needs for one step.
pub(super) struct Job<'a> {
    pub index: usize,
    pub last: bool,
    pub stage: &'a mut Stage,
    pub actions: &'a [Action],
    pub micro_batches: &'a [Batch],
    /// The global index of each micro-batch's first sample (keys its dropout masks).
    pub firsts: &'a [usize],
    /// Samples in the batch: each micro-batch's loss is weighted by its share of them.
    pub total: usize,
    pub run: &'a StepCore,
    pub recompute: bool,
    pub trace: Option<Trace>,
    pub track: String,
    pub links: Links,
}

/// What a micro-batch keeps between its forward and its backward.
struct Saved {
    input: Tensor,
    /// The stage output (or the scaled loss on the last stage); `None` when recomputing.
    output: Option<Tensor>,
    bytes: u64,
}

/// How errors name a stage's worker.
pub(super) const STAGE: &str = "pipeline stage";

fn recv(rx: &Option<Box<dyn Inbox>>, mb: usize, what: &'static str, stage: usize) -> Result<Tensor> {
    let rx = rx.as_ref().ok_or_else(|| Error::Msg(format!("pipeline stage {stage}: no {what} channel")))?;
    let msg = rx.recv(mb, what, stage)?;
    if msg.mb != mb {
        return Err(Error::Msg(format!("pipeline stage {stage}: expected the {what} of micro-batch {mb}, got {}", msg.mb)));
    }
    Ok(msg.tensor)
}

fn send(tx: &Option<Box<dyn Outbox>>, msg: Msg, what: &'static str, stage: usize) -> Result<()> {
    let tx = tx.as_ref().ok_or_else(|| Error::Msg(format!("pipeline stage {stage}: no {what} channel")))?;
    tx.send(msg, what, stage)
}

/// Bytes that autograd keeps alive for `root`'s backward: the buffers of every non-parameter
/// tensor of its graph, each buffer once (a view shares its source's, and a view of a
/// parameter holds no activation), plus the buffers ops saved (im2col columns, pooling argmax).
/// `params` holds the [`Tensor::id`]s of the parameters. A pipeline stage's activation memory
/// in [`PipelineStats`](super::PipelineStats) is this count; `tandem bench` reports a whole
/// model's with it.
///
/// ```
/// use std::collections::HashSet;
/// use tandem::{Device, Tensor};
/// # fn main() -> tandem::Result<()> {
/// let dev = Device::cpu();
/// let w = Tensor::from_vec(vec![1.0; 4], [2, 2], &dev)?.requires_grad();
/// let x = Tensor::from_vec(vec![1.0; 6], [3, 2], &dev)?;
/// let loss = x.matmul(&w)?.relu()?.mean_all()?;
/// let params: HashSet<u64> = [w.id()].into();
/// assert!(tandem::parallel::pipeline::graph_bytes(&loss, &params) > 0);
/// # Ok(()) }
/// ```
pub fn graph_bytes(root: &Tensor, params: &HashSet<u64>) -> u64 {
    let mut seen = HashSet::new();
    let mut stack = vec![root.clone()];
    let (mut weights, mut kept): (Vec<Buffer>, Vec<Buffer>) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    while let Some(t) = stack.pop() {
        if !seen.insert(t.id()) {
            continue;
        }
        if params.contains(&t.id()) {
            weights.push(t.buffer().clone());
            continue;
        }
        kept.push(t.buffer().clone());
        if let Some(node) = &t.0.node {
            bytes += match &node.op {
                GradOp::Conv2d { cols, .. } => cols.len() as u64 * 4,
                GradOp::MaxPool2d { argmax, .. } => argmax.len() as u64 * 4,
                _ => 0,
            };
            stack.extend(node.inputs.iter().cloned());
        }
    }
    let mut counted: Vec<&Buffer> = Vec::new();
    for b in &kept {
        if !weights.iter().chain(counted.iter().copied()).any(|w| w.same_as(b)) {
            counted.push(b);
        }
    }
    bytes + counted.iter().map(|b| b.len() as u64 * 4).sum::<u64>()
}

impl Job<'_> {
    fn span(&self, name: &str, phase: Phase, start: Instant) {
        if let Some(tr) = &self.trace {
            tr.span(&self.track, name, phase, start, start.elapsed().as_secs_f64());
        }
    }

    /// The stage input of `mb`: uploaded on the first stage, received (and made a leaf) on the
    /// others. Counts waiting as idle and the copy as communication.
    fn input(&self, mb: usize, out: &mut Outcome) -> Result<Tensor> {
        let dev = &self.stage.device;
        if self.index == 0 {
            let copy = Instant::now();
            let x = batch_to_device(&self.micro_batches[mb], dev)?.0;
            out.comm_s += copy.elapsed().as_secs_f64();
            self.span(&format!("upload {mb}"), Phase::Comm, copy);
            return Ok(x);
        }
        let wait = Instant::now();
        let sent = recv(&self.links.act_in, mb, "activation", self.index)?;
        self.span(&format!("wait F{mb}"), Phase::Idle, wait);
        let copy = Instant::now();
        let x = sent.to(dev)?.detach().requires_grad();
        out.comm_s += copy.elapsed().as_secs_f64();
        self.span(&format!("recv act {mb}"), Phase::Comm, copy);
        Ok(x)
    }

    /// The stage's forward of `mb` from `input`, ending in the scaled loss on the last stage.
    /// Under the micro-batch's sample context, so that a recomputed forward replays its masks.
    fn forward(&self, mb: usize, input: &Tensor) -> Result<Tensor> {
        let out = self.run.forward(&self.stage.model, input, self.firsts[mb])?;
        if !self.last {
            return Ok(out);
        }
        let part = &self.micro_batches[mb];
        let (_, y) = batch_to_device(part, &self.stage.device)?;
        // Always weighted (even one micro-batch of all N): the scaled loss is what backward
        // starts from on the last stage.
        self.run.scaled(self.run.loss.compute(&out, &y)?.mul_scalar(part.len() as f32 / self.total as f32)?)
    }

    /// Runs the action list; the caller steps the optimizer once every stage succeeded.
    pub fn run(self) -> Result<Outcome> {
        let params: HashSet<u64> = self.stage.model.parameters().iter().map(|(_, t)| t.id()).collect();
        let mut out = Outcome { compute_s: 0.0, forward_s: 0.0, comm_s: 0.0, end: Instant::now(), loss: 0.0, peak_activation_bytes: 0 };
        let mut saved: HashMap<usize, Saved> = HashMap::new();
        let mut alive = 0u64;
        for &action in self.actions {
            match action {
                Action::Forward(mb) => {
                    let input = self.input(mb, &mut out)?;
                    let t0 = Instant::now();
                    let output = if self.recompute { no_grad(|| self.forward(mb, &input))? } else { self.forward(mb, &input)? };
                    if self.last {
                        out.loss += output.to_scalar()?;
                    } else {
                        send(&self.links.act_out, Msg { mb, tensor: output.detach() }, "activation", self.index)?;
                    }
                    let bytes = if self.recompute { input.buffer().len() as u64 * 4 } else { graph_bytes(&output, &params) };
                    alive += bytes;
                    out.peak_activation_bytes = out.peak_activation_bytes.max(alive);
                    saved.insert(mb, Saved { input, output: (!self.recompute).then_some(output), bytes });
                    let dt = t0.elapsed().as_secs_f64();
                    out.compute_s += dt;
                    out.forward_s += dt;
                    self.span(&format!("F{mb}"), Phase::Forward, t0);
                }
                Action::Backward(mb) => {
                    let s = saved
                        .remove(&mb)
                        .ok_or_else(|| Error::Msg(format!("pipeline stage {}: backward of micro-batch {mb} before its forward", self.index)))?;
                    let grad = if self.last {
                        None
                    } else {
                        let wait = Instant::now();
                        let g = recv(&self.links.grad_in, mb, "gradient", self.index)?;
                        self.span(&format!("wait B{mb}"), Phase::Idle, wait);
                        let copy = Instant::now();
                        let g = g.to(&self.stage.device)?;
                        out.comm_s += copy.elapsed().as_secs_f64();
                        self.span(&format!("recv grad {mb}"), Phase::Comm, copy);
                        Some(g)
                    };
                    let t0 = Instant::now();
                    let output = match s.output {
                        Some(o) => o,
                        None => self.forward(mb, &s.input)?,
                    };
                    // Seeding backward with g: d/d(out) of sum(out * g) is g.
                    let root = match grad {
                        Some(g) => output.mul(&g)?.sum_all()?,
                        None => output,
                    };
                    // A first stage without parameters has nothing to learn and no one to tell.
                    if root.needs_grad() {
                        root.backward()?;
                    }
                    if self.index > 0 {
                        let g = s.input.grad().ok_or_else(|| {
                            Error::invalid("Pipeline::step", format!("no gradient reached stage {}'s input (does a layer detach it?)", self.index))
                        })?;
                        send(&self.links.grad_out, Msg { mb, tensor: g }, "gradient", self.index)?;
                    }
                    alive -= s.bytes;
                    out.compute_s += t0.elapsed().as_secs_f64();
                    self.span(&format!("B{mb}"), Phase::Backward, t0);
                }
            }
        }
        self.links.finish()?;
        self.stage.device.sync()?;
        out.end = Instant::now();
        Ok(out)
    }
}
