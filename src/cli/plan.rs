//! `tandem plan` and the planner's part in `tandem train`: calibrate the model (a seed model or
//! the GPT) on the devices, under their `--memory-limit` budgets (or scale it to a described
//! cluster), search the layouts, print the plan and save it; and for `train --strategy auto` /
//! `--plan FILE`, the plan a run trains with, which a resumed run takes from its checkpoint
//! instead of planning again.
use super::gpt::Tokens;
use super::ranks::Ranks;
use super::setup::StrategyKind;
use super::{Balance, ModelArg, OptimizerKind};
use super::{PlanArgs, TrainArgs};
use std::path::PathBuf;
use tandem::data::text::Split;
use tandem::data::Dataset;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::{Module, Sequential};
use tandem::optim::Precision;
use tandem::parallel::plan::{self, gpt_cuttable, gpt_unbuildable, job_unbuildable, unbuildable, Cluster, Plan, Workload, REFERENCE_FLOPS};
use tandem::parallel::{inputs_to_device, DataParallelConfig, Loss, OptimConfig, Shard};
use tandem::train::plan_record;
use tandem::{DType, Device, Error, Result, Tensor};

/// Samples of the training data the calibration times each layer on (and twice as many).
const PROBE: usize = 16;
/// Token windows the GPT's calibration times each layer on (and twice as many).
const GPT_PROBE: usize = 4;
/// The stream of the windows the GPT's calibration draws (training batch `s` uses stream `s`).
const PROBE_STREAM: u64 = u64::MAX - 1;

/// `tandem plan`: the plan for `train`'s flags on `--devices` (their budgets set by
/// `--memory-limit`), or on `--cluster`.
pub fn run(args: &PlanArgs, ranks: &super::ranks::Ranks) -> Result<()> {
    let t = &args.train;
    if t.batch == 0 {
        return Err(Error::invalid("--batch", "must be at least 1"));
    }
    if let Some(path) = &args.save_plan {
        super::setup::check_output("--save-plan", path)?;
    }
    let limits = t.memory_limit.as_deref().map(super::memory::MemoryLimits::parse).transpose()?;
    if limits.is_some() && args.cluster.is_some() {
        return Err(Error::invalid("--memory-limit", "budgets apply to --devices; a --cluster describes its devices' memory"));
    }
    let devices = |ranks: &super::ranks::Ranks| -> Result<Vec<Device>> {
        let devices = ranks.devices(&t.devices)?;
        if let Some(l) = &limits {
            l.apply(&devices, !ranks.many())?;
        }
        Ok(devices)
    };
    check_search_precision(t, args.cluster.is_none())?;
    let ModelArg::Seed(kind) = t.model else {
        let p = gpt_plan(args, ranks, &|| devices(ranks))?;
        return save(args, &p, ranks);
    };
    let optim = super::setup::optim_config(t, OptimizerKind::Sgd)?;
    let (train, _) = super::setup::DataSource::parse(&t.data)?.load(kind, t.seed)?;
    super::setup::check_fit(kind, &train, "training data")?;
    let model = kind.build(t.seed, &Device::cpu())?;
    let p = match &args.cluster {
        Some(name) => {
            let cluster = Cluster::parse(name)?;
            let (p, how) = on_cluster(&model, &train, t.batch, &optim, &cluster, reuse(t)?, t.precision, t.grad_dtype)?;
            out!("{p}");
            out!("{}", p.megatron(&cluster));
            out!("{how}");
            p
        }
        None => {
            let (p, how) = on_devices(&model, &train, t, &optim, &devices(ranks)?, ranks)?;
            if ranks.leader() {
                out!("{p}");
                out!("{how}");
            }
            p
        }
    };
    save(args, &p, ranks)
}

/// `--save-plan`.
fn save(args: &PlanArgs, p: &Plan, ranks: &Ranks) -> Result<()> {
    if let Some(path) = args.save_plan.as_ref().filter(|_| ranks.leader()) {
        p.save(path)?;
        out!("plan written to {}", path.display());
    }
    Ok(())
}

