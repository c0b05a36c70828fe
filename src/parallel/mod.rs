//! Running training on one or many devices: the `Strategy` trait every parallel scheme
//! implements, the single-device strategy, collectives, and the trace of device timelines.
//!
//! A strategy owns the model replicas/stages and their optimizers; the caller hands it host
//! batches. All strategies give the same losses and weights as `Single` on one device, within
//! floating-point tolerance (bit for bit where a strategy documents determinism).
#![doc = include_str!("strategies.md")]
mod build;
pub mod comm;
mod data_parallel;
mod grid;
mod loss;
pub mod pipeline;
mod placement;
pub mod plan;
mod replica;
mod split;
mod stages;
mod step;
mod tensor_parallel;
pub mod trace;

pub use build::{DataBuilder, DataTensorBuilder, GridBuilder, LayersBuilder, Parallel, SingleBuilder, TensorBuilder, TensorModel};
pub use data_parallel::{assign_buckets, DataParallel, DataParallelConfig, DeviceSpans, GatherStats, Gathers, Overlap, Shard, StepEvent};
pub use grid::{DataGrid, PipelineGrid};
pub use loss::{batch_to_device, inputs_to_device, Loss, LossFn};
pub use pipeline::{Pipeline, PipelineBuilder, PipelineConfig, Schedule};
pub use placement::LayerPlacement;
pub use replica::Replica;
pub use split::proportional_split;
pub use stages::{plan_stages, Split, Stages};
pub use tensor_parallel::{ColumnParallelLinear, ParallelMlp, RowParallelLinear, ShardedStage, TensorParallel, TensorParallelGpt};

use crate::data::Batch;
use crate::nn::Module;
pub use crate::optim::OptimConfig;
use crate::optim::Optimizer;
use crate::{Device, Error, Result, Tensor};
use std::time::Instant;
pub use step::StepCore;
use step::{NormOver, Part};

/// What one optimizer step measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StepReport {
    /// The global batch's mean loss, as the single-device forward computes it.
    pub loss: f32,
    /// Wall time of the whole step, seconds.
    pub wall_s: f64,
    /// Seconds spent computing (forward, backward, update), the slowest device's.
    pub compute_s: f64,
    /// Seconds spent in collectives or cross-device copies. Overlapped data parallelism times
    /// its all-reduces on each device's own timeline (wgpu timestamp queries, CUDA events; the
    /// host clock on CPU devices), see `DataParallel::last_overlap`.
    pub comm_s: f64,
    /// Fraction of communication that ran while backward was still computing (0 when none),
    /// measured on the same timeline as `comm_s`.
    pub overlap: f64,
    /// Peak bytes allocated per device during the step, in device order.
    pub peak_memory: Vec<u64>,
    /// The global gradient norm before clipping, over every parameter once (all stages and
    /// shards, replicas counted once); `None` when clipping is off.
    pub grad_norm: Option<f32>,
}

