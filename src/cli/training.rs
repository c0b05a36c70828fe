//! What every `tandem train` run shares, whatever the model: the run directory and resume, the
//! step loop with its checks, checkpoints and stop handling, the summary and the outputs every
//! model writes. `train.rs` (seed models) and `gpt.rs` say only how to draw a batch and what to
//! do besides.
use tandem::train::run_file::{self as checkpoints, RunCheckpoint as Checkpoint, RunState};
use super::progress::{Reporter, Summary};
use super::ranks::Ranks;
use tandem::train::run_dir::{self, Claim, RunDir};
use super::stop::{StopSignal, Stopped};
use super::{plot, setup, TrainArgs};
use tandem::data::{Batch, DataLoader, LoaderState};
use tandem::parallel::{trace::Trace, Strategy};
use tandem::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Checks the output flags and opens `--checkpoint-dir` (rank 0 alone: the outputs and the
/// checkpoints are its to write); returns what the run claims of the directory.
pub(super) fn outputs_and_run_dir(args: &TrainArgs, ranks: &Ranks) -> Result<(Claim, Option<RunDir>)> {
    let claim = match (args.resume, args.overwrite_checkpoints) {
        (true, _) => Claim::Resume,
        (false, true) => Claim::Overwrite,
        (false, false) => Claim::Fresh,
    };
    if !ranks.leader() {
        return Ok((claim, None));
    }
    let outputs = [("--save", args.save.as_deref()), ("--trace", args.trace.as_deref()), ("--plot", args.plot.as_deref())];
    setup::check_outputs(&outputs, args.checkpoint_dir.as_deref())?;
    let run_dir = args.checkpoint_dir.as_deref().map(|d| RunDir::open(d, claim)).transpose()?;
    Ok((claim, run_dir))
}

/// The progress reporter of steps `start + 1..=total`; silent on ranks other than 0.
pub(super) fn reporter(ranks: &Ranks, args: &TrainArgs, start: u64, total: u64) -> Reporter {
    if ranks.leader() {
        Reporter::new(args.log_format, start + 1, total, args.batch)
    } else {
        Reporter::quiet(args.log_format, start + 1, total, args.batch)
    }
}

/// Where a run's checkpoints are: `--checkpoint-dir` (`dir`), opened by rank 0 alone
/// (`run_dir`), and what the run claims of it.
pub(super) struct Resume<'a> {
    pub ranks: &'a Ranks,
    pub dir: Option<&'a Path>,
    pub run_dir: Option<&'a RunDir>,
    pub claim: Claim,
}

/// Where a run starts (see [`start_run`]).
pub(super) struct Start {
    /// The last step already taken: 0, or the resumed checkpoint's.
    pub step: u64,
    pub run: String,
    /// The checkpoint resumed from.
    pub kept: Option<PathBuf>,
}

/// Where a run starts: step 0 under a new run id, or, with `claim` `Resume`, the newest valid
/// checkpoint in the directory (loaded into `strategy` and `loader` on every rank); a fresh
/// run told to overwrite clears the directory's earlier files first. `length_flag` names the
/// flag that set `total` in the error for a checkpoint already past it.
pub(super) fn start_run(
    at: Resume,
    strategy: &mut dyn Strategy,
    loader: Option<&mut DataLoader>,
    config: &serde_json::Value,
    seed: u64,
    total: u64,
    length_flag: &'static str,
) -> Result<Start> {
    let fresh = || Start { step: 0, run: run_dir::new_run_id(), kept: None };
    let Some(dir) = at.dir else { return Ok(fresh()) };
    if at.claim != Claim::Resume {
        if let (Claim::Overwrite, Some(run_dir)) = (at.claim, at.run_dir) {
            run_dir.discard_earlier()?;
        }
        return Ok(fresh());
    }
    let resumed = resume(at.ranks, dir, strategy, loader, config, seed)?;
    if resumed.state.step > total {
        let at = format!("{} is at step {}, past the {total} steps asked for", resumed.path.display(), resumed.state.step);
        return Err(Error::invalid(length_flag, format!("{at}: nothing to do; ask for more steps to continue it")));
    }
    if at.ranks.leader() {
        eprintln!("resuming from {} (step {})", resumed.path.display(), resumed.state.step);
    }
    // Files written before run ids carry none; the continued run takes a new one.
    let run = if resumed.state.run.is_empty() { run_dir::new_run_id() } else { resumed.state.run };
    Ok(Start { step: resumed.state.step, run, kept: Some(resumed.path) })
}

