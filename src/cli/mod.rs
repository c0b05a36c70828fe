//! The `tandem` command line: argument definitions and dispatch to `devices`, `train` and
//! `bench`. The binary's `main` only parses, calls [`run`], prints the error and exits with
//! [`exit_code`]. It is a client of the library's public API (this module is the binary's, not
//! the library's), and its one error of its own is [`Failure::Usage`].
/// `println!` for the command's output that ends the process quietly, with status 141 (128 +
/// SIGPIPE, as a shell reports `cat` cut off by `head`), when the reader has gone
/// (`tandem train | head -3`): Rust's `println!` panics on a broken pipe. Checkpoints are
/// written atomically, so stopping there loses nothing a run had saved. Any other failed write
/// makes the command fail when it ends (see [`run`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!($($arg)*))
    };
}

mod allreduce;
mod bench;
mod bench_memory;
mod devices;
mod export_hf;
mod generate;
mod gpt;
mod hf_init;
mod memory;
mod mismatch;
mod plan;
mod plot;
mod progress;
mod ranks;
mod same_run;
mod setup;
mod stop;
mod tokens;
mod train;
mod training;
mod windows;

use clap::{Args, Parser, Subcommand, ValueEnum};
use export_hf::ExportHfArgs;
use std::path::PathBuf;
use tandem::nn::models::SeedModel;
use tokens::TokenizerArg;

pub use setup::StrategyKind;

/// Why a command failed: an error of the library, or one that only a command line can make.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Tandem(#[from] tandem::Error),
    /// The processes of a job were started with different commands or flags (see
    /// `same_run.rs`): the message names each flag and every rank's value.
    #[error("{0}")]
    Usage(String),
}

/// Train neural networks on GPUs of any vendor, or on the CPU reference.
#[derive(Debug, Parser)]
#[command(name = "tandem", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every device of every compiled backend and mark the one `auto` picks.
    Devices,
    /// Train a seed model and evaluate it on the test split, or a GPT on text (`--model gpt`).
    // A repeated flag overrides the earlier one, so wrappers can append to a base command.
    #[command(args_override_self = true)]
    Train(Box<TrainArgs>),
    /// Choose the parallel layout for `train`'s flags (a seed model or --model gpt): calibrate
    /// the model on --devices under their --memory-limit budgets (or scale it to --cluster),
    /// search data, tensor and pipeline degrees, micro-batches, recomputation and --shard
    /// modes, and print the plan, its predicted step time and memory per device, the next
    /// best layouts and why each rejected one was excluded.
    #[command(args_override_self = true)]
    Plan(Box<PlanArgs>),
    /// Benchmark matmul, a training step and op dispatch on the chosen devices.
    Bench(BenchArgs),
    /// Continue a prompt with a GPT trained by `tandem train --model gpt`.
    Generate(GenerateArgs),
    /// Write a GPT trained by `tandem train --model gpt` as a Hugging Face GPT-2 folder
    /// (config.json, model.safetensors) for transformers' `GPT2LMHeadModel.from_pretrained`.
    ExportHf(ExportHfArgs),
}

/// `--model`: one of the seed models, or a GPT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelArg {
    Seed(SeedModel),
    Gpt,
}

