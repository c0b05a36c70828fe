//! Pipeline parallelism: layer stages on different devices, each driven by its own thread,
//! working on micro-batches in a GPipe or 1F1B order; gradients accumulate over micro-batches
//! and each stage's optimizer steps once per batch.
mod balance;
mod remote;
mod schedule;
mod tied;
mod tied_across;
mod worker;
pub use worker::graph_bytes;

pub use schedule::{schedule, simulate, simulate_stages, theoretical_bubble, Action, Plan, Schedule, Simulation};
pub use tied::StageParam;

use super::stages::{self, Stage, Stages};
use super::step::{NormOver, Part, StepCore};
use super::{Loss, OptimConfig, StepReport, Strategy};
use crate::data::Batch;
use crate::dist::Group;
use crate::nn::Module;
use crate::{Device, Error, Result, Tensor};
use balance::Balance;
use remote::Across;
use std::sync::mpsc::channel;
use std::time::Instant;
use worker::{Job, Links, Outcome};

/// Pipeline options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Keep only each stage's input during forward and redo the forward before backward
    /// (activation recomputation): less memory, about one more forward of compute.
    pub recompute: bool,
}

/// What the last step measured, per stage in device order.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PipelineStats {
    /// Seconds each stage spent computing or copying its inputs in.
    pub busy_s: Vec<f64>,
    /// Seconds each stage waited, from the step's start until the last stage finished.
    pub idle_s: Vec<f64>,
    /// Total idle over total stage time (`stages × span`).
    pub bubble_measured: f64,
    /// `(p-1)/(m+p-1)`, the bubble of equal stages with free communication.
    pub bubble_theoretical: f64,
    /// The bubble this schedule gives stages as unequal as measured (each stage's busy time
    /// spread evenly over its micro-batches, forwards and backwards as measured) with free
    /// communication and no fixed costs: above `bubble_theoretical` by the split's imbalance,
    /// below `bubble_measured` by the overheads. `None` when the stages span processes.
    pub bubble_of_split: Option<f64>,
    /// Most bytes of saved activations alive at once on each stage.
    pub peak_activation_bytes: Vec<u64>,
}

/// Pipeline-parallel training over one stage per device: a `Sequential` split by
/// [`Split`](super::Split), or the user's stage modules ([`Stages::Built`]).
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use std::sync::Arc;
/// use tandem::parallel::pipeline::{Pipeline, Schedule};
/// use tandem::parallel::{Loss, OptimConfig, Split, Stages, Strategy};
/// let dev = || tandem::Device::from_backend(Arc::new(tandem::backend::cpu::CpuBackend::new()));
/// let model = tandem::nn::models::SeedModel::Cnn.build(0, &dev())?;
/// let opt = OptimConfig::sgd(Default::default());
/// let mut pipe = Pipeline::builder(Stages::Split(&model, Split::At(vec![6])), &[dev(), dev()], &opt, Loss::CrossEntropy)
///     .micro_batches(2)
///     .schedule(Schedule::OneFOneB)
///     .build()?;
/// let data = tandem::data::synthetic::seed_images(4, 0)?;
/// pipe.step(&data.batch(&[0, 1, 2, 3])?)?;
/// let stats = pipe.last_stats().expect("one step ran");
/// assert_eq!(stats.busy_s.len(), 2);
/// # Ok(()) }
/// ```
pub struct Pipeline {
    stages: Vec<Stage>,
    micro_batches: usize,
    schedule: Schedule,
    plan: Vec<Vec<Action>>,
    opt: OptimConfig,
    run: StepCore,
    cfg: PipelineConfig,
    balance: Balance,
    stats: Option<PipelineStats>,
    /// Where this rank's stages sit when the pipeline spans processes.
    across: Option<Across>,
    ties: tied::Ties,
    /// Every rank's weights, gathered by `gather_full` across processes, until the next step.
    full: Option<Vec<(String, Tensor)>>,
    /// The last share a data-parallel grid ran (`Replica::backward_share`), until its report.
    pub(in crate::parallel) share_run: Option<PartRun>,
}

/// The options of a [`Pipeline`] before it is built; defaults: 1 micro-batch, 1F1B, no
/// recomputation, no clipping.
pub struct PipelineBuilder<'a> {
    stages: Stages<'a>,
    devices: Vec<Device>,
    opt: OptimConfig,
    loss: Loss,
    micro_batches: usize,
    schedule: Schedule,
    cfg: PipelineConfig,
    clip: Option<f32>,
    group: Option<Group>,
    ties: Vec<(StageParam, StageParam)>,
    /// What `Strategy::set_precision` is given at build (set by `build.rs`'s `precision`).
    pub(in crate::parallel) precision: (crate::optim::Precision, Option<crate::optim::GradScaler>),
}