/// Restores weights, optimizer and loader (when there is one) from the newest valid
/// checkpoint; returns it. Rank 0 reads the directory and sends the file to the other ranks,
/// which need not see it (another machine's disk), whatever their number when it was written.
fn resume(ranks: &Ranks, dir: &Path, s: &mut dyn Strategy, loader: Option<&mut DataLoader>, config: &serde_json::Value, seed: u64) -> Result<Checkpoint> {
    let newest = if ranks.leader() {
        Some(checkpoints::load_newest(dir, |path, e| eprintln!("warning: skipping checkpoint {}: {e}", path.display()))?)
    } else {
        None
    };
    let (newest, bytes) = newest.map_or((None, None), |(c, b)| (Some(c), Some(b)));
    let bytes = ranks.share_bytes(bytes)?;
    let ckpt = match newest {
        Some(c) => c,
        None => {
            let mut c = checkpoints::from_bytes(dir, &bytes)?;
            c.path = dir.join(checkpoints::file_name(c.state.step));
            c
        }
    };
    let st = &ckpt.state;
    if st.config != *config || st.shuffle_seed != seed {
        let changed = super::mismatch::changed(config, &st.config);
        return Err(Error::ResumeMismatch { path: ckpt.path.clone(), changed });
    }
    s.load_state_dict(&ckpt.weights)?;
    s.load_optimizer_state(&ckpt.optim, st.optim_steps)?;
    if let Some(loader) = loader {
        loader.set_state(st.loader)?;
    }
    Ok(ckpt)
}

/// The steps of a run, from where [`start_run`] put it to `total`.
pub(super) struct Steps<'a> {
    pub args: &'a TrainArgs,
    pub ranks: &'a Ranks,
    pub stop: &'a StopSignal,
    /// `--checkpoint-dir` as rank 0 opened it (`None` on the other ranks).
    pub run_dir: Option<&'a RunDir>,
    /// The run configuration each checkpoint records (see `RunState::config`).
    pub config: &'a serde_json::Value,
    pub total: u64,
    /// Checkpoint after every this many steps (and after the last).
    pub every: u64,
    /// When the command began, for the summary's `wall_s`.
    pub t0: Instant,
}

/// How [`Steps::run`] ended.
pub(super) enum Ended {
    /// The steps ran on rank 0: the caller evaluates, writes its outputs and calls
    /// [`Trained::finish`].
    Trained(Box<Trained>),
    /// The command is over with this exit status: a signal stopped the run (summary printed),
    /// or this rank, not 0, has nothing to write.
    Exit(u8),
}

/// A finished run on rank 0, before its outputs are written.
pub(super) struct Trained {
    pub reporter: Reporter,
    pub summary: Summary,
    /// `(step, loss)` of every step this process ran.
    pub losses: Vec<(u64, f32)>,
    trace: Option<Trace>,
}

