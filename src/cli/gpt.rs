//! `tandem train --model gpt`: a GPT on text (its characters or GPT-2's BPE, see `tokens`) or
//! token windows, from scratch or from a Hugging Face GPT-2 folder (see `hf_init`), under `single`,
//! `data`, `tensor`, `pipeline` or `data,pipeline` parallelism, with AdamW, clipping, warmup +
//! cosine decay, periodic validation loss, trained through the library's
//! [`Trainer`](tandem::train::Trainer) with the same run directory, resume and stop handling as
//! the seed models. Training windows are drawn at random ([`RandomWindows`]) or served in epochs ([`WindowLoader`], `--order`),
//! validated on the data's last 10% or on `--val-data`.
//!
//! The checkpoint's run configuration carries the model's shape and the tokenizer (the
//! character vocabulary, or `gpt2` for GPT-2's BPE with `--tokenizer gpt2`), so `tandem
//! generate` needs nothing but the checkpoint file.
use super::ranks::Ranks;
use super::setup::{self, StrategyKind};
pub(super) use super::tokens::Tokens;
use super::training::{Ended, Run};
use super::windows::ValWindows;
use super::{GptArgs, OptimizerKind, TrainArgs, WindowOrder};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tandem::checkpoint::{read_safetensors, to_host, write_safetensors, HostData};
use tandem::data::text::{read_text, Split, TokenWindows};
use tandem::data::{Batch, RandomWindows, Tokenizer, WindowLoader, WindowPool};
use tandem::dist::Group;
use tandem::nn::models::{Gpt, GptConfig, StateShards};
use tandem::nn::Module;
use tandem::optim::LrSchedule;
use tandem::parallel::{
    DataGrid, DataParallel, DataParallelConfig, Loss, OptimConfig, Pipeline, PipelineGrid, Single, Stages, Strategy, TensorParallelGpt,
};
use tandem::train::MeanLoss;
use tandem::{Device, Error, Result, Tensor};

/// The model's shape when --n-layer, --n-head, --n-embd are not given.
const DEFAULT_N_LAYER: usize = 4;
const DEFAULT_N_HEAD: usize = 4;
const DEFAULT_N_EMBD: usize = 128;
/// Steps when --steps is not given.
const DEFAULT_STEPS: u64 = 2000;
const DEFAULT_CHECKPOINT_EVERY: u64 = 500;
/// Validation windows in every evaluation: always the same ones, so losses compare across steps.
pub(super) const VAL_WINDOWS: usize = 64;
/// Stream of the validation windows' generator; training batch `s` uses stream `s`.
const VAL_STREAM: u64 = u64::MAX;

/// Where a run's batches come from: `--order`, `--val-data`.
pub(super) struct Draws {
    /// Every validation window, evaluated at each --eval-every.
    val: Batch,
    training: Training,
}

/// The training windows: in epochs (`--order shuffle` or `sequential`), or at random (`--order
/// random`) from the rows of a token file (all with --val-data, else the first 90%) or from
/// anywhere in a text's training tokens.
enum Training {
    Epochs(WindowLoader),
    Random(RandomWindows),
}

