//! Pipeline stages on different processes, ZeRO-1 over every rank, and NCCL across processes:
//! run under `mpirun`, every rank trains the seed CNN on the same global batches of the digits
//! set (a tiny GPT on fixed token batches in the `gpt` modes); rank 0 prints one JSON line per
//! step. Tests (tests/mpi_pipeline.rs) compare the modes with one process.
//!
//! ```text
//! cargo build --example dist_pipeline --features mpi
//! target/debug/examples/dist_pipeline --mode single --steps 10
//! mpirun -np 2 target/debug/examples/dist_pipeline --mode pipeline --split 6 --micro 4
//! mpirun -np 2 target/debug/examples/dist_pipeline --mode zero --devices cpu
//! mpirun -np 2 target/debug/examples/dist_pipeline --mode dp --devices cuda:0,cuda:1 --comm nccl
//! mpirun -np 2 target/debug/examples/dist_pipeline --mode gpt-pipeline --devices cpu,cpu,cpu,cpu --tensor 2
//! ```
//! Options: `--mode single|pipeline|dp|zero|zero2|zero3|gpt|gpt-pipeline` (ZeRO-1, 2, 3; `gpt`: the GPT on
//! one device, `gpt-pipeline`: its stages over the ranks, each a tensor-parallel group of
//! `--tensor T` of the rank's devices, the embedding on rank 0 tied to the head on the last;
//! `--bad-tie one-rank|shape` gives rank 0 alone a tie, or every rank a tie of two shapes);
//! `--devices SPEC` (the machine's devices, shared
//! out by local rank; default `cpu`); `--steps N`; `--batch B`; pipeline: `--split A,B,..`
//! (layer indices where ranks 1, 2, .. start; one rank per stage), `--micro M`, `--schedule
//! gpipe|1f1b`, `--recompute`; `--clip MAX_NORM` (single and pipeline); data parallel: `--comm hierarchical|nccl`; `--state-out PATH`
//! (rank 0 writes the weights, then the optimizer state, each sorted by name, as
//! little-endian f32).
use std::sync::Arc;
use tandem::data::{digits, DataLoader};
use tandem::dist::{self, Group, Order};
use tandem::nn::models::{Gpt, GptConfig, SeedModel};
use tandem::optim::{AdamConfig, SgdConfig};
use tandem::parallel::comm::{Communicator, Hierarchical};
use tandem::parallel::pipeline::Schedule;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Parallel, Shard, Stages, Strategy};
use tandem::train::{Observer, StepInfo, Trainer};
use tandem::{Error, Result, Tensor};

struct Args {
    mode: String,
    devices: String,
    steps: u64,
    batch: usize,
    split: Vec<usize>,
    micro: usize,
    schedule: Schedule,
    recompute: bool,
    clip: Option<f32>,
    comm: String,
    state_out: Option<String>,
    tensor: usize,
    bad_tie: Option<String>,
}

fn main() {
    let group = match dist::init() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("dist_pipeline: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = parse_args().and_then(|args| train(&group, &args)) {
        group.abort(&format!("dist_pipeline: {e}"));
    }
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        mode: "single".into(),
        devices: "cpu".into(),
        steps: 10,
        batch: 32,
        split: vec![6],
        micro: 4,
        schedule: Schedule::OneFOneB,
        recompute: false,
        clip: None,
        comm: "hierarchical".into(),
        state_out: None,
        tensor: 1,
        bad_tie: None,
    };
    let mut it = std::env::args().skip(1);
    let usage = |m: String| Error::invalid("dist_pipeline", m);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| usage(format!("{flag} needs a value")));
        let num = |v: &str| v.parse::<usize>().map_err(|_| usage(format!("{v:?} is not a number")));
        match flag.as_str() {
            "--mode" => a.mode = value()?,
            "--devices" => a.devices = value()?,
            "--steps" => a.steps = num(&value()?)? as u64,
            "--batch" => a.batch = num(&value()?)?,
            "--split" => a.split = value()?.split(',').map(num).collect::<Result<_>>()?,
            "--micro" => a.micro = num(&value()?)?,
            "--schedule" => {
                a.schedule = match value()?.as_str() {
                    "gpipe" => Schedule::GPipe,
                    "1f1b" => Schedule::OneFOneB,
                    s => return Err(usage(format!("--schedule {s}: expected gpipe or 1f1b"))),
                }
            }
            "--recompute" => a.recompute = true,
            "--clip" => a.clip = Some(value()?.parse().map_err(|_| usage("--clip needs a number".into()))?),
            "--comm" => a.comm = value()?,
            "--state-out" => a.state_out = Some(value()?),
            "--tensor" => a.tensor = num(&value()?)?,
            "--bad-tie" => a.bad_tie = Some(value()?),
            f => return Err(usage(format!("unknown option {f}"))),
        }
    }
    Ok(a)
}

