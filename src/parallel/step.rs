//! The part of a step every strategy shares, and its one owner [`StepCore`]: the forward of one
//! part of the global batch under its sample context (so Dropout keys masks by global sample
//! index), that part's share of the loss, and the update (global-norm clipping, then every
//! optimizer's step at the learning rate set last). The strategies keep only what differs:
//! where gradients are reduced and how stages exchange activations.
use super::trace::{Phase, Trace};
use super::{batch_to_device, Loss};
use crate::data::Batch;
use crate::nn::{with_samples, Module, SampleContext};
use crate::optim::{grad_norm_sq, scale_grads, GradScaler, Optimizer, Precision};
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

/// What every strategy holds besides its models and optimizers, the same for all of them: the
/// devices, the loss, the clipping bound, the learning rate set last, the trace, and the step
/// count (part of every dropout mask's key). [`Strategy`](super::Strategy)'s `devices`,
/// `set_lr`, `set_grad_clip` and `set_trace` are written once over it, and every strategy's
/// update goes through its one clip-and-update path.
pub struct StepCore {
    pub(crate) loss: Loss,
    pub(crate) clip: Option<f32>,
    /// Steps taken, restored with the optimizer state.
    pub(crate) step: u64,
    /// The learning rate every optimizer takes before its next update; `None` keeps each
    /// optimizer's own (its `OptimConfig`'s).
    pub(crate) lr: Option<f32>,
    pub(crate) trace: Option<Trace>,
    pub(crate) devices: Vec<Device>,
    /// What forwards compute in (see `Strategy::set_precision`).
    pub(crate) precision: Precision,
    /// F16's loss scaling, `Some` exactly when the precision is F16.
    pub(crate) scaler: Option<GradScaler>,
    /// Steps whose gradients overflowed under loss scaling, and so updated nothing.
    pub(crate) skipped: u64,
}

/// Whose gradients clipping's (and loss scaling's overflow check's) norm is summed over.
pub(crate) enum NormOver<'a> {
    /// The parts' own parameters, which then hold each parameter once.
    Parts,
    /// These parameters: every parameter of the model once, where several optimizers hold
    /// copies of it (one replica's, all of them holding the reduced gradient).
    Params(&'a [(String, Tensor)]),
    /// Summed by the caller, given the factor loss scaling divides the gradients by (the
    /// same `1 / scale` the parts' gradients are multiplied by), where the gradients the norm
    /// is over are not on any device (deterministic ZeRO).
    Given(&'a dyn Fn(Option<f32>) -> Result<f64>),
}

/// One optimizer of a strategy (a replica's, a stage's or a shard's) as the update steps it.
pub(crate) struct Part<'a> {
    pub opt: &'a mut Box<dyn Optimizer>,
    pub device: &'a Device,
    /// The trace track its optimizer span is drawn on; `None` draws none.
    pub track: Option<String>,
}