impl Draws {
    /// The validation windows, and the training windows' loader or rows; with --val-data all of
    /// --data trains. Checks that both hold a window before any step runs.
    fn new(args: &TrainArgs, order: WindowOrder, data: &mut Tokens, block: usize) -> Result<Draws> {
        let whole = args.gpt.val_data.is_some();
        let val = match &args.gpt.val_data {
            None => data.batch(Split::Val, VAL_WINDOWS, block, &mut batch_rng(args.seed, VAL_STREAM))?,
            Some(v) => val_windows(v, data, block)?,
        };
        // The rows served: of the token file, or of windows cut end to end from the training
        // text for a loader (a text's random windows start anywhere in its training tokens).
        let (windows, rows) = match data {
            Tokens::Text(c) => {
                if whole {
                    let c = Arc::make_mut(c);
                    c.train.append(&mut c.val);
                }
                if order == WindowOrder::Random {
                    (None, 0..0)
                } else {
                    let w = TokenWindows::from_tokens(&c.train, block, c.vocab.len(), format!("{} (training tokens)", c.source))?;
                    let rows = 0..w.rows;
                    (Some(Arc::new(w)), rows)
                }
            }
            Tokens::Windows(w, _) => (Some(w.clone()), if whole { 0..w.rows } else { w.rows_of(Split::Train) }),
        };
        let training = match windows.filter(|_| order != WindowOrder::Random) {
            None => {
                let pool = match data {
                    Tokens::Windows(w, _) => WindowPool::Rows(w.clone(), rows),
                    Tokens::Text(c) => WindowPool::Text(c.clone(), block),
                };
                Training::Random(RandomWindows::new(pool, args.batch, args.seed)?)
            }
            Some(w) => {
                if args.batch > rows.len() {
                    let what = format!(
                        "{} exceeds the {} training windows: --order shuffle and sequential serve full batches of distinct windows",
                        args.batch,
                        rows.len()
                    );
                    return Err(Error::invalid("--batch", what));
                }
                Training::Epochs(WindowLoader::new(w, rows.clone(), args.batch, order == WindowOrder::Shuffle, args.seed)?.drop_last(true)?)
            }
        };
        Ok(Draws { val, training })
    }
}

/// Every window of `--val-data`: token ids beside token ids (of the same length, in the
/// vocabulary of --data), or a text in the tokenizer of the training text.
fn val_windows(val: &str, data: &Tokens, block: usize) -> Result<Batch> {
    let windows = match (data, val.strip_prefix("text:")) {
        (Tokens::Text(c), Some(path)) => {
            let ids = c.vocab.encode(&read_text(path)?).map_err(|e| Error::format(path, format!("--val-data: {e} (the characters of --data)")))?;
            TokenWindows::from_tokens(&ids, block, c.vocab.len(), path).map_err(|e| Error::format(path, format!("--val-data: {e}")))?
        }
        (Tokens::Windows(w, _), None) if val.ends_with(".safetensors") => {
            let mut v = TokenWindows::load(val)?;
            if v.block != w.block {
                return Err(Error::format(val, format!("--val-data: windows of {} tokens, but those of --data are {} long", v.block, w.block)));
            }
            if let Some((i, &id)) = v.x.iter().chain(&v.y).enumerate().find(|&(_, &id)| id as usize >= w.vocab_size) {
                return Err(Error::format(
                    val,
                    format!("--val-data: token id {id} at flat index {i} (x, then y) is outside the vocabulary of --data, 0..{}", w.vocab_size),
                ));
            }
            // Scored over the model's vocabulary, which a file of fewer ids would not know.
            v.vocab_size = w.vocab_size;
            v
        }
        (Tokens::Text(_), None) => return Err(Error::invalid("--val-data", format!("'{val}' is not text:PATH, as a text --data needs"))),
        (Tokens::Windows(..), _) => {
            return Err(Error::invalid("--val-data", format!("'{val}' is not a PATH.safetensors of token ids, as --data is")))
        }
    };
    let rows = windows.rows;
    Ok(WindowLoader::new(Arc::new(windows), 0..rows, rows, false, 0)?.next_batch())
}

/// The generator of stream `stream` of `seed` ([`tandem::data::window_rng`]): training batch `s`
/// (0-based) is drawn from stream `s`, the validation windows and the planner's probes from
/// streams no run reaches.
pub(super) fn batch_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    tandem::data::window_rng(seed, stream)
}

