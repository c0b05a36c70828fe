//! Turning `train` flags into checked inputs before any step runs: the data, the model's fit to
//! it, output paths, initial weights, and the strategy (one constructor per `--strategy`).
use super::{OptimizerKind, Schedule, TrainArgs};
use clap::ValueEnum;
use std::path::{Path, PathBuf};
use tandem::checkpoint::{output_target, read_safetensors, HostData, HostTensor, OutputTarget};
use tandem::data::{digits, mnist, synthetic, tensor_file, Dataset, Targets};
use tandem::nn::models::SeedModel;
use tandem::nn::{Module, Sequential};
use tandem::optim::{AdamConfig, ParamGroups, SgdConfig};
use tandem::parallel::{
    pipeline, plan_stages, DataParallel, DataParallelConfig, LayerPlacement, Loss, OptimConfig, Parallel, Pipeline, Shard, Single, Split, Stages,
    Strategy, TensorParallel,
};
use tandem::{Device, Error, Result, Tensor};

/// Size of the built-in digits set: enough distinct images that 1500 steps of 64 see each
/// about five times, generated in about a second.
const DIGITS_TRAIN: usize = 20_000;
const DIGITS_TEST: usize = 2_000;
/// Sample count of `--data synthetic`, the seeds' 1000 random rows or images.
const SYNTHETIC_N: usize = 1_000;

/// How the model is spread over the devices; `--strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrategyKind {
    /// Everything on one device.
    Single,
    /// Data parallelism: a replica per device, gradients all-reduced.
    Data,
    /// Model parallelism: consecutive layers placed on different devices.
    Model,
    /// Tensor parallelism: large layers split across devices.
    Tensor,
    /// Pipeline parallelism over micro-batches.
    Pipeline,
    /// Data parallelism over pipelines on a grid of devices (--pipelines rows; --model gpt).
    #[value(name = "data,pipeline")]
    DataPipeline,
    /// Data parallelism over tensor-parallel groups (--tensor devices each).
    #[value(name = "data,tensor")]
    DataTensor,
    /// Single on one device; on several, the layout `tandem plan` chooses (data parallelism
    /// under --deterministic); under mpirun, the plan of every rank's devices together.
    Auto,
}

/// Everything a strategy constructor needs.
pub struct StrategyPlan {
    pub kind: StrategyKind,
    pub model: Sequential,
    pub optim: OptimConfig,
    pub loss: Loss,
    pub devices: Vec<Device>,
    pub micro_batches: usize,
    pub schedule: Schedule,
    pub deterministic: bool,
    /// `--shard`: data parallelism only.
    pub shard: Shard,
    /// `--bucket-size`: data parallelism only.
    pub bucket_bytes: usize,
    /// `--grad-dtype`: ZeRO-2/3 only.
    pub grad_dtype: tandem::DType,
    /// Data-parallel batch weights, one per device (`--balance`); equal shares without.
    pub weights: Option<Vec<f64>>,
    /// `--tensor`: the group size of data,tensor.
    pub tensor: Option<usize>,
}