impl PipelineBuilder<'_> {
    /// Micro-batches per batch (they must divide it evenly).
    pub fn micro_batches(mut self, m: usize) -> Self {
        self.micro_batches = m;
        self
    }
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }
    /// Keep only each stage's input during forward and redo the forward before backward.
    pub fn recompute(mut self, recompute: bool) -> Self {
        self.cfg.recompute = recompute;
        self
    }
    pub fn config(mut self, cfg: PipelineConfig) -> Self {
        self.cfg = cfg;
        self
    }
    /// Stages on the ranks of `group` (`mpirun`): every rank builds the pipeline with its own
    /// stages (`Stages::Built` of its part, or a `Split::At` of it) and devices; rank 0 holds
    /// the first stages, the last rank the last. Activations and gradients cross processes by
    /// `Group::send`/`recv`; every rank calls `step` with the same batch. Parameters tied
    /// across ranks (a GPT's embedding on the first rank, its head on the last, from
    /// [`Gpt::stages_of`](crate::nn::models::Gpt::stages_of)) stay one parameter: the copy's
    /// gradient is summed into the primary's rank before clipping and the update, and the
    /// new value sent back. A group of one changes nothing.
    pub fn across(mut self, group: &Group) -> Self {
        self.group = Some(group.clone());
        self
    }
    /// Global-norm gradient clipping (as `Strategy::set_grad_clip`).
    pub fn grad_clip(mut self, max_norm: Option<f32>) -> Self {
        self.clip = max_norm;
        self
    }
    /// Ties `copy` to `primary`, each `(stage index, name in that stage's state_dict)`, for
    /// stages whose modules do not declare it themselves (the pipeline ties every pair that
    /// [`Module::tied_parameters`] of a stage declares, as [`Gpt::stages`](crate::nn::models::Gpt::stages)'
    /// output projection does): one parameter held by two stages, such as a language model's token embedding (first stage)
    /// and output projection (last stage). The copy starts as the primary's value, its
    /// gradient is moved into the primary's after the backward of every micro-batch (so the
    /// optimizers, clipping and weight decay see the parameter once, and keep no state for the
    /// copy), and after each update it takes the primary's new value: the two stay
    /// bit-identical. Needs fixed stages
    /// (`Stages::Built` or `Split::At`). Across processes ([`across`](Self::across)) the stage
    /// indices count every rank's stages, and every rank must be given the same ties.
    pub fn tie(mut self, primary: (usize, &str), copy: (usize, &str)) -> Self {
        self.ties.push(((primary.0, primary.1.to_string()), (copy.0, copy.1.to_string())));
        self
    }
    /// Builds the stages. Errors (before any work) on zero micro-batches, more devices than
    /// layers, a split point that does not exist, a stage whose weights, gradients and
    /// optimizer state cannot fit its device's memory, built stages off their devices, or a
    /// tie that names no parameter, pairs tensors of different shapes, or sits in stages that
    /// `Split::Auto` may still move.
    pub fn build(self) -> Result<Pipeline> {
        if self.micro_batches == 0 {
            return Err(Error::invalid("Pipeline", "micro_batches must be at least 1"));
        }
        let spread = self.group.filter(|g| g.size() > 1);
        if spread.is_some() {
            remote::check_options(matches!(self.stages, Stages::Split(_, stages::Split::Auto)), self.micro_batches)?;
        }
        let (stages, balance_pending) = stages::build_stages(self.stages, &self.devices, &self.opt)?;
        let across = spread.map(|g| Across::place(&g, stages.len())).transpose()?;
        let ties = tied::Ties::new(&stages, self.ties, across.as_ref(), balance_pending)?;
        let plan = match &across {
            Some(a) => schedule::schedule(self.schedule, a.total, self.micro_batches)[a.first..a.first + stages.len()].to_vec(),
            None => schedule::schedule(self.schedule, stages.len(), self.micro_batches),
        };
        let devices: Vec<Device> = stages.iter().flat_map(|s| s.devices()).collect();
        let mut run = StepCore::new(self.loss, &devices);
        run.set_clip(self.clip)?;
        run.set_precision(self.precision.0, self.precision.1);
        Ok(Pipeline {
            stages,
            micro_batches: self.micro_batches,
            schedule: self.schedule,
            plan,
            opt: self.opt,
            run,
            cfg: self.cfg,
            balance: if balance_pending { Balance::Pending } else { Balance::Fixed },
            stats: None,
            across,
            ties,
            full: None,
            share_run: None,
        })
    }
}

