//! Training runs over any [`Strategy`]: the [`Trainer`] (steps or epochs, LR schedule,
//! clipping, validation with metrics, checkpoints and exact resume, a stop token, observers).
#![doc = include_str!("training.md")]
mod fit;
pub mod metric;
mod observer;
pub mod plan_record;
pub mod ranks;
mod record;
pub mod run_dir;
pub mod run_file;
mod stop;

pub use metric::{Accuracy, MeanLoss, Metric, Mse, Perplexity, R2};
pub use observer::{Observer, PrintEvery, RunStart, StepInfo};
pub use run_dir::{Claim, RunDir};
pub use run_file::{RunCheckpoint, RunState};
pub use stop::StopToken;

use crate::data::BatchSource;
use crate::dist::Group;
use crate::optim::LrSchedule;
use crate::parallel::{trace::Trace, Strategy};
use crate::{Error, Result};
use std::path::PathBuf;

/// How long a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Length {
    /// This many optimizer steps in all (a resumed run counts the steps already taken).
    Steps(u64),
    /// This many passes over the training source (`batches_per_epoch` steps each).
    Epochs(u64),
}

/// Where and how often a run writes checkpoints, and what it claims of the directory.
///
/// Every checkpoint holds everything that decides the rest of the trajectory: the weights, the
/// optimizer state and step count (which also keys the LR schedule and every Dropout mask),
/// the data source's position, the run's seed and settings, sealed by a SHA-256. Files are
/// written atomically into a directory the run holds a lock on; retention deletes only this
/// run's older files (see [`RunDir`]).
#[derive(Clone, Debug)]
pub struct Checkpoints {
    pub dir: PathBuf,
    /// A checkpoint after every this many steps, and after the last step or a stop.
    pub every: u64,
    /// This run's newest checkpoints kept on disk.
    pub keep: usize,
    pub claim: Claim,
    /// The directory opened (locked and claimed) by the caller before training, see
    /// [`Checkpoints::opened`].
    opened: Option<std::sync::Arc<RunDir>>,
}

impl Checkpoints {
    /// Checkpoints into a directory the caller has opened already, every 100 steps, with the
    /// claim and retention it was opened with: the lock is held from the caller's check of the
    /// directory (before any data is read) to the end of training, with no gap in which another
    /// run could take it.
    pub fn opened(dir: RunDir) -> Checkpoints {
        let (path, keep, claim) = (dir.path().to_path_buf(), dir.kept(), dir.claim());
        Checkpoints { dir: path, every: 100, keep, claim, opened: Some(std::sync::Arc::new(dir)) }
    }
    /// Checkpoints into `dir` every 100 steps, the newest 3 kept, for a fresh run (refused when
    /// `dir` holds checkpoints already).
    pub fn new(dir: impl Into<PathBuf>) -> Checkpoints {
        Checkpoints { dir: dir.into(), every: 100, keep: run_dir::KEEP, claim: Claim::Fresh, opened: None }
    }
    pub fn every(mut self, steps: u64) -> Checkpoints {
        self.every = steps;
        self
    }
    pub fn keep(mut self, n: usize) -> Checkpoints {
        self.keep = n;
        self
    }
    /// What the run claims of the directory ([`Claim::Fresh`] by default).
    pub fn claiming(mut self, claim: Claim) -> Checkpoints {
        self.claim = claim;
        self
    }
    /// Continue from the newest valid checkpoint in the directory (an error when there is none).
    pub fn resume(mut self) -> Checkpoints {
        self.claim = Claim::Resume;
        self
    }
    /// Start a new run after deleting the checkpoints in the directory.
    pub fn overwrite(mut self) -> Checkpoints {
        self.claim = Claim::Overwrite;
        self
    }
}

/// Names each setting in which a resumed run differs from its checkpoint's.
pub type DescribeChanges = Box<dyn Fn(&serde_json::Value, &serde_json::Value) -> Vec<String>>;

struct Validation {
    /// What the metrics are reported as: `None` their own names, `Some(name)` `name_metric`.
    name: Option<String>,
    every: u64,
    source: Box<dyn BatchSource>,
    metrics: Vec<Box<dyn Metric>>,
}