impl std::str::FromStr for ModelArg {
    type Err = tandem::Error;
    fn from_str(s: &str) -> tandem::Result<Self> {
        match s {
            "gpt" => Ok(ModelArg::Gpt),
            _ => s
                .parse()
                .map(ModelArg::Seed)
                .map_err(|_| tandem::Error::invalid("--model", format!("'{s}' is not one of seed-cnn, seed-linear, seed-two-layer, gpt"))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerKind {
    Sgd,
    Adam,
    /// PyTorch's AdamW: decoupled weight decay (`--weight-decay`), on parameters of rank >= 2 only.
    Adamw,
}

/// `--balance`: how data parallelism shares each batch among the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Balance {
    /// In proportion to each device's measured speed, so unequal devices finish together.
    Measured,
    /// Equal shares.
    Even,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Schedule {
    Gpipe,
    #[value(name = "1f1b")]
    OneFOneB,
}

/// `--order`: how `--model gpt` draws its training windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WindowOrder {
    /// Windows at random, with replacement, each batch drawn from --seed and its step alone.
    Random,
    /// Every window once per epoch, in an order drawn from --seed and the epoch.
    Shuffle,
    /// Every window once per epoch, in the data's order.
    Sequential,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `tandem train`. Defaults train the seed CNN on the built-in digits to >= 95% test
/// accuracy on the device `auto` picks.
#[derive(Clone, Debug, Args)]
pub struct TrainArgs {
    /// seed-cnn, seed-linear, seed-two-layer or gpt.
    #[arg(long, default_value = "seed-cnn")]
    pub model: ModelArg,
    /// digits, synthetic, mnist:DIR, or a PATH.safetensors holding tensors `x` and `y`; for
    /// gpt: text (the built-in corpus), text:PATH (a UTF-8 file), or a PATH.safetensors of
    /// token ids `x`, `y` [N, T].
    #[arg(long, default_value = "digits")]
    pub data: String,
    /// Initial weights (safetensors with PyTorch state_dict names), or for --model gpt a
    /// Hugging Face GPT-2 folder (config.json, model.safetensors), whose shape the model takes;
    /// their SHA-256 (a folder's model.safetensors') is recorded in the checkpoints. With --resume the weights come from the checkpoint, and --init may
    /// be given again (as a scheduler restarting the same command does) only for the file the
    /// run started from.
    #[arg(long, value_name = "PATH")]
    pub init: Option<PathBuf>,
    /// Write the final weights here (safetensors, PyTorch state_dict names).
    #[arg(long, value_name = "PATH")]
    pub save: Option<PathBuf>,
    /// Optimizer steps to run [default: 1500].
    #[arg(long, conflicts_with = "epochs")]
    pub steps: Option<u64>,
    /// Passes over the training set (full batches only) instead of --steps.
    #[arg(long)]
    pub epochs: Option<u64>,
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Learning rate [default: 0.01 for sgd, 0.001 for adam and adamw].
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9, allow_negative_numbers = true)]
    pub momentum: f32,
    /// [default: sgd; adamw for gpt]
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerKind>,
    /// AdamW's decoupled weight decay [default: 0.01].
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f32>,
    /// Clip gradients to this global norm before each update.
    #[arg(long, value_name = "NORM", allow_negative_numbers = true)]
    pub grad_clip: Option<f32>,
    #[command(flatten)]
    pub gpt: GptArgs,
    /// Seeds the model's initialisation, the generated data and the shuffle.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// cpu, wgpu:N, cuda:N, auto, all, or a comma list.
    #[arg(long, default_value = "auto")]
    pub devices: String,
    #[arg(long, value_enum, default_value_t = StrategyKind::Auto)]
    pub strategy: StrategyKind,
    /// Train with a plan `tandem plan --save-plan` wrote: its layout, layer cuts and batch
    /// shares, on the devices it was made for.
    #[arg(long, value_name = "FILE.json", conflicts_with = "strategy")]
    pub plan: Option<PathBuf>,
    /// Data-parallel batch shares (--strategy data, and the planned layouts): by each device's
    /// measured speed, or equal [default: measured when the devices differ].
    #[arg(long, value_enum)]
    pub balance: Option<Balance>,
    /// Split each batch into this many micro-batches (pipeline strategies).
    #[arg(long, value_name = "N")]
    pub micro_batches: Option<usize>,
    /// Pipeline schedule.
    #[arg(long, value_enum, default_value_t = Schedule::OneFOneB)]
    pub schedule: Schedule,
    /// Pipelines of --strategy data,pipeline: the devices are cut into this many equal rows,
    /// one pipeline each [default: 2].
    #[arg(long, value_name = "N")]
    pub pipelines: Option<usize>,
    /// Tensor-parallel group size: under --strategy data,tensor the devices are cut into groups
    /// of N consecutive devices, each holding one replica's shards, with data parallelism over
    /// the groups (Megatron-LM's layout: tensor inside a server, data across) [default: 2];
    /// under pipeline and data,pipeline (--model gpt) each stage is a group of N [default: 1].
    #[arg(long, value_name = "N")]
    pub tensor: Option<usize>,
    /// Recompute activations in the backward instead of keeping them (--model gpt): each
    /// block under single, data and tensor, each stage under the pipelines (less memory, one
    /// more forward per step; the same gradients).
    #[arg(long)]
    pub recompute: bool,
    /// Caps the memory each device's tensors may hold: one SIZE for every device (8GiB,
    /// 512MiB, 4096) or SPEC=SIZE per device (cpu=2GiB,wgpu:0=8GiB). Past it the step that asks
    /// fails with an out-of-memory error naming the device, the bytes asked, the budget and the
    /// bytes in use; checkpoints already written stay intact. Plays a smaller GPU on this one.
    #[arg(long, value_name = "SIZE|SPEC=SIZE,..")]
    pub memory_limit: Option<String>,
    /// Bit-identical results across runs, and across device counts of one backend, at some
    /// cost in speed; layer splits (model, pipeline) fixed by parameter bytes, not timings.
    #[arg(long)]
    pub deterministic: bool,
    /// Shard the training state over the data axis: `optimizer` (ZeRO-1), `grads` (ZeRO-2:
    /// gradients and optimizer state), `full` (ZeRO-3: parameters too). Needs a data axis:
    /// --strategy data (or auto on several devices), data,tensor or data,pipeline, where each
    /// stage's or shard's state is sharded over the replicas that hold it.
    #[arg(long, value_name = "MODE", default_value = "none")]
    pub shard: tandem::parallel::Shard,
    /// Gradient bytes per data-parallel bucket (PyTorch DDP's `bucket_cap_mb`): smaller ones
    /// start communicating earlier in backward. Under --shard grads|full the buckets are the
    /// units of sharding, and ZeRO-3 holds about two units of full parameters at a time.
    #[arg(long, value_name = "SIZE", default_value = "25MiB", value_parser = bucket_size)]
    pub bucket_size: usize,
    /// The type --shard grads|full keep each device's gradient shard in until the update:
    /// `f32`, or `bf16` / `f16` (DeepSpeed's `grad_accum_dtype`), which takes 2 of ZeRO-3's 16
    /// bytes a parameter off. Summed in f32 first; the update widens it again. With a plan
    /// (`--strategy auto`, `tandem plan`), the type the planner counts for the layouts that
    /// shard gradients (ZeRO-2/3), which then keep them in it.
    #[arg(long, value_name = "TYPE", default_value = "f32", value_parser = grad_dtype)]
    pub grad_dtype: tandem::DType,
    /// Keep the optimizer state in host memory (DeepSpeed's `offload_optimizer`): each
    /// parameter's state visits its device for that parameter's update only, which takes Adam's
    /// 8 of 16 bytes a parameter (with --shard, of each device's shard) off the device and
    /// moves them over the bus both ways every step. Same kernels, so the same results bit for
    /// bit; a run may resume with or without it. A plan (`--strategy auto`) offloads by
    /// itself where no layout fits the devices' memory otherwise.
    #[arg(long)]
    pub offload_optimizer: bool,
    /// What the forward computes in: `f32`, or `bf16` / `f16` (PyTorch's autocast: products
    /// and the activations after them stored in the half type, computed in f32; F32 master
    /// weights; f16 with dynamic loss scaling). Every --strategy.
    #[arg(long, value_name = "TYPE", default_value = "f32")]
    pub precision: tandem::optim::Precision,
    /// Measure the planner's calibration again (`--strategy auto`, `tandem plan`) instead of
    /// reusing the one an earlier run on the same devices kept (for a week, under
    /// $TANDEM_CACHE_DIR/plan; TANDEM_CALIBRATION=off keeps none).
    #[arg(long)]
    pub recalibrate: bool,
    /// Choose the layout from the cost model alone. By default the planner first runs the
    /// layout it would choose for a few steps and adds what the step cost beyond the model to
    /// its estimate, until its choice is a layout that ran (`plan::tried`).
    #[arg(long)]
    pub no_trials: bool,
    /// Let the plan choose the precision too (f32, bf16 or f16, each calibrated and planned;
    /// the fastest wins, f32 on a tie): halves change the numerics and halve activations, so
    /// a layout that does not fit in f32 may in bf16. `--strategy auto` on several devices,
    /// or `tandem plan`; the run trains in the chosen precision, and a resume repeats it.
    #[arg(long)]
    pub search_precision: bool,
    /// Write resumable checkpoints into this directory.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps [default: 100].
    #[arg(long, value_name = "N", requires = "checkpoint_dir")]
    pub checkpoint_every: Option<u64>,
    /// Continue from the newest valid checkpoint in --checkpoint-dir.
    #[arg(long, requires = "checkpoint_dir")]
    pub resume: bool,
    /// Delete the checkpoints already in --checkpoint-dir and start a new run there.
    #[arg(long, requires = "checkpoint_dir", conflicts_with = "resume")]
    pub overwrite_checkpoints: bool,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Write a Chrome trace of the device timelines (open in Perfetto).
    #[arg(long, value_name = "PATH.json")]
    pub trace: Option<PathBuf>,
    /// Write an SVG plot of the loss curve and the test accuracy.
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<PathBuf>,
}

/// Flags of `tandem plan`: those of `train`, and where to plan for.
#[derive(Clone, Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Plan for a described cluster instead of --devices: dual-m60:N (N servers of 4 M60
    /// GPUs on PCIe 3, 10 GbE between) or h100:N (N servers of 8 H100s on NVLink, InfiniBand
    /// between); the layers are timed on this CPU and scaled by its matmul throughput.
    #[arg(long, value_name = "NAME:N")]
    pub cluster: Option<String>,
    /// Write the plan here as JSON, for `tandem train --plan`.
    #[arg(long, value_name = "FILE.json")]
    pub save_plan: Option<PathBuf>,
}

/// The flags only `--model gpt` reads.
#[derive(Clone, Debug, Args)]
pub struct GptArgs {
    /// Transformer blocks [default: 4].
    #[arg(long, value_name = "N")]
    pub n_layer: Option<usize>,
    /// Attention heads per block [default: 4].
    #[arg(long, value_name = "N")]
    pub n_head: Option<usize>,
    /// Embedding width, a multiple of --n-head [default: 128].
    #[arg(long, value_name = "N")]
    pub n_embd: Option<usize>,
    /// Tokens per training window, the longest context the model reads [default: 64].
    #[arg(long, value_name = "N")]
    pub block_size: Option<usize>,
    /// Drop probability of every Dropout layer [default: 0].
    #[arg(long, value_name = "P")]
    pub dropout: Option<f32>,
    /// Linear warmup over N steps, then cosine decay of the learning rate to a tenth of it at
    /// the last step.
    #[arg(long, value_name = "N")]
    pub warmup_steps: Option<u64>,
    /// Print the validation loss every N steps (and after the last).
    #[arg(long, value_name = "N")]
    pub eval_every: Option<u64>,
    /// How training windows are drawn: random (with replacement), shuffle or sequential (each
    /// window once per epoch, in full batches; --epochs then counts them) [default: random].
    #[arg(long, value_enum)]
    pub order: Option<WindowOrder>,
    /// The validation windows, all of them evaluated: a PATH.safetensors of token ids `x`, `y`
    /// [N, T] beside such a --data, or text:PATH beside a text --data (in its characters).
    /// All of --data then trains, instead of its first 90%.
    #[arg(long, value_name = "PATH")]
    pub val_data: Option<String>,
    /// How a text --data (and --val-data) becomes tokens: `chars`, the text's own characters
    /// (nanoGPT's shakespeare_char), or `gpt2`, GPT-2's byte-level BPE of 50,257 tokens. With
    /// a token file, `gpt2` says its ids are GPT-2's. The run records it for `generate` and
    /// resume [default: chars].
    #[arg(long, value_enum)]
    pub tokenizer: Option<TokenizerArg>,
}

/// Flags of `tandem generate`.
#[derive(Clone, Debug, Args)]
pub struct GenerateArgs {
    /// A checkpoint of `tandem train --model gpt` (from --checkpoint-dir, or its --save file).
    #[arg(long, value_name = "CKPT")]
    pub init: PathBuf,
    /// The text to continue, in the run's tokenizer (with `chars`, every character must be in
    /// the training text's vocabulary).
    #[arg(long)]
    pub prompt: String,
    /// Tokens (characters, or GPT-2's BPE tokens) to sample.
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    /// Divides the logits: below 1 sharper, above 1 more random; a finite number above 0.
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true, value_parser = temperature)]
    pub temperature: f32,
    /// Sample among the K likeliest tokens only (K >= 1).
    #[arg(long, value_name = "K", allow_negative_numbers = true, value_parser = at_least_one)]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The device to run on.
    #[arg(long, default_value = "cpu")]
    pub devices: String,
}

