//! `tandem bench`: matmul throughput, seed-CNN training steps, per-op dispatch cost and the
//! pipeline bubble (two logical devices) on each chosen device, as one table or one JSON object
//! per figure. Every figure is a median.
use super::devices::print_table;
use super::{BenchArgs, LogFormat};
use crate::autograd::no_grad;
use crate::data::synthetic;
use crate::nn::models::SeedModel;
use crate::optim::SgdConfig;
use crate::parallel::pipeline::{Pipeline, Schedule};
use crate::parallel::{Loss, OptimConfig, Single, Split, Stages, Strategy};
use crate::{Device, Result, Tensor};
use rand::SeedableRng;
use std::time::Instant;

const MATMUL_SIZES: [usize; 4] = [256, 512, 1024, 2048];
const STEP_BATCHES: [usize; 2] = [64, 1000];
/// Independent small adds recorded before one sync, for the dispatch figure.
const DISPATCH_OPS: usize = 1000;
const DISPATCH_LEN: usize = 64;
/// Micro-batch counts of the pipeline figure (two stages, seed CNN, batch 64).
const PIPELINE_MICRO_BATCHES: [usize; 4] = [1, 2, 4, 8];
const PIPELINE_BATCH: usize = 64;

/// Timed repetitions per figure (after one untimed warm-up).
struct Reps {
    matmul: usize,
    step: usize,
    dispatch: usize,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let devices = Device::parse(&args.devices)?;
    // Large matmuls and batch-1000 steps are slow on the CPU: fewer runs keep it under a minute.
    let reps = if args.quick { Reps { matmul: 1, step: 2, dispatch: 2 } } else { Reps { matmul: 3, step: 5, dispatch: 5 } };
    let mut rows = Vec::new();
    for dev in &devices {
        let device = dev.spec();
        for n in MATMUL_SIZES {
            let gflops = matmul(dev, n, reps.matmul)?;
            emit(args.log_format, &mut rows, Figure::Matmul { device: device.clone(), n, gflops });
        }
        for batch in STEP_BATCHES {
            let (median_ms, first_step_ms) = train_step(dev, batch, reps.step)?;
            emit(args.log_format, &mut rows, Figure::TrainStep { model: "seed-cnn", device: device.clone(), batch, median_ms, first_step_ms });
        }
        let us_per_op = dispatch(dev, reps.dispatch)?;
        emit(args.log_format, &mut rows, Figure::Dispatch { device: device.clone(), us_per_op });
        for micro_batches in PIPELINE_MICRO_BATCHES {
            let (bubble_measured, bubble_theoretical, step_ms) = pipeline_bubble(dev, micro_batches, reps.step)?;
            let f = Figure::PipelineBubble { device: device.clone(), stages: 2, micro_batches, batch: PIPELINE_BATCH, bubble_measured, bubble_theoretical, step_ms };
            emit(args.log_format, &mut rows, f);
        }
    }
    if args.log_format == LogFormat::Text {
        print_table(&["BENCH", "DEVICE", "CASE", "RESULT"], &rows);
    }
    Ok(())
}