/// Trains a [`Strategy`] on a [`BatchSource`]: the step loop every program would otherwise write.
///
/// Built with chained settings, then run with [`fit`](Trainer::fit); the strategy stays
/// reachable for prediction and saving ([`strategy`](Trainer::strategy)). A run that writes
/// checkpoints and is stopped (by the [`StopToken`], or killed) and resumed continues bit for
/// bit as if it had never stopped.
///
/// A non-finite loss, or a non-finite weight or optimizer value about to be checkpointed,
/// ends the run with [`Error::NonFinite`] naming the newest checkpoint whose state is finite.
///
/// The steps and predictions of a strategy that computes on a CPU device from its caller's
/// thread run on the CPU backend's pool, under the caller's thread settings; observers are
/// called on the caller's thread (the guide's "Which thread steps").
pub struct Trainer<S: Strategy + ?Sized = dyn Strategy> {
    strategy: Box<S>,
    length: Length,
    schedule: Option<Schedule>,
    clip: Option<Option<f32>>,
    validation: Option<Validation>,
    checkpoints: Option<Checkpoints>,
    settings: serde_json::Value,
    seed: u64,
    describe: Option<DescribeChanges>,
    stop: StopToken,
    observers: Vec<Box<dyn Observer>>,
    group: Group,
    trace: Option<Trace>,
}

/// The LR schedule as given: fixed, or made from the run's total steps once `fit` knows them.
enum Schedule {
    Fixed(LrSchedule),
    OverRun(Box<dyn Fn(u64) -> LrSchedule>),
}

/// What a [`Trainer::fit`] did.
#[derive(Clone, Debug, Default)]
pub struct Fit {
    /// Steps already taken when it began (0, or the resumed checkpoint's).
    pub first_step: u64,
    /// The last step taken.
    pub step: u64,
    /// The step the run was to end after.
    pub total: u64,
    /// `(step, loss)` of every step this call ran: each the mean loss over that step's batch.
    pub losses: Vec<(u64, f32)>,
    /// `(epoch, mean loss)` of each epoch of the training source that ended during this call
    /// (epochs count from 0): the mean over the samples of its steps that this call ran, each
    /// batch weighted by its samples (a resumed run's first epoch counts only the steps after
    /// the checkpoint). What Keras and most training logs report as an epoch's loss.
    pub epoch_losses: Vec<(u64, f64)>,
    /// Every validation pass: its step and each metric's name and value.
    pub validations: Vec<(u64, Vec<(String, f64)>)>,
    /// The stop token's reason code when a stop ended the run before `total`.
    pub stopped: Option<usize>,
    /// The newest checkpoint known to hold a finite state (written by this call, or resumed).
    pub checkpoint: Option<PathBuf>,
    /// The checkpoint this call resumed from.
    pub resumed_from: Option<PathBuf>,
    /// Seconds spent in the step loop, and the samples it trained on.
    pub train_s: f64,
    pub samples: u64,
}

impl Fit {
    pub fn steps_run(&self) -> u64 {
        self.step - self.first_step
    }
    /// The loss of the last step this call ran: the mean over that one batch, which may be an
    /// epoch's short last batch of a few samples, so it is noisy. For a figure over the data
    /// see [`mean_loss_last_epoch`](Fit::mean_loss_last_epoch), or validate.
    pub fn final_loss(&self) -> Option<f32> {
        self.losses.last().map(|l| l.1)
    }
    /// The mean training loss over the samples of the last epoch that ended during this call
    /// (see [`epoch_losses`](Fit::epoch_losses)); `None` when no epoch ended.
    pub fn mean_loss_last_epoch(&self) -> Option<f64> {
        self.epoch_losses.last().map(|e| e.1)
    }
    /// The newest value of the metric named `name`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.validations.iter().rev().find_map(|(_, m)| m.iter().find(|(n, _)| n == name).map(|(_, v)| *v))
    }
}

impl<S: Strategy + 'static> Trainer<S> {
    /// A trainer of `strategy` (any strategy: [`Single`](crate::parallel::Single), data, tensor,
    /// pipeline parallelism or their grid), for 1 epoch, with nothing else set. The trainer
    /// keeps the strategy's type: [`Trainer::strategy`] gives it back for what only it has
    /// (a pipeline's bubble statistics, say).
    pub fn new(strategy: S) -> Trainer<S> {
        Trainer::from_box(Box::new(strategy))
    }
}

impl Trainer {
    /// [`Trainer::new`] of a strategy chosen at run time.
    pub fn boxed(strategy: Box<dyn Strategy>) -> Self {
        Trainer::from_box(strategy)
    }
}