impl Pipeline {
    /// Starts a pipeline of `stages` over `devices` (one stage each), each stage with its own
    /// optimizer from `opt`, training on `loss`.
    pub fn builder<'a>(stages: Stages<'a>, devices: &[Device], opt: &OptimConfig, loss: Loss) -> PipelineBuilder<'a> {
        PipelineBuilder {
            stages,
            devices: devices.to_vec(),
            opt: opt.clone(),
            loss,
            micro_batches: 1,
            schedule: Schedule::OneFOneB,
            cfg: PipelineConfig::default(),
            clip: None,
            group: None,
            ties: Vec::new(),
            precision: Default::default(),
        }
    }
    /// Each stage's action list.
    pub fn plan(&self) -> &[Vec<Action>] {
        &self.plan
    }
    pub fn schedule_kind(&self) -> Schedule {
        self.schedule
    }
    /// The layer range of each stage, in device order.
    pub fn ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.stages.iter().map(|s| s.range.clone()).collect()
    }
    /// Whether a `Split::Auto` split is still to be measured (at the first step).
    pub(crate) fn split_pending(&self) -> bool {
        matches!(self.balance, Balance::Pending)
    }
    /// Measures the `Split::Auto` split on `part` now, as the first step would, and fixes it
    /// there: a [`PipelineGrid`](crate::parallel::PipelineGrid) measures one replica and gives
    /// the others its cut ([`Pipeline::fix_split`]), because replicas timed apart can disagree.
    pub(crate) fn measure_split(&mut self, part: &Batch) -> Result<()> {
        self.balance.first_split(&mut self.stages, part, self.micro_batches, &self.opt)?;
        self.balance = Balance::Fixed;
        Ok(())
    }
    /// Moves layers so that stage `s` holds `ranges[s]`, and keeps them there.
    pub(crate) fn fix_split(&mut self, ranges: &[std::ops::Range<usize>]) -> Result<()> {
        stages::resplit_to(&mut self.stages, ranges, &self.opt)?;
        self.balance = Balance::Fixed;
        Ok(())
    }
    /// Measurements of the last step, `None` before the first.
    pub fn last_stats(&self) -> Option<&PipelineStats> {
        self.stats.as_ref()
    }
}

/// Micro-batches must cut a batch of `n` into equal non-empty parts.
pub(crate) fn check_micro_batches(n: usize, m: usize) -> Result<()> {
    if n == 0 || !n.is_multiple_of(m) {
        return Err(Error::invalid("Pipeline::step", format!("{m} micro-batches do not divide a batch of {n} samples evenly")));
    }
    Ok(())
}

/// The batch cut into `m` equal micro-batches along the sample dimension.
fn split_batch(batch: &Batch, m: usize) -> Result<Vec<Batch>> {
    let n = batch.len();
    check_micro_batches(n, m)?;
    let k = n / m;
    (0..m).map(|i| batch.slice(i * k..(i + 1) * k)).collect()
}

