//! What every `tandem train` run shares, whatever the model: the checkpoint directory checked
//! before any data is read, the [`Trainer`] the common flags configure (length, clipping,
//! checkpoints and resume, the stop signals, the ranks, the trace, the progress output), how a
//! run's end is reported, and the outputs every model writes. `train.rs` (seed models) and
//! `gpt.rs` say what to train on and what to do besides.
use super::progress::{Console, Summary};
use super::ranks::Ranks;
use super::stop::{StopSignal, Stopped};
use super::{mismatch, plot, setup, TrainArgs};
use std::time::Instant;
use tandem::data::BatchSource;
use tandem::parallel::{trace::Trace, Strategy};
use tandem::train::{Checkpoints, Claim, Fit, RunDir, Trainer};
use tandem::{Error, Result};

/// One `tandem train` command: its flags, its place in the job, and what lives for the whole
/// command (the stop signals' handlers, the trace, the clock).
pub(super) struct Run<'a> {
    pub args: &'a TrainArgs,
    pub ranks: &'a Ranks,
    stop: StopSignal,
    trace: Option<Trace>,
    /// When the command began, for the summary's `wall_s`.
    t0: Instant,
    /// `--checkpoint-dir` as rank 0 opened it to check it, until the trainer takes it over.
    run_dir: std::cell::RefCell<Option<RunDir>>,
}

/// How [`Run::fit`] ended.
pub(super) enum Ended {
    /// The steps ran on rank 0: the caller evaluates, writes its outputs and calls
    /// [`Run::finish`].
    Trained(Box<Trained>),
    /// The command is over with this exit status: a signal stopped the run (summary printed),
    /// or this rank, not 0, has nothing to write.
    Exit(u8),
}

/// A finished run on rank 0, before its outputs are written.
pub(super) struct Trained {
    pub fit: Fit,
    console: Console,
}

impl Trained {
    /// A line of the run's notes (after its last step, before its summary).
    pub fn note(&self, msg: &str) {
        self.console.note(msg);
    }
}