impl<S: Strategy + ?Sized> Trainer<S> {
    fn from_box(strategy: Box<S>) -> Trainer<S> {
        Trainer {
            strategy,
            length: Length::Epochs(1),
            schedule: None,
            clip: None,
            validation: None,
            checkpoints: None,
            settings: serde_json::Value::Null,
            seed: 0,
            describe: None,
            stop: StopToken::new(),
            observers: Vec::new(),
            group: Group::alone(),
            trace: None,
        }
    }
    /// Runs `n` optimizer steps in all.
    pub fn steps(mut self, n: u64) -> Self {
        self.length = Length::Steps(n);
        self
    }
    /// Runs `n` epochs of the training source.
    pub fn epochs(mut self, n: u64) -> Self {
        self.length = Length::Epochs(n);
        self
    }
    /// The learning rate of step `s` (from 0) is `schedule.lr_at(s)`. The schedule is recorded
    /// in every checkpoint, and a resume must repeat it.
    pub fn schedule(mut self, schedule: LrSchedule) -> Self {
        self.schedule = Some(Schedule::Fixed(schedule));
        self
    }
    /// The schedule `make(total)` of the run's total steps, which `fit` works out from the
    /// run's length and the training source ([`total_steps`](Trainer::total_steps)), so that
    /// a schedule over the whole run needs no epochs × batches by hand:
    ///
    /// ```
    /// # use tandem::optim::LrSchedule;
    /// # fn with(t: tandem::train::Trainer) -> tandem::train::Trainer {
    /// t.epochs(10).schedule_over_run(|total| LrSchedule::one_cycle(0.1, total))
    /// # }
    /// ```
    pub fn schedule_over_run(mut self, make: impl Fn(u64) -> LrSchedule + 'static) -> Self {
        self.schedule = Some(Schedule::OverRun(Box::new(make)));
        self
    }
    /// Clips the global gradient norm to `max_norm` before each update (PyTorch's
    /// `clip_grad_norm_` over the whole model), or not at all.
    pub fn grad_clip(mut self, max_norm: Option<f32>) -> Self {
        self.clip = Some(max_norm);
        self
    }
    /// After every `every` steps and after the last, measures `metrics` over one pass of
    /// `source` in eval mode ([`Strategy::set_training`] false), from the start of its epoch 0
    /// each time. The values are reported under the metrics' own names (`val_loss`,
    /// `accuracy`, ...); [`validate_named`](Trainer::validate_named) names the source.
    pub fn validate(mut self, every: u64, source: impl BatchSource + 'static, metrics: Vec<Box<dyn Metric>>) -> Self {
        self.validation = Some(Validation { name: None, every: every.max(1), source: Box::new(source), metrics });
        self
    }
    /// [`validate`](Trainer::validate) with the values reported under the source's `name`:
    /// `name_loss` for [`MeanLoss`], `name_accuracy`, `name_mse`, ... (see
    /// [`metric_name`](metric::metric_name)), so that a test set's loss is not called `val_loss`.
    pub fn validate_named(mut self, name: &str, every: u64, source: impl BatchSource + 'static, metrics: Vec<Box<dyn Metric>>) -> Self {
        self.validation = Some(Validation { name: Some(name.to_string()), every: every.max(1), source: Box::new(source), metrics });
        self
    }
    /// Writes checkpoints (and resumes from them) as `plan` says.
    pub fn checkpoints(mut self, plan: Checkpoints) -> Self {
        self.checkpoints = Some(plan);
        self
    }
    /// What decides the trajectory besides the checkpoint's own state and what the trainer
    /// records itself (the model, the data, the batch size, the optimizer's settings, ...), as
    /// JSON ([`tandem::serde_json`](crate::serde_json)), and the run's seed: recorded in every
    /// checkpoint, and a resume refuses a checkpoint written with other ones
    /// ([`Error::ResumeMismatch`] naming each).
    ///
    /// The trainer records by itself, under the key `"trainer"` beside these settings'
    /// keys, the strategy's kind ([`Strategy::describe`]), its precision, its clipping bound
    /// and the LR schedule; a resume refuses other ones too, named `precision bf16
    /// (checkpoint: f32)`. The devices and data parallelism's sharding may change on resume.
    /// Checkpoints written before the trainer recorded anything are checked against the
    /// settings alone.
    pub fn settings(mut self, settings: serde_json::Value, seed: u64) -> Self {
        self.settings = settings;
        self.seed = seed;
        self
    }
    /// How a resume mismatch names what changed (the command line names its flags); by default
    /// `key value (checkpoint: value)` for each top-level key of the settings. `describe` is given
    /// the settings alone (without the trainer's record). What the trainer records (see
    /// [`settings`](Trainer::settings)) and a different seed (`seed N (checkpoint: M)`) are
    /// named after the default description, and after a custom one only when that names nothing
    /// (settings that hold the seed or the precision name them themselves).
    pub fn describe_changes(mut self, describe: DescribeChanges) -> Self {
        self.describe = Some(describe);
        self
    }
    /// The token that stops the run after its current step.
    pub fn stop_token(mut self, token: StopToken) -> Self {
        self.stop = token;
        self
    }
    /// A clone of the trainer's stop token.
    pub fn stopper(&self) -> StopToken {
        self.stop.clone()
    }
    pub fn observe(mut self, observer: impl Observer + 'static) -> Self {
        self.observers.push(Box::new(observer));
        self
    }
    /// Runs as one rank of `group` (under `mpirun`/`srun`): every rank runs the same trainer on
    /// the same batches; rank 0 alone opens the checkpoint directory and writes, the others
    /// receive its checkpoint on resume, and all stop after the same step.
    pub fn group(mut self, group: Group) -> Self {
        self.group = group;
        self
    }
    /// Records each step's device timelines into `trace`.
    pub fn trace(mut self, trace: Trace) -> Self {
        self.trace = Some(trace);
        self
    }

