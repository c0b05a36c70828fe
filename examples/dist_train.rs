//! Data-parallel training across processes: run under `mpirun`, each rank trains the seed CNN
//! on its share of every global batch of the digits set, on its local devices, through the
//! `Hierarchical` communicator. Rank 0 prints one JSON line per step. Options inject faults
//! (for tests/mpi.rs). `tandem train` does the same from the command line, and `tandem bench
//! --bench allreduce` times the cross-process all-reduce against plain rsmpi.
//!
//! ```text
//! cargo build --example dist_train --features mpi
//! mpirun -np 2 target/debug/examples/dist_train --devices cpu --steps 10
//! ```
//! Options: `--devices SPEC` (the machine's devices, shared out by local rank; default `cpu`),
//! `--steps N`, `--batch B`, `--deterministic`, `--shard none|optimizer|grads|full` (ZeRO-1,
//! 2, 3 over every rank's devices), `--split W,W,..` (the batch cut in these proportions, one
//! weight per device of the job in rank order), `--order mpi|ranks`, `--weights-out PATH`
//! (rank 0 writes the final weights as little-endian f32), `--panic-at STEP`, `--hang-at STEP`,
//! `--kill-at STEP` (on rank `--fault-rank R`, default the last), `--mismatched-collectives`
//! (no training: each collective called with another length, root or kind on each rank, one
//! JSON line per rank and case with the error every rank must get).
use std::time::Duration;
use tandem::data::{digits, DataLoader};
use tandem::dist::{self, Group, Order};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::comm::{Communicator, Hierarchical};
use tandem::parallel::{DataParallelConfig, Loss, OptimConfig, Parallel, Shard, Strategy};
use tandem::train::{Observer, RunStart, StepInfo, Trainer};
use tandem::{Error, Result};

struct Args {
    devices: String,
    steps: u64,
    batch: usize,
    deterministic: bool,
    shard: Shard,
    order: Option<Order>,
    weights_out: Option<String>,
    split: Option<Vec<f64>>,
    fault: Option<(Fault, u64)>,
    fault_rank: Option<usize>,
    mismatched: bool,
}

#[derive(Clone, Copy)]
enum Fault {
    Panic,
    Hang,
    Kill,
}

fn main() {
    let group = match dist::init() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("dist_train: {e}");
            std::process::exit(1);
        }
    };
    let result = parse_args().and_then(|args| train(&group, &args));
    if let Err(e) = result {
        group.abort(&format!("dist_train: {e}"));
    }
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        devices: "cpu".into(),
        steps: 10,
        batch: 64,
        deterministic: false,
        shard: Shard::None,
        order: None,
        weights_out: None,
        split: None,
        fault: None,
        fault_rank: None,
        mismatched: false,
    };
    let mut it = std::env::args().skip(1);
    let usage = |m: String| Error::invalid("dist_train", m);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| usage(format!("{flag} needs a value")));
        let num = |v: String| v.parse::<u64>().map_err(|_| usage(format!("{v:?} is not a number")));
        match flag.as_str() {
            "--devices" => a.devices = value()?,
            "--steps" => a.steps = num(value()?)?,
            "--batch" => a.batch = num(value()?)? as usize,
            "--deterministic" => a.deterministic = true,
            "--shard" => a.shard = value()?.parse()?,
            "--order" => {
                a.order = Some(match value()?.as_str() {
                    "mpi" => Order::Mpi,
                    "ranks" => Order::Ranks,
                    o => return Err(usage(format!("--order {o}: expected mpi or ranks"))),
                })
            }
            "--weights-out" => a.weights_out = Some(value()?),
            "--split" => {
                let w = value()?;
                a.split = Some(w.split(',').map(|v| v.trim().parse::<f64>().map_err(|e| usage(format!("--split {w}: {e}")))).collect::<Result<_>>()?);
            }
            "--panic-at" => a.fault = Some((Fault::Panic, num(value()?)?)),
            "--hang-at" => a.fault = Some((Fault::Hang, num(value()?)?)),
            "--kill-at" => a.fault = Some((Fault::Kill, num(value()?)?)),
            "--fault-rank" => a.fault_rank = Some(num(value()?)? as usize),
            "--mismatched-collectives" => a.mismatched = true,
            f => return Err(usage(format!("unknown option {f}"))),
        }
    }
    Ok(a)
}