pub fn train(args: &TrainArgs, ranks: &Ranks) -> Result<u8> {
    let run = Run::new(args, ranks)?;
    let g = &args.gpt;
    let order = g.order.unwrap_or(WindowOrder::Random);
    if args.epochs.is_some() && order == WindowOrder::Random {
        return Err(Error::invalid(
            "--epochs",
            "--order random draws windows with replacement and has no epochs; use --steps, or --order shuffle or sequential",
        ));
    }
    if args.micro_batches.is_some_and(|m| m == 0 || !args.batch.is_multiple_of(m)) {
        return Err(super::train::micro_batches_refused(args.micro_batches.unwrap_or(1), args.batch));
    }
    for (flag, n) in
        [("--steps", args.steps), ("--epochs", args.epochs), ("--checkpoint-every", args.checkpoint_every), ("--eval-every", g.eval_every)]
    {
        if n == Some(0) {
            return Err(Error::invalid(flag, "must be at least 1"));
        }
    }
    if args.batch == 0 {
        return Err(Error::invalid("--batch", "must be at least 1"));
    }
    let optim = setup::optim_config(args, OptimizerKind::Adamw)?;
    let limits = args.memory_limit.as_deref().map(super::memory::MemoryLimits::parse).transpose()?;
    let devices = ranks.devices(&args.devices)?;
    if let Some(l) = &limits {
        l.apply(&devices, !ranks.many())?;
    }
    ranks.check_strategy(args.strategy, true)?;
    run.check_outputs()?;

    check_shape(g)?;
    let mut data = Tokens::of(args)?;
    let cfg = config_of(args, &data)?;
    let block = cfg.block_size;
    let Draws { val, mut training } = Draws::new(args, order, &mut data, block)?;
    let (length_flag, total) = match (args.epochs, &training) {
        (Some(e), Training::Epochs(l)) => {
            let steps = e
                .checked_mul(l.batches_per_epoch() as u64)
                .ok_or_else(|| Error::invalid("--epochs", format!("{e} epochs is more steps than can be counted")))?;
            ("--epochs", steps)
        }
        _ => ("--steps", args.steps.unwrap_or(DEFAULT_STEPS)),
    };
    let schedule = lr_schedule(g.warmup_steps, optim.lr(), total)?;

    let planned = super::plan::gpt_planned(args, cfg, &data, &optim, &devices, ranks)?;
    let args = &super::plan::in_plan_precision(args, planned.as_ref())?;
    // --strategy data shares the batch by measured speed where the devices differ (--balance).
    let (weights, weights_entry) = match (&planned, args.strategy) {
        (None, StrategyKind::Data) if !args.deterministic => {
            let make = |d: &Device| -> Result<Box<dyn Module>> { Ok(Box::new(gpt_on(args, cfg)(d)?)) };
            super::plan::data_weights(args, &make, || super::plan::gpt_probe(&data, cfg, &devices[0]), &devices, ranks)?
        }
        _ => (None, None),
    };
    let mut strategy = if ranks.many() && args.strategy == StrategyKind::DataTensor {
        let tensor = setup::tensor_groups(args.tensor, args.strategy, &devices, true)?;
        let groups = devices
            .chunks(tensor)
            .map(|row| TensorParallelGpt::new(gpt_on(args, cfg)(&row[0])?, row, &optim, Loss::CrossEntropy))
            .collect::<Result<Vec<_>>>()?;
        ranks.grid(groups, &setup::grid_config(args.shard, args.bucket_size, setup::grad_dtype(args)?), &optim)?
    } else if ranks.many() && args.strategy == StrategyKind::Pipeline {
        // One pipeline over the processes: each rank builds and trains its own stages.
        if g.eval_every.is_some() {
            return Err(Error::invalid(
                "--eval-every",
                "rank 0 evaluates alone, and a pipeline across processes needs every rank's stages: leave it out",
            ));
        }
        build(args, cfg, &optim, &devices, None, Some(ranks.group()))?
    } else if ranks.many() {
        // Across processes, data parallelism spans them (check_strategy refused the others).
        let dp = match &planned {
            Some(p) => super::plan::job_config(p, args),
            None => DataParallelConfig {
                deterministic: args.deterministic,
                micro_batches: args.micro_batches.unwrap_or(1),
                shard: args.shard,
                bucket_bytes: args.bucket_size,
                grad_dtype: setup::grad_dtype(args)?,
                weights: weights.clone(),
                ..Default::default()
            },
        };
        let optim = planned.as_ref().map_or_else(|| optim.clone(), |p| p.optim(&optim));
        ranks.data_parallel(super::plan::job_gpt(args, cfg, planned.as_ref()), &devices, &optim, Loss::CrossEntropy, dp)?
    } else if let Some(p) = &planned {
        p.build_gpt(&gpt_on(args, cfg), &devices, &optim)?
    } else {
        build(args, cfg, &optim, &devices, weights, None)?
    };
    setup::set_precision(&mut *strategy, args)?;
    let clip = setup::grad_clip(args)?;
    if let Some(path) = &args.init {
        let weights = match super::hf_init::folder(args) {
            Some(dir) => super::hf_init::weights(dir, &cfg)?,
            None => read_weights(path)?,
        };
        strategy.load_state_dict(&weights).map_err(|e| Error::format(path, format!("--init: {e}")))?;
    }
    let mut config = run_config(args, cfg, &optim, schedule.as_ref(), data.tokenizer());
    setup::record_precision(&mut config, args);
    // A resumed run repeats the plan rather than measuring again.
    if let Some(entry) = super::plan::config_entry(args, ranks, planned.as_ref())? {
        config["plan"] = entry;
    }
    if let Some(entry) = weights_entry {
        config["batch_weights"] = entry;
    }

    let every = args.checkpoint_every.unwrap_or(DEFAULT_CHECKPOINT_EVERY);
    let (mut trainer, console) = run.trainer(strategy, total, clip, config.clone(), every);
    let console = console.with_plan(planned.as_ref());
    if let Some(sch) = schedule {
        trainer = trainer.schedule(sch);
    }
    // The replicas are equal: rank 0's validation loss is every rank's.
    if let (Some(e), true) = (g.eval_every, ranks.leader()) {
        trainer = trainer.validate(e, ValWindows::new(val, args.batch), vec![Box::new(MeanLoss::new(Loss::CrossEntropy))]);
    }
    let trained = match &mut training {
        Training::Epochs(l) => run.fit(&mut trainer, l, console, length_flag)?,
        Training::Random(windows) => {
            // The windows of a step are drawn from (--seed, the step): told where the run starts.
            trainer = trainer.observe(windows.observer());
            run.fit(&mut trainer, windows, console, length_flag)?
        }
    };
    let trained = match trained {
        Ended::Trained(t) => t,
        Ended::Exit(code) => return Ok(code),
    };
    if let Some(p) = &planned {
        trained.note(&super::plan::compared(p, trained.fit.train_s, trained.fit.steps_run()));
    }
    setup::note_loss_scale(&trained, trainer.strategy().core());
    if let Some(path) = &args.save {
        let meta = BTreeMap::from([("config".to_string(), config.to_string())]);
        write_safetensors(path, &to_host(&trainer.strategy().state_dict()?)?, &meta)?;
    }
    run.finish(*trained, None)
}