    pub fn strategy(&self) -> &S {
        &self.strategy
    }
    pub fn strategy_mut(&mut self) -> &mut S {
        &mut self.strategy
    }
    /// The trained weights with their `state_dict` names, gathered from every device (what
    /// `checkpoint::save_weights` writes for PyTorch).
    pub fn state_dict(&self) -> Result<Vec<(String, crate::Tensor)>> {
        self.strategy.state_dict()
    }
    pub fn into_strategy(self) -> Box<S> {
        self.strategy
    }

    /// `metrics` over one pass of `source` (from the start of its epoch 0), in eval mode; the
    /// strategy goes back to training mode after. The values carry the metrics' own names;
    /// [`evaluate_named`](Trainer::evaluate_named) names the source.
    pub fn evaluate(&mut self, source: &mut dyn BatchSource, metrics: &mut [Box<dyn Metric>]) -> Result<Vec<(String, f64)>> {
        evaluate(&mut *self.strategy, source, metrics, None)
    }
    /// [`evaluate`](Trainer::evaluate) with the values named after the source: `test_loss`,
    /// `test_accuracy`, ... for `name` `"test"` (see [`metric_name`](metric::metric_name)).
    pub fn evaluate_named(&mut self, name: &str, source: &mut dyn BatchSource, metrics: &mut [Box<dyn Metric>]) -> Result<Vec<(String, f64)>> {
        evaluate(&mut *self.strategy, source, metrics, Some(name))
    }

    /// The run's total steps on `data`: the steps asked for, or the epochs times `data`'s
    /// batches per epoch (what [`schedule_over_run`](Trainer::schedule_over_run) is given).
    pub fn total_steps(&self, data: &dyn BatchSource) -> Result<u64> {
        match self.length {
            Length::Steps(n) => Ok(n),
            Length::Epochs(e) => e
                .checked_mul(data.batches_per_epoch() as u64)
                .ok_or_else(|| Error::invalid("Trainer::epochs", format!("{e} epochs is more steps than can be counted"))),
        }
    }
}

/// One validation pass: `metrics` over `source`'s epoch 0, in eval mode, named after the
/// source when it has a `name`.
fn evaluate<S: Strategy + ?Sized>(
    s: &mut S,
    source: &mut dyn BatchSource,
    metrics: &mut [Box<dyn Metric>],
    name: Option<&str>,
) -> Result<Vec<(String, f64)>> {
    source.set_state(crate::data::LoaderState { epoch: 0, position: 0 })?;
    s.set_training(false);
    let pass = (|| {
        for _ in 0..source.batches_per_epoch() {
            let batch = source.next_batch()?;
            let x = crate::parallel::inputs_to_device(&batch, &s.devices()[0])?;
            let out = crate::parallel::on_step_threads(s, |s| s.predict(&x))?;
            for m in metrics.iter_mut() {
                m.update(&out, &batch)?;
            }
        }
        Ok(())
    })();
    s.set_training(true);
    let values: Vec<(String, f64)> = metrics.iter_mut().map(|m| (metric::metric_name(name, &m.name()), m.finish())).collect();
    pass.map(|()| values)
}

/// `key value (checkpoint: value)` for each top-level setting that differs.
fn default_changes(now: &serde_json::Value, then: &serde_json::Value) -> Vec<String> {
    let null = serde_json::Value::Null;
    let mut out: Vec<String> = match now.as_object() {
        Some(map) => map
            .iter()
            .filter(|(k, v)| then.get(k.as_str()).unwrap_or(&null) != *v)
            .map(|(k, v)| format!("{k} {v} (checkpoint: {})", then.get(k.as_str()).unwrap_or(&null)))
            .collect(),
        None => Vec::new(),
    };
    if out.is_empty() && now != then {
        out.push(format!("settings {now} (checkpoint: {then})"));
    }
    out
}