/// `tandem plan --model gpt`: the GPT of `train`'s shape flags and `--data`, planned on the
/// devices `devices` opens or on `--cluster`, and printed.
fn gpt_plan(args: &PlanArgs, ranks: &Ranks, devices: &dyn Fn() -> Result<Vec<Device>>) -> Result<Plan> {
    let t = &args.train;
    let optim = super::setup::optim_config(t, OptimizerKind::Adamw)?;
    let data = Tokens::of(t)?;
    let cfg = super::gpt::config_of(t, &data)?;
    let p = match &args.cluster {
        Some(name) => {
            let cluster = Cluster::parse(name)?;
            // Timed as a reduced model and scaled: the full one may not fit this host at all.
            let cpu = Device::cpu();
            let reduction = plan::Reduction::default();
            let probe = gpt_probe(&data, reduction.of(&cfg), &cpu)?;
            let states = optimizer_states(&optim);
            let (work, how) = tandem::autocast(t.precision.autocast(), || {
                plan::measure_gpt_scaled(cfg, t.seed, &probe, &cpu, t.batch, states, reuse(t)?, reduction)
            })?;
            let work = Workload {
                grad_dtype: t.grad_dtype,
                offloaded_states: offloaded_states(&optim),
                ..work.scaled(matmul_flops(&cpu)? / REFERENCE_FLOPS)
            };
            // Only what tandem builds for this GPT, so that the plan can be trained as printed.
            let mut p = plan::plan_cut_within(&work, &cluster, &|l, shares| gpt_unbuildable(l, shares, &cfg), &gpt_cuttable(cfg.n_layer))?;
            p.model = cfg.describe();
            out!("{p}");
            out!("{}", p.megatron(&cluster));
            out!("{how}");
            p
        }
        None => {
            let (p, how) = on_gpt_devices(cfg, &data, t, &optim, &devices()?, ranks)?;
            if ranks.leader() {
                out!("{p}");
                out!("{how}");
            }
            p
        }
    };
    Ok(p)
}

/// The plan for training `gpt` on `devices` at `--batch` in `--precision`, gradient shards in
/// `--grad-dtype` where a layout shards them, calibrated here on windows of `data` (or that
/// calibration as an earlier run kept it), among the layouts [`Plan::build_gpt`] can make,
/// the chosen one tried first ([`plan::tried`]); and where the calibration came from.
pub fn on_gpt_devices(
    cfg: GptConfig,
    data: &Tokens,
    args: &TrainArgs,
    optim: &OptimConfig,
    devices: &[Device],
    ranks: &Ranks,
) -> Result<(Plan, plan::Calibration)> {
    searched(args, &|args| on_gpt_devices_in(cfg, data, args, optim, devices, ranks))
}

/// [`on_gpt_devices`] in `--precision`.
fn on_gpt_devices_in(
    cfg: GptConfig,
    data: &Tokens,
    args: &TrainArgs,
    optim: &OptimConfig,
    devices: &[Device],
    ranks: &Ranks,
) -> Result<(Plan, plan::Calibration)> {
    let probe = gpt_probe(data, cfg, &devices[0])?;
    let reuse = reuse(args)?;
    // The host copy the calibration times from lives only while it does: a trial's memory
    // is the run's, with no other copy beside it.
    let described = Gpt::new(cfg, args.seed, &Device::cpu())?.describe();
    let calibrate = |reuse: plan::Reuse| {
        let gpt = Gpt::new(cfg, args.seed, &Device::cpu())?;
        tandem::autocast(args.precision.autocast(), || plan::measure_gpt_reusing(&gpt, &probe, devices, args.batch, optimizer_states(optim), reuse))
    };
    let search = |work: &Workload, cluster: &Cluster| {
        let work = Workload { grad_dtype: args.grad_dtype, offloaded_states: offloaded_states(optim), ..work.clone() };
        let n = cluster.devices.len();
        let mut p = plan::plan_cut_within(
            &work,
            cluster,
            &|l, shares| gpt_unbuildable(l, shares, &cfg).or_else(|| in_job(ranks, l, n)),
            &gpt_cuttable(cfg.n_layer),
        )?;
        p.model = described.clone();
        Ok(p)
    };
    let batch = data.batch(Split::Train, args.batch, cfg.block_size, &mut super::gpt::batch_rng(0, PROBE_STREAM))?;
    let mut run = |p: &Plan| {
        let mut strategy = match ranks.many() {
            true => ranks.data_parallel(job_gpt(args, cfg, Some(p)), devices, &p.optim(optim), Loss::CrossEntropy, job_config(p, args))?,
            false => p.build_gpt(&super::gpt::gpt_on(args, cfg), devices, optim)?,
        };
        super::setup::set_precision(&mut *strategy, args)?;
        plan::step_seconds(&mut *strategy, &batch)
    };
    planned_on(ranks, &devices[0], (&calibrate, reuse), &search, (!args.no_trials).then_some(&mut run))
}

