//! What every `tandem train` run shares, whatever the model: the checkpoint directory checked
//! before any data is read, the [`Trainer`] the common flags configure (length, clipping,
//! checkpoints and resume, the stop signals, the ranks, the trace, the progress output), how a
//! run's end is reported, and the outputs every model writes. `train.rs` (seed models) and
//! `gpt.rs` say what to train on and what to do besides.
use super::progress::{Console, Summary};
use super::ranks::Ranks;
use super::stop::{StopSignal, Stopped};
use super::{mismatch, plot, setup, TrainArgs};
use serde_json::Value;
use std::time::Instant;
use tandem::data::BatchSource;
use tandem::parallel::{trace::Trace, Strategy};
use tandem::train::{run_file, Checkpoints, Claim, Fit, RunDir, Trainer};
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
    /// What the run configuration records of `--init` (see [`Run::init_record`]), the same on
    /// every rank: rank 0's.
    init: std::cell::RefCell<Option<Value>>,
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
        Ok(Run { args, ranks, stop, trace, t0, run_dir: std::cell::RefCell::new(None), init: std::cell::RefCell::new(None) })
    }

    /// Checks the output flags and opens `--checkpoint-dir` as the run will claim it (rank 0
    /// alone: the outputs and the checkpoints are its to write), so that an unusable directory
    /// (under /proc, in use, holding another run's checkpoints) fails the command before any
    /// data is read. The trainer takes the open directory over, so the lock is held throughout.
    /// `--init` is checked against the checkpoint a resumed run continues (see
    /// [`Run::init_record`]). Collective: every rank calls it, and learns rank 0's `--init`.
    pub(super) fn check_outputs(&self) -> Result<()> {
        let args = self.args;
        if self.ranks.leader() {
            let outputs = [("--save", args.save.as_deref()), ("--trace", args.trace.as_deref()), ("--plot", args.plot.as_deref())];
            setup::check_outputs(&outputs, args.checkpoint_dir.as_deref())?;
            if let Some(dir) = &args.checkpoint_dir {
                *self.run_dir.borrow_mut() = Some(RunDir::open(dir, claim(args))?);
            }
            *self.init.borrow_mut() = self.init_record()?;
        }
        if self.ranks.many() {
            let encode = || serde_json::to_vec(&*self.init.borrow()).map_err(|e| Error::Msg(format!("encoding --init's record: {e}")));
            let mine = if self.ranks.leader() { Some(encode()?) } else { None };
            let shared = tandem::train::ranks::share_bytes(self.ranks.group(), mine)?;
            let record = serde_json::from_slice(&shared).map_err(|e| Error::Msg(format!("rank 0's --init record did not arrive whole: {e}")))?;
            *self.init.borrow_mut() = record;
        }
        Ok(())
    }

    /// What the run configuration records of `--init`: the path given and the file's SHA-256
    /// (a Hugging Face folder's: its model.safetensors')
    /// (`{"path": .., "sha256": ..}`), or nothing for a run that did not start from a file.
    ///
    /// A resumed run takes its weights from the checkpoint, and records what the checkpoint
    /// does, so that a scheduler may restart a job with its own command and `--resume` added:
    /// an `--init` given again must be the file the run started from (by its contents: the
    /// path may differ), and is refused, naming both files, when it is another, or when the run
    /// did not start from a file. The checkpoint's record is read from the newest file's
    /// header; the trainer then checks the whole configuration against the file it resumes.
    fn init_record(&self) -> Result<Option<Value>> {
        let args = self.args;
        // The record is for checkpoints only.
        if args.checkpoint_dir.is_none() {
            return Ok(None);
        }
        // A FIFO or a device is read once, by the run: it is not hashed beforehand, and what
        // it held cannot be compared with a later --init, so a resume refuses one.
        let regular = |p: &std::path::Path| std::fs::metadata(p).map_or(true, |m| m.is_file());
        let given = match &args.init {
            Some(path) if !regular(&init_file(path)) && args.resume => {
                let what = format!(
                    "{}: not a regular file; with --resume, --init must be the file the run started from, whose contents are compared",
                    path.display()
                );
                return Err(Error::invalid("--init", what));
            }
            Some(path) if !regular(&init_file(path)) => None,
            Some(path) => Some((path, file_sha256(&init_file(path))?)),
            None => None,
        };
        let entry = |path: &std::path::Path, sha256: &str| serde_json::json!({ "path": path.display().to_string(), "sha256": sha256 });
        let dir = args.checkpoint_dir.as_deref().filter(|_| args.resume);
        // No checkpoint to resume: the trainer says so.
        let Some((ckpt, config)) = dir.and_then(run_file::recorded_config) else {
            return Ok(given.filter(|_| !args.resume).map(|(p, h)| entry(p, &h)));
        };
        let recorded = config.get("init").filter(|v| !v.is_null()).cloned();
        match (recorded, given) {
            (recorded, None) => Ok(recorded),
            (None, Some((path, _))) => Err(Error::invalid(
                "--init",
                format!("{}: the run being resumed did not start from a file ({} records no --init); resume it without --init", path.display(), ckpt.display()),
            )),
            (Some(r), Some((_, sha256))) if r.get("sha256").and_then(Value::as_str) == Some(sha256.as_str()) => Ok(Some(r)),
            (Some(r), Some((path, sha256))) => Err(Error::invalid(
                "--init",
                format!(
                    "{} (sha256 {sha256}) is not the file the run being resumed started from: {} records {}; give that file, or resume without --init",
                    path.display(),
                    ckpt.display(),
                    mismatch::init_typed(&r)
                ),
            )),
        }
    }

    /// The trainer of `strategy` for `total` steps as the common flags say: clipped to `clip`,
    /// checkpointed every `every` steps under `settings` (what a resume must repeat, with
    /// `--seed`), stopped by SIGINT/SIGTERM, one rank of the job, traced with `--trace`, and
    /// observed by the progress output on rank 0. Returns the console of its notes and summary.
    pub(super) fn trainer(
        &self,
        strategy: Box<dyn Strategy>,
        total: u64,
        clip: Option<f32>,
        settings: serde_json::Value,
        every: u64,
    ) -> (Trainer, Console) {
        let args = self.args;
        let console = Console::new(args.log_format, total, !self.ranks.leader());
        let mut settings = settings;
        if let Some(init) = &*self.init.borrow() {
            settings["init"] = init.clone();
        }
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

/// The SHA-256 of the file at `path` in lowercase hex, as `sha256sum` prints it, read in
/// pieces (weights may be large).
fn file_sha256(path: &std::path::Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| Error::io(path, e))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// What the run claims of `--checkpoint-dir`.
fn claim(args: &TrainArgs) -> Claim {
    match (args.resume, args.overwrite_checkpoints) {
        (true, _) => Claim::Resume,
        (false, true) => Claim::Overwrite,
        (false, false) => Claim::Fresh,
    }
}

/// The file of `--init` whose contents a run records: the file itself, or a Hugging Face
/// folder's model.safetensors.
fn init_file(path: &std::path::Path) -> std::path::PathBuf {
    if path.is_dir() {
        path.join(tandem::nn::models::hf_gpt2::WEIGHTS_FILE)
    } else {
        path.to_path_buf()
    }
}