/// Picks the error that explains a failed step: a stage's own failure over the closed
/// channels it causes in the others.
fn first_cause(results: Vec<Result<Outcome>>) -> Result<Vec<Outcome>> {
    let mut errors = Vec::new();
    let mut ok = Vec::new();
    for r in results {
        match r {
            Ok(o) => ok.push(o),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        return Ok(ok);
    }
    let knock_on = |e: &Error| matches!(e.root_cause(), Error::ChannelClosed { .. });
    let pos = errors.iter().position(|e| !knock_on(e)).unwrap_or(0);
    Err(errors.swap_remove(pos))
}

/// One forward and backward of a batch (or a data-parallel share of one) through the stages.
pub(crate) struct PartRun {
    outcomes: Vec<Outcome>,
    start: Instant,
}

impl PartRun {
    /// The part's loss: its share of the global batch's mean loss.
    pub fn loss(&self) -> f32 {
        self.outcomes.last().map_or(0.0, |o| o.loss)
    }
}

impl Pipeline {
    /// Forward and backward of `part`, samples `first..` of a global batch of `total` (so its
    /// loss is weighted `len / total` and dropout masks are keyed by global sample index),
    /// through every stage, gradients accumulated from zero and tied gradients summed. No
    /// update: `step`, or a data-parallel grid around pipelines, does it.
    pub(crate) fn backward_part(&mut self, part: &Batch, first: usize, total: usize) -> Result<PartRun> {
        let micro = split_batch(part, self.micro_batches)?;
        self.full = None;
        self.balance.first_split(&mut self.stages, part, self.micro_batches, &self.opt)?;
        let firsts: Vec<usize> = micro.iter().scan(first, |at, b| Some(std::mem::replace(at, *at + b.len()))).collect();
        for s in &self.stages {
            s.zero_grad();
        }
        self.ties.clear_copy_grads();
        let p = self.stages.len();
        let mut links: Vec<Links> = (0..p).map(|_| Links::default()).collect();
        for s in 0..p.saturating_sub(1) {
            let (act_tx, act_rx) = channel();
            let (grad_tx, grad_rx) = channel();
            links[s].act_out = Some(Box::new(act_tx));
            links[s].grad_in = Some(Box::new(grad_rx));
            links[s + 1].act_in = Some(Box::new(act_rx));
            links[s + 1].grad_out = Some(Box::new(grad_tx));
        }
        let (first_stage, stages_total) = self.across.as_ref().map_or((0, p), |a| (a.first, a.total));
        if let Some(a) = &self.across {
            a.link_ends(&mut links, &self.stages[0].device, &self.stages[p - 1].device)?;
        }
        let names: Vec<String> = self.stages.iter().map(|s| s.device.to_string()).collect();
        let start = Instant::now();
        let results: Vec<Result<Outcome>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .stages
                .iter_mut()
                .zip(links)
                .zip(&self.plan)
                .enumerate()
                .map(|(index, ((stage, links), actions))| {
                    let job = Job {
                        index: first_stage + index,
                        last: first_stage + index + 1 == stages_total,
                        track: stages::track_name(index, &stage.device),
                        stage,
                        actions,
                        micro_batches: &micro,
                        firsts: &firsts,
                        total,
                        run: &self.run,
                        recompute: self.cfg.recompute,
                        trace: self.run.trace.clone(),
                        links,
                    };
                    scope.spawn(move || job.run())
                })
                .collect();
            // A panicking stage drops its channel ends while unwinding, so its neighbours see
            // closed channels and stop too: nothing waits forever.
            handles
                .into_iter()
                .zip(&names)
                .enumerate()
                .map(|(i, (h, dev))| h.join().unwrap_or_else(|p| Err(Error::panicked(p))).map_err(|e| e.in_worker(worker::STAGE, i, dev)))
                .collect()
        });
        let outcomes = first_cause(results)?;
        self.ties.sum_grads(self.across.as_ref())?;
        Ok(PartRun { outcomes, start })
    }

    /// The parameters each device's optimizer trains (tied copies left out), in device order
    /// (stage by stage, a tensor-parallel stage's group in order).
    pub(crate) fn trained_params(&self) -> Vec<Vec<(String, Tensor)>> {
        let trained = |slot: Vec<(String, Tensor)>| slot.into_iter().filter(|(_, t)| !self.ties.is_copy(t)).collect();
        self.stages.iter().flat_map(|s| s.slot_params()).map(trained).collect()
    }

    /// The stages this process holds.
    pub(crate) fn stage_list(&self) -> &[Stage] {
        &self.stages
    }

    /// Every device's optimizer, for the update, with its trace track.
    pub(crate) fn parts(&mut self) -> Vec<Part<'_>> {
        self.stages.iter_mut().enumerate().flat_map(|(i, s)| s.parts(i)).collect()
    }

    /// After an update by a grid around this pipeline: the tied copies take their primaries'
    /// new values, and the step count follows the grid's.
    pub(crate) fn updated(&mut self, step: u64) -> Result<()> {
        self.ties.sync(self.across.as_ref())?;
        self.run.step = step;
        Ok(())
    }

    /// What [`PipelineStats::bubble_of_split`] says, from the stages' measured times.
    fn bubble_of_split(&self, outcomes: &[Outcome]) -> Option<f64> {
        if self.across.is_some() {
            return None;
        }
        let m = self.micro_batches as f64;
        let share = |o: &Outcome| if o.compute_s > 0.0 { o.forward_s / o.compute_s } else { 0.5 };
        let forward: Vec<f64> = outcomes.iter().map(|o| (o.compute_s + o.comm_s) * share(o) / m).collect();
        let backward: Vec<f64> = outcomes.iter().map(|o| (o.compute_s + o.comm_s) * (1.0 - share(o)) / m).collect();
        simulate_stages(&self.plan, self.micro_batches, &forward, &backward).ok().map(|s| s.bubble)
    }

    /// The step's report and `last_stats` from a part's run, the update done.
    pub(crate) fn report(&mut self, run: &PartRun, grad_norm: Option<f32>) -> StepReport {
        let (outcomes, start, p) = (&run.outcomes, run.start, self.stages.len());
        let span = outcomes.iter().map(|o| o.end.duration_since(start).as_secs_f64()).fold(0.0, f64::max);
        let busy: Vec<f64> = outcomes.iter().map(|o| o.compute_s + o.comm_s).collect();
        let idle: Vec<f64> = busy.iter().map(|b| (span - b).max(0.0)).collect();
        self.stats = Some(PipelineStats {
            bubble_measured: if span > 0.0 { idle.iter().sum::<f64>() / (p as f64 * span) } else { 0.0 },
            bubble_theoretical: theoretical_bubble(p, self.micro_batches),
            bubble_of_split: self.bubble_of_split(outcomes),
            peak_activation_bytes: outcomes.iter().map(|o| o.peak_activation_bytes).collect(),
            busy_s: busy,
            idle_s: idle,
        });
        StepReport {
            loss: run.loss(),
            wall_s: start.elapsed().as_secs_f64(),
            compute_s: outcomes.iter().map(|o| o.compute_s).fold(0.0, f64::max),
            comm_s: outcomes.iter().map(|o| o.comm_s).sum(),
            overlap: 0.0,
            peak_memory: self.run.devices.iter().map(|d| d.memory().peak).collect(),
            grad_norm,
        }
    }
}