/// How a calibration is made: measured or read as the [`plan::Reuse`] it is given says, and
/// the reuse `--recalibrate` or `TANDEM_CALIBRATION` chose.
type Calibrate<'a> = (&'a dyn Fn(plan::Reuse) -> Result<(Workload, Cluster, plan::Calibration)>, plan::Reuse);

/// The plan `search` makes of `calibrate`'s measurements, of this process's devices alone or
/// under a launcher of every rank's ([`plan::measure_job`]), the layout it chooses tried with
/// `run` where given (not `--no-trials`, [`plan::tried`]). A kept calibration that a trial
/// contradicts ([`plan::faster_than_modelled`]) is measured again and the search redone.
fn planned_on(
    ranks: &Ranks,
    first: &Device,
    (calibrate, reuse): Calibrate,
    search: &dyn Fn(&Workload, &Cluster) -> Result<Plan>,
    mut run: Option<&mut plan::Trial>,
) -> Result<(Plan, plan::Calibration)> {
    if ranks.many() {
        return plan::measure_job(ranks.group(), first, &|| calibrate(reuse), search, run);
    }
    let mut planned = |reuse| -> Result<(Plan, plan::Calibration)> {
        let (work, cluster, how) = calibrate(reuse)?;
        let p = match run.as_deref_mut() {
            Some(run) => plan::tried(&work, &cluster, search, run)?,
            None => search(&work, &cluster)?,
        };
        Ok((p, how))
    };
    let (p, how) = planned(reuse)?;
    let (plan::Calibration::Reused { path, .. }, Some(why)) = (&how, plan::faster_than_modelled(&p)) else { return Ok((p, how)) };
    let note = format!("{} not reused: {why}", path.display());
    let (p, how) = planned(plan::Reuse::Fresh)?;
    Ok((p, how.noted(note)))
}

/// Why a job of several processes cannot run `l` on its `n` devices ([`job_unbuildable`]);
/// nothing for one process.
fn in_job(ranks: &Ranks, l: &plan::Layout, n: usize) -> Option<String> {
    ranks.many().then(|| job_unbuildable(l, n)).flatten()
}

/// `--recalibrate`, else `TANDEM_CALIBRATION` (reuse a kept calibration by default).
pub fn reuse(args: &TrainArgs) -> Result<plan::Reuse> {
    if args.recalibrate {
        Ok(plan::Reuse::Fresh)
    } else {
        plan::Reuse::from_env()
    }
}

/// A fresh plan's calibration line, before training with it.
/// Under `--log-format json` it goes to standard error, which keeps standard output JSON lines.
pub fn announced((p, how): (Plan, plan::Calibration), ranks: &Ranks, args: &TrainArgs) -> Plan {
    let tried = match p.tried.len() {
        0 => String::new(),
        n => format!("; tried {n} layout{} for a few steps before choosing (`tandem plan` lists them)", if n == 1 { "" } else { "s" }),
    };
    match args.log_format {
        _ if !ranks.leader() => {}
        super::LogFormat::Json => eprintln!("{how}{tried}"),
        _ => out!("{how}{tried}"),
    }
    p
}

