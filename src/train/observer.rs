//! Callbacks of a training run: the [`Observer`] trait the command line's progress bar and JSON
//! lines implement, and [`PrintEvery`], a plain one for programs and examples.
use super::Fit;
use crate::parallel::StepReport;
use std::path::Path;

/// Where a run starts, told to every observer before the first step.
#[derive(Clone, Debug)]
pub struct RunStart<'a> {
    /// The last step already taken: 0, or the resumed checkpoint's.
    pub step: u64,
    /// The step the run ends after.
    pub total: u64,
    /// The checkpoint resumed from.
    pub resumed_from: Option<&'a Path>,
}

/// One finished optimizer step.
#[derive(Clone, Debug)]
pub struct StepInfo<'a> {
    /// This step's number, from 1.
    pub step: u64,
    pub total: u64,
    /// The learning rate it ran with (the schedule's, when there is one).
    pub lr: Option<f32>,
    /// Samples in its batch.
    pub samples: usize,
    /// What the strategy measured (the loss, timings, memory, gradient norm).
    pub report: &'a StepReport,
}

/// Callbacks of a [`Trainer`](super::Trainer) run, all optional. They see the run; they cannot
/// change its trajectory (a stop is asked through a [`StopToken`](super::StopToken)).
pub trait Observer {
    /// A checkpoint file a resume passed over because it does not read back whole (damaged,
    /// unreadable, not a checkpoint), before [`started`](Observer::started); the resume goes on
    /// to the next older one.
    fn skipped(&mut self, _path: &Path, _why: &crate::Error) {}
    fn started(&mut self, _start: &RunStart<'_>) {}
    fn step(&mut self, _step: &StepInfo<'_>) {}
    /// A validation pass after `step`: each metric's name and value.
    fn validated(&mut self, _step: u64, _metrics: &[(String, f64)]) {}
    fn checkpointed(&mut self, _step: u64, _path: &Path) {}
    /// The run ended: all its steps ran, or a stop was asked ([`Fit::stopped`]).
    fn finished(&mut self, _fit: &Fit) {}
}

/// Prints the loss to stderr every `every` steps and after the last, and each validation.
pub struct PrintEvery(pub u64);

impl Observer for PrintEvery {
    fn step(&mut self, s: &StepInfo<'_>) {
        if s.step.is_multiple_of(self.0.max(1)) || s.step == s.total {
            eprintln!("step {}/{}: loss {:.6}", s.step, s.total, s.report.loss);
        }
    }
    fn validated(&mut self, step: u64, metrics: &[(String, f64)]) {
        let m: Vec<String> = metrics.iter().map(|(n, v)| format!("{n} {v:.6}")).collect();
        eprintln!("step {step}: {}", m.join(", "));
    }
    fn checkpointed(&mut self, step: u64, path: &Path) {
        if step.is_multiple_of(self.0.max(1)) {
            eprintln!("step {step}: checkpoint {}", path.display());
        }
    }
}

/// A [`RandomWindows`](crate::data::RandomWindows) sampler learns the step each run starts after.
impl Observer for crate::data::StartStep {
    fn started(&mut self, start: &RunStart<'_>) {
        self.start_after(start.step);
    }
}