impl std::fmt::Debug for StepCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepCore")
            .field("devices", &self.devices)
            .field("clip", &self.clip)
            .field("lr", &self.lr)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl StepCore {
    pub(crate) fn new(loss: Loss, devices: &[Device]) -> Self {
        StepCore { loss, clip: None, step: 0, lr: None, trace: None, devices: devices.to_vec(), precision: Precision::F32, scaler: None, skipped: 0 }
    }

    /// The precision forwards run in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// F16's loss scaler (its scale and growth tracker), `None` in other precisions.
    pub fn grad_scaler(&self) -> Option<&GradScaler> {
        self.scaler.as_ref()
    }

    /// Restores a checkpoint's loss scale (an error outside F16, or for an invalid scale).
    pub fn load_grad_scaler(&mut self, scale: f32, growth_tracker: u32) -> Result<()> {
        match &mut self.scaler {
            Some(s) => s.load(scale, growth_tracker),
            None => {
                Err(Error::invalid("load_grad_scaler", format!("a loss scale belongs to f16 training; this run trains in {}", self.precision.name())))
            }
        }
    }

    /// Steps skipped because their scaled gradients overflowed.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }

    pub(crate) fn set_precision(&mut self, precision: Precision, scaler: Option<GradScaler>) {
        self.precision = precision;
        self.scaler = (precision == Precision::F16).then(|| scaler.unwrap_or_default());
    }

    /// The devices the strategy runs on, in its order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The clipping bound, `None` when clipping is off.
    pub fn grad_clip(&self) -> Option<f32> {
        self.clip
    }

    /// The learning rate set last with `Strategy::set_lr`, `None` before.
    pub fn lr(&self) -> Option<f32> {
        self.lr
    }

    /// Optimizer steps taken (restored with the optimizer state).
    pub fn steps(&self) -> u64 {
        self.step
    }

    pub(crate) fn set_clip(&mut self, max_norm: Option<f32>) -> Result<()> {
        self.clip = clip_bound(max_norm)?;
        Ok(())
    }

    /// `model`'s forward of `x`, whose samples are `first..` of the global batch.
    pub fn forward(&self, model: &dyn Module, x: &Tensor, first: usize) -> Result<Tensor> {
        let ctx = SampleContext { step: self.step, first_sample: first as u64, samples: x.dims().first().copied().unwrap_or(1) };
        crate::autocast(self.precision.autocast(), || with_samples(ctx, || model.forward(x)))
    }

    /// The loss of `out` against `y`, weighted by the part's share `n / total` of the global
    /// batch, so that the parts' losses (and gradients) add up to the whole batch's.
    pub(crate) fn loss_share(&self, out: &Tensor, y: &Tensor, n: usize, total: usize) -> Result<Tensor> {
        let mut loss = self.loss.compute(out, y)?;
        if n != total {
            loss = loss.mul_scalar(n as f32 / total as f32)?;
        }
        self.scaled(loss)
    }

    /// `loss` with f16's loss scale on its gradient (itself unchanged in other precisions).
    pub(crate) fn scaled(&self, loss: Tensor) -> Result<Tensor> {
        match &self.scaler {
            Some(s) => s.scale_loss(&loss),
            None => Ok(loss),
        }
    }

    /// `f` under this run's autocast (see `Strategy::set_precision`), for a forward that is
    /// not one module's (`forward`): tensor parallelism's shards.
    pub(crate) fn autocast<T>(&self, f: impl FnOnce() -> T) -> T {
        crate::autocast(self.precision.autocast(), f)
    }

    /// Uploads `part` (samples `first..` of a global batch of `total`) to `device`, runs
    /// `model` on it and returns its share of the loss.
    pub(crate) fn part_loss(&self, model: &dyn Module, part: &Batch, first: usize, total: usize, device: &Device) -> Result<Tensor> {
        let (x, y) = batch_to_device(part, device)?;
        let out = self.forward(model, &x, first)?;
        self.loss_share(&out, &y, part.len(), total)
    }

    /// The global norm for a sum of squared gradients and, when it exceeds the clipping bound,
    /// the factor every gradient is multiplied by (PyTorch's `max_norm / (norm + 1e-6)`; a
    /// NaN norm gives NaN, as there). `(None, None)` without clipping.
    fn clip_scale(&self, norm_sq: f64) -> (Option<f32>, Option<f32>) {
        let Some(max) = self.clip else { return (None, None) };
        let norm = norm_sq.sqrt() as f32;
        let coef = crate::optim::clip_scale(norm, max);
        (Some(norm), (coef < 1.0 || coef.is_nan()).then_some(coef))
    }

    /// The one clip-and-update path of every strategy. With clipping on: the global norm over
    /// `norm`'s gradients (see [`NormOver`]), its square summed across processes by `reduce`
    /// where the model spans them; over the
    /// bound, every part's gradients are scaled. Then each part's optimizer steps at the
    /// learning rate set last (each on its own thread, its device synced, with `threads`;
    /// `worker` names such a thread in its error), and the step is counted. Returns the norm
    /// before clipping (when clipping is on) and each part's seconds.
    pub(crate) fn update(
        &mut self,
        norm_over: NormOver<'_>,
        reduce: Option<&dyn Fn(f64) -> Result<f64>>,
        mut parts: Vec<Part<'_>>,
        threads: Option<&'static str>,
    ) -> Result<(Option<f32>, Vec<f64>)> {
        let mut scale = None;
        let mut norm = None;
        // Loss scaling: the gradients divided by the scale again, and the step skipped when any
        // overflowed (their squares' sum, over every part and process, is then not finite).
        if let Some(scaler) = &self.scaler {
            for p in &parts {
                scale_grads(p.opt.params(), 1.0 / scaler.scale())?;
            }
        }
        if self.clip.is_some() || self.scaler.is_some() {
            let mut sq = match norm_over {
                NormOver::Params(ps) => grad_norm_sq(ps)?,
                NormOver::Parts => parts.iter().try_fold(0.0, |acc, p| Ok::<f64, Error>(acc + grad_norm_sq(p.opt.params())?))?,
                NormOver::Given(f) => f(self.scaler.as_ref().map(|s| 1.0 / s.scale()))?,
            };
            if let Some(reduce) = reduce {
                sq = reduce(sq)?;
            }
            if let Some(scaler) = &mut self.scaler {
                let found_inf = !sq.is_finite();
                scaler.update(found_inf);
                if found_inf {
                    self.skipped += 1;
                    self.step += 1;
                    return Ok((self.clip.map(|_| sq.sqrt() as f32), vec![0.0; parts.len()]));
                }
            }
            if self.clip.is_some() {
                (norm, scale) = self.clip_scale(sq);
            }
        }
        let (lr, trace) = (self.lr, self.trace.as_ref());
        let one = |p: &mut Part<'_>, sync: bool| -> Result<f64> {
            let t = Instant::now();
            if let Some(s) = scale {
                scale_grads(p.opt.params(), s)?;
            }
            if let Some(lr) = lr {
                p.opt.set_lr(lr);
            }
            p.opt.step()?;
            if sync {
                p.device.sync()?;
            }
            if let (Some(tr), Some(track)) = (trace, &p.track) {
                tr.span(track, "optimizer", Phase::Optimizer, t, t.elapsed().as_secs_f64());
            }
            Ok(t.elapsed().as_secs_f64())
        };
        let seconds = match threads {
            None => parts.iter_mut().map(|p| one(p, false)).collect::<Result<Vec<_>>>()?,
            Some(worker) => std::thread::scope(|s| {
                let one = &one;
                let handles: Vec<_> = parts.iter_mut().map(|p| s.spawn(move || one(p, true))).collect();
                let results: Vec<Result<f64>> = handles
                    .into_iter()
                    .zip(&self.devices)
                    .enumerate()
                    .map(|(i, (h, d))| h.join().unwrap_or_else(|payload| Err(Error::panicked(payload))).map_err(|e| e.in_worker(worker, i, d)))
                    .collect();
                results.into_iter().collect::<Result<Vec<_>>>()
            })?,
        };
        self.step += 1;
        Ok((norm, seconds))
    }
}