/// The one place where `--strategy` becomes a constructor.
///
/// `--deterministic` takes the deterministic path on any device count: one device runs the
/// data-parallel micro-shard path too, so its result is the one of 2 or 4 devices. Layer
/// splits (model, pipeline) are then fixed by the layers' parameter bytes instead of measured
/// times, so the same layers land on the same devices in every run.
pub fn build_strategy(plan: StrategyPlan) -> Result<Box<dyn Strategy>> {
    let kind = match plan.kind {
        StrategyKind::Auto if plan.devices.len() == 1 && !plan.deterministic => StrategyKind::Single,
        StrategyKind::Auto => StrategyKind::Data,
        k => k,
    };
    check_shard(plan.shard, kind)?;
    let tensor = tensor_groups(plan.tensor, kind, &plan.devices, false)?;
    match kind {
        // `Auto` was resolved to Single or Data above.
        StrategyKind::Single | StrategyKind::Auto => {
            if plan.devices.len() != 1 {
                let specs: Vec<String> = plan.devices.iter().map(Device::spec).collect();
                return Err(Error::invalid("--strategy single", format!("runs on one device, --devices names {}: {}", specs.len(), specs.join(","))));
            }
            if plan.micro_batches != 1 {
                return Err(Error::invalid("--micro-batches", "needs --strategy pipeline (single runs each batch whole)"));
            }
            if plan.deterministic {
                return data_parallel(&plan);
            }
            Ok(Box::new(Single::new(plan.model, &plan.optim, plan.loss, &plan.devices[0])?))
        }
        StrategyKind::Data => data_parallel(&plan),
        StrategyKind::Model => {
            no_micro_batches(&plan, "model")?;
            Ok(Box::new(LayerPlacement::new(&plan.model, &plan.devices, layer_split(&plan)?, &plan.optim, plan.loss.clone())?))
        }
        StrategyKind::Tensor => {
            no_micro_batches(&plan, "tensor")?;
            Ok(Box::new(TensorParallel::new(&plan.model, &plan.devices, &plan.optim, plan.loss.clone())?))
        }
        StrategyKind::Pipeline if tensor > 1 => Err(Error::invalid(
            "--tensor",
            "pipeline stages of tensor-parallel groups are written for --model gpt; use data,tensor for the seed models",
        )),
        StrategyKind::Pipeline => {
            let stages = Stages::Split(&plan.model, layer_split(&plan)?);
            let pipe = Pipeline::builder(stages, &plan.devices, &plan.optim, plan.loss.clone())
                .micro_batches(plan.micro_batches)
                .schedule(pipeline_schedule(plan.schedule));
            Ok(Box::new(pipe.build()?))
        }
        StrategyKind::DataPipeline => {
            Err(Error::invalid("--strategy", "data,pipeline is written for --model gpt; use data or pipeline for the seed models"))
        }
        StrategyKind::DataTensor => {
            no_micro_batches(&plan, "data,tensor")?;
            let mesh = Parallel::data_tensor(|_| Ok(&plan.model), &plan.devices, tensor, &plan.optim, plan.loss.clone()).data_config(grid_config(
                plan.shard,
                plan.bucket_bytes,
                plan.grad_dtype,
            ));
            Ok(match plan.weights.clone() {
                Some(w) => mesh.split_weights(group_weights(&w, tensor)).boxed()?,
                None => mesh.boxed()?,
            })
        }
    }
}

/// `--shard` shards the state of a data axis: `data`, `data,tensor` and `data,pipeline` have one.
pub(super) fn check_shard(shard: Shard, kind: StrategyKind) -> Result<()> {
    if shard != Shard::None && !matches!(kind, StrategyKind::Data | StrategyKind::DataTensor | StrategyKind::DataPipeline) {
        let name = format!("{kind:?}").to_lowercase();
        return Err(Error::invalid(
            "--shard",
            format!("shards the state of a data axis; --strategy {name} has none (use data, data,tensor or data,pipeline)"),
        ));
    }
    Ok(())
}

/// What a grid's data axis (`data,tensor`, `data,pipeline`) takes of the data-parallel flags:
/// `--shard`, `--bucket-size` and `--grad-dtype`.
pub(super) fn grid_config(shard: Shard, bucket_bytes: usize, grad_dtype: tandem::DType) -> DataParallelConfig {
    DataParallelConfig { shard, bucket_bytes, grad_dtype, ..Default::default() }
}

/// The group size of `--strategy data,tensor` (`--tensor`, 2 by default), or of the pipelines'
/// stages (`--strategy pipeline` or `data,pipeline`, 1 by default), checked against the
/// devices; `--tensor` with another strategy is refused.
/// Under `mpirun` (`across`) one group per process is enough: the data axis spans the processes.
pub(super) fn tensor_groups(tensor: Option<usize>, kind: StrategyKind, devices: &[Device], across: bool) -> Result<usize> {
    if matches!(kind, StrategyKind::Pipeline | StrategyKind::DataPipeline) {
        let t = tensor.unwrap_or(1);
        if t == 0 || !devices.len().is_multiple_of(t) {
            return Err(Error::invalid("--tensor", format!("stages of {t} devices over {} devices: give a multiple of {t} devices", devices.len())));
        }
        return Ok(t);
    }
    if kind != StrategyKind::DataTensor {
        return match tensor {
            Some(_) => Err(Error::invalid("--tensor", "needs --strategy data,tensor, pipeline or data,pipeline")),
            None => Ok(1),
        };
    }
    let t = tensor.unwrap_or(2);
    if across {
        if t < 2 || !devices.len().is_multiple_of(t) {
            return Err(Error::invalid(
                "--tensor",
                format!("groups of {t} over this process's {} devices: give each process a multiple of {t} devices, at least 2", devices.len()),
            ));
        }
        return Ok(t);
    }
    if t < 2 || !devices.len().is_multiple_of(t) || devices.len() == t {
        let what =
            format!("groups of {t} over {} devices: give at least 2 groups of at least 2 devices each (a multiple of {t} devices)", devices.len());
        return Err(Error::invalid("--tensor", what));
    }
    Ok(t)
}

