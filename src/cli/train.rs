//! `tandem train`: check every input, build the strategy, run the steps with checkpoints, then
//! evaluate on the test split and write the requested outputs. SIGINT or SIGTERM ends the run
//! after the current step, with a checkpoint and the summary.
use super::ranks::Ranks;
use super::setup::{self, build_strategy, DataSource, StrategyPlan};
use super::stop::StopSignal;
use super::training::{self, Ended, Resume, Steps};
use super::{ModelArg, OptimizerKind, TrainArgs};
use tandem::data::{DataLoader, Dataset, Targets};
use tandem::nn::models::SeedModel;
use tandem::nn::Module;
use tandem::parallel::{DataParallelConfig, Loss, OptimConfig, Strategy};
use tandem::{Device, Error, Result};
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
    let (claim, run_dir) = training::outputs_and_run_dir(args, ranks)?;

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
    let at = Resume { ranks, dir: args.checkpoint_dir.as_deref(), run_dir: run_dir.as_ref(), claim };
    let start = training::start_run(at, strategy.as_mut(), Some(&mut loader), &config, args.seed, total, length_flag)?;
    let reporter = training::reporter(ranks, args, start.step, total);
    if start.step == total {
        reporter.note(&format!("the checkpoint is already at step {total}: no steps to run"));
    }
    let every = args.checkpoint_every.unwrap_or(DEFAULT_CHECKPOINT_EVERY);
    let steps = Steps { args, ranks, stop: &stop, run_dir: run_dir.as_ref(), config: &config, total, every, t0 };
    let next = |_: &mut dyn Strategy, _: u64| {
        let batch = loader.next_batch();
        Ok((batch, loader.state()))
    };
    let mut trained = match steps.run(strategy.as_mut(), start, reporter, next, |_, _| Ok(None))? {
        Ended::Trained(t) => t,
        Ended::Exit(code) => return Ok(code),
    };

    let accuracy = match &test {
        Some(t) => evaluate(strategy.as_ref(), t)?,
        None => None,
    };
    if let Some(path) = &args.save {
        tandem::checkpoint::save_weights(path, &strategy.state_dict()?)?;
    }
    trained.summary.test_accuracy = accuracy;
    trained.summary.test_samples = accuracy.and(test.as_ref().map(Dataset::len));
    trained.finish(&steps, accuracy.map(|a| (total, a)))
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
