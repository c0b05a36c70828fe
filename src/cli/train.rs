//! `tandem train`: check every input, build the strategy, run the steps with checkpoints, then
//! evaluate on the test split and write the requested outputs. SIGINT or SIGTERM ends the run
//! after the current step, with a checkpoint and the summary.
use super::checkpoints::{self, Checkpoint, RunState};
use super::progress::{Reporter, Summary};
use super::ranks::Ranks;
use super::run_dir::{self, Claim, RunDir};
use super::setup::{self, build_strategy, DataSource, StrategyPlan};
use super::stop::StopSignal;
use super::{plot, ModelArg, OptimizerKind, TrainArgs};
use crate::data::{DataLoader, Dataset, Targets};
use crate::nn::models::SeedModel;
use crate::nn::Module;
use crate::parallel::{trace::Trace, DataParallelConfig, Loss, OptimConfig, Strategy};
use crate::{Device, Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Steps when neither --steps nor --epochs is given: the seed CNN reaches >= 95% on the
/// digits test split at batch 64 in this many steps.
const DEFAULT_STEPS: u64 = 1500;
const DEFAULT_CHECKPOINT_EVERY: u64 = 100;
/// Samples per forward pass when evaluating.
const EVAL_CHUNK: usize = 1000;

pub fn run(args: &TrainArgs, ranks: &Ranks) -> Result<u8> {
    let ModelArg::Seed(model_kind) = args.model else { return super::gpt::train(args, ranks) };
    setup::no_gpt_flags(args)?;
    let t0 = Instant::now();
    let stop = StopSignal::install()?;
    let source = DataSource::parse(&args.data)?;
    let optim = setup::optim_config(args, OptimizerKind::Sgd)?;
    if args.batch == 0 {
        return Err(Error::invalid("--batch", "must be at least 1"));
    }
    let micro_batches = args.micro_batches.unwrap_or(1);
    if micro_batches == 0 || !args.batch.is_multiple_of(micro_batches) {
        return Err(Error::invalid("--micro-batches", format!("{micro_batches} does not divide --batch {}", args.batch)));
    }
    for (flag, n) in [("--steps", args.steps), ("--epochs", args.epochs), ("--checkpoint-every", args.checkpoint_every)] {
        if n == Some(0) {
            return Err(Error::invalid(flag, "must be at least 1"));
        }
    }
    let devices = ranks.devices(&args.devices)?;
    ranks.check_strategy(args.strategy)?;
    let (claim, run_dir) = outputs_and_run_dir(args, ranks)?;

    let (train, test) = source.load(model_kind, args.seed)?;
    setup::check_fit(model_kind, &train, "training data")?;
    if let Some(t) = &test {
        setup::check_fit(model_kind, t, "test data")?;
    }
    if args.batch > train.len() {
        return Err(Error::invalid("--batch", format!("{} exceeds the {} training samples", args.batch, train.len())));
    }
    let loss = Loss::for_targets(&train.y);
    let mut loader = DataLoader::new(Arc::new(train), args.batch, true, args.seed)?.drop_last(true)?;
    let (length_flag, total) = match (args.steps, args.epochs) {
        (Some(s), _) => ("--steps", s),
        (None, Some(e)) => (
            "--epochs",
            e.checked_mul(loader.batches_per_epoch() as u64)
                .ok_or_else(|| Error::invalid("--epochs", format!("{e} epochs is more steps than can be counted")))?,
        ),
        (None, None) => ("--steps", DEFAULT_STEPS),
    };

    let model = model_kind.build(args.seed, &Device::cpu())?;
    if let Some(path) = &args.init {
        model.load_state_dict(&setup::read_init(path, &model)?)?;
    }
    let mut strategy = if ranks.many() {
        let cfg = DataParallelConfig { deterministic: args.deterministic, micro_batches, ..Default::default() };
        ranks.data_parallel(|d| model.slice(0..model.len(), d), &devices, &optim, loss, cfg)?
    } else {
        let plan = StrategyPlan {
            kind: args.strategy,
            model,
            optim: optim.clone(),
            loss,
            devices,
            micro_batches,
            schedule: args.schedule,
            deterministic: args.deterministic,
        };
        build_strategy(plan)?
    };
    strategy.set_grad_clip(setup::grad_clip(args)?)?;

    let config = run_config(args, model_kind, &optim);
    // `kept`: the newest checkpoint known to hold finite weights: the one resumed from, then
    // each one this process writes (a non-finite state is never written).
    let at = Resume { ranks, dir: args.checkpoint_dir.as_deref(), run_dir: run_dir.as_ref(), claim };
    let (start, run, mut kept) = start_run(at, strategy.as_mut(), Some(&mut loader), &config, args.seed, total, length_flag)?;
    let trace = args.trace.as_ref().map(|_| Trace::new());
    if let Some(t) = &trace {
        strategy.set_trace(t.clone());
    }

    let reporter = reporter(ranks, args, start, total);
    if start == total {
        reporter.note(&format!("the checkpoint is already at step {total}: no steps to run"));
    }
    let every = args.checkpoint_every.unwrap_or(DEFAULT_CHECKPOINT_EVERY);
    let mut losses = Vec::new();
    let train_t0 = Instant::now();
    let mut step = start;
    // A signal during setup stops before the first step.
    let mut stopped = ranks.agree_stop(stop.get())?;
    while step < total && stopped.is_none() {
        step += 1;
        let batch = loader.next_batch();
        let rep = strategy.step(&batch)?;
        if !rep.loss.is_finite() {
            return Err(Error::NonFinite { step, what: format!("loss is {} at step {step}", rep.loss), kept });
        }
        reporter.step(step, rep.loss, rep.wall_s);
        losses.push((step, rep.loss));
        stopped = ranks.agree_stop(stop.get())?;
        if args.checkpoint_dir.is_some() && (step.is_multiple_of(every) || step == total || stopped.is_some()) {
            if let Some(dir) = &run_dir {
                let loader_state = loader.state();
                kept = Some(save_checkpoint(dir, strategy.as_ref(), step, kept, |optim_steps| RunState {
                    run: run.clone(),
                    step,
                    optim_steps,
                    loader: loader_state,
                    shuffle_seed: args.seed,
                    config: config.clone(),
                })?);
            }
            // Nobody goes on (and could read the directory) before rank 0 has written it.
            ranks.barrier()?;
        }
    }
    let train_s = train_t0.elapsed().as_secs_f64();
    if let Some(path) = &kept {
        reporter.note(&format!("checkpoint {}", path.display()));
    }
    let steps_run = step - start;
    let mut summary = Summary {
        summary: true,
        steps_run,
        steps: step,
        final_loss: losses.last().map(|l| l.1),
        val_loss: None,
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
        return Ok(finish_stopped(reporter, &mut summary, sig, step, args.checkpoint_dir.is_some(), t0));
    }
    if !ranks.leader() {
        // Rank 0 evaluates and writes the outputs; the job ends when it has.
        ranks.barrier()?;
        return Ok(0);
    }

    let accuracy = match &test {
        Some(t) => evaluate(strategy.as_ref(), t)?,
        None => None,
    };
    if let Some(path) = &args.save {
        crate::checkpoint::save_weights(path, &strategy.state_dict()?)?;
    }
    if let Some(path) = &args.plot {
        crate::checkpoint::write_atomic(path, plot::svg(&losses, accuracy.map(|a| (total, a))).as_bytes())?;
    }
    if let (Some(path), Some(t)) = (&args.trace, &trace) {
        t.write(path)?;
    }
    summary.test_accuracy = accuracy;
    summary.test_samples = accuracy.and(test.as_ref().map(Dataset::len));
    summary.wall_s = t0.elapsed().as_secs_f64();
    reporter.finish(&summary);
    ranks.barrier()?;
    Ok(0)
}

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
    setup::check_outputs(&[("--save", args.save.as_deref()), ("--trace", args.trace.as_deref()), ("--plot", args.plot.as_deref())])?;
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

/// The flags that decide the trajectory of weights; a resumed run must repeat them exactly.
/// The optimizer is recorded with every setting in effect (defaults included), so that `--lr
/// 0.01` and the default 0.01 agree.
fn run_config(args: &TrainArgs, model: SeedModel, optim: &OptimConfig) -> serde_json::Value {
    serde_json::json!({
        "model": setup::model_name(model),
        "data": args.data,
        "batch": args.batch,
        "optimizer": format!("{optim:?}"),
        "seed": args.seed,
    })
}

/// Where a run's checkpoints are: `--checkpoint-dir` (`dir`), opened by rank 0 alone
/// (`run_dir`), and what the run claims of it.
pub(super) struct Resume<'a> {
    pub ranks: &'a Ranks,
    pub dir: Option<&'a Path>,
    pub run_dir: Option<&'a RunDir>,
    pub claim: Claim,
}