/// [`GPT_PROBE`] training windows of `data` on `device`, always the same ones.
pub fn gpt_probe(data: &Tokens, cfg: GptConfig, device: &Device) -> Result<Tensor> {
    let batch = data.batch(Split::Train, GPT_PROBE, cfg.block_size, &mut super::gpt::batch_rng(0, PROBE_STREAM))?;
    inputs_to_device(&batch, device)
}

/// The plan a GPT run trains with, or `None`: with `--plan FILE`, or `--strategy auto` on
/// several devices without `--deterministic` (as for the seed models, [`for_training`]).
/// The layout's knobs are the plan's: `--micro-batches`, `--shard`, `--recompute` and
/// `--pipelines` and `--tensor` are refused beside it.
pub fn gpt_planned(args: &TrainArgs, cfg: GptConfig, data: &Tokens, optim: &OptimConfig, devices: &[Device], ranks: &Ranks) -> Result<Option<Plan>> {
    let auto = args.strategy == StrategyKind::Auto && (devices.len() > 1 || ranks.many()) && !args.deterministic;
    check_search_precision(args, auto && args.plan.is_none())?;
    if args.plan.is_none() && !auto {
        return Ok(None);
    }
    // Each knob with the strategy that takes it, so that the message says what to give.
    let by_hand = [
        ("--micro-batches", args.micro_batches.is_some(), "--strategy"),
        ("--shard", args.shard != Shard::None, "--strategy data"),
        ("--recompute", args.recompute, "--strategy"),
        ("--pipelines", args.pipelines.is_some(), "--strategy data,pipeline"),
        ("--tensor", args.tensor.is_some(), "--strategy data,tensor"),
    ];
    if let Some((flag, _, strategy)) = by_hand.iter().find(|(_, given, _)| *given) {
        return Err(Error::invalid(
            flag,
            format!("needs {strategy}: a plan chooses the layout (--strategy auto on several devices, --plan); give --strategy to set it by hand"),
        ));
    }
    let described = Gpt::new(cfg, args.seed, &Device::cpu())?.describe();
    for_training(args, &described, devices, ranks, || Ok(announced(on_gpt_devices(cfg, data, args, optim, devices, ranks)?, ranks, args))).map(Some)
}

/// The data parallelism a job of several processes trains `p` with: its micro-batches,
/// sharding, gradient shards' type and buckets (`--bucket-size` where the plan keeps the
/// default), and its batch shares over every rank's devices.
pub fn job_config(p: &Plan, args: &TrainArgs) -> DataParallelConfig {
    let l = &p.best.layout;
    let bucket_bytes = l.bucket.map_or(args.bucket_size, |b| b as usize);
    let grad_dtype = p.grad_dtype_of(l);
    DataParallelConfig { micro_batches: l.micro_batches, shard: l.shard, grad_dtype, weights: p.job_weights(), bucket_bytes, ..Default::default() }
}

/// The GPT a job of several processes builds on each device: `--recompute`'s, recomputing
/// per block where the plan `p` recomputes without pipeline stages.
pub fn job_gpt<'a>(args: &'a TrainArgs, cfg: GptConfig, p: Option<&Plan>) -> impl Fn(&Device) -> Result<Gpt> + 'a {
    let per_block = p.is_some_and(|p| p.best.layout.recompute && p.best.layout.pipeline == 1);
    let make = super::gpt::gpt_on(args, cfg);
    move |d| {
        let g = make(d)?;
        if per_block {
            g.set_recompute(true);
        }
        Ok(g)
    }
}

/// The line a planned run ends with: its layout, predicted and measured step time.
pub fn compared(p: &Plan, train_s: f64, steps: u64) -> String {
    let measured = train_s / steps.max(1) as f64;
    format!(
        "planned {}: predicted {:.2} ms/step, measured {:.2} ms/step (x{:.2})",
        p.best.layout,
        p.best.step_s * 1e3,
        measured * 1e3,
        p.best.step_s / measured.max(1e-12)
    )
}

