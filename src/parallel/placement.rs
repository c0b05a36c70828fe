//! Layer placement (model parallelism): consecutive layers of a `Sequential` (or the user's
//! stage modules) on different devices, activations crossing with the differentiable `Tensor::to`.
use super::stages::{
    build_stages, load_stage_opt_state, load_stage_params, probe_input, rebalance, stage_opt_state, stage_params, track_name, Split, Stage, Stages,
};
use super::step::{NormOver, StepCore};
use super::trace::Phase;
use super::{batch_to_device, Loss, OptimConfig, StepReport, Strategy};
use crate::data::Batch;
use crate::nn::{Module, Sequential};
use crate::{Device, Result, Tensor};
use std::ops::Range;
use std::time::Instant;

/// Model parallelism by layers: stage `s` runs on `devices[s]`; a step is one forward through
/// all stages and one backward (autograd crosses devices through `Tensor::to`).
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use std::sync::Arc;
/// use tandem::parallel::{LayerPlacement, Loss, OptimConfig, Split, Strategy};
/// let dev = || tandem::Device::from_backend(Arc::new(tandem::backend::cpu::CpuBackend::new()));
/// let model = tandem::nn::models::SeedModel::Cnn.build(0, &dev())?;
/// let opt = OptimConfig::sgd(Default::default());
/// let mut lp = LayerPlacement::new(&model, &[dev(), dev()], Split::At(vec![6]), &opt, Loss::CrossEntropy)?;
/// let data = tandem::data::synthetic::seed_images(4, 0)?;
/// let report = lp.step(&data.batch(&[0, 1, 2, 3])?)?;
/// assert!(report.loss.is_finite());
/// # Ok(()) }
/// ```
pub struct LayerPlacement {
    stages: Vec<Stage>,
    opt: OptimConfig,
    run: StepCore,
    /// `Split::Auto` still has to measure layer times on the first batch.
    balance_pending: bool,
}

impl LayerPlacement {
    /// `model`'s layers cut at `split`, one stage per device. [`Parallel::layers`](super::Parallel::layers)
    /// builds the same from [`Stages`] (it calls [`with_stages`](Self::with_stages)).
    pub fn new(model: &Sequential, devices: &[Device], split: Split, opt: &OptimConfig, loss: Loss) -> Result<Self> {
        Self::with_stages(Stages::Split(model, split), devices, opt, loss)
    }
    /// Stages as `stages` describes (a split `Sequential`, or the user's stage modules).
    pub fn with_stages(stages: Stages, devices: &[Device], opt: &OptimConfig, loss: Loss) -> Result<Self> {
        let (stages, balance_pending) = build_stages(stages, devices, opt)?;
        Ok(LayerPlacement { stages, opt: opt.clone(), run: StepCore::new(loss, devices), balance_pending })
    }
    /// The layer range of each stage, in device order.
    pub fn ranges(&self) -> Vec<Range<usize>> {
        self.stages.iter().map(|s| s.range.clone()).collect()
    }
    fn forward(&self, x: &Tensor, mut on_stage: impl FnMut(usize, Instant, f64, f64)) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, s) in self.stages.iter().enumerate() {
            let t0 = Instant::now();
            h = h.to(&s.device)?;
            let comm = t0.elapsed().as_secs_f64();
            h = self.run.forward(&s.model, &h, 0).map_err(|e| e.in_worker("placement stage", i, &s.device))?;
            on_stage(i, t0, comm, t0.elapsed().as_secs_f64());
        }
        Ok(h)
    }
}

impl Strategy for LayerPlacement {
    fn autocasts(&self) -> bool {
        true
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        if self.balance_pending {
            let probe = probe_input(batch, 4, &self.stages[0].device)?;
            rebalance(&mut self.stages, &probe, &self.opt)?;
            self.balance_pending = false;
        }
        let t0 = Instant::now();
        let first = &self.stages[0].device;
        let last = &self.stages[self.stages.len() - 1].device;
        let (x, _) = batch_to_device(batch, first)?;
        let (_, y) = batch_to_device(batch, last)?;
        let mut comm_s = 0.0;
        let tracks: Vec<String> = (0..self.stages.len()).map(|i| track_name(i, &self.stages[i].device)).collect();
        let trace = self.run.trace.clone();
        let out = self.forward(&x, |i, start, comm, total| {
            comm_s += comm;
            if let Some(tr) = &trace {
                tr.span(&tracks[i], "forward", Phase::Forward, start, total);
            }
        })?;
        let loss = self.run.loss_share(&out, &y, batch.len(), batch.len())?;
        for s in &self.stages {
            s.zero_grad();
        }
        let tb = Instant::now();
        loss.backward()?;
        if let Some(tr) = &trace {
            // One backward crosses every device; it is drawn on the last stage, where it starts.
            tr.span(&tracks[tracks.len() - 1], "backward (all stages)", Phase::Backward, tb, tb.elapsed().as_secs_f64());
        }
        let parts = self.stages.iter_mut().enumerate().flat_map(|(i, s)| s.parts(i)).collect();
        let (grad_norm, _) = self.run.update(NormOver::Parts, None, parts, None)?;
        let value = loss.to_scalar()?;
        let wall = t0.elapsed().as_secs_f64();
        Ok(StepReport {
            loss: value,
            wall_s: wall,
            compute_s: wall - comm_s,
            comm_s,
            overlap: 0.0,
            peak_memory: self.stages.iter().map(|s| s.device.memory().peak).collect(),
            grad_norm,
        })
    }
    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to(&self.stages[0].device)?;
        let out = crate::autograd::no_grad(|| self.forward(&x, |_, _, _, _| {}))?;
        out.to(&self.stages[0].device)
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        stage_params(&self.stages)
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        load_stage_params(&self.stages, state)
    }
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        stage_opt_state(&self.stages)
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        load_stage_opt_state(&mut self.stages, state, steps)
    }
    fn modules(&self) -> Vec<&dyn Module> {
        self.stages.iter().map(|s| &s.model as &dyn Module).collect()
    }
    fn core(&self) -> &StepCore {
        &self.run
    }
    fn core_mut(&mut self) -> &mut StepCore {
        &mut self.run
    }
}