/// A way of running training steps on a set of devices.
pub trait Strategy: Send {
    /// One optimizer step on a global batch (forward, loss, backward, update).
    fn step(&mut self, batch: &Batch) -> Result<StepReport>;
    /// The model's outputs for inputs `x` (`[batch, ...]`, f32 features or I32 token ids,
    /// on any device: they are copied to the first), with no gradients, on the first device:
    /// PyTorch's `model(x)` under `torch.no_grad()`. No targets are needed;
    /// [`inputs_to_device`] makes `x` from a [`Batch`]. Dropout follows the training mode
    /// ([`Strategy::set_training`]).
    fn predict(&self, x: &Tensor) -> Result<Tensor>;
    /// The full model's weights with their state_dict names (gathered when sharded).
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>>;
    /// Overwrites the weights on every device from `state`.
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()>;
    /// Optimizer state (`name.momentum_buffer`, ...) and its step count, gathered.
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)>;
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()>;
    /// Keeps the whole model on this process until the next step, so that `predict` and
    /// `state_dict` need no other process (FSDP's `summon_full_params`): what a job calls on
    /// every rank before rank 0 alone evaluates and saves. Only ZeRO-3 has anything to gather
    /// (a collective across processes); the default does nothing.
    fn gather_full(&mut self) -> Result<()> {
        Ok(())
    }
    /// Whether `state_dict` and `optimizer_state` are collectives across processes (state
    /// sharded over the ranks): then every rank calls them when rank 0 saves a checkpoint.
    fn state_is_collective(&self) -> bool {
        false
    }
    /// Every module the strategy runs (each replica, stage or shard's part), for what is
    /// set on all of them alike: the training mode.
    fn modules(&self) -> Vec<&dyn Module>;
    /// What every strategy holds alike: devices, loss, clipping bound, learning rate, trace
    /// and step count. The methods below are written once over it.
    fn core(&self) -> &StepCore;
    fn core_mut(&mut self) -> &mut StepCore;
    /// The devices the strategy runs on (this process's, where it spans several).
    fn devices(&self) -> Vec<Device> {
        self.core().devices().to_vec()
    }
    /// Attach a trace: from now on each step records its device timelines there.
    fn set_trace(&mut self, trace: trace::Trace) {
        self.core_mut().trace = Some(trace);
    }
    /// The learning rate of every optimizer (every replica, stage and shard) from the next
    /// update on.
    fn set_lr(&mut self, lr: f32) {
        self.core_mut().lr = Some(lr);
    }
    /// Clip gradients to this global norm before each update (PyTorch's `clip_grad_norm_`
    /// over the whole model), or not at all.
    fn set_grad_clip(&mut self, max_norm: Option<f32>) -> Result<()> {
        self.core_mut().set_clip(max_norm)
    }
    /// Trains in `precision` from the next step (see [`Precision`](crate::optim::Precision)):
    /// forwards under `autocast` in the half types, and with F16 a loss scaler (`scaler`, or
    /// PyTorch's defaults). Evaluation (`predict`) stays F32. Every strategy of tandem's takes
    /// a half precision (one device, data parallelism with any sharding, layers, pipelines and
    /// their grid, tensor parallelism); a strategy of one's own whose forwards do not go through
    /// [`StepCore`] says so (`Strategy::autocasts`).
    fn set_precision(&mut self, precision: crate::optim::Precision, scaler: Option<crate::optim::GradScaler>) -> Result<()> {
        if precision != crate::optim::Precision::F32 && !self.autocasts() {
            return Err(Error::invalid(
                "set_precision",
                format!("{} training needs forwards under StepCore's autocast (Strategy::autocasts); this strategy trains in f32", precision.name()),
            ));
        }
        self.core_mut().set_precision(precision, scaler);
        Ok(())
    }
    /// What kind of strategy this is, as the [`Trainer`](crate::train::Trainer) records it in
    /// every checkpoint and a resume must repeat it: by default the type's name (`Single`,
    /// `DataParallel`, `Pipeline`, ...). The devices and data parallelism's sharding are not
    /// part of it: a checkpoint resumes on other devices and under another ZeRO stage (the
    /// stages shard memory, not the arithmetic).
    fn describe(&self) -> String {
        let name = std::any::type_name::<Self>();
        let name = name.split('<').next().unwrap_or(name);
        name.rsplit("::").next().unwrap_or(name).to_string()
    }
    /// Whether this strategy computes on the thread that calls `step` and `predict` (one
    /// device, layers placed over devices, tensor parallelism's shards in turn), as opposed to
    /// threads of its own per device or stage, which its caller waits for. [`on_step_threads`]
    /// asks it. The default: yes.
    fn computes_on_caller(&self) -> bool {
        true
    }
    /// Whether every forward of this strategy goes through `StepCore::forward`, which applies
    /// the precision (see `set_precision`).
    fn autocasts(&self) -> bool {
        false
    }
    /// PyTorch's `model.train()` / `model.eval()` on every replica and stage: Dropout and
    /// BatchNorm switch behaviour (call it with `false` before `predict` for evaluation).
    fn set_training(&mut self, training: bool) {
        self.modules().into_iter().for_each(|m| m.set_training(training));
    }
    /// Whether a batch of `n` samples meets this strategy's constraints (not empty,
    /// micro-batches that divide it): the check `step` makes, without
    /// any work. The default accepts any batch.
    fn check_batch_size(&self, _n: usize) -> Result<()> {
        Ok(())
    }
    /// Checks every batch `source` can draw (its full batch and its smallest, an epoch's short
    /// last one) before training starts, so that a constraint fails at build time and not at
    /// the end of the first epoch; the error names the constraint and the batch size.
    fn check_batches(&self, source: &dyn crate::data::BatchSource) -> Result<()> {
        let (full, smallest) = (source.batch_size(), source.smallest_batch());
        self.check_batch_size(full)?;
        if smallest != full {
            self.check_batch_size(smallest).map_err(|e| {
                // The inner error's own "invalid argument to ..." prefix would repeat this one's.
                let why = match e {
                    Error::Invalid { detail, .. } => detail,
                    other => other.to_string(),
                };
                Error::invalid("Strategy::check_batches", format!("the source's short last batch of {smallest} samples (of {full}): {why}; drop it (DataLoader::drop_last) or choose a batch size that divides the data"))
            })?;
        }
        Ok(())
    }
}