/// The plan for training `model` on `devices` at `--batch` in `--precision`, gradient shards
/// in `--grad-dtype` where a layout shards them, calibrated here (or as an earlier run kept the
/// calibration), among the layouts [`Plan::build`] can make, the chosen one tried first on
/// `train`'s first samples ([`plan::tried`]); and where the calibration came from.
pub fn on_devices(
    model: &Sequential,
    train: &Dataset,
    args: &TrainArgs,
    optim: &OptimConfig,
    devices: &[Device],
    ranks: &Ranks,
) -> Result<(Plan, plan::Calibration)> {
    searched(args, &|args| on_devices_in(model, train, args, optim, devices, ranks))
}

/// [`on_devices`] in `--precision`.
fn on_devices_in(
    model: &Sequential,
    train: &Dataset,
    args: &TrainArgs,
    optim: &OptimConfig,
    devices: &[Device],
    ranks: &Ranks,
) -> Result<(Plan, plan::Calibration)> {
    let probe = probe(train, &devices[0])?;
    let reuse = reuse(args)?;
    let calibrate = |reuse| {
        tandem::autocast(args.precision.autocast(), || plan::measure_reusing(model, &probe, devices, args.batch, optimizer_states(optim), reuse))
    };
    let search = |work: &Workload, cluster: &Cluster| {
        let work = Workload { grad_dtype: args.grad_dtype, offloaded_states: offloaded_states(optim), ..work.clone() };
        let n = cluster.devices.len();
        let mut p = plan::plan_within(&work, cluster, &|l, shares| unbuildable(l, shares, model).or_else(|| in_job(ranks, l, n)))?;
        p.model = model.describe();
        Ok(p)
    };
    let batch = train.batch(&(0..args.batch).map(|i| i % train.len().max(1)).collect::<Vec<_>>())?;
    let loss = Loss::for_targets(&train.y);
    let mut run = |p: &Plan| {
        let mut strategy = match ranks.many() {
            true => ranks.data_parallel(|d| model.slice(0..model.len(), d), devices, &p.optim(optim), loss.clone(), job_config(p, args))?,
            false => p.build(model, devices, optim, loss.clone())?,
        };
        super::setup::set_precision(&mut *strategy, args)?;
        plan::step_seconds(&mut *strategy, &batch)
    };
    planned_on(ranks, &devices[0], (&calibrate, reuse), &search, (!args.no_trials).then_some(&mut run))
}

/// `plan_in(args)`'s plan, or with `--search-precision` the fastest of its plans in each
/// precision ([`plan::fastest_precision`]), with the first calibration's origin.
fn searched(args: &TrainArgs, plan_in: &dyn Fn(&TrainArgs) -> Result<(Plan, plan::Calibration)>) -> Result<(Plan, plan::Calibration)> {
    if !args.search_precision {
        return plan_in(args);
    }
    let mut how = None;
    let p = plan::fastest_precision(&[Precision::F32, Precision::Bf16, Precision::F16], &mut |precision| {
        let (p, h) = plan_in(&TrainArgs { precision, ..args.clone() })?;
        how.get_or_insert(h);
        Ok(p)
    })?;
    Ok((p, how.ok_or_else(|| Error::Msg("a plan without a calibration".into()))?))
}

/// `args` as a run of `planned` trains: in the precision the plan chose, where it searched
/// one (`--search-precision`, recorded in plan files and checkpoints). Errors where the run
/// asks for another half precision than the plan's.
pub fn in_plan_precision(args: &TrainArgs, planned: Option<&Plan>) -> Result<TrainArgs> {
    let Some(chosen) = planned.and_then(|p| p.precision) else { return Ok(args.clone()) };
    if args.precision != Precision::F32 && args.precision != chosen {
        return Err(Error::invalid("--precision", format!("the plan trains in {}, which it chose; not {}", chosen.name(), args.precision.name())));
    }
    Ok(TrainArgs { precision: chosen, ..args.clone() })
}

/// Why `--search-precision` cannot be given with the rest of `args`: it needs a plan made
/// here, and the precision to be the plan's.
pub fn check_search_precision(args: &TrainArgs, planning: bool) -> Result<()> {
    if !args.search_precision {
        return Ok(());
    }
    if args.precision != Precision::F32 {
        return Err(Error::invalid(
            "--search-precision",
            format!("the plan chooses the precision; --precision {} chooses it by hand: give one", args.precision.name()),
        ));
    }
    if !planning {
        return Err(Error::invalid(
            "--search-precision",
            "needs a plan made here: --strategy auto on several devices, or tandem plan (not --plan FILE or --cluster)",
        ));
    }
    Ok(())
}