#[derive(Clone, Debug, Args)]
pub struct BenchArgs {
    /// One benchmark only: allreduce (run it under `mpirun -np N`: tandem's all-reduce across
    /// the processes against a plain MPI_Allreduce of the same bytes, 4 KiB to 64 MiB), or
    /// memory (each device's peak and held bytes under data parallelism in every --shard mode,
    /// for GPT-2 small's shape, or --model gpt; name two devices or more: cpu,cpu,cpu,cpu).
    #[arg(long, value_name = "NAME")]
    pub bench: Option<String>,
    /// Benchmark training steps of this model only: gpt (4 layers, 4 heads, 128 wide, block
    /// 64, batch 16) instead of the default set of figures.
    #[arg(long)]
    pub model: Option<String>,
    /// Devices to benchmark, one after another (cpu, wgpu:N, cuda:N, auto, all, comma list).
    #[arg(long, default_value = "auto")]
    pub devices: String,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// One timed run per figure instead of several: a quick smoke run.
    #[arg(long)]
    pub quick: bool,
    /// `--bench memory`: the precisions to measure, comma-separated (f32, bf16, f16); in a half
    /// type ZeRO-2/3 keep their gradient shards in it (--grad-dtype).
    #[arg(long, value_name = "TYPE,..", value_delimiter = ',', default_value = "f32")]
    pub precision: Vec<tandem::optim::Precision>,
}