/// This rank's strategy for `args.mode`: a data-parallel one apart, to report its memory.
enum Built {
    Data(Box<DataParallel>),
    Other(Box<dyn Strategy>),
}

fn strategy(group: &Group, args: &Args) -> Result<Built> {
    let devices = dist::local_devices(&args.devices, group)?;
    let model = SeedModel::Cnn.build(0, &devices[0])?;
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let loss = Loss::CrossEntropy;
    match args.mode.as_str() {
        "single" => Ok(Built::Other(Parallel::single(|_| Ok(model), &devices[0], &opt, loss).grad_clip(args.clip).boxed()?)),
        "pipeline" => {
            // Rank r builds only layers split[r-1]..split[r] of the model, on its device.
            let (rank, size) = (group.rank(), group.size());
            if args.split.len() + 1 != size {
                return Err(Error::invalid(
                    "dist_pipeline",
                    format!("--split {:?} makes {} stages for {size} ranks", args.split, args.split.len() + 1),
                ));
            }
            let starts: Vec<usize> = std::iter::once(0).chain(args.split.iter().copied()).chain([model.len()]).collect();
            let part = model.slice(starts[rank]..starts[rank + 1], &devices[0])?;
            let pipe = Parallel::pipeline(Stages::Built(vec![part]), &devices[..1], &opt, loss)
                .micro_batches(args.micro)
                .schedule(args.schedule)
                .recompute(args.recompute)
                .grad_clip(args.clip)
                .across(group)
                .build()?;
            Ok(Built::Other(Box::new(pipe)))
        }
        "dp" | "zero" | "zero2" | "zero3" => {
            let comm: Box<dyn Communicator> = match args.comm.as_str() {
                "hierarchical" => Box::new(Hierarchical::new(&devices, group.clone(), Order::Mpi)?),
                "nccl" => nccl(&devices, group)?,
                c => return Err(Error::invalid("dist_pipeline", format!("--comm {c}: expected hierarchical or nccl"))),
            };
            let shard = match args.mode.as_str() {
                "zero" => Shard::Optimizer,
                "zero2" => Shard::Grads,
                "zero3" => Shard::Full,
                _ => Shard::None,
            };
            let cfg = DataParallelConfig { shard, ..Default::default() };
            Ok(Built::Data(Box::new(
                Parallel::data(|d| model.slice(0..model.len(), d), &devices, &opt, loss).config(cfg).communicator(comm).build()?,
            )))
        }
        m => Err(Error::invalid("dist_pipeline", format!("--mode {m}: expected single, pipeline, dp, zero, zero2 or zero3"))),
    }
}

#[cfg(feature = "nccl")]
fn nccl(devices: &[tandem::Device], group: &Group) -> Result<Box<dyn Communicator>> {
    Ok(Box::new(tandem::parallel::comm::Nccl::across(devices, group)?))
}

#[cfg(not(feature = "nccl"))]
fn nccl(_: &[tandem::Device], _: &Group) -> Result<Box<dyn Communicator>> {
    Err(Error::Unavailable { backend: "nccl", reason: "built without the `nccl` cargo feature".into() })
}

/// The GPT of the `gpt` modes on `device`.
fn gpt(device: &tandem::Device) -> Result<Gpt> {
    let cfg = GptConfig { vocab_size: 16, block_size: 8, n_layer: 2, n_head: 2, n_embd: 8, dropout: 0.0, bias: true };
    Gpt::new(cfg, 0, device)
}

