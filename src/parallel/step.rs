//! The step loop every strategy shares: the forward of one part of the global batch under its
//! sample context (so Dropout keys masks by global sample index), that part's share of the
//! loss, and the update (global-norm clipping, then every optimizer's step). The strategies
//! keep only what differs: where gradients are reduced and how stages exchange activations.
use super::{batch_to_device, Loss};
use crate::data::Batch;
use crate::nn::{with_samples, Module, SampleContext};
use crate::optim::{grad_norm_sq, scale_grads, Optimizer};
use crate::{Device, Error, Result, Tensor};
use std::time::Instant;

/// `max_norm` as a strategy's clipping bound: none, or positive and finite.
pub(crate) fn clip_bound(max_norm: Option<f32>) -> Result<Option<f32>> {
    if let Some(m) = max_norm {
        if !(m.is_finite() && m > 0.0) {
            return Err(Error::invalid("set_grad_clip", format!("max norm {m} must be positive and finite")));
        }
    }
    Ok(max_norm)
}

/// What every strategy's step needs besides its models: the loss, the clipping bound and the
/// step number.
pub(crate) struct StepLoop {
    pub loss: Loss,
    pub clip: Option<f32>,
    /// Steps taken, restored with the optimizer state: part of every dropout mask's key.
    pub step: u64,
}

impl StepLoop {
    pub fn new(loss: Loss) -> Self {
        StepLoop { loss, clip: None, step: 0 }
    }

    pub fn set_clip(&mut self, max_norm: Option<f32>) -> Result<()> {
        self.clip = clip_bound(max_norm)?;
        Ok(())
    }

    /// `model`'s forward of `x`, whose samples are `first..` of the global batch.
    pub fn forward(&self, model: &dyn Module, x: &Tensor, first: usize) -> Result<Tensor> {
        let ctx = SampleContext { step: self.step, first_sample: first as u64, samples: x.dims().first().copied().unwrap_or(1) };
        with_samples(ctx, || model.forward(x))
    }

    /// The loss of `out` against `y`, weighted by the part's share `n / total` of the global
    /// batch, so that the parts' losses (and gradients) add up to the whole batch's.
    pub fn loss_share(&self, out: &Tensor, y: &Tensor, n: usize, total: usize) -> Result<Tensor> {
        let loss = self.loss.compute(out, y)?;
        if n == total {
            return Ok(loss);
        }
        loss.mul_scalar(n as f32 / total as f32)
    }

    /// Uploads `part` (samples `first..` of a global batch of `total`) to `device`, runs
    /// `model` on it and returns its share of the loss.
    pub fn part_loss(&self, model: &dyn Module, part: &Batch, first: usize, total: usize, device: &Device) -> Result<Tensor> {
        let (x, y) = batch_to_device(part, device)?;
        let out = self.forward(model, &x, first)?;
        self.loss_share(&out, &y, part.len(), total)
    }

    /// The global norm for a sum of squared gradients and, when it exceeds the clipping bound,
    /// the factor every gradient is multiplied by (PyTorch's `max_norm / (norm + 1e-6)`; a
    /// NaN norm gives NaN, as there). `(None, None)` without clipping.
    pub fn clip_scale(&self, norm_sq: f64) -> (Option<f32>, Option<f32>) {
        let Some(max) = self.clip else { return (None, None) };
        let norm = norm_sq.sqrt() as f32;
        let coef = crate::optim::clip_scale(norm, max);
        (Some(norm), (coef < 1.0 || coef.is_nan()).then_some(coef))
    }

    /// Clips over all of `opts`' parameters (which together hold each parameter once), steps
    /// each optimizer (`on_step(i, start)` after the i-th) and counts the step. Returns the
    /// norm before clipping when clipping is on.
    pub fn update(&mut self, opts: &mut [Box<dyn Optimizer>], on_step: impl FnMut(usize, Instant)) -> Result<Option<f32>> {
        self.update_each(opts.iter_mut().collect(), on_step)
    }

    /// `update` for optimizers that do not sit in one slice (pipeline stages).
    pub fn update_each(&mut self, mut opts: Vec<&mut Box<dyn Optimizer>>, mut on_step: impl FnMut(usize, Instant)) -> Result<Option<f32>> {
        let mut norm = None;
        if self.clip.is_some() {
            let mut sq = 0.0;
            for o in &opts {
                sq += grad_norm_sq(o.params())?;
            }
            let (n, scale) = self.clip_scale(sq);
            if let Some(s) = scale {
                for o in &opts {
                    scale_grads(o.params(), s)?;
                }
            }
            norm = n;
        }
        for (i, o) in opts.iter_mut().enumerate() {
            let t = Instant::now();
            o.step()?;
            on_step(i, t);
        }
        self.step += 1;
        Ok(norm)
    }
}