/// The plan on a described cluster: the layers timed on this machine's CPU, scaled by its
/// measured matmul throughput to the cluster's reference GPU. Every layout is searched, as the
/// paper's strategies would build them, not only those [`Plan::build`] makes of a Sequential.
#[allow(clippy::too_many_arguments)]
fn on_cluster(
    model: &Sequential,
    train: &Dataset,
    batch: usize,
    optim: &OptimConfig,
    cluster: &Cluster,
    reuse: plan::Reuse,
    precision: Precision,
    grad_dtype: DType,
) -> Result<(Plan, plan::Calibration)> {
    let cpu = Device::cpu();
    let probe = probe(train, &cpu)?;
    let (work, _, how) = tandem::autocast(precision.autocast(), || {
        plan::measure_reusing(model, &probe, std::slice::from_ref(&cpu), batch, optimizer_states(optim), reuse)
    })?;
    let work = Workload { grad_dtype, offloaded_states: offloaded_states(optim), ..work.scaled(matmul_flops(&cpu)? / REFERENCE_FLOPS) };
    let mut p = plan::plan(&work, cluster)?;
    p.model = model.describe();
    Ok((p, how))
}

/// The plan `train` runs with: the one its checkpoint recorded when resuming, `--plan FILE`,
/// or a `fresh` one (`--strategy auto`); it must be for the `model` trained (as
/// `Module::describe` names it). A `--plan` given to a resumed run must be the recorded plan.
/// `--balance even` makes the data-parallel shares equal. Says the layout the run trains with
/// before its first step (rank 0; on standard error under `--log-format json`, which keeps
/// standard output JSON lines).
pub fn for_training(args: &TrainArgs, model: &str, devices: &[Device], ranks: &Ranks, fresh: impl FnOnce() -> Result<Plan>) -> Result<Plan> {
    let p = chosen(args, model, devices, ranks, fresh)?;
    match args.log_format {
        _ if !ranks.leader() => {}
        super::LogFormat::Json => eprintln!("{}", starting(&p)),
        _ => out!("{}", starting(&p)),
    }
    Ok(p)
}

/// The line a planned run starts with: the layout it trains with and its predicted step time.
pub fn starting(p: &Plan) -> String {
    format!("training with the planned layout {}: predicted {:.2} ms/step", p.best.layout, p.best.step_s * 1e3)
}

/// [`for_training`]'s plan.
fn chosen(args: &TrainArgs, model: &str, devices: &[Device], ranks: &Ranks, fresh: impl FnOnce() -> Result<Plan>) -> Result<Plan> {
    let rank = ranks.group().rank();
    let given = |path: &PathBuf| if ranks.many() { Plan::load_for_rank(path, rank, devices) } else { Plan::load(path, devices) };
    let mut p = match (recorded(args, devices, ranks)?, &args.plan) {
        (Some((p, checkpoint)), Some(path)) => {
            let usage = |e: Error| match e {
                Error::Invalid { detail, .. } => Error::invalid("--plan", detail),
                e => e,
            };
            plan_record::check_given_plan(&p, &checkpoint, &even(args, given(path)?), path).map_err(usage)?;
            p
        }
        (Some((p, _)), None) => p,
        (None, Some(path)) => given(path)?,
        (None, None) => fresh()?,
    };
    if ranks.many() && p.processes.is_empty() {
        return Err(Error::invalid("--plan", "the plan is for one process, this job has several: plan again under the launcher"));
    }
    if !p.model.is_empty() && p.model != model {
        return Err(Error::invalid("--plan", format!("the plan is for {}, this run trains {model}", p.model)));
    }
    if p.batch != args.batch {
        return Err(Error::invalid("--plan", format!("the plan is for batches of {}, --batch is {}", p.batch, args.batch)));
    }
    if args.grad_dtype != DType::F32 && args.grad_dtype != p.grad_dtype {
        let dtype = |d: DType| format!("{d:?}").to_lowercase();
        return Err(Error::invalid(
            "--grad-dtype",
            format!(
                "the plan was made for {} gradient shards, not {}: plan again with --grad-dtype {}",
                dtype(p.grad_dtype),
                dtype(args.grad_dtype),
                dtype(args.grad_dtype)
            ),
        ));
    }
    p = even(args, p);
    Ok(p)
}