/// Runs one parsed command; returns the exit status: 0, or 128 + the signal's number after
/// `train` stopped early on SIGINT (130) or SIGTERM (143). Output that could not be written
/// (standard output on a full disk) makes a finished command an error; a reader that closed the
/// pipe (`| head`) ends it at once with status 141, as `cat` would.
///
/// Under `mpirun`/`srun` every rank runs the command (see `ranks.rs`), after checking that
/// every rank was started with the same run configuration (see `same_run.rs`); an error on
/// any rank ends the whole job with a message naming that rank instead of returning.
pub fn run(cli: Cli) -> Result<u8, Failure> {
    let ranks = ranks::Ranks::init()?;
    let done = same_run::check(&cli.command, &ranks).and_then(|()| {
        let code = match cli.command {
            Command::Devices => devices::run(&ranks).map(|()| 0),
            Command::Train(args) => train::run(&args, &ranks),
            Command::Plan(args) => plan::run(&args, &ranks).map(|()| 0),
            Command::Bench(args) => bench::run(&args, &ranks).map(|()| 0),
            Command::Generate(args) => generate::run(&args).map(|()| 0),
            Command::ExportHf(args) => export_hf::run(&args).map(|()| 0),
        };
        Ok(code.and_then(output_written)?)
    });
    done.or_else(|e| ranks.fail(e))
}