/// One measured figure; serialized with `bench` first, as `{"bench":"matmul",...}`.
#[derive(serde::Serialize)]
#[serde(tag = "bench", rename_all = "kebab-case")]
enum Figure {
    Matmul { device: String, n: usize, gflops: f64 },
    TrainStep { model: &'static str, device: String, batch: usize, median_ms: f64, first_step_ms: f64 },
    Dispatch { device: String, us_per_op: f64 },
    PipelineBubble { device: String, stages: usize, micro_batches: usize, batch: usize, bubble_measured: f64, bubble_theoretical: f64, step_ms: f64 },
}

/// Prints a JSON figure now, or keeps a table row (bench, device, case, result) for later.
fn emit(format: LogFormat, rows: &mut Vec<Vec<String>>, f: Figure) {
    if format == LogFormat::Json {
        println!("{}", serde_json::to_string(&f).unwrap_or_default());
        return;
    }
    rows.push(match f {
        Figure::Matmul { device, n, gflops } => vec!["matmul".into(), device, format!("n={n}"), format!("{gflops:.1} GFLOP/s")],
        Figure::TrainStep { model, device, batch, median_ms, first_step_ms } => {
            vec!["train-step".into(), device, format!("{model} batch={batch}"), format!("{median_ms:.1} ms (first {first_step_ms:.1} ms)")]
        }
        Figure::Dispatch { device, us_per_op } => vec!["dispatch".into(), device, format!("{DISPATCH_OPS} adds, one sync"), format!("{us_per_op:.2} us/op")],
        Figure::PipelineBubble { device, stages, micro_batches, batch, bubble_measured, bubble_theoretical, step_ms } => vec![
            "pipeline-bubble".into(),
            device,
            format!("p={stages} m={micro_batches} batch={batch}"),
            format!("{bubble_measured:.3} (theory {bubble_theoretical:.3}), step {step_ms:.1} ms"),
        ],
    });
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Seconds of `f` per run: one warm-up (shader compilation, pools), then the median of `reps`.
fn timed(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    let t = Instant::now();
    f()?;
    let first = t.elapsed().as_secs_f64();
    let mut runs = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        runs.push(t.elapsed().as_secs_f64());
    }
    Ok((median(runs), first))
}

fn matmul(dev: &Device, n: usize, reps: usize) -> Result<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(n as u64);
    let a = Tensor::randn([n, n], &mut rng, dev)?;
    let b = Tensor::randn([n, n], &mut rng, dev)?;
    let (s, _) = no_grad(|| {
        timed(reps, || {
            a.matmul(&b)?;
            dev.sync()
        })
    })?;
    Ok(2.0 * (n as f64).powi(3) / s / 1e9)
}

/// Median and first step time, ms, of SGD steps of the seed CNN on random images.
fn train_step(dev: &Device, batch: usize, reps: usize) -> Result<(f64, f64)> {
    let data = synthetic::seed_images(batch, 0)?;
    let all: Vec<usize> = (0..batch).collect();
    let b = data.batch(&all)?;
    let optim = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let mut s = Single::new(SeedModel::Cnn.build(0, &Device::cpu())?, &optim, Loss::CrossEntropy, dev)?;
    // `step` reads the loss back to the host, so each timed step includes its sync.
    let (median, first) = timed(reps, || s.step(&b).map(drop))?;
    Ok((median * 1e3, first * 1e3))
}

/// Microseconds per op of a chain of independent small adds, synced once at the end.
fn dispatch(dev: &Device, reps: usize) -> Result<f64> {
    let x = Tensor::ones([DISPATCH_LEN], dev)?;
    let y = Tensor::ones([DISPATCH_LEN], dev)?;
    let (s, _) = no_grad(|| {
        timed(reps, || {
            for _ in 0..DISPATCH_OPS {
                x.add(&y)?;
            }
            dev.sync()
        })
    })?;
    Ok(s / DISPATCH_OPS as f64 * 1e6)
}

/// Median measured bubble, its theory and the median step time (ms) of a 1F1B pipeline of the
/// seed CNN over two logical devices like `dev`, split by measured layer times.
fn pipeline_bubble(dev: &Device, micro_batches: usize, reps: usize) -> Result<(f64, f64, f64)> {
    let info = dev.info();
    let devices = [Device::open(info.backend, info.ordinal)?, Device::open(info.backend, info.ordinal)?];
    let data = synthetic::seed_images(PIPELINE_BATCH, 0)?;
    let all: Vec<usize> = (0..PIPELINE_BATCH).collect();
    let b = data.batch(&all)?;
    let optim = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let model = SeedModel::Cnn.build(0, &Device::cpu())?;
    let stages = Stages::Split(&model, Split::Auto);
    let mut pipe = Pipeline::builder(stages, &devices, &optim, Loss::CrossEntropy).micro_batches(micro_batches).schedule(Schedule::OneFOneB).build()?;
    // The first step measures the layers and rebalances the split.
    pipe.step(&b)?;
    let (mut bubbles, mut theory) = (Vec::new(), 0.0);
    let (step, _) = timed(reps, || {
        pipe.step(&b)?;
        let st = pipe.last_stats().ok_or_else(|| crate::Error::invalid("bench", "a pipeline step left no statistics"))?;
        bubbles.push(st.bubble_measured);
        theory = st.bubble_theoretical;
        Ok(())
    })?;
    Ok((median(bubbles), theory, step * 1e3))
}