impl Steps<'_> {
    /// Runs steps `start.step + 1..=total`. `next(strategy, s)` readies step `s + 1` (0-based
    /// `s`) and returns its batch and the loader position a checkpoint after it records;
    /// `validate(strategy, step)` returns the validation loss after `step` when it measures
    /// one, before the step's checkpoint. A non-finite loss or weight stops the run with an error
    /// naming the newest sound checkpoint.
    pub(super) fn run(
        &self,
        strategy: &mut dyn Strategy,
        start: Start,
        reporter: Reporter,
        mut next: impl FnMut(&mut dyn Strategy, u64) -> Result<(Batch, LoaderState)>,
        mut validate: impl FnMut(&mut dyn Strategy, u64) -> Result<Option<f32>>,
    ) -> Result<Ended> {
        let (args, ranks) = (self.args, self.ranks);
        let trace = args.trace.as_ref().map(|_| Trace::new());
        if let Some(t) = &trace {
            strategy.set_trace(t.clone());
        }
        // `kept`: the newest checkpoint known to hold finite weights: the one resumed from, then
        // each one this process writes (a non-finite state is never written).
        let Start { step: first, run, mut kept } = start;
        let mut losses = Vec::new();
        let mut val_loss = None;
        let train_t0 = Instant::now();
        let mut step = first;
        // A signal during setup stops before the first step.
        let mut stopped = ranks.agree_stop(self.stop.get())?;
        while step < self.total && stopped.is_none() {
            let (batch, loader) = next(strategy, step)?;
            step += 1;
            let rep = strategy.step(&batch)?;
            if !rep.loss.is_finite() {
                return Err(Error::NonFinite { step, what: format!("loss is {} at step {step}", rep.loss), kept });
            }
            reporter.step(step, rep.loss, rep.wall_s);
            losses.push((step, rep.loss));
            stopped = ranks.agree_stop(self.stop.get())?;
            if let Some(v) = validate(strategy, step)? {
                reporter.val_loss(step, v);
                val_loss = Some(v);
            }
            if args.checkpoint_dir.is_some() && (step.is_multiple_of(self.every) || step == self.total || stopped.is_some()) {
                if let Some(dir) = self.run_dir {
                    let state = |optim_steps| RunState {
                        run: run.clone(),
                        step,
                        optim_steps,
                        loader,
                        shuffle_seed: args.seed,
                        config: self.config.clone(),
                    };
                    kept = Some(save_checkpoint(dir, &*strategy, step, kept, state)?);
                }
                // Nobody goes on (and could read the directory) before rank 0 has written it.
                ranks.barrier()?;
            }
        }
        let train_s = train_t0.elapsed().as_secs_f64();
        if let Some(path) = &kept {
            reporter.note(&format!("checkpoint {}", path.display()));
        }
        let steps_run = step - first;
        let mut summary = Summary {
            summary: true,
            steps_run,
            steps: step,
            final_loss: losses.last().map(|l| l.1),
            val_loss,
            test_accuracy: None,
            test_samples: None,
            samples_per_sec: (steps_run as f64 * args.batch as f64) / train_s.max(1e-9),
            train_s,
            wall_s: 0.0,
            stopped_by: stopped.map(|s| s.name),
        };
        if let Some(sig) = stopped {
            // A stopped run is not finished: no evaluation, and no --save/--plot/--trace that could
            // be mistaken for the results of the whole run.
            return Ok(Ended::Exit(finish_stopped(reporter, &mut summary, sig, step, kept.as_deref(), self.t0)));
        }
        if !ranks.leader() {
            // Rank 0 evaluates and writes the outputs; the job ends when it has.
            ranks.barrier()?;
            return Ok(Ended::Exit(0));
        }
        Ok(Ended::Trained(Box::new(Trained { reporter, summary, losses, trace })))
    }
}

impl Trained {
    /// Writes `--plot` (the losses, and `accuracy` at its step when there is one) and
    /// `--trace`, prints the summary and lets the other ranks end.
    pub(super) fn finish(mut self, steps: &Steps, accuracy: Option<(u64, f64)>) -> Result<u8> {
        let args = steps.args;
        if let Some(path) = &args.plot {
            tandem::checkpoint::write_atomic(path, plot::svg(&self.losses, accuracy).as_bytes())?;
        }
        if let (Some(path), Some(t)) = (&args.trace, &self.trace) {
            t.write(path)?;
        }
        self.summary.wall_s = steps.t0.elapsed().as_secs_f64();
        self.reporter.finish(&self.summary);
        steps.ranks.barrier()?;
        Ok(0)
    }
}

/// Writes `strategy`'s checkpoint after `step` into `dir`, unless a weight or optimizer value is
/// not finite: then the run stops with an error naming it and `kept`, the newest checkpoint
/// known to be sound. `state` builds the run state from the optimizer's step count.
fn save_checkpoint(dir: &RunDir, strategy: &dyn Strategy, step: u64, kept: Option<PathBuf>, state: impl FnOnce(u64) -> RunState) -> Result<PathBuf> {
    let (tensors, optim_steps) = checkpoints::snapshot(strategy)?;
    if let Some((name, value)) = checkpoints::first_non_finite(&tensors) {
        let what = format!("{name} holds {value} after step {step} (its loss was finite)");
        return Err(Error::NonFinite { step, what, kept });
    }
    dir.save(&tensors, &state(optim_steps))
}

/// Ends a run a signal stopped: says how to continue it (with `--resume` only when there is a
/// checkpoint, `kept`, to continue from), prints the summary and returns the signal's exit
/// status.
fn finish_stopped(reporter: Reporter, summary: &mut Summary, sig: Stopped, step: u64, kept: Option<&Path>, t0: Instant) -> u8 {
    let resume = match kept {
        Some(p) => format!("; continue it with --resume (from {})", p.display()),
        None if step == 0 => "; no step ran and no checkpoint was written: start it again".to_string(),
        None => String::new(),
    };
    reporter.note(&format!("stopped by {} after step {step}{resume}", sig.name));
    summary.wall_s = t0.elapsed().as_secs_f64();
    reporter.finish(summary);
    sig.exit_code()
}