/// `--mode gpt` or `gpt-pipeline`: this rank's strategy.
fn gpt_strategy(group: &Group, args: &Args) -> Result<Box<dyn Strategy>> {
    let devices = dist::local_devices(&args.devices, group)?;
    let opt = OptimConfig::adam(AdamConfig { lr: 0.01, weight_decay: 0.1, ..AdamConfig::adamw() });
    let loss = Loss::CrossEntropy;
    if args.mode == "gpt" {
        return Parallel::single(gpt, &devices[0], &opt, loss).grad_clip(args.clip).boxed();
    }
    // This rank's stages: as many as its devices make groups of --tensor, after the lower ranks'.
    let local = devices.len() / args.tensor.max(1);
    let counts = group.all_gather_u64(&[local as u64])?;
    let first: usize = counts[..group.rank()].iter().map(|c| c[0] as usize).sum();
    let total: usize = counts.iter().map(|c| c[0] as usize).sum();
    // Drawn on the host by every rank alike; each keeps its own stages.
    let model = gpt(&tandem::Device::cpu())?;
    let stages = match args.tensor {
        1 => Stages::Built(model.stages_of(first..first + local, total, &devices, None)?),
        t => Stages::Sharded(model.tensor_stages_of(first..first + local, total, &devices, t, None)?),
    };
    let mut pipe = Parallel::pipeline(stages, &devices, &opt, loss)
        .micro_batches(args.micro)
        .schedule(args.schedule)
        .recompute(args.recompute)
        .grad_clip(args.clip);
    pipe = match args.bad_tie.as_deref() {
        None => pipe,
        Some("one-rank") if group.rank() == 0 => pipe.tie((0, Gpt::WTE), (total - 1, Gpt::LM_HEAD)),
        Some("one-rank") => pipe,
        Some("shape") => pipe.tie((0, "transformer.wpe.weight"), (total - 1, "transformer.ln_f.weight")),
        Some(b) => return Err(Error::invalid("dist_pipeline", format!("--bad-tie {b}: expected one-rank or shape"))),
    };
    Ok(Box::new(pipe.across(group).build()?))
}

/// The GPT modes' loop: batch `s` is a fixed function of `s`, 8 windows of 8 tokens.
fn train_gpt(group: &Group, args: &Args) -> Result<()> {
    let mut strategy = gpt_strategy(group, args)?;
    let mut lines = JsonLines { leader: group.rank() == 0 };
    for step in 0..args.steps {
        let ids: Vec<i32> = (0..8 * 9).map(|i| ((i * 5 + i / 9 + step as usize * 3) % 16) as i32).collect();
        let (x, y): (Vec<i32>, Vec<i32>) = ids.chunks(9).flat_map(|w| w[..8].iter().zip(&w[1..]).map(|(a, b)| (*a, *b))).unzip();
        let report = strategy.step(&tandem::data::Batch::tokens(x, y, 8, 16)?)?;
        lines.step(&StepInfo { step: step + 1, total: args.steps, lr: None, samples: 8, report: &report });
    }
    write_state(group, args, &*strategy)
}

fn train(group: &Group, args: &Args) -> Result<()> {
    if args.mode.starts_with("gpt") {
        return train_gpt(group, args);
    }
    let (data, _) = digits::load(512, 0, 0)?;
    let mut loader = DataLoader::new(Arc::new(data), args.batch, true, 0)?;
    let lines = JsonLines { leader: group.rank() == 0 };
    match strategy(group, args)? {
        Built::Data(dp) => {
            let mut trainer = Trainer::new(*dp).steps(args.steps).group(group.clone()).observe(lines);
            trainer.fit(&mut loader)?;
            let dp = trainer.strategy();
            // Memory per rank: the optimizer state each holds (made by the first step).
            let mine: u64 = dp.optimizer_state_bytes().iter().sum();
            let all = group.all_gather_u64(&[mine])?;
            if group.rank() == 0 {
                let bytes: Vec<u64> = all.iter().map(|v| v[0]).collect();
                println!(r#"{{"optimizer_state_bytes":{bytes:?},"communicator":"{}"}}"#, dp.communicator().name());
            }
            write_state(group, args, dp)
        }
        Built::Other(s) => {
            let mut trainer = Trainer::boxed(s).steps(args.steps).group(group.clone()).observe(lines);
            trainer.fit(&mut loader)?;
            write_state(group, args, trainer.strategy())
        }
    }
}

/// Rank 0's line per step.
struct JsonLines {
    leader: bool,
}

impl Observer for JsonLines {
    fn step(&mut self, s: &StepInfo<'_>) {
        if self.leader {
            let (r, step) = (s.report, s.step);
            let norm = r.grad_norm.map_or("null".into(), |n| n.to_string());
            println!(r#"{{"step":{step},"loss":{},"loss_bits":{},"grad_norm":{norm},"wall_ms":{:.2}}}"#, r.loss, r.loss.to_bits(), r.wall_s * 1e3);
        }
    }
}

/// `--state-out`: the weights and optimizer state, gathered (a collective across processes:
/// every rank gathers, rank 0 writes).
fn write_state(group: &Group, args: &Args, strategy: &dyn Strategy) -> Result<()> {
    let weights = strategy.state_dict()?;
    let (opt_state, _) = strategy.optimizer_state()?;
    if let (Some(path), 0) = (&args.state_out, group.rank()) {
        let mut bytes = Vec::new();
        for mut part in [weights, opt_state] {
            part.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, t) in &part {
                bytes.extend(Tensor::to_vec(t)?.iter().flat_map(|x| x.to_le_bytes()));
            }
        }
        std::fs::write(path, bytes).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}