/// Per-device batch weights summed over each group of `tensor` devices: one per replica.
pub(super) fn group_weights(weights: &[f64], tensor: usize) -> Vec<f64> {
    weights.chunks(tensor).map(|g| g.iter().sum()).collect()
}

/// The pipeline's schedule for `--schedule`.
pub(super) fn pipeline_schedule(s: Schedule) -> pipeline::Schedule {
    match s {
        Schedule::Gpipe => pipeline::Schedule::GPipe,
        Schedule::OneFOneB => pipeline::Schedule::OneFOneB,
    }
}

fn data_parallel(plan: &StrategyPlan) -> Result<Box<dyn Strategy>> {
    let cfg = DataParallelConfig {
        deterministic: plan.deterministic,
        micro_batches: plan.micro_batches,
        shard: plan.shard,
        bucket_bytes: plan.bucket_bytes,
        weights: plan.weights.clone(),
        grad_dtype: plan.grad_dtype,
        ..Default::default()
    };
    Ok(Box::new(DataParallel::new(&plan.model, &plan.devices, &plan.optim, plan.loss.clone(), cfg)?))
}

/// Measured after the first step normally; with `--deterministic`, the split by parameter
/// bytes that `Split::Auto` starts from, fixed for the whole run: measured times vary from
/// run to run, and on a mix of backends another split means other numerics.
fn layer_split(plan: &StrategyPlan) -> Result<Split> {
    if !plan.deterministic {
        return Ok(Split::Auto);
    }
    let ranges = plan_stages(&plan.model, &plan.devices, &Split::Auto)?;
    Ok(Split::At(ranges.iter().skip(1).map(|r| r.start).collect()))
}

fn no_micro_batches(plan: &StrategyPlan, name: &str) -> Result<()> {
    if plan.micro_batches != 1 {
        return Err(Error::invalid("--micro-batches", format!("needs --strategy pipeline or data, not {name}")));
    }
    Ok(())
}

/// Where the training data comes from; `--data`.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    Digits,
    Synthetic,
    Mnist(PathBuf),
    File(PathBuf),
}

impl DataSource {
    pub fn parse(s: &str) -> Result<DataSource> {
        Ok(match s {
            "digits" => DataSource::Digits,
            "synthetic" => DataSource::Synthetic,
            _ => match s.strip_prefix("mnist:") {
                Some("") => return Err(Error::invalid("--data", "mnist: needs a directory, as in mnist:data/mnist")),
                Some(dir) => DataSource::Mnist(dir.into()),
                None if s.ends_with(".safetensors") => DataSource::File(s.into()),
                None => return Err(Error::invalid("--data", format!("'{s}' is not digits, synthetic, mnist:DIR or a PATH.safetensors"))),
            },
        })
    }

    /// The train split and, when the source has one, the test split.
    pub fn load(&self, model: SeedModel, seed: u64) -> Result<(Dataset, Option<Dataset>)> {
        match self {
            DataSource::Digits => digits::load(DIGITS_TRAIN, DIGITS_TEST, seed).map(|(a, b)| (a, Some(b))),
            DataSource::Mnist(dir) => mnist::load(dir).map(|(a, b)| (a, Some(b))),
            DataSource::Synthetic if model.is_classifier() => Ok((synthetic::seed_images(SYNTHETIC_N, seed)?, None)),
            DataSource::Synthetic => Ok((synthetic::regression(SYNTHETIC_N, model.input_shape()[0], seed)?, None)),
            DataSource::File(path) => {
                let classes = model.is_classifier().then_some(CNN_CLASSES);
                Ok((tensor_file::load(path, classes)?, None))
            }
        }
    }
}

