//! Running training on one or many devices: the `Strategy` trait every parallel scheme
//! implements, the single-device strategy, collectives, and the trace of device timelines.
//!
//! A strategy owns the model replicas/stages and their optimizers; the caller hands it host
//! batches. All strategies give the same losses and weights as `Single` on one device, within
//! floating-point tolerance (bit for bit where a strategy documents determinism).
pub mod comm;
mod data_parallel;
pub mod pipeline;
mod placement;
mod tensor_parallel;
pub mod trace;

pub use data_parallel::{assign_buckets, DataParallel, DataParallelConfig, StepEvent};
pub use pipeline::{Pipeline, PipelineConfig, Schedule};
pub use placement::{LayerPlacement, Split};
// The CLI fixes a byte-balanced split up front when --deterministic asks for one.
#[cfg(feature = "cli")]
pub(crate) use placement::plan as plan_stages;
pub use tensor_parallel::{ColumnParallelLinear, RowParallelLinear, TensorParallel};

use crate::data::{Batch, Targets};
use crate::nn::{Module, Sequential};
use crate::optim::Optimizer;
pub use crate::optim::OptimConfig;
use crate::{Device, Error, Result, Tensor};
use std::time::Instant;

/// The training loss; picked from the data's targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Mean cross-entropy over class indices (PyTorch `CrossEntropyLoss()`).
    CrossEntropy,
    /// Mean squared error (PyTorch `MSELoss()`).
    Mse,
}

impl Loss {
    pub fn for_targets(t: &Targets) -> Loss {
        match t {
            Targets::Classes { .. } => Loss::CrossEntropy,
            Targets::Values { .. } => Loss::Mse,
        }
    }
    /// The loss of `output` against `target` (as made by `batch_to_device`).
    pub fn compute(self, output: &Tensor, target: &Tensor) -> Result<Tensor> {
        match self {
            Loss::CrossEntropy => output.cross_entropy(target),
            Loss::Mse => output.mse_loss(target),
        }
    }
}

/// Uploads a host batch: inputs as f32 `[b, ...]`, targets as I32 labels `[b]` or f32 values
/// `[b, ...]`.
pub fn batch_to_device(batch: &Batch, device: &Device) -> Result<(Tensor, Tensor)> {
    let x = Tensor::from_vec(batch.x.clone(), batch.x_shape.clone(), device)?;
    let b = batch.x_shape.first().copied().unwrap_or(0);
    let y = match &batch.y {
        Targets::Classes { labels, .. } => Tensor::from_labels(labels.clone(), [labels.len()], device)?,
        Targets::Values { data, shape_per_sample } => {
            let mut shape = vec![b];
            shape.extend(shape_per_sample);
            Tensor::from_vec(data.clone(), shape, device)?
        }
    };
    Ok((x, y))
}

/// What one optimizer step measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StepReport {
    /// The global batch's mean loss, as the single-device forward computes it.
    pub loss: f32,
    /// Wall time of the whole step, seconds.
    pub wall_s: f64,
    /// Seconds spent computing (forward, backward, update), the slowest device's.
    pub compute_s: f64,
    /// Seconds spent in collectives or cross-device copies.
    pub comm_s: f64,
    /// Fraction of communication that ran while backward was still computing (0 when none).
    pub overlap: f64,
    /// Peak bytes allocated per device during the step, in device order.
    pub peak_memory: Vec<u64>,
}

/// A way of running training steps on a set of devices.
pub trait Strategy: Send {
    /// One optimizer step on a global batch (forward, loss, backward, update).
    fn step(&mut self, batch: &Batch) -> Result<StepReport>;
    /// Model outputs for a batch (no gradients), gathered on the first device.
    fn predict(&self, x: &Batch) -> Result<Tensor>;
    /// The full model's weights with their state_dict names (gathered when sharded).
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>>;
    /// Overwrites the weights on every device from `state`.
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()>;
    /// Optimizer state (`name.momentum_buffer`, ...) and its step count, gathered.
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)>;
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()>;
    fn devices(&self) -> Vec<Device>;
    /// Attach a trace: from now on each step records its device timelines there.
    fn set_trace(&mut self, _trace: trace::Trace) {}
}

/// Everything on one device: the reference every other strategy is tested against.
pub struct Single {
    model: Sequential,
    opt: Box<dyn Optimizer>,
    loss: Loss,
    device: Device,
    trace: Option<trace::Trace>,
}

impl Single {
    pub fn new(model: Sequential, opt: &OptimConfig, loss: Loss, device: &Device) -> Result<Self> {
        let model = model.slice(0..model.len(), device)?;
        let opt = opt.build(model.parameters())?;
        Ok(Single { model, opt, loss, device: device.clone(), trace: None })
    }
    pub fn model(&self) -> &Sequential {
        &self.model
    }
}

impl Strategy for Single {
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        let (x, y) = batch_to_device(batch, &self.device)?;
        let loss = self.loss.compute(&self.model.forward(&x)?, &y)?;
        self.opt.zero_grad();
        loss.backward()?;
        self.opt.step()?;
        let value = loss.to_scalar()?;
        let wall = t0.elapsed().as_secs_f64();
        if let Some(tr) = &self.trace {
            tr.span(&self.device.spec(), "step", trace::Phase::Compute, t0, wall);
        }
        Ok(StepReport { loss: value, wall_s: wall, compute_s: wall, peak_memory: vec![self.device.memory().peak], ..Default::default() })
    }
    fn predict(&self, x: &Batch) -> Result<Tensor> {
        let (x, _) = batch_to_device(x, &self.device)?;
        crate::autograd::no_grad(|| self.model.forward(&x))
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self.model.state_dict())
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.model.load_state_dict(state)
    }
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        Ok(self.opt.state())
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.opt.load_state(state, steps)
    }
    fn devices(&self) -> Vec<Device> {
        vec![self.device.clone()]
    }
    fn set_trace(&mut self, trace: trace::Trace) {
        self.trace = Some(trace);
    }
}

/// Splits `n` samples into parts proportional to `weights` (largest remainders), every part
/// as close to its share as integers allow; errors when a weight is not positive.
pub fn proportional_split(n: usize, weights: &[f64]) -> Result<Vec<usize>> {
    if weights.is_empty() || weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return Err(Error::invalid("split", format!("weights must be positive, got {weights:?}")));
    }
    let total: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| n as f64 * w / total).collect();
    let mut parts: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    let short = n - parts.iter().sum::<usize>();
    for &i in order.iter().take(short) {
        parts[i] += 1;
    }
    Ok(parts)
}