/// The model of the shape flags (their defaults where not given) over `data`'s vocabulary and
/// window length; or of the Hugging Face folder `--init` names (see `hf_init`).
pub(super) fn config_of(args: &TrainArgs, data: &Tokens) -> Result<GptConfig> {
    let g = &args.gpt;
    check_shape(g)?;
    if let Some(dir) = super::hf_init::folder(args) {
        return super::hf_init::config(args, data, dir);
    }
    Ok(GptConfig {
        n_layer: g.n_layer.unwrap_or(DEFAULT_N_LAYER),
        n_head: g.n_head.unwrap_or(DEFAULT_N_HEAD),
        n_embd: g.n_embd.unwrap_or(DEFAULT_N_EMBD),
        block_size: data.block(g.block_size)?,
        vocab_size: data.vocab_size(),
        dropout: g.dropout.unwrap_or(0.0),
        bias: true,
    })
}

/// Refuses, as usage errors, model-shape flags no model can have: a zero count or width, a
/// width that the heads do not divide, a dropout outside [0, 1).
/// Checked before any data is read, with the defaults of the flags not given.
fn check_shape(g: &GptArgs) -> Result<()> {
    let (n_head, n_embd) = (g.n_head.unwrap_or(DEFAULT_N_HEAD), g.n_embd.unwrap_or(DEFAULT_N_EMBD));
    for (flag, n) in [("--n-layer", g.n_layer), ("--n-head", g.n_head), ("--n-embd", g.n_embd), ("--block-size", g.block_size)] {
        if n == Some(0) {
            return Err(Error::invalid(flag, "must be at least 1"));
        }
    }
    if !n_embd.is_multiple_of(n_head) {
        return Err(Error::invalid("--n-embd", format!("{n_embd} is not a multiple of --n-head {n_head}")));
    }
    if let Some(p) = g.dropout.filter(|p| !(0.0..1.0).contains(p)) {
        return Err(Error::invalid("--dropout", format!("{p} is not in [0, 1)")));
    }
    Ok(())
}