/// Output width of the seed CNN.
const CNN_CLASSES: usize = 10;

/// Checks that `model` can train on `ds`: input shape, and class labels for the classifier or
/// one real target per sample for the regression models.
pub fn check_fit(model: SeedModel, ds: &Dataset, what: &str) -> Result<()> {
    let name = model_name(model);
    if ds.sample_shape != model.input_shape() {
        return Err(Error::Msg(format!(
            "{name} takes inputs of shape {:?} but the {what} has samples of shape {:?}",
            model.input_shape(),
            ds.sample_shape
        )));
    }
    match (&ds.y, model.is_classifier()) {
        (Targets::Classes { classes, .. }, true) if *classes == CNN_CLASSES => Ok(()),
        (Targets::Classes { classes, .. }, true) => Err(Error::Msg(format!("{name} predicts {CNN_CLASSES} classes but the {what} has {classes}"))),
        (Targets::Values { .. }, true) => {
            Err(Error::Msg(format!("{name} is a classifier but the {what} has real-valued targets (y must hold integer labels)")))
        }
        (Targets::Tokens { shape_per_sample, .. }, _) => {
            Err(Error::Msg(format!("{name} takes one target per sample but the {what} has class ids of shape {shape_per_sample:?} per sample")))
        }
        (Targets::Classes { .. }, false) => Err(Error::Msg(format!("{name} is a regression model but the {what} has class labels (y must be F32)"))),
        (Targets::Values { shape_per_sample, .. }, false) if shape_per_sample == &[1] => Ok(()),
        (Targets::Values { shape_per_sample, .. }, false) => {
            Err(Error::Msg(format!("{name} predicts one value per sample but the {what} has targets of shape {shape_per_sample:?}")))
        }
    }
}

pub fn model_name(model: SeedModel) -> &'static str {
    match model {
        SeedModel::Cnn => "seed-cnn",
        SeedModel::Linear => "seed-linear",
        SeedModel::TwoLayer => "seed-two-layer",
    }
}

/// The optimizer the flags ask for (`default` when --optimizer is not given), with the
/// learning rate and weight decay checked. AdamW decays only parameters of rank >= 2, as
/// nanoGPT does (biases and LayerNorm weights are left alone).
pub fn optim_config(args: &TrainArgs, default: OptimizerKind) -> Result<OptimConfig> {
    let kind = args.optimizer.unwrap_or(default);
    let lr = args.lr.unwrap_or(match kind {
        OptimizerKind::Sgd => 0.01,
        OptimizerKind::Adam | OptimizerKind::Adamw => 1e-3,
    });
    if !(lr.is_finite() && lr >= 0.0) {
        return Err(Error::invalid("--lr", format!("must be a finite number >= 0, got {lr}")));
    }
    if kind != OptimizerKind::Adamw && args.weight_decay.is_some() {
        return Err(Error::invalid("--weight-decay", "applies to --optimizer adamw only"));
    }
    let weight_decay = args.weight_decay.unwrap_or(0.01);
    let optim = match kind {
        OptimizerKind::Sgd => {
            if !(args.momentum.is_finite() && (0.0..1.0).contains(&args.momentum)) {
                return Err(Error::invalid("--momentum", format!("must be in [0, 1), got {}", args.momentum)));
            }
            OptimConfig::sgd(SgdConfig { lr, momentum: args.momentum, ..Default::default() })
        }
        OptimizerKind::Adam => OptimConfig::adam(AdamConfig { lr, ..Default::default() }),
        OptimizerKind::Adamw => {
            if !(weight_decay.is_finite() && weight_decay >= 0.0) {
                return Err(Error::invalid("--weight-decay", format!("must be a finite number >= 0, got {weight_decay}")));
            }
            OptimConfig::adam(AdamConfig { lr, weight_decay, ..AdamConfig::adamw() }).with_groups(ParamGroups::no_decay_for_biases_and_norms())
        }
    };
    Ok(optim.offloaded(args.offload_optimizer))
}