impl Strategy for Pipeline {
    fn autocasts(&self) -> bool {
        true
    }
    fn computes_on_caller(&self) -> bool {
        false
    }
    fn check_batch_size(&self, n: usize) -> Result<()> {
        check_micro_batches(n, self.micro_batches)
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        self.balance.correct(&mut self.stages, &self.opt)?;
        let run = self.backward_part(batch, 0, batch.len())?;
        self.balance.measured(&run.outcomes);
        // Across processes the norm spans every rank's stages.
        let across = self.across.as_ref().map(|a| a.group.clone());
        let reduce = |sq: f64| remote::sum_over_ranks(across.as_ref().expect("only across processes"), sq);
        let parts = self.stages.iter_mut().enumerate().flat_map(|(i, s)| s.parts(i)).collect();
        let (grad_norm, _) = self.run.update(NormOver::Parts, across.as_ref().map(|_| &reduce as &dyn Fn(f64) -> Result<f64>), parts, None)?;
        self.ties.sync(self.across.as_ref())?;
        let mut report = self.report(&run, grad_norm);
        if let Some(a) = &self.across {
            report.loss = a.share_loss(report.loss)?;
        }
        Ok(report)
    }
    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to(&self.stages[0].device)?;
        let mine = |x: &Tensor| {
            let mut h = x.clone();
            for s in &self.stages {
                h = self.run.forward(&s.model, &h.to(&s.device)?, 0)?;
            }
            h.to(&self.stages[0].device)
        };
        crate::autograd::no_grad(|| match &self.across {
            Some(a) => remote::forward_across(&a.group, &x, &self.stages[0].device, mine),
            None => mine(&x),
        })
    }
    /// Across processes, every rank's stages gathered on every rank (collective), the other
    /// ranks' tensors on the CPU.
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        if let Some(full) = &self.full {
            return Ok(full.clone());
        }
        let mine = stages::stage_params(&self.stages)?;
        match &self.across {
            Some(a) => a.group.all_gather_named(&mine),
            None => Ok(mine),
        }
    }
    /// Across processes, every rank's weights gathered here (collective), so that rank 0 alone
    /// can then take `state_dict` (until the next step).
    fn gather_full(&mut self) -> Result<()> {
        if self.across.is_some() {
            self.full = None;
            self.full = Some(self.state_dict()?);
        }
        Ok(())
    }
    /// Across processes the stages' state is gathered from every rank.
    fn state_is_collective(&self) -> bool {
        self.across.is_some()
    }
    /// Strict over every stage; a tied copy may be left out (it is filled from its primary).
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.full = None;
        let state = self.ties.complete_state(state)?;
        match &self.across {
            Some(a) => {
                let names = stages::stage_names(&self.stages);
                a.load(&names, &state, |own| stages::load_stage_params(&self.stages, own))
            }
            None => stages::load_stage_params(&self.stages, &state),
        }
    }
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        let (mine, steps) = stages::stage_opt_state(&self.stages)?;
        match &self.across {
            Some(a) => Ok((a.group.all_gather_named(&mine)?, steps)),
            None => Ok((mine, steps)),
        }
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        stages::load_stage_opt_state(&mut self.stages, state, steps)
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