/// The model of `cfg` drawn from `--seed` on a device, its blocks recomputing their
/// activations in the backward with `--recompute`.
pub(super) fn gpt_on(args: &TrainArgs, cfg: GptConfig) -> impl Fn(&Device) -> Result<Gpt> + Copy + '_ {
    move |d| {
        let g = Gpt::new(cfg, args.seed, d)?;
        g.set_recompute(args.recompute);
        Ok(g)
    }
}

/// `single` or `data` (what `auto` becomes), `tensor`, `pipeline`, `data,pipeline` and
/// `data,tensor`; with
/// `--recompute` each block (single, data, tensor) or each stage (the pipelines) recomputes its
/// activations in the backward. `across`: the job's processes, over which a pipeline spans.
fn build(
    args: &TrainArgs,
    cfg: GptConfig,
    optim: &OptimConfig,
    devices: &[Device],
    weights: Option<Vec<f64>>,
    across: Option<&Group>,
) -> Result<Box<dyn Strategy>> {
    let micro_batches = args.micro_batches.unwrap_or(1);
    let gpt = gpt_on(args, cfg);
    let kind = match args.strategy {
        StrategyKind::Auto if devices.len() == 1 && !args.deterministic => StrategyKind::Single,
        StrategyKind::Auto => StrategyKind::Data,
        k => k,
    };
    if args.pipelines.is_some() && kind != StrategyKind::DataPipeline {
        return Err(Error::invalid("--pipelines", "needs --strategy data,pipeline"));
    }
    let tensor = setup::tensor_groups(args.tensor, kind, devices, false)?;
    setup::check_shard(args.shard, kind)?;
    let grid_cfg = setup::grid_config(args.shard, args.bucket_size, setup::grad_dtype(args)?);
    if matches!(kind, StrategyKind::Single | StrategyKind::Auto | StrategyKind::Data) {
        // The whole model trains on each device: refuse before drawing a weight what cannot fit.
        let shards = match kind {
            StrategyKind::Data => {
                StateShards { gradient_bytes: setup::grad_dtype(args)?.size() as u64, ..args.shard.state_shards(devices.len() as u64) }
            }
            _ => StateShards::WHOLE,
        };
        for d in devices {
            cfg.check_sharded_training_fits(d, optim.device_states_per_parameter(), shards)?;
        }
    }
    match kind {
        StrategyKind::Single | StrategyKind::Auto if devices.len() != 1 => {
            let specs: Vec<String> = devices.iter().map(Device::spec).collect();
            Err(Error::invalid("--strategy single", format!("runs on one device, --devices names {}: {}", specs.len(), specs.join(","))))
        }
        StrategyKind::Single | StrategyKind::Auto if micro_batches == 1 && !args.deterministic => {
            Ok(Box::new(Single::new(gpt(&devices[0])?, optim, Loss::CrossEntropy, &devices[0])?))
        }
        StrategyKind::Single | StrategyKind::Auto | StrategyKind::Data => {
            let dp = DataParallelConfig {
                deterministic: args.deterministic,
                micro_batches,
                shard: args.shard,
                bucket_bytes: args.bucket_size,
                grad_dtype: setup::grad_dtype(args)?,
                weights,
                ..Default::default()
            };
            Ok(Box::new(DataParallel::from_factory(gpt, devices, optim, Loss::CrossEntropy, dp)?))
        }
        StrategyKind::Tensor => {
            if micro_batches != 1 || args.deterministic {
                return Err(Error::invalid(
                    "--strategy tensor",
                    "runs the whole batch at once, deterministically: --micro-batches and --deterministic do not apply",
                ));
            }
            Ok(Box::new(TensorParallelGpt::new(gpt(&devices[0])?, devices, optim, Loss::CrossEntropy)?))
        }
        StrategyKind::Pipeline => Ok(Box::new(pipeline(args, cfg, optim, devices, micro_batches, tensor, across)?)),
        StrategyKind::DataPipeline => {
            let rows = args.pipelines.unwrap_or(2);
            if rows == 0 || !devices.len().is_multiple_of(rows * tensor) || devices.len() == rows * tensor {
                let what = format!(
                    "{rows} pipelines of stages of {tensor} devices over {} devices: give a multiple of {} devices, at least 2 stages per pipeline",
                    devices.len(),
                    rows * tensor
                );
                return Err(Error::invalid("--pipelines", what));
            }
            if !args.batch.is_multiple_of(rows * micro_batches) {
                let what = format!("--batch {} does not split into {rows} pipelines of {micro_batches} equal micro-batches", args.batch);
                return Err(Error::invalid("--micro-batches", what));
            }
            Ok(Box::new(
                PipelineGrid::from_factory(devices, rows, |row| pipeline(args, cfg, optim, row, micro_batches, tensor, None))?
                    .shard(&grid_cfg, optim)?,
            ))
        }
        StrategyKind::DataTensor => {
            if micro_batches != 1 || args.deterministic {
                return Err(Error::invalid(
                    "--strategy data,tensor",
                    "runs each group's share at once: --micro-batches and --deterministic do not apply",
                ));
            }
            let mesh =
                DataGrid::from_factory(devices, devices.len() / tensor, |row| TensorParallelGpt::new(gpt(&row[0])?, row, optim, Loss::CrossEntropy))?
                    .shard(&grid_cfg, optim)?;
            Ok(Box::new(match weights {
                Some(w) => mesh.split_weights(setup::group_weights(&w, tensor))?,
                None => mesh,
            }))
        }
        StrategyKind::Model => Err(Error::invalid(
            "--strategy",
            "model is not supported for --model gpt yet; use single, data, tensor, pipeline, data,pipeline or data,tensor",
        )),
    }
}