/// `p` with equal data-parallel shares under `--balance even`.
fn even(args: &TrainArgs, mut p: Plan) -> Plan {
    if args.balance == Some(Balance::Even) && p.shares.len() > 1 {
        let n = p.shares.len();
        p.shares = (0..n).map(|i| p.batch / n + usize::from(i < p.batch % n)).collect();
    }
    p
}

/// The plan a checkpoint of this run recorded (`--resume`), and that checkpoint's path, so the
/// resumed run repeats its layout and batch shares instead of measuring anew
/// ([`plan_record::recorded_plan`]: not one for another number of processes).
fn recorded(args: &TrainArgs, devices: &[Device], ranks: &Ranks) -> Result<Option<(Plan, PathBuf)>> {
    let Some((path, config)) = resumed_config(args, ranks)? else { return Ok(None) };
    let p = plan_record::recorded_plan(&config, &path, ranks.group().rank(), ranks.group().size(), devices)?;
    Ok(p.map(|p| (p, path)))
}

/// Resuming (`--resume` with a checkpoint directory that holds a checkpoint), the newest
/// checkpoint's path and run configuration, as rank 0 read them: every rank takes the same
/// branch of what depends on them, whether or not it sees the directory itself. Collective
/// under a launcher.
fn resumed_config(args: &TrainArgs, ranks: &Ranks) -> Result<Option<(PathBuf, serde_json::Value)>> {
    // The plan, its configuration entry and the batch shares each ask; the checkpoint, which
    // may be large, is read once per run (every rank asks in the same order, so the
    // collective below runs once on each).
    type Read = ((Option<PathBuf>, bool), Option<(PathBuf, serde_json::Value)>);
    static READ: std::sync::Mutex<Option<Read>> = std::sync::Mutex::new(None);
    let key = (args.checkpoint_dir.clone(), args.resume);
    let mut cache = READ.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, v)) = cache.as_ref().filter(|(k, _)| *k == key) {
        return Ok(v.clone());
    }
    let v = read_resumed_config(args, ranks)?;
    *cache = Some((key, v.clone()));
    Ok(v)
}

/// [`resumed_config`], read (by rank 0) and shared.
fn read_resumed_config(args: &TrainArgs, ranks: &Ranks) -> Result<Option<(PathBuf, serde_json::Value)>> {
    let read = || plan_record::resumed_settings(args.checkpoint_dir.as_deref().filter(|_| args.resume)?);
    if !ranks.many() {
        return Ok(read());
    }
    let mine = if ranks.group().rank() == 0 {
        Some(serde_json::to_vec(&read()).map_err(|e| Error::Msg(format!("encoding the checkpoint's configuration: {e}")))?)
    } else {
        None
    };
    let shared = tandem::train::ranks::share_bytes(ranks.group(), mine)?;
    serde_json::from_slice(&shared).map_err(|e| Error::Msg(format!("rank 0's checkpoint configuration did not arrive whole: {e}")))
}

/// The `plan` entry of a run's configuration ([`plan_record::plan_setting`]): a resumed run
/// keeps its checkpoint's, a new run records `planned`. Collective under a launcher.
pub fn config_entry(args: &TrainArgs, ranks: &Ranks, planned: Option<&Plan>) -> Result<Option<serde_json::Value>> {
    let resumed = resumed_config(args, ranks)?;
    plan_record::plan_setting(resumed.as_ref().map(|(_, config)| config), planned)
}

