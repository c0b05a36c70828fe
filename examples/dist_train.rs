//! Data-parallel training across processes: run under `mpirun`, each rank trains the seed CNN
//! on its share of every global batch of the digits set, on its local devices, through the
//! `Hierarchical` communicator. Rank 0 prints one JSON line per step. Options inject faults
//! (for tests/mpi.rs) or time the cross-process all-reduce against plain rsmpi.
//!
//! ```text
//! cargo build --example dist_train --features mpi
//! mpirun -np 2 target/debug/examples/dist_train --devices cpu --steps 10
//! mpirun -np 2 target/debug/examples/dist_train --bench-allreduce
//! ```
//! Options: `--devices SPEC` (the machine's devices, shared out by local rank; default `cpu`),
//! `--steps N`, `--batch B`, `--deterministic`, `--order mpi|ranks`, `--weights-out PATH`
//! (rank 0 writes the final weights as little-endian f32), `--panic-at STEP`, `--hang-at STEP`,
//! `--kill-at STEP` (on rank `--fault-rank R`, default the last), `--bench-allreduce`.
use std::time::{Duration, Instant};
use tandem::data::{digits, DataLoader};
use tandem::dist::{self, Group, Order};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::comm::{Communicator, Hierarchical, ReduceKind};
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Strategy};
use tandem::{Device, Error, Result, Tensor};

struct Args {
    devices: String,
    steps: u64,
    batch: usize,
    deterministic: bool,
    order: Option<Order>,
    weights_out: Option<String>,
    fault: Option<(Fault, u64)>,
    fault_rank: Option<usize>,
    bench: bool,
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
    let result = parse_args().and_then(|args| if args.bench { bench(&group) } else { train(&group, &args) });
    if let Err(e) = result {
        group.abort(&format!("dist_train: {e}"));
    }
}

fn parse_args() -> Result<Args> {
    let mut a = Args { devices: "cpu".into(), steps: 10, batch: 64, deterministic: false, order: None, weights_out: None, fault: None, fault_rank: None, bench: false };
    let mut it = std::env::args().skip(1);
    let usage = |m: String| Error::Usage(format!("dist_train: {m}"));
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| usage(format!("{flag} needs a value")));
        let num = |v: String| v.parse::<u64>().map_err(|_| usage(format!("{v:?} is not a number")));
        match flag.as_str() {
            "--devices" => a.devices = value()?,
            "--steps" => a.steps = num(value()?)?,
            "--batch" => a.batch = num(value()?)? as usize,
            "--deterministic" => a.deterministic = true,
            "--order" => {
                a.order = Some(match value()?.as_str() {
                    "mpi" => Order::Mpi,
                    "ranks" => Order::Ranks,
                    o => return Err(usage(format!("--order {o}: expected mpi or ranks"))),
                })
            }
            "--weights-out" => a.weights_out = Some(value()?),
            "--panic-at" => a.fault = Some((Fault::Panic, num(value()?)?)),
            "--hang-at" => a.fault = Some((Fault::Hang, num(value()?)?)),
            "--kill-at" => a.fault = Some((Fault::Kill, num(value()?)?)),
            "--fault-rank" => a.fault_rank = Some(num(value()?)? as usize),
            "--bench-allreduce" => a.bench = true,
            f => return Err(usage(format!("unknown option {f}"))),
        }
    }
    Ok(a)
}