/// A GPT pipeline over `devices`, one stage per device or per group of `tensor` consecutive
/// devices (the blocks' heads and MLP features split over the group): the blocks split
/// evenly, the embeddings on the first stage, ln_f and the output projection (a copy of `wte`,
/// tied) on the last. `across`: the stages of every process in rank order make the pipeline,
/// this process building its own (collective).
fn pipeline(
    args: &TrainArgs,
    cfg: GptConfig,
    optim: &OptimConfig,
    devices: &[Device],
    micro_batches: usize,
    tensor: usize,
    across: Option<&Group>,
) -> Result<Pipeline> {
    let local = devices.len() / tensor;
    let (mine, stages) = match across {
        Some(g) => {
            let counts: Vec<usize> = g.all_gather_u64(&[local as u64])?.iter().map(|c| c.first().map_or(0, |&n| n as usize)).collect();
            let first: usize = counts[..g.rank()].iter().sum();
            (first..first + local, counts.iter().sum())
        }
        None => (0..local, local),
    };
    if stages > cfg.n_layer {
        return Err(Error::invalid(
            "--devices",
            format!("{stages} pipeline stages for {} blocks (--n-layer): every stage needs a block", cfg.n_layer),
        ));
    }
    // Initialised on the host, so that no device holds the whole model.
    let gpt = Gpt::new(cfg, args.seed, &Device::cpu())?;
    let built = match tensor {
        1 => Stages::Built(gpt.stages_of(mine, stages, devices, None)?),
        t => Stages::Sharded(gpt.tensor_stages_of(mine, stages, devices, t, None)?),
    };
    let pipe = Pipeline::builder(built, devices, optim, Loss::CrossEntropy)
        .micro_batches(micro_batches)
        .schedule(setup::pipeline_schedule(args.schedule))
        .recompute(args.recompute)
        .tie((0, Gpt::WTE), (stages - 1, Gpt::LM_HEAD));
    match across {
        Some(g) => pipe.across(g).build(),
        None => pipe.build(),
    }
}