/// Data-parallel batch weights for `--strategy data`, and the run configuration's
/// `batch_weights` entry: the speeds of the model `make` builds on each device, timed on
/// `probe`'s samples, unless `--balance even`, or the devices (under a launcher, every
/// rank's) are all alike (same name) and `--balance` is not given. A resumed
/// run repeats the weights its checkpoint recorded; resumed on another number of devices (or
/// ranks) it measures again and keeps the recorded entry, so that it is still the same run.
/// Under a launcher the weights are one per device of the job, in rank order, the same on
/// every rank ([`plan::measure_job_speeds`]). Collective under a launcher.
pub fn data_weights(
    args: &TrainArgs,
    make: &dyn Fn(&Device) -> Result<Box<dyn Module>>,
    probe: impl FnOnce() -> Result<Tensor>,
    devices: &[Device],
    ranks: &Ranks,
) -> Result<(Option<Vec<f64>>, Option<serde_json::Value>)> {
    let names = job_device_names(devices, ranks)?;
    let differ = names.windows(2).any(|w| w[0] != w[1]);
    let measured = match args.balance {
        Some(Balance::Measured) => true,
        Some(Balance::Even) => false,
        None => differ,
    };
    // Resuming, the configuration's entry is the checkpoint's, present or not.
    let resumed = resumed_config(args, ranks)?.map(|(_, config)| config.get("batch_weights").cloned());
    let recorded = resumed.clone().flatten();
    if !measured || names.len() < 2 {
        return Ok((None, recorded));
    }
    if let Some(w) = recorded.as_ref().and_then(|v| serde_json::from_value::<Vec<f64>>(v.clone()).ok()).filter(|w| w.len() == names.len()) {
        return Ok((Some(w), recorded));
    }
    let probe = probe()?;
    let weights =
        if ranks.many() { plan::measure_job_speeds(ranks.group(), make, &probe, devices)? } else { plan::measure_speeds_of(make, &probe, devices)? };
    let entry = resumed.unwrap_or_else(|| Some(serde_json::json!(weights)));
    Ok((Some(weights), entry))
}

/// The names ([`Device::spec`]) of this process's devices, or under a launcher of every
/// rank's, in rank order (collective).
fn job_device_names(devices: &[Device], ranks: &Ranks) -> Result<Vec<String>> {
    let mine: Vec<String> = devices.iter().map(Device::spec).collect();
    if !ranks.many() {
        return Ok(mine);
    }
    let text = serde_json::to_vec(&mine).map_err(|e| Error::Msg(format!("encoding the device names: {e}")))?;
    let mut all = Vec::new();
    for (r, bytes) in tandem::train::ranks::gather_bytes(ranks.group(), &text)?.iter().enumerate() {
        all.extend(
            serde_json::from_slice::<Vec<String>>(bytes).map_err(|e| Error::Msg(format!("rank {r}'s device names did not arrive whole: {e}")))?,
        );
    }
    Ok(all)
}

/// The first [`PROBE`] samples of `train` on `device`.
pub fn probe(train: &Dataset, device: &Device) -> Result<Tensor> {
    let n = PROBE.min(train.len()).max(1);
    inputs_to_device(&train.batch(&(0..n).collect::<Vec<_>>())?, device)
}

/// Optimizer state tensors per parameter on the device: SGD's momentum, Adam's two moments;
/// none when offloaded to host memory.
fn optimizer_states(optim: &OptimConfig) -> usize {
    optim.device_states_per_parameter() as usize
}

/// Optimizer state tensors per parameter kept in host memory (`--offload-optimizer`).
fn offloaded_states(optim: &OptimConfig) -> u64 {
    optim.states_per_parameter() - optim.device_states_per_parameter()
}

/// The device's f32 matmul throughput, best of three 256³ products.
fn matmul_flops(device: &Device) -> Result<f64> {
    let n = 256;
    let mut rng = tandem::rand::rng();
    let a = Tensor::randn([n, n], &mut rng, device)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let c = a.matmul(&a)?;
        device.sync()?;
        best = best.min(t0.elapsed().as_secs_f64());
        drop(c);
    }
    Ok(2.0 * (n * n * n) as f64 / best.max(1e-9))
}