/// The --grad-clip bound, checked.
pub fn grad_clip(args: &TrainArgs) -> Result<Option<f32>> {
    match args.grad_clip {
        Some(m) if !(m.is_finite() && m > 0.0) => Err(Error::invalid("--grad-clip", format!("must be a finite number > 0, got {m}"))),
        m => Ok(m),
    }
}

/// The seed models refuse the flags only a GPT reads, rather than ignore them.
pub fn no_gpt_flags(args: &TrainArgs) -> Result<()> {
    let g = &args.gpt;
    let given = [
        ("--warmup-steps", g.warmup_steps.is_some()),
        ("--eval-every", g.eval_every.is_some()),
        ("--n-layer", g.n_layer.is_some()),
        ("--n-head", g.n_head.is_some()),
        ("--n-embd", g.n_embd.is_some()),
        ("--block-size", g.block_size.is_some()),
        ("--dropout", g.dropout.is_some()),
        ("--order", g.order.is_some()),
        ("--val-data", g.val_data.is_some()),
        ("--tokenizer", g.tokenizer.is_some()),
        ("--pipelines", args.pipelines.is_some()),
        ("--recompute", args.recompute),
    ];
    match given.iter().find(|(_, set)| *set) {
        Some((flag, _)) => Err(Error::invalid(flag, "applies to --model gpt only")),
        None => Ok(()),
    }
}

/// Checks every output file flag (see [`check_output`]), that no two name the same file (the
/// later write would silently replace the earlier one: `--save X --plot X` would leave a plot
/// where the weights should be), and that none names a file the run keeps in
/// `checkpoint_dir` (a checkpoint or the lock), which the run would overwrite or delete. Two
/// outputs may share a character device such as `/dev/null`, which nothing replaces.
pub fn check_outputs(outputs: &[(&'static str, Option<&Path>)], checkpoint_dir: Option<&Path>) -> Result<()> {
    let run_dir = checkpoint_dir.and_then(|d| d.canonicalize().ok());
    let mut seen: Vec<(&str, PathBuf)> = Vec::new();
    for (flag, path) in outputs {
        let Some(path) = path else { continue };
        let target = check_output(flag, path)?;
        if matches!(target, OutputTarget::Device(_)) {
            continue;
        }
        let key = same_file_key(target.path());
        let name = key.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if run_dir.is_some() && key.parent() == run_dir.as_deref() && tandem::train::run_dir::is_reserved(name) {
            let what =
                format!("{} is {name} of --checkpoint-dir, which the run writes itself; give the output another name or directory", path.display());
            return Err(Error::invalid(flag, what));
        }
        if let Some((other, _)) = seen.iter().find(|(_, k)| *k == key) {
            return Err(Error::invalid(flag, format!("{} is also the {other} path; give each output its own file", path.display())));
        }
        seen.push((flag, key));
    }
    Ok(())
}

/// A path that is equal for two spellings of one file (`./a.svg`, `a.svg`, `d/../a.svg`): the
/// canonical parent directory (which [`check_output`] found to exist) and the file name.
fn same_file_key(path: &Path) -> PathBuf {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = parent.canonicalize().unwrap_or_else(|_| parent.to_path_buf());
    path.file_name().map_or(parent.clone(), |n| parent.join(n))
}

/// Fails early, before a long run, when an output could not be written (see
/// [`write_atomic`](tandem::checkpoint::write_atomic)): a directory, a block device or a socket
/// (symbolic links followed), a missing parent directory, or a directory we may not create
/// files in. A character device or a FIFO is written in place, so nothing is created to probe
/// it. Returns where the output leads.
pub fn check_output(flag: &str, path: &Path) -> Result<OutputTarget> {
    let target = output_target(path).map_err(|e| Error::Msg(format!("{flag} {e}")))?;
    let OutputTarget::File(file) = &target else { return Ok(target) };
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(Error::Msg(format!("{flag} {}: directory {} does not exist", path.display(), parent.display())));
    }
    let probe = parent.join(format!(".tandem-probe-{}", std::process::id()));
    std::fs::File::create(&probe).map_err(|e| Error::Msg(format!("{flag} {}: cannot write there: {e}", path.display())))?;
    std::fs::remove_file(&probe).map_err(|e| Error::io(&probe, e))?;
    Ok(target)
}

/// Reads `--init` weights and checks them against the model's parameters (names, shapes,
/// dtypes) so that a mismatch names the file and the tensor.
pub fn read_init(path: &Path, model: &Sequential) -> Result<Vec<(String, Tensor)>> {
    let (tensors, _) = read_safetensors(path)?;
    finite_weights(path, &tensors)?;
    let params = model.parameters();
    let missing: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).filter(|n| !tensors.iter().any(|(t, _)| t == n)).collect();
    let unexpected: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).filter(|n| !params.iter().any(|(p, _)| p == n)).collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        return Err(Error::format(
            path,
            format!(
                "tensor names do not match the model: missing [{}], unexpected [{}]",
                Error::capped_list(missing),
                Error::capped_list(unexpected)
            ),
        ));
    }
    let mut out = Vec::with_capacity(params.len());
    for (name, p) in &params {
        let h = &tensors.iter().find(|(n, _)| n == name).expect("every name was checked present").1;
        if h.shape != p.dims() {
            return Err(Error::format(path, format!("{name} has shape {:?}; the model needs {:?}", h.shape, p.dims())));
        }
        out.push((name.clone(), host_f32(path, name, h)?));
    }
    Ok(out)
}