fn train(group: &Group, args: &Args) -> Result<()> {
    if args.mismatched {
        return mismatched_collectives(group);
    }
    let devices = dist::local_devices(&args.devices, group)?;
    let order = args.order.unwrap_or(if args.deterministic { Order::Ranks } else { Order::Mpi });
    let comm = Hierarchical::new(&devices, group.clone(), order)?;
    let (_, world_devices) = comm.device_span();
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let cfg = DataParallelConfig { deterministic: args.deterministic, shard: args.shard, weights: args.split.clone(), ..Default::default() };
    let dp = Parallel::data(|d| SeedModel::Cnn.build(0, d), &devices, &opt, Loss::CrossEntropy).config(cfg).communicator(Box::new(comm)).build()?;
    // Every rank draws the same global batches; the strategy gives each its share.
    let (train, _) = digits::load(1024, 0, 0)?;
    let mut loader = DataLoader::new(std::sync::Arc::new(train), args.batch, true, 0)?;
    let faults = Faults { fault: args.fault, rank: group.rank(), on: args.fault_rank.unwrap_or(group.size() - 1) };
    let lines = JsonLines { leader: group.rank() == 0, processes: group.size(), devices: world_devices };
    let mut trainer = Trainer::new(dp).steps(args.steps).group(group.clone()).observe(faults).observe(lines);
    trainer.fit(&mut loader)?;
    if let Some(path) = &args.weights_out {
        // Every rank asks: under ZeRO-3 the weights are gathered from every rank's shards.
        let state = trainer.strategy().state_dict()?;
        if group.rank() != 0 {
            return Ok(());
        }
        let mut bytes = Vec::new();
        for (_, t) in state {
            bytes.extend(t.to_vec()?.iter().flat_map(|x| x.to_le_bytes()));
        }
        std::fs::write(path, bytes).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}

/// Injects the fault on its rank just before its step runs.
struct Faults {
    fault: Option<(Fault, u64)>,
    rank: usize,
    on: usize,
}

impl Faults {
    fn before(&self, step: u64) {
        if let Some((fault, at)) = self.fault.filter(|(_, at)| *at == step && self.rank == self.on) {
            inject(fault, self.rank, at);
        }
    }
}

impl Observer for Faults {
    fn started(&mut self, s: &RunStart<'_>) {
        self.before(s.step + 1);
    }
    fn step(&mut self, s: &StepInfo<'_>) {
        self.before(s.step + 1);
    }
}

/// Rank 0's line per step.
struct JsonLines {
    leader: bool,
    processes: usize,
    devices: usize,
}

impl Observer for JsonLines {
    fn step(&mut self, s: &StepInfo<'_>) {
        if self.leader {
            let (r, step, devices) = (s.report, s.step, self.devices);
            println!(
                r#"{{"step":{step},"loss":{},"loss_bits":{},"processes":{},"devices":{devices},"wall_ms":{:.2}}}"#,
                r.loss,
                r.loss.to_bits(),
                self.processes,
                r.wall_s * 1e3
            );
        }
    }
}

fn inject(fault: Fault, rank: usize, step: u64) {
    eprintln!("dist_train: rank {rank} injects a fault at step {step}");
    match fault {
        Fault::Panic => panic!("injected panic on rank {rank} at step {step}"),
        Fault::Kill => {
            let _ = std::process::Command::new("kill").args(["-KILL", &std::process::id().to_string()]).status();
        }
        Fault::Hang => {}
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Every collective with a length (or root, or kind) that differs by rank: each must return an
/// error on every rank instead of moving data. Then a matching all-reduce shows the group is
/// still in step.
fn mismatched_collectives(group: &Group) -> Result<()> {
    let r = group.rank();
    let mut own = vec![1.0f32; 3 + r];
    let cpu = tandem::Device::cpu();
    let hierarchical = Hierarchical::new(std::slice::from_ref(&cpu), group.clone(), Order::Mpi)?;
    type Case<'a> = (&'static str, Box<dyn FnMut() -> Result<()> + 'a>);
    let cases: Vec<Case> = vec![
        ("broadcast", Box::new(|| group.broadcast(&mut vec![0.0; 3 + r], 0))),
        ("broadcast root", Box::new(|| group.broadcast(&mut [0.0; 4], r))),
        ("all_reduce", Box::new(|| group.all_reduce_sum(&mut own))),
        ("all_reduce ranks", Box::new(|| group.all_reduce(&mut vec![1.0; 3 + r], Order::Ranks))),
        ("all_reduce_into", Box::new(|| group.all_reduce_into(&vec![1.0; 3 + r], &mut vec![0.0; 3 + r], Order::Mpi))),
        ("broadcast_bytes", Box::new(|| group.broadcast_bytes(&mut vec![0u8; 100 + r], 0))),
        ("kind", Box::new(|| if r == 0 { group.broadcast(&mut [0.0; 4], 0) } else { group.all_reduce_sum(&mut [0.0; 4]) })),
        ("gather type", Box::new(|| if r == 0 { group.all_gather(&[1.0]).map(drop) } else { group.all_gather_u64(&[1]).map(drop) })),
        ("barrier", Box::new(|| if r == 0 { group.barrier() } else { group.all_reduce_sum(&mut [0.0; 4]) })),
        (
            "hierarchical all_reduce",
            Box::new(|| {
                let t = tandem::Tensor::from_vec(vec![1.0; 3 + r], [3 + r], &cpu)?;
                hierarchical.all_reduce(std::slice::from_ref(&t), tandem::parallel::comm::ReduceKind::Sum)
            }),
        ),
    ];
    for (case, mut call) in cases {
        let got = call();
        let error = got.err().map(|e| e.to_string());
        println!("{}", serde_json::json!({ "rank": r, "case": case, "error": error }));
    }
    let mut after = vec![1.0f32; 4];
    group.all_reduce_sum(&mut after)?;
    println!("{}", serde_json::json!({ "rank": r, "after": after }));
    Ok(())
}