impl<'a> Run<'a> {
    /// Starts the clock and installs the SIGINT/SIGTERM handlers, before anything else.
    pub(super) fn new(args: &'a TrainArgs, ranks: &'a Ranks) -> Result<Run<'a>> {
        let t0 = Instant::now();
        let stop = StopSignal::install()?;
        let trace = args.trace.as_ref().map(|_| Trace::new());
        Ok(Run { args, ranks, stop, trace, t0, run_dir: std::cell::RefCell::new(None) })
    }

    /// Checks the output flags and opens `--checkpoint-dir` as the run will claim it (rank 0
    /// alone: the outputs and the checkpoints are its to write), so that an unusable directory
    /// (under /proc, in use, holding another run's checkpoints) fails the command before any
    /// data is read. The trainer takes the open directory over, so the lock is held throughout.
    pub(super) fn check_outputs(&self) -> Result<()> {
        let args = self.args;
        if !self.ranks.leader() {
            return Ok(());
        }
        let outputs = [("--save", args.save.as_deref()), ("--trace", args.trace.as_deref()), ("--plot", args.plot.as_deref())];
        setup::check_outputs(&outputs, args.checkpoint_dir.as_deref())?;
        if let Some(dir) = &args.checkpoint_dir {
            *self.run_dir.borrow_mut() = Some(RunDir::open(dir, claim(args))?);
        }
        Ok(())
    }

    /// The trainer of `strategy` for `total` steps as the common flags say: clipped to `clip`,
    /// checkpointed every `every` steps under `settings` (what a resume must repeat, with
    /// `--seed`), stopped by SIGINT/SIGTERM, one rank of the job, traced with `--trace`, and
    /// observed by the progress output on rank 0. Returns the console of its notes and summary.
    pub(super) fn trainer(&self, strategy: Box<dyn Strategy>, total: u64, clip: Option<f32>, settings: serde_json::Value, every: u64) -> (Trainer, Console) {
        let args = self.args;
        let console = Console::new(args.log_format, total, !self.ranks.leader());
        let mut trainer = Trainer::boxed(strategy)
            .steps(total)
            .grad_clip(clip)
            .settings(settings, args.seed)
            .describe_changes(Box::new(mismatch::changed))
            .stop_token(self.stop.token())
            .group(self.ranks.group().clone());
        if let Some(dir) = &args.checkpoint_dir {
            let plan = match self.run_dir.borrow_mut().take() {
                Some(open) => Checkpoints::opened(open),
                // Ranks other than 0 never open it: they only read what rank 0 sends.
                None => Checkpoints::new(dir.clone()).claiming(claim(args)),
            };
            trainer = trainer.checkpoints(plan.every(every));
        }
        if let Some(t) = &self.trace {
            trainer = trainer.trace(t.clone());
        }
        (console.observe(trainer, args.batch), console)
    }

    /// Runs `trainer` on `data`. A checkpoint already past the run's length is a usage error of
    /// `length_flag`, the flag that set it. A stopped run prints its summary and ends with the
    /// signal's status; a finished one goes on to [`Run::finish`] on rank 0.
    pub(super) fn fit(&self, trainer: &mut Trainer, data: &mut dyn BatchSource, console: Console, length_flag: &'static str) -> Result<Ended> {
        let fit = trainer.fit(data).map_err(|e| match e {
            Error::Invalid { op: "resume", detail } => Error::Invalid { op: length_flag, detail },
            e => e,
        })?;
        if let Some(path) = &fit.checkpoint {
            console.note(&format!("checkpoint {}", path.display()));
        }
        if let Some(code) = fit.stopped {
            // A stopped run is not finished: no evaluation, and no --save/--plot/--trace that could
            // be mistaken for the results of the whole run.
            return Ok(Ended::Exit(self.finish_stopped(&console, &fit, Stopped::of(code))));
        }
        // Every rank, so that rank 0 can evaluate and save alone (ZeRO-3 gathers its shards).
        // One process needs no other: it evaluates and saves ZeRO-3's model unit by unit,
        // which a model larger than one device needs.
        if self.ranks.many() {
            trainer.strategy_mut().gather_full()?;
        }
        if !self.ranks.leader() {
            // Rank 0 evaluates and writes the outputs; the job ends when it has.
            self.ranks.barrier()?;
            return Ok(Ended::Exit(0));
        }
        Ok(Ended::Trained(Box::new(Trained { fit, console })))
    }

    /// Writes `--plot` (the losses, and the test accuracy at the last step when there is one)
    /// and `--trace`, prints the summary with `accuracy` (the fraction and the samples) and lets
    /// the other ranks end.
    pub(super) fn finish(&self, trained: Trained, accuracy: Option<(f64, usize)>) -> Result<u8> {
        let Trained { fit, console } = trained;
        let args = self.args;
        if let Some(path) = &args.plot {
            tandem::checkpoint::write_atomic(path, plot::svg(&fit.losses, accuracy.map(|a| (fit.total, a.0))).as_bytes())?;
        }
        if let (Some(path), Some(t)) = (&args.trace, &self.trace) {
            t.write(path)?;
        }
        let mut summary = self.summary(&fit);
        (summary.test_accuracy, summary.test_samples) = (accuracy.map(|a| a.0), accuracy.map(|a| a.1));
        summary.wall_s = self.t0.elapsed().as_secs_f64();
        console.finish(&summary);
        self.ranks.barrier()?;
        Ok(0)
    }

    fn summary(&self, fit: &Fit) -> Summary {
        let steps_run = fit.steps_run();
        Summary {
            summary: true,
            steps_run,
            steps: fit.step,
            final_loss: fit.final_loss(),
            val_loss: fit.metric("val_loss").map(|v| v as f32),
            test_accuracy: None,
            test_samples: None,
            samples_per_sec: (steps_run as f64 * self.args.batch as f64) / fit.train_s.max(1e-9),
            train_s: fit.train_s,
            wall_s: 0.0,
            stopped_by: fit.stopped.map(|c| Stopped::of(c).name),
        }
    }

    /// Ends a run a signal stopped: says how to continue it (with `--resume` only when there is
    /// a checkpoint to continue from), prints the summary and returns the signal's exit status.
    fn finish_stopped(&self, console: &Console, fit: &Fit, sig: Stopped) -> u8 {
        let resume = match &fit.checkpoint {
            Some(p) => format!("; continue it with --resume (from {})", p.display()),
            None if fit.step == 0 => "; no step ran and no checkpoint was written: start it again".to_string(),
            None => String::new(),
        };
        console.note(&format!("stopped by {} after step {}{resume}", sig.name, fit.step));
        let mut summary = self.summary(fit);
        summary.wall_s = self.t0.elapsed().as_secs_f64();
        console.finish(&summary);
        sig.exit_code()
    }
}

/// What the run claims of `--checkpoint-dir`.
fn claim(args: &TrainArgs) -> Claim {
    match (args.resume, args.overwrite_checkpoints) {
        (true, _) => Claim::Resume,
        (false, true) => Claim::Overwrite,
        (false, false) => Claim::Fresh,
    }
}
