//! `tandem train`: check every input, build the strategy, train it through the library's
//! [`Trainer`](tandem::train::Trainer) with checkpoints, then evaluate on the test split and
//! write the requested outputs. SIGINT or SIGTERM ends the run after the current step, with a
//! checkpoint and the summary.
use super::ranks::Ranks;
use super::setup::{self, build_strategy, DataSource, StrategyPlan};
use super::training::{Ended, Run};
use super::{ModelArg, OptimizerKind, StrategyKind, TrainArgs};
use std::sync::Arc;
use tandem::data::{DataLoader, Dataset, Targets};
use tandem::nn::models::SeedModel;
use tandem::nn::Module;
use tandem::parallel::plan::Plan;
use tandem::parallel::{DataParallelConfig, Loss, OptimConfig, TensorParallel};
use tandem::train::{Accuracy, Metric, Trainer};
use tandem::{Device, Error, Result};

/// Steps when neither --steps nor --epochs is given: the seed CNN reaches >= 95% on the
/// digits test split at batch 64 in this many steps.
const DEFAULT_STEPS: u64 = 1500;
const DEFAULT_CHECKPOINT_EVERY: u64 = 100;
/// Samples per forward pass when evaluating.
const EVAL_CHUNK: usize = 1000;

pub fn run(args: &TrainArgs, ranks: &Ranks) -> Result<u8> {
    let ModelArg::Seed(model_kind) = args.model else { return super::gpt::train(args, ranks) };
    setup::no_gpt_flags(args)?;
    let run = Run::new(args, ranks)?;
    let source = DataSource::parse(&args.data)?;
    let optim = setup::optim_config(args, OptimizerKind::Sgd)?;
    if args.batch == 0 {
        return Err(Error::invalid("--batch", "must be at least 1"));
    }
    let micro_batches = args.micro_batches.unwrap_or(1);
    if micro_batches == 0 || !args.batch.is_multiple_of(micro_batches) {
        return Err(micro_batches_refused(micro_batches, args.batch));
    }
    for (flag, n) in [("--steps", args.steps), ("--epochs", args.epochs), ("--checkpoint-every", args.checkpoint_every)] {
        if n == Some(0) {
            return Err(Error::invalid(flag, "must be at least 1"));
        }
    }
    let limits = args.memory_limit.as_deref().map(super::memory::MemoryLimits::parse).transpose()?;
    let devices = ranks.devices(&args.devices)?;
    if let Some(l) = &limits {
        l.apply(&devices, !ranks.many())?;
    }
    ranks.check_strategy(args.strategy, false)?;
    run.check_outputs()?;

    let (train, test) = source.load(model_kind, args.seed)?;
    setup::check_fit(model_kind, &train, "training data")?;
    if let Some(t) = &test {
        setup::check_fit(model_kind, t, "test data")?;
    }
    if args.batch > train.len() {
        return Err(Error::invalid("--batch", format!("{} exceeds the {} training samples", args.batch, train.len())));
    }
    let loss = Loss::for_targets(&train.y);
    // The planner and --balance time the model on a few training samples, before the loader
    // takes the data.
    let model = model_kind.build(args.seed, &Device::cpu())?;
    // Across processes the planner plans every rank's devices together (data parallelism).
    let planned = planned(args, &model, &train, &optim, &devices, ranks)?;
    // A plan that chose the precision trains in it (and records it for a resume).
    let args = &super::plan::in_plan_precision(args, planned.as_ref())?;
    let (weights, weights_entry) = match (&planned, args.strategy) {
        (None, StrategyKind::Data) if !args.deterministic => {
            let make = |d: &Device| -> Result<Box<dyn Module>> { Ok(Box::new(model.slice(0..model.len(), d)?)) };
            super::plan::data_weights(args, &make, || super::plan::probe(&train, &devices[0]), &devices, ranks)?
        }
        _ => (None, None),
    };
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

    if let Some(path) = &args.init {
        model.load_state_dict(&setup::read_init(path, &model)?)?;
    }
    let strategy = if ranks.many() && args.strategy == StrategyKind::DataTensor {
        let tensor = setup::tensor_groups(args.tensor, args.strategy, &devices, true)?;
        let groups = devices.chunks(tensor).map(|row| TensorParallel::new(&model, row, &optim, loss.clone())).collect::<Result<Vec<_>>>()?;
        ranks.grid(groups, &setup::grid_config(args.shard, args.bucket_size, setup::grad_dtype(args)?), &optim)?
    } else if ranks.many() {
        let cfg = match &planned {
            Some(p) => super::plan::job_config(p, args),
            None => DataParallelConfig {
                deterministic: args.deterministic,
                micro_batches,
                shard: args.shard,
                bucket_bytes: args.bucket_size,
                grad_dtype: setup::grad_dtype(args)?,
                weights: weights.clone(),
                ..Default::default()
            },
        };
        let optim = planned.as_ref().map_or_else(|| optim.clone(), |p| p.optim(&optim));
        ranks.data_parallel(|d| model.slice(0..model.len(), d), &devices, &optim, loss, cfg)?
    } else if let Some(p) = &planned {
        p.build(&model, &devices, &optim, loss)?
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
            shard: args.shard,
            bucket_bytes: args.bucket_size,
            grad_dtype: setup::grad_dtype(args)?,
            weights: weights.clone(),
            tensor: args.tensor,
        };
        build_strategy(plan)?
    };
    let mut strategy = strategy;
    setup::set_precision(&mut *strategy, args)?;
    let clip = setup::grad_clip(args)?;

    let mut config = run_config(args, model_kind, &optim);
    setup::record_precision(&mut config, args);
    // What a resumed run must repeat rather than measure again: the plan (its alternatives
    // and rejections are not needed for that), or the measured batch weights.
    if let Some(entry) = super::plan::config_entry(args, ranks, planned.as_ref())? {
        config["plan"] = entry;
    }
    if let Some(entry) = weights_entry {
        config["batch_weights"] = entry;
    }
    let every = args.checkpoint_every.unwrap_or(DEFAULT_CHECKPOINT_EVERY);
    let (mut trainer, console) = run.trainer(strategy, total, clip, config, every);
    let console = console.with_plan(planned.as_ref());
    let trained = match run.fit(&mut trainer, &mut loader, console, length_flag)? {
        Ended::Trained(t) => t,
        Ended::Exit(code) => return Ok(code),
    };
    if let Some(p) = &planned {
        trained.note(&super::plan::compared(p, trained.fit.train_s, trained.fit.steps_run()));
    }
    setup::note_loss_scale(&trained, trainer.strategy().core());

    let accuracy = match test {
        Some(t) => evaluate(&mut trainer, t)?,
        None => None,
    };
    if let Some(path) = &args.save {
        tandem::checkpoint::save_weights(path, &trainer.strategy().state_dict()?)?;
    }
    run.finish(*trained, accuracy)
}

