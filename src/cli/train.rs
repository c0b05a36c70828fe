//! `tandem train`: check every input, build the strategy, run the steps with checkpoints, then
//! evaluate on the test split and write the requested outputs.
use super::checkpoints::{self, RunState};
use super::progress::{Reporter, Summary};
use super::setup::{self, build_strategy, DataSource, StrategyPlan};
use super::{plot, TrainArgs};
use crate::data::{DataLoader, Dataset, Targets};
use crate::nn::Module;
use crate::parallel::{trace::Trace, Loss, OptimConfig, Strategy};
use crate::{Device, Error, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Steps when neither --steps nor --epochs is given: the seed CNN reaches >= 95% on the
/// digits test split at batch 64 in this many steps.
const DEFAULT_STEPS: u64 = 1500;
const DEFAULT_CHECKPOINT_EVERY: u64 = 100;
/// Samples per forward pass when evaluating.
const EVAL_CHUNK: usize = 1000;

pub fn run(args: &TrainArgs) -> Result<()> {
    let t0 = Instant::now();
    let source = DataSource::parse(&args.data)?;
    let optim = setup::optim_config(args)?;
    if args.batch == 0 {
        return Err(Error::invalid("--batch", "must be at least 1"));
    }
    let micro_batches = args.micro_batches.unwrap_or(1);
    if micro_batches == 0 || !args.batch.is_multiple_of(micro_batches) {
        return Err(Error::invalid("--micro-batches", format!("{micro_batches} does not divide --batch {}", args.batch)));
    }
    if args.steps == Some(0) || args.epochs == Some(0) || args.checkpoint_every == Some(0) {
        return Err(Error::Msg("--steps, --epochs and --checkpoint-every must be at least 1".into()));
    }
    for (flag, path) in [("--save", &args.save), ("--trace", &args.trace), ("--plot", &args.plot)] {
        if let Some(p) = path {
            setup::check_output(flag, p)?;
        }
    }
    let devices = Device::parse(&args.devices)?;

    let (train, test) = source.load(args.model, args.seed)?;
    setup::check_fit(args.model, &train, "training data")?;
    if let Some(t) = &test {
        setup::check_fit(args.model, t, "test data")?;
    }
    if args.batch > train.len() {
        return Err(Error::invalid("--batch", format!("{} exceeds the {} training samples", args.batch, train.len())));
    }
    let loss = Loss::for_targets(&train.y);
    let mut loader = DataLoader::new(Arc::new(train), args.batch, true, args.seed)?.drop_last(true)?;
    let total = match (args.steps, args.epochs) {
        (Some(s), _) => s,
        (None, Some(e)) => e
            .checked_mul(loader.batches_per_epoch() as u64)
            .ok_or_else(|| Error::invalid("--epochs", format!("{e} epochs is more steps than can be counted")))?,
        (None, None) => DEFAULT_STEPS,
    };

    let model = args.model.build(args.seed, &Device::cpu())?;
    if let Some(path) = &args.init {
        model.load_state(&setup::read_init(path, &model)?)?;
    }
    let plan = StrategyPlan {
        kind: args.strategy,
        model,
        optim,
        loss,
        devices,
        micro_batches,
        schedule: args.schedule,
        deterministic: args.deterministic,
    };
    let mut strategy = build_strategy(plan)?;

    let config = run_config(args, &optim);
    let mut start = 0;
    if let Some(dir) = &args.checkpoint_dir {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        checkpoints::remove_stale_temps(dir)?;
        if args.resume {
            start = resume(dir, strategy.as_mut(), &mut loader, &config, args.seed)?;
        }
    }
    let trace = args.trace.as_ref().map(|_| Trace::new());
    if let Some(t) = &trace {
        strategy.set_trace(t.clone());
    }

    let reporter = Reporter::new(args.log_format, start + 1, total, args.batch);
    let every = args.checkpoint_every.unwrap_or(DEFAULT_CHECKPOINT_EVERY);
    let mut losses = Vec::new();
    let train_t0 = Instant::now();
    let mut last_saved = start;
    for step in start + 1..=total {
        let batch = loader.next_batch();
        let rep = strategy.step(&batch)?;
        if !rep.loss.is_finite() {
            return Err(Error::NonFinite { step, value: rep.loss });
        }
        reporter.step(step, rep.loss, rep.wall_s);
        losses.push((step, rep.loss));
        if let Some(dir) = &args.checkpoint_dir {
            if step.is_multiple_of(every) || step == total {
                let state = run_state(step, strategy.as_ref(), &loader, &config, args.seed)?;
                checkpoints::save(dir, strategy.as_ref(), &state)?;
                last_saved = step;
            }
        }
    }
    let train_s = train_t0.elapsed().as_secs_f64();
    if let Some(dir) = &args.checkpoint_dir {
        reporter.note(&format!("checkpoint {}", dir.join(checkpoints::file_name(last_saved)).display()));
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
    let steps_run = total.saturating_sub(start);
    let summary = Summary {
        summary: true,
        steps_run,
        steps: total.max(start),
        final_loss: losses.last().map(|l| l.1),
        test_accuracy: accuracy,
        test_samples: accuracy.and(test.as_ref().map(Dataset::len)),
        samples_per_sec: (steps_run as f64 * args.batch as f64) / train_s.max(1e-9),
        train_s,
        wall_s: t0.elapsed().as_secs_f64(),
    };
    reporter.finish(&summary);
    Ok(())
}

/// The flags that decide the trajectory of weights; a resumed run must repeat them exactly.
/// The optimizer is recorded with every setting in effect (defaults included), so that `--lr
/// 0.01` and the default 0.01 agree.
fn run_config(args: &TrainArgs, optim: &OptimConfig) -> serde_json::Value {
    serde_json::json!({
        "model": setup::model_name(args.model),
        "data": args.data,
        "batch": args.batch,
        "optimizer": format!("{optim:?}"),
        "seed": args.seed,
    })
}

fn run_state(step: u64, s: &dyn Strategy, loader: &DataLoader, config: &serde_json::Value, seed: u64) -> Result<RunState> {
    let (_, optim_steps) = s.optimizer_state()?;
    Ok(RunState { step, optim_steps, loader: loader.state(), shuffle_seed: seed, config: config.clone() })
}

/// Restores weights, optimizer and loader from the newest valid checkpoint; returns its step.
fn resume(dir: &Path, s: &mut dyn Strategy, loader: &mut DataLoader, config: &serde_json::Value, seed: u64) -> Result<u64> {
    let ckpt = checkpoints::load_newest(dir, |path, e| eprintln!("warning: skipping checkpoint {}: {e}", path.display()))?;
    let st = &ckpt.state;
    if st.config != *config || st.shuffle_seed != seed {
        let changed: Vec<String> = config
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| st.config.get(k.as_str()) != Some(v))
            .map(|(k, v)| format!("--{k} {v} (checkpoint: {})", st.config.get(k.as_str()).unwrap_or(&serde_json::Value::Null)))
            .collect();
        return Err(Error::Msg(format!("--resume: {} was written with other settings: {}", ckpt.path.display(), changed.join(", "))));
    }
    s.load_state_dict(&ckpt.weights)?;
    s.load_optimizer_state(&ckpt.optim, st.optim_steps)?;
    loader.set_state(st.loader)?;
    eprintln!("resuming from {} (step {})", ckpt.path.display(), st.step);
    Ok(st.step)
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