/// Refuses weights holding a NaN or an infinity, naming the first such tensor: nothing can be
/// trained or generated from them, and a later check (two tied tensors that differ) would only
/// blame what it compares.
pub fn finite_weights(path: &Path, tensors: &[(String, HostTensor)]) -> Result<()> {
    match tandem::train::run_file::first_non_finite(tensors) {
        Some((name, x)) => Err(Error::format(path, format!("{name} holds {x}; weights must be finite numbers"))),
        None => Ok(()),
    }
}

/// A host tensor of float weights as a CPU tensor; integer tensors are refused.
fn host_f32(path: &Path, name: &str, h: &HostTensor) -> Result<Tensor> {
    match &h.data {
        HostData::F32(v) => Tensor::from_vec(v.clone(), h.shape.clone(), &Device::cpu()),
        HostData::I32(_) => Err(Error::format(path, format!("{name} holds integers; weights must be F32, F16 or BF16"))),
    }
}

/// Applies `--precision` to the strategy `train` built, naming the flag where it cannot.
pub fn set_precision(strategy: &mut dyn Strategy, args: &TrainArgs) -> Result<()> {
    strategy.set_precision(args.precision, None).map_err(|e| Error::invalid("--precision", e.to_string()))
}

/// Records a half `--precision` in the run's configuration (which a resume must repeat); F32
/// adds nothing, so that checkpoints written before the flag still resume.
pub fn record_precision(config: &mut serde_json::Value, args: &TrainArgs) {
    if args.precision != tandem::optim::Precision::F32 {
        config["precision"] = args.precision.name().into();
    }
    if args.grad_dtype != tandem::DType::F32 {
        config["grad_dtype"] = format!("{:?}", args.grad_dtype).to_lowercase().into();
    }
}

/// `--grad-dtype`, which only ZeRO-2/3 (`--shard grads|full`) have gradient shards to keep in.
pub fn grad_dtype(args: &TrainArgs) -> Result<tandem::DType> {
    if args.grad_dtype != tandem::DType::F32 && !matches!(args.shard, Shard::Grads | Shard::Full) {
        return Err(Error::invalid("--grad-dtype", "sets the type of ZeRO-2/3's gradient shards: needs --shard grads or full"));
    }
    Ok(args.grad_dtype)
}

/// The loss scale an f16 run ended with and the steps it skipped, among the run's notes.
pub(super) fn note_loss_scale(trained: &super::training::Trained, core: &tandem::parallel::StepCore) {
    if let Some(s) = core.grad_scaler() {
        trained.note(&format!("f16 loss scale {} at the end; {} steps skipped for overflowing gradients", s.scale(), core.skipped_steps()));
    }
}