/// Where a run starts: step 0 under a new run id, or, with `claim` `Resume`, the newest valid
/// checkpoint in the directory (loaded into `strategy` and `loader` on every rank); a fresh
/// run told to overwrite clears the directory's earlier files first. Returns the first step,
/// the run id and the checkpoint resumed from. `length_flag` names the flag that set `total`
/// in the error for a checkpoint already past it.
pub(super) fn start_run(
    at: Resume,
    strategy: &mut dyn Strategy,
    loader: Option<&mut DataLoader>,
    config: &serde_json::Value,
    seed: u64,
    total: u64,
    length_flag: &'static str,
) -> Result<(u64, String, Option<PathBuf>)> {
    let Some(dir) = at.dir else { return Ok((0, run_dir::new_run_id(), None)) };
    if at.claim != Claim::Resume {
        if let (Claim::Overwrite, Some(run_dir)) = (at.claim, at.run_dir) {
            run_dir.discard_earlier()?;
        }
        return Ok((0, run_dir::new_run_id(), None));
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
    Ok((resumed.state.step, run, Some(resumed.path)))
}

/// Writes `strategy`'s checkpoint after `step` into `dir`, unless a weight or optimizer value is
/// not finite: then the run stops with an error naming it and `kept`, the newest checkpoint
/// known to be sound. `state` builds the run state from the optimizer's step count.
pub(super) fn save_checkpoint(dir: &RunDir, strategy: &dyn Strategy, step: u64, kept: Option<PathBuf>, state: impl FnOnce(u64) -> RunState) -> Result<PathBuf> {
    let (tensors, optim_steps) = checkpoints::snapshot(strategy)?;
    if let Some((name, value)) = checkpoints::first_non_finite(&tensors) {
        let what = format!("{name} holds {value} after step {step} (its loss was finite)");
        return Err(Error::NonFinite { step, what, kept });
    }
    dir.save(&tensors, &state(optim_steps))
}

/// Ends a run a signal stopped: says how to continue it, prints the summary and returns the
/// signal's exit status.
pub(super) fn finish_stopped(reporter: Reporter, summary: &mut Summary, sig: super::stop::Stopped, step: u64, resumable: bool, t0: Instant) -> u8 {
    let resume = if resumable { "; continue it with --resume" } else { "" };
    reporter.note(&format!("stopped by {} after step {step}{resume}", sig.name));
    summary.wall_s = t0.elapsed().as_secs_f64();
    reporter.finish(summary);
    sig.exit_code()
}

/// Restores weights, optimizer and loader (when there is one) from the newest valid
/// checkpoint; returns it. Rank 0 reads the directory and sends the file to the other ranks,
/// which need not see it (another machine's disk), whatever their number when it was written.
pub(super) fn resume(ranks: &Ranks, dir: &Path, s: &mut dyn Strategy, loader: Option<&mut DataLoader>, config: &serde_json::Value, seed: u64) -> Result<Checkpoint> {
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
        let changed: Vec<String> = config
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| st.config.get(k.as_str()) != Some(v))
            .map(|(k, v)| format!("--{k} {v} (checkpoint: {})", st.config.get(k.as_str()).unwrap_or(&serde_json::Value::Null)))
            .collect();
        return Err(Error::ResumeMismatch { path: ckpt.path.clone(), changed });
    }
    s.load_state_dict(&ckpt.weights)?;
    s.load_optimizer_state(&ckpt.optim, st.optim_steps)?;
    if let Some(loader) = loader {
        loader.set_state(st.loader)?;
    }
    Ok(ckpt)
}

/// Test accuracy of a classifier: batched predictions, argmax on the host. `None` for
/// regression targets, which have no accuracy.
fn evaluate(s: &dyn Strategy, test: &Dataset) -> Result<Option<f64>> {
    let Targets::Classes { labels, .. } = &test.y else { return Ok(None) };
    let mut correct = 0usize;
    let indices: Vec<usize> = (0..test.len()).collect();
    for chunk in indices.chunks(EVAL_CHUNK) {
        let out = s.predict(&test.batch(chunk)?)?;
        let classes = out.dims().last().copied().unwrap_or(1).max(1);
        let logits = out.to_vec()?;
        for (row, &i) in logits.chunks(classes).zip(chunk) {
            let best = row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (j, &v)| if v > b.1 { (j, v) } else { b }).0;
            correct += usize::from(best as i32 == labels[i]);
        }
    }
    Ok(Some(correct as f64 / test.len().max(1) as f64))
}