/// Warmup then cosine decay to a tenth of the rate at the last step, or `None` (a constant rate).
fn lr_schedule(warmup: Option<u64>, lr: f32, total: u64) -> Result<Option<LrSchedule>> {
    let Some(warmup_steps) = warmup else { return Ok(None) };
    let decay_steps = total.saturating_sub(1);
    if warmup_steps > decay_steps {
        return Err(Error::invalid("--warmup-steps", format!("{warmup_steps} leaves no step to decay over in a run of {total} steps")));
    }
    let s = LrSchedule::WarmupCosine { lr, warmup_steps, decay_steps, min_lr: lr / 10.0 };
    s.check()?;
    Ok(Some(s))
}

/// The flags that decide the trajectory of weights (a resume must repeat them: the data, its
/// tokenizer and the order its windows are drawn in among them), the model's shape and the
/// tokenizer (which `generate` reads back): `vocab` holds a character vocabulary, `tokenizer`
/// names any other.
fn run_config(
    args: &TrainArgs,
    cfg: GptConfig,
    optim: &OptimConfig,
    schedule: Option<&LrSchedule>,
    tokenizer: Option<&Tokenizer>,
) -> serde_json::Value {
    let vocab = match tokenizer {
        Some(Tokenizer::Chars(v)) => Some(v.chars().iter().collect::<String>()),
        _ => None,
    };
    let g = &args.gpt;
    let mut config = serde_json::json!({
        "model": "gpt",
        "data": args.data,
        "batch": args.batch,
        "optimizer": format!("{optim:?}"),
        "seed": args.seed,
        "grad_clip": args.grad_clip,
        "lr_schedule": schedule,
        "gpt": {
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd, "block_size": cfg.block_size,
            "vocab_size": cfg.vocab_size, "dropout": cfg.dropout, "bias": cfg.bias,
        },
        "vocab": vocab,
    });
    // Only where given, so that checkpoints of runs that drew at random and validated on
    // --data's last 10% (written before these flags) resume.
    if let Some(order) = g.order.filter(|&o| o != WindowOrder::Random) {
        config["order"] = format!("{order:?}").to_lowercase().into();
    }
    if let Some(val) = &g.val_data {
        config["val_data"] = val.as_str().into();
    }
    if let Some(t) = tokenizer.filter(|t| !matches!(t, Tokenizer::Chars(_))) {
        config["tokenizer"] = t.name().into();
    }
    config
}

/// Weights for `--init`: a safetensors of the model's state_dict (a `--save` file, or
/// nanoGPT's `state_dict()`), names as the model's.
fn read_weights(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let (tensors, _) = read_safetensors(path)?;
    setup::finite_weights(path, &tensors)?;
    tensors
        .into_iter()
        .map(|(name, h)| match h.data {
            HostData::F32(v) => Ok((name, Tensor::from_vec(v, h.shape, &Device::cpu())?)),
            HostData::I32(_) => Err(Error::format(path, format!("{name} holds integers; weights must be F32, F16 or BF16"))),
        })
        .collect()
}