/// The plan `train` runs with: with `--plan FILE`, or `--strategy auto` on several devices
/// (one device is `single`; `--deterministic` keeps `auto` data parallel, since a measured plan
/// differs from run to run). Only within one process.
fn planned(
    args: &TrainArgs,
    model: &tandem::nn::Sequential,
    train: &Dataset,
    optim: &OptimConfig,
    devices: &[Device],
    ranks: &super::ranks::Ranks,
) -> Result<Option<Plan>> {
    let auto = args.strategy == StrategyKind::Auto && (devices.len() > 1 || ranks.many()) && !args.deterministic;
    super::plan::check_search_precision(args, auto && args.plan.is_none())?;
    if args.plan.is_none() && !auto {
        return Ok(None);
    }
    if args.micro_batches.is_some() {
        return Err(Error::invalid("--micro-batches", "a plan chooses its micro-batches; give --strategy to set them by hand"));
    }
    if args.shard != tandem::parallel::Shard::None {
        return Err(Error::invalid("--shard", "a plan chooses its sharding; give --strategy data to set it by hand"));
    }
    super::plan::for_training(args, &model.describe(), devices, ranks, || {
        Ok(super::plan::announced(super::plan::on_devices(model, train, args, optim, devices, ranks)?, ranks, args))
    })
    .map(Some)
}

/// The flags that decide the trajectory of weights; a resumed run must repeat them exactly.
/// The optimizer is recorded with every setting in effect (defaults included), so that `--lr
/// 0.01` and the default 0.01 agree.
/// The usage error for `--micro-batches n` beside `--batch`, which it must divide.
pub(super) fn micro_batches_refused(n: usize, batch: usize) -> Error {
    if n == 0 {
        return Error::invalid("--micro-batches", "must be at least 1");
    }
    let detail = format!("--micro-batches {n} does not divide --batch {batch} into equal micro-batches; give a divisor of --batch");
    Error::invalid("--micro-batches", detail)
}

fn run_config(args: &TrainArgs, model: SeedModel, optim: &OptimConfig) -> serde_json::Value {
    serde_json::json!({
        "model": setup::model_name(model),
        "data": args.data,
        "batch": args.batch,
        "optimizer": format!("{optim:?}"),
        "seed": args.seed,
    })
}

/// Test accuracy of a classifier and the samples it was measured on, `EVAL_CHUNK` samples
/// per forward; `None` for regression targets, which have no accuracy.
fn evaluate(trainer: &mut Trainer, test: Dataset) -> Result<Option<(f64, usize)>> {
    if !matches!(test.y, Targets::Classes { .. }) {
        return Ok(None);
    }
    let n = test.len();
    if n == 0 {
        return Ok(Some((0.0, 0)));
    }
    let mut source = DataLoader::new(Arc::new(test), EVAL_CHUNK, false, 0)?;
    let mut metrics: [Box<dyn Metric>; 1] = [Box::new(Accuracy::new())];
    let values = trainer.evaluate(&mut source, &mut metrics)?;
    Ok(values.first().map(|(_, a)| (*a, n)))
}