/// Runs `work` on `s` on the threads that suit it: on the CPU backend's pool
/// ([`on_cpu_pool`](crate::on_cpu_pool), under this thread's settings) when `s` computes on a
/// CPU device from its caller's thread, so that the hundreds of ops of a step need no hand-off
/// each (a hand-off per op costs a small model a large share of its step; benches/README.md);
/// right here otherwise:
/// on GPUs alone, and for strategies that run their devices on threads of their own, where a
/// waiting caller would only hold one of the pool's threads. The [`Trainer`](crate::train::Trainer)
/// runs every step and prediction this way, and the planner's trials time steps this way.
pub fn on_step_threads<S: Strategy + ?Sized, R: Send>(s: &mut S, work: impl FnOnce(&mut S) -> R + Send) -> R {
    if s.computes_on_caller() && s.devices().iter().any(|d| d.info().backend == crate::BackendKind::Cpu) {
        crate::on_cpu_pool(|| work(s))
    } else {
        work(s)
    }
}

/// Everything on one device: the reference every other strategy is tested against.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use tandem::nn::{Linear, Module};
/// use tandem::parallel::{Loss, OptimConfig, Single, Strategy};
/// use tandem::{Device, Result, Tensor};
/// // Any module: here a residual block the user writes.
/// struct Res { fc: Linear }
/// impl Module for Res {
///     fn forward(&self, x: &Tensor) -> Result<Tensor> { x.add(&self.fc.forward(x)?.relu()?) }
///     fn children(&self) -> Vec<(String, &dyn Module)> { vec![("fc".into(), &self.fc)] }
///     fn describe(&self) -> String { "Res".into() }
/// }
/// let dev = Device::cpu();
/// let mut rng = tandem::rng(0);
/// let model = Res { fc: Linear::new(3, 3, &mut rng, &dev)? };
/// let l1 = Loss::custom(|out, y| out.l1_loss(y));
/// let mut single = Single::new(model, &OptimConfig::sgd(Default::default()), l1, &dev)?;
/// single.set_grad_clip(Some(1.0))?;
/// let x: Vec<f32> = (0..12).map(|i| i as f32 / 12.0).collect();
/// let y = tandem::data::Targets::Values { data: x.iter().map(|v| 1.0 - v).collect(), shape_per_sample: vec![3] };
/// let data = tandem::data::Dataset { x, sample_shape: vec![3], y };
/// let report = single.step(&data.batch(&[0, 1, 2, 3])?)?;
/// assert!(report.grad_norm.is_some());
/// # Ok(()) }
/// ```
pub struct Single {
    model: Box<dyn Module>,
    opt: Box<dyn Optimizer>,
    run: StepCore,
}

impl Single {
    /// What [`Parallel::single`] calls, public for a model built already (the builder takes
    /// its constructor). Trains `model` on `device`: a model whose tensors are all there already is used as it
    /// is (any `Module`); otherwise it is copied there with `Module::to_device` (every built-in
    /// layer and `Sequential` has it; a user's module built elsewhere should be built on
    /// `device` instead).
    pub fn new<M: Module>(model: M, opt: &OptimConfig, loss: Loss, device: &Device) -> Result<Self> {
        let on_device = model.state_dict().iter().all(|(_, t)| t.device().same(device));
        let model: Box<dyn Module> = if on_device { Box::new(model) } else { model.to_device(device)? };
        let opt = opt.build(model.parameters())?;
        Ok(Single { model, opt, run: StepCore::new(loss, std::slice::from_ref(device)) })
    }
    pub fn model(&self) -> &dyn Module {
        &*self.model
    }
}

impl Strategy for Single {
    fn autocasts(&self) -> bool {
        true
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        self.opt.zero_grad();
        let device = self.run.devices[0].clone();
        let loss = self.run.part_loss(&*self.model, batch, 0, batch.len(), &device)?;
        loss.backward()?;
        let (grad_norm, _) = self.run.update(NormOver::Parts, None, vec![Part { opt: &mut self.opt, device: &device, track: None }], None)?;
        let value = loss.to_scalar()?;
        let wall = t0.elapsed().as_secs_f64();
        if let Some(tr) = &self.run.trace {
            tr.span(&device.spec(), "step", trace::Phase::Compute, t0, wall);
        }
        Ok(StepReport { loss: value, wall_s: wall, compute_s: wall, peak_memory: vec![device.memory().peak], grad_norm, ..Default::default() })
    }
    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to(&self.run.devices[0])?;
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
        self.run.step = steps;
        self.opt.load_state(state, steps)
    }
    fn modules(&self) -> Vec<&dyn Module> {
        vec![&*self.model]
    }
    fn core(&self) -> &StepCore {
        &self.run
    }
    fn core_mut(&mut self) -> &mut StepCore {
        &mut self.run
    }
}