/// The exit status for a failed command: 2 for a usage error (a flag's value that can never
/// work, whatever the files and devices, or a fresh run into a checkpoint directory that needs
/// `--resume` or `--overwrite-checkpoints`), 1 for everything else.
pub fn exit_code(e: &Failure) -> u8 {
    match e {
        Failure::Tandem(tandem::Error::Invalid { op, .. }) if op.starts_with("--") => 2,
        Failure::Tandem(tandem::Error::CheckpointsPresent { .. }) => 2,
        _ => 1,
    }
}

/// The exit status when standard output's reader has gone: 128 + SIGPIPE's number.
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// The first failure to write standard output other than a closed pipe (a full disk behind a
/// redirect, `> /dev/full`): the command goes on, and ends with this error instead of success.
static STDOUT_FAILED: std::sync::OnceLock<(std::io::ErrorKind, String)> = std::sync::OnceLock::new();

/// Writes one line of output; see `out!`.
pub(crate) fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(args).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(BROKEN_PIPE_STATUS);
        }
        // Reported once; a run goes on, since its checkpoints and saved files do not depend on
        // the log, and [`run`] turns the failure into the command's error at the end.
        if STDOUT_FAILED.set((e.kind(), e.to_string())).is_ok() {
            eprintln!("warning: could not write to standard output: {e}");
        }
    }
}

/// A command that succeeded but could not write its output ends with the write's error.
/// `--bucket-size`: a size as `--memory-limit` takes one (32KiB, 25MiB, 4096).
fn bucket_size(text: &str) -> std::result::Result<usize, String> {
    let bytes = tandem::backend::parse_bytes(text)?;
    usize::try_from(bytes).map_err(|_| format!("{bytes} bytes do not fit this machine's address space"))
}

/// `generate --temperature`: a finite number above 0 (the logits are divided by it).
fn temperature(text: &str) -> std::result::Result<f32, String> {
    let t: f32 = text.trim().parse().map_err(|_| format!("{text:?} is not a number"))?;
    if t > 0.0 && t.is_finite() {
        Ok(t)
    } else {
        Err(format!("{text} cannot divide the logits: give a finite number above 0 (1 samples the model's own distribution)"))
    }
}

/// A count that must be at least 1 (`generate --top-k`).
fn at_least_one(text: &str) -> std::result::Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{text:?} is not a whole number: {e}")),
    }
}

fn grad_dtype(text: &str) -> std::result::Result<tandem::DType, String> {
    match text {
        "f32" => Ok(tandem::DType::F32),
        "bf16" => Ok(tandem::DType::Bf16),
        "f16" => Ok(tandem::DType::F16),
        _ => Err(format!("{text:?} is not f32, bf16 or f16")),
    }
}

fn output_written(code: u8) -> tandem::Result<u8> {
    match STDOUT_FAILED.get() {
        Some((kind, msg)) if code == 0 => Err(tandem::Error::io("standard output", std::io::Error::new(*kind, msg.clone()))),
        _ => Ok(code),
    }
}
