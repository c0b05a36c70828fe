//! [`Replica`]: one copy of the model over a row of devices (a pipeline's stages, a
//! tensor-parallel group), as the data axis of a [`DataGrid`](super::DataGrid) replicates it.
//!
//! A replica's devices are its *slots*: slot `s` of every replica holds the same parameters
//! (stage `s`'s layers, or tensor rank `s`'s shards), so the data axis reduces gradients slot by
//! slot, over one communicator per slot, whatever the replica does inside. That is how one
//! data-parallel grid serves every layout that replicates a multi-device model.
use super::pipeline::PartRun;
use super::{Pipeline, StepReport, Strategy, TensorParallel, TensorParallelGpt};
use crate::data::Batch;
use crate::optim::Optimizer;
use crate::{Device, Result, Tensor};
use std::time::Instant;

mod sealed {
    /// Only tandem's strategies are replicas: the grid relies on each one's slot layout.
    pub trait Sealed {}
}

/// One copy of the model over the devices of a row, which a [`DataGrid`](super::DataGrid)
/// trains as data parallelism: a [`Pipeline`] (data × pipeline), a [`TensorParallelGpt`] or a
/// [`TensorParallel`] (data × tensor). Sealed: the grid relies on how each lays out its
/// parameters over its devices.
pub trait Replica: Strategy + sealed::Sealed {
    /// What the grid calls a replica of this kind in its errors (`pipeline`, `tensor group`).
    fn kind(&self) -> &'static str;
    /// Forward and backward of `part`, samples `first..` of a global batch of `total` (its loss
    /// weighted `len / total`, dropout keyed by global sample index), gradients accumulated from
    /// zero; no update. Returns the part's share of the batch's mean loss.
    #[doc(hidden)]
    fn backward_share(&mut self, part: &Batch, first: usize, total: usize) -> Result<f32>;
    /// The parameters each slot trains, slot by slot (device order), every parameter of the
    /// model in exactly one slot: the data axis all-reduces slot `s`'s over the replicas, and
    /// replica 0's, concatenated, are the model's for the global norm.
    #[doc(hidden)]
    fn slot_params(&self) -> Vec<Vec<(String, Tensor)>>;
    /// Every optimizer with its device and trace track, for the grid's one update.
    #[doc(hidden)]
    fn optimizers(&mut self) -> Vec<(&mut Box<dyn Optimizer>, &Device, Option<String>)>;
    /// The whole model's optimizer state, as [`Strategy::optimizer_state`] gives it, from
    /// `per_slot[s]`, what slot `s`'s optimizer would hold: how a grid whose data axis shards
    /// the optimizer state (ZeRO) saves it in the unsplit model's names and shapes.
    #[doc(hidden)]
    fn state_of_slots(&self, per_slot: Vec<(Vec<(String, Tensor)>, u64)>) -> Result<(Vec<(String, Tensor)>, u64)>;
    /// Each slot's part of a whole optimizer state (a slot of one whole device may be given
    /// more: its optimizer picks its own names), slot order.
    #[doc(hidden)]
    fn slots_of_state(&self, state: &[(String, Tensor)]) -> Result<Vec<Vec<(String, Tensor)>>>;
    /// After the grid's update: what the replica keeps in step (tied copies), and the step count.
    #[doc(hidden)]
    fn updated(&mut self, step: u64) -> Result<()> {
        self.core_mut().step = step;
        Ok(())
    }
    /// The step's report for this replica's share, begun at `t0`, the update done.
    #[doc(hidden)]
    fn share_report(&mut self, loss: f32, grad_norm: Option<f32>, t0: Instant) -> StepReport {
        let wall = t0.elapsed().as_secs_f64();
        let peak_memory = self.core().devices().iter().map(|d| d.memory().peak).collect();
        StepReport { loss, wall_s: wall, compute_s: wall, peak_memory, grad_norm, ..Default::default() }
    }
    /// The pipeline inside, whose layer cuts the grid keeps equal over the replicas.
    #[doc(hidden)]
    fn as_pipeline_mut(&mut self) -> Option<&mut Pipeline> {
        None
    }
}

impl sealed::Sealed for Pipeline {}
impl sealed::Sealed for TensorParallelGpt {}
impl sealed::Sealed for TensorParallel {}

impl Replica for Pipeline {
    fn kind(&self) -> &'static str {
        "pipeline"
    }
    fn backward_share(&mut self, part: &Batch, first: usize, total: usize) -> Result<f32> {
        let run: PartRun = self.backward_part(part, first, total)?;
        let loss = run.loss();
        self.share_run = Some(run);
        Ok(loss)
    }
    fn slot_params(&self) -> Vec<Vec<(String, Tensor)>> {
        self.trained_params()
    }
    fn optimizers(&mut self) -> Vec<(&mut Box<dyn Optimizer>, &Device, Option<String>)> {
        self.parts().into_iter().map(|p| (p.opt, p.device, p.track)).collect()
    }
    fn state_of_slots(&self, per_slot: Vec<(Vec<(String, Tensor)>, u64)>) -> Result<(Vec<(String, Tensor)>, u64)> {
        let mut per_slot = per_slot.into_iter();
        let (mut all, mut steps) = (Vec::new(), 0);
        for stage in self.stage_list() {
            let (state, n) = stage.opt_state_of(per_slot.by_ref().take(stage.devices().len()).collect())?;
            all.extend(state);
            steps = n;
        }
        Ok((all, steps))
    }
    fn slots_of_state(&self, state: &[(String, Tensor)]) -> Result<Vec<Vec<(String, Tensor)>>> {
        Ok(self.stage_list().iter().map(|s| s.opt_state_slices(state)).collect::<Result<Vec<_>>>()?.concat())
    }
    fn updated(&mut self, step: u64) -> Result<()> {
        Pipeline::updated(self, step)
    }
    fn share_report(&mut self, loss: f32, grad_norm: Option<f32>, t0: Instant) -> StepReport {
        match self.share_run.take() {
            Some(run) => self.report(&run, grad_norm),
            None => StepReport { loss, wall_s: t0.elapsed().as_secs_f64(), grad_norm, ..Default::default() },
        }
    }
    fn as_pipeline_mut(&mut self) -> Option<&mut Pipeline> {
        Some(self)
    }
}