fn train(group: &Group, args: &Args) -> Result<()> {
    let devices = dist::local_devices(&args.devices, group)?;
    let order = args.order.unwrap_or(if args.deterministic { Order::Ranks } else { Order::Mpi });
    let comm = Hierarchical::new(&devices, group.clone(), order)?;
    let (_, world_devices) = comm.device_span();
    let model = SeedModel::Cnn.build(0, &devices[0])?;
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let cfg = DataParallelConfig { deterministic: args.deterministic, ..Default::default() };
    let mut dp = DataParallel::with_communicator(&model, Box::new(comm), &opt, Loss::CrossEntropy, cfg)?;
    // Every rank draws the same global batches; the strategy gives each its share.
    let (train, _) = digits::load(1024, 0, 0)?;
    let mut loader = DataLoader::new(std::sync::Arc::new(train), args.batch, true, 0)?;
    for step in 1..=args.steps {
        if let Some((fault, at)) = args.fault {
            if at == step && group.rank() == args.fault_rank.unwrap_or(group.size() - 1) {
                inject(fault, group.rank(), step);
            }
        }
        let r = dp.step(&loader.next_batch())?;
        if group.rank() == 0 {
            println!(
                r#"{{"step":{step},"loss":{},"loss_bits":{},"processes":{},"devices":{world_devices},"wall_ms":{:.2}}}"#,
                r.loss,
                r.loss.to_bits(),
                group.size(),
                r.wall_s * 1e3
            );
        }
    }
    if let (Some(path), 0) = (&args.weights_out, group.rank()) {
        let mut bytes = Vec::new();
        for (_, t) in dp.state_dict()? {
            bytes.extend(t.to_vec()?.iter().flat_map(|x| x.to_le_bytes()));
        }
        std::fs::write(path, bytes).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
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

/// Algorithm bandwidth (buffer bytes per second) of each all-reduce, 4 KiB to 64 MiB: plain
/// rsmpi `all_reduce_into`, the group's polled MPI all-reduce and its rank-order sum, and the
/// `Hierarchical` communicator on a CPU tensor (downloads and uploads included).
fn bench(group: &Group) -> Result<()> {
    use mpi::traits::*;
    let world = mpi::topology::SimpleCommunicator::world();
    let cpu = Device::cpu();
    let comms = [("tandem-hierarchical-mpi", Order::Mpi), ("tandem-hierarchical-ranks", Order::Ranks)]
        .map(|(name, order)| Hierarchical::new(std::slice::from_ref(&cpu), group.clone(), order).map(|c| (name, c)));
    let comms = comms.into_iter().collect::<Result<Vec<_>>>()?;
    for bytes in (0..7).map(|i| 4096usize << (2 * i)).chain([64 << 20]) {
        let n = bytes / 4;
        let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        let reps = (256usize << 20).div_ceil(bytes).clamp(3, 200);
        let mut results = Vec::new();
        let mut recv = vec![0f32; n];
        results.push(("rsmpi-all_reduce_into", time(group, reps, || {
            world.all_reduce_into(&data[..], &mut recv[..], mpi::collective::SystemOperation::sum());
            Ok(())
        })?));
        let mut buf = data.clone();
        for (name, order) in [("tandem-group-mpi", Order::Mpi), ("tandem-group-ranks", Order::Ranks)] {
            results.push((name, time(group, reps, || group.all_reduce(&mut buf, order))?));
        }
        let t = Tensor::from_vec(data.clone(), [n], &cpu)?;
        for (name, c) in &comms {
            results.push((name, time(group, reps, || c.all_reduce(std::slice::from_ref(&t), ReduceKind::Sum))?));
        }
        if group.rank() == 0 {
            for (name, s) in results {
                println!(r#"{{"bench":"allreduce","impl":"{name}","backend":"cpu","processes":{},"bytes":{bytes},"gbps":{:.3}}}"#, group.size(), bytes as f64 / s / 1e9);
            }
        }
    }
    Ok(())
}

/// Median seconds of one call of `f` over `reps` calls after two warm-up calls, each call
/// started together on every rank.
fn time(group: &Group, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut s = Vec::with_capacity(reps);
    for i in 0..reps + 2 {
        group.barrier()?;
        let t = Instant::now();
        f()?;
        if i >= 2 {
            s.push(t.elapsed().as_secs_f64());
        }
    }
    s.sort_by(f64::total_cmp);
    Ok(s[s.len() / 2])
}
