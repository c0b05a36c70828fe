//! Data parallelism's step, communication time and overlap, measured: the seed CNN at batch 64
//! on 1 and 2 CPU devices with default and small buckets and in deterministic mode; and on a mix
//! of CPU + two wgpu adapters (when present), one optimizer owner against ZeRO-1's balanced
//! owners, interleaved. Medians of the steps after a warm-up; `cargo bench --bench strategies`.
//! What was measured goes to benches/README.md, with the machine it ran on.
use tandem::data::{synthetic, Batch};
use tandem::nn::models::SeedModel;
use tandem::optim::{AdamConfig, SgdConfig};
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Single, StepReport, Strategy};
use tandem::{BackendKind, Device};

fn cpu_devices(n: usize) -> Vec<Device> {
    (0..n).map(|_| Device::from_backend(std::sync::Arc::new(tandem::backend::cpu::CpuBackend::new()))).collect()
}

fn batches(size: usize, steps: usize, seed: u64) -> Vec<Batch> {
    let ds = synthetic::seed_images(size * steps, seed).unwrap();
    (0..steps).map(|s| ds.batch(&(s * size..(s + 1) * size).collect::<Vec<_>>()).unwrap()).collect()
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    1e3 * v[v.len() / 2]
}

/// Reports of every step after the first three (kernel compilation, first allocations).
fn run(s: &mut dyn Strategy, data: &[Batch]) -> Vec<StepReport> {
    data.iter().map(|b| s.step(b).unwrap()).skip(3).collect()
}

fn buckets_and_determinism() {
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    let sgd = OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let data = batches(64, 13, 3);
    let mut single = Single::new(SeedModel::Cnn.build(7, &Device::cpu()).unwrap(), &sgd, Loss::CrossEntropy, &cpu_devices(1)[0]).unwrap();
    println!("single: step {:.1} ms", median_ms(run(&mut single, &data).iter().map(|r| r.wall_s).collect()));
    let configs = [
        ("default buckets (25 MiB)", DataParallelConfig::default()),
        ("16 KiB buckets", DataParallelConfig { bucket_bytes: 16 << 10, ..Default::default() }),
        ("deterministic, 4 shards", DataParallelConfig { deterministic: true, ..Default::default() }),
    ];
    for n in [1, 2] {
        for (name, cfg) in &configs {
            let mut dp = DataParallel::new(&model, &cpu_devices(n), &sgd, Loss::CrossEntropy, cfg.clone()).unwrap();
            let r = run(&mut dp, &data);
            let of = |f: fn(&StepReport) -> f64| median_ms(r.iter().map(f).collect());
            let overlap = {
                let mut o: Vec<f64> = r.iter().map(|r| r.overlap).collect();
                o.sort_by(f64::total_cmp);
                o[o.len() / 2]
            };
            println!(
                "{n} device(s), {name}: step {:.1} ms, compute {:.1} ms, comm {:.2} ms, overlap {overlap:.2}, {} bytes moved",
                of(|r| r.wall_s),
                of(|r| r.compute_s),
                of(|r| r.comm_s),
                dp.communicator().bytes_moved()
            );
        }
    }
}

fn owners_on_mixed_devices() {
    let wgpu: Vec<_> = Device::list().into_iter().filter(|i| i.backend == BackendKind::Wgpu).take(2).collect();
    if wgpu.len() < 2 {
        println!("owners on cpu + 2 wgpu adapters: skipped, {} adapter(s) here", wgpu.len());
        return;
    }
    let mut devs = vec![Device::cpu()];
    devs.extend(wgpu.iter().map(|i| Device::open(i.backend, i.ordinal).unwrap()));
    let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
    let adam = OptimConfig::adam(AdamConfig { lr: 1e-3, ..Default::default() });
    let data = batches(64, 30, 5);
    let mut times = std::collections::BTreeMap::<(bool, &str), (Vec<f64>, Vec<f64>)>::new();
    for _round in 0..3 {
        for det in [false, true] {
            for (owners, shard) in [("one owner", Shard::None), ("balanced owners", Shard::Optimizer)] {
                let cfg = DataParallelConfig { shard, deterministic: det, deterministic_shards: 4, ..Default::default() };
                let mut dp = DataParallel::new(&model, &devs, &adam, Loss::CrossEntropy, cfg).unwrap();
                let entry = times.entry((det, owners)).or_default();
                for r in run(&mut dp, &data) {
                    entry.0.push(r.wall_s);
                    entry.1.push(r.comm_s);
                }
            }
        }
    }
    for ((det, owners), (wall, comm)) in times {
        let n = wall.len();
        println!("cpu + 2 wgpu, deterministic {det}, {owners}: step {:.1} ms, comm {:.1} ms (medians of {n})", median_ms(wall), median_ms(comm));
    }
}

fn main() {
    buckets_and_determinism();
    owners_on_mixed_devices();
}
