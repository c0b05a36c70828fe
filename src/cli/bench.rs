//! `tandem bench`: matmul throughput, seed-CNN training steps, per-op dispatch cost, the
//! kernels autotuning chose (wgpu), and the pipeline bubble (two logical devices) on each
//! chosen device, or with `--model gpt` a GPT's training step, tokens/s and activation bytes;
//! as one table or one JSON object per figure.
//! Every figure is a median.
use super::devices::print_table;
use super::ranks::Ranks;
use super::{BenchArgs, LogFormat};
use rand::SeedableRng;
use std::collections::HashSet;
use std::time::Instant;
use tandem::autograd::no_grad;
use tandem::data::synthetic;
use tandem::data::text::{Split as TextSplit, TextCorpus};
use tandem::data::Batch;
use tandem::nn::models::SeedModel;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::Module;
use tandem::optim::{AdamConfig, SgdConfig};
use tandem::parallel::pipeline::{graph_bytes, Pipeline, Schedule};
use tandem::parallel::{batch_to_device, DataParallel, DataParallelConfig, Loss, OptimConfig, Single, Split, Stages, Strategy};
use tandem::{Device, Result, Tensor};

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

pub fn run(args: &BenchArgs, ranks: &Ranks) -> Result<()> {
    match args.bench.as_deref() {
        None => {}
        Some("allreduce") => return super::allreduce::run(args, ranks),
        Some("memory") if !ranks.many() => return super::bench_memory::run(args),
        Some(b) => {
            return Err(tandem::Error::invalid(
                "--bench",
                format!("'{b}' is not a benchmark; the named benchmarks are allreduce and memory (one process)"),
            ))
        }
    }
    if ranks.many() {
        return Err(tandem::Error::invalid(
            "--bench",
            format!("under {} processes tandem bench measures --bench allreduce only", ranks.group().size()),
        ));
    }
    let devices = Device::parse(&args.devices)?;
    match args.model.as_deref() {
        None => {}
        Some("gpt") => return gpt_figures(args, &devices),
        Some(m) => {
            return Err(tandem::Error::invalid("--model", format!("'{m}': tandem bench measures gpt, or every default figure without --model")))
        }
    }
    // Large matmuls and batch-1000 steps are slow on the CPU: fewer runs keep it under a minute.
    let reps = if args.quick { Reps { matmul: 1, step: 2, dispatch: 2 } } else { Reps { matmul: 5, step: 5, dispatch: 5 } };
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
        // The choices the figures above made by measurement (the matmuls' and the steps').
        let tuning = dev.backend().tuning();
        if tuning.is_empty() && dev.info().backend == tandem::BackendKind::Wgpu && args.log_format == LogFormat::Text {
            rows.push(vec!["autotune".into(), device.clone(), "-".into(), "none: TANDEM_AUTOTUNE is off, or auto on a software adapter".into()]);
        }
        for t in tuning {
            emit(
                args.log_format,
                &mut rows,
                Figure::Autotune {
                    device: device.clone(),
                    class: t.class,
                    kernel: t.kernel,
                    times_us: t.times_us,
                    clock: t.clock,
                    from_cache: t.from_cache,
                },
            );
        }
        for model in [BubbleModel::SeedCnn, BubbleModel::EvenMlp] {
            for micro_batches in PIPELINE_MICRO_BATCHES {
                let (bubble_measured, bubble_theoretical, bubble_of_split, step_ms) = pipeline_bubble(dev, model, micro_batches, reps.step)?;
                let f = Figure::PipelineBubble {
                    model: model.name(),
                    device: device.clone(),
                    stages: 2,
                    micro_batches,
                    batch: PIPELINE_BATCH,
                    bubble_measured,
                    bubble_theoretical,
                    bubble_of_split,
                    step_ms,
                };
                emit(args.log_format, &mut rows, f);
            }
        }
        emit(args.log_format, &mut rows, dp_overlap(dev, reps.step)?);
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
    Matmul {
        device: String,
        n: usize,
        gflops: f64,
    },
    TrainStep {
        model: &'static str,
        device: String,
        batch: usize,
        median_ms: f64,
        first_step_ms: f64,
    },
    /// A GPT's training step; `activation_bytes` are the tensors autograd keeps for backward
    /// at the end of forward (weights excluded); `recompute`: with per-block recomputation.
    #[serde(rename = "train-step")]
    GptStep {
        model: &'static str,
        device: String,
        batch: usize,
        block_size: usize,
        median_ms: f64,
        tokens_per_sec: f64,
        activation_bytes: u64,
        recompute: bool,
    },
    Dispatch {
        device: String,
        us_per_op: f64,
    },
    /// A kernel chosen by measurement for a shape class (`Backend::tuning`): each candidate's
    /// best time per run, on the `clock` named, measured now or read from the cache.
    Autotune {
        device: String,
        class: String,
        kernel: String,
        times_us: Vec<(String, f64)>,
        clock: String,
        from_cache: bool,
    },
    /// `bubble_of_split`: what the schedule gives stages as unequal as the measured ones.
    PipelineBubble {
        model: &'static str,
        device: String,
        stages: usize,
        micro_batches: usize,
        batch: usize,
        bubble_measured: f64,
        bubble_theoretical: f64,
        bubble_of_split: f64,
        step_ms: f64,
    },
    /// Data parallelism over logical devices like `device`: the all-reduce time per device and
    /// the fraction of it hidden behind backward (on the device clock where `clock` says so),
    /// the same on the host clock (what a host-timed report says), and the step time on one
    /// device and on `devices`.
    DpOverlap {
        device: String,
        devices: usize,
        batch: usize,
        bucket_bytes: usize,
        clock: &'static str,
        allreduce_ms: f64,
        hidden_fraction: f64,
        host_allreduce_ms: f64,
        host_hidden_fraction: f64,
        step_ms_1: f64,
        step_ms_n: f64,
    },
}

/// Prints a JSON figure now, or keeps a table row (bench, device, case, result) for later.
fn emit(format: LogFormat, rows: &mut Vec<Vec<String>>, f: Figure) {
    if format == LogFormat::Json {
        out!("{}", serde_json::to_string(&f).unwrap_or_default());
        return;
    }
    rows.push(match f {
        Figure::Matmul { device, n, gflops } => vec!["matmul".into(), device, format!("n={n}"), format!("{gflops:.1} GFLOP/s")],
        Figure::TrainStep { model, device, batch, median_ms, first_step_ms } => {
            vec!["train-step".into(), device, format!("{model} batch={batch}"), format!("{median_ms:.1} ms (first {first_step_ms:.1} ms)")]
        }
        Figure::GptStep { model, device, batch, block_size, median_ms, tokens_per_sec, activation_bytes, recompute } => vec![
            "train-step".into(),
            device,
            format!("{model} batch={batch} block={block_size}{}", if recompute { " recompute" } else { "" }),
            format!("{median_ms:.1} ms, {tokens_per_sec:.0} tokens/s, activations {:.1} MiB", activation_bytes as f64 / (1 << 20) as f64),
        ],
        Figure::Dispatch { device, us_per_op } => vec!["dispatch".into(), device, format!("{DISPATCH_OPS} adds, one sync"), format!("{us_per_op:.2} us/op")],
        Figure::Autotune { device, class, kernel, times_us, clock, from_cache } => {
            let times: Vec<String> = times_us.iter().map(|(k, us)| format!("{k} {us:.0}")).collect();
            let source = if from_cache { "cached" } else { "tuned now" };
            vec!["autotune".into(), device, class, format!("{kernel} ({} us, {clock} clock, {source})", times.join(", "))]
        }
        Figure::PipelineBubble { model, device, stages, micro_batches, batch, bubble_measured, bubble_theoretical, bubble_of_split, step_ms } => vec![
            "pipeline-bubble".into(),
            device,
            format!("{model} p={stages} m={micro_batches} batch={batch}"),
            format!("{bubble_measured:.3} (theory {bubble_theoretical:.3}, this split {bubble_of_split:.3}), step {step_ms:.1} ms"),
        ],
        Figure::DpOverlap { device, devices, batch, bucket_bytes, clock, allreduce_ms, hidden_fraction, step_ms_1, step_ms_n, .. } => vec![
            "dp-overlap".into(),
            device,
            format!("{devices} devices batch={batch} buckets={bucket_bytes} B"),
            format!("all-reduce {allreduce_ms:.2} ms, {hidden_fraction:.2} hidden ({clock} clock); step {step_ms_1:.1} ms on 1, {step_ms_n:.1} ms on {devices}"),
        ],
    });
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Shortest timed sample, seconds: a figure whose run is shorter repeats it within one sample, so
/// that a single preemption of this process does not decide a sub-millisecond median.
const SAMPLE_S: f64 = 0.04;

/// Seconds of `f` per run: one warm-up (shader compilation, pools), then the median of `reps`
/// samples, each the mean over as many runs as fill [`SAMPLE_S`] (judged by the warm-up run).
/// scripts/torch-bench.py times PyTorch's side the same way.
fn timed(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    let t = Instant::now();
    f()?;
    let first = t.elapsed().as_secs_f64();
    let per_sample = (SAMPLE_S / first.max(1e-6)).ceil().clamp(1.0, 1000.0) as usize;
    let mut runs = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        for _ in 0..per_sample {
            f()?;
        }
        runs.push(t.elapsed().as_secs_f64() / per_sample as f64);
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

/// The models of the pipeline-bubble figure: the seed CNN, whose ten layers cannot be cut into
/// two equal stages, and an MLP whose layers can, so that what the schedule and its overheads
/// cost shows apart from what the model's granularity costs.
#[derive(Clone, Copy)]
enum BubbleModel {
    SeedCnn,
    /// Eight `Linear(512, 512)` + ReLU blocks and a `Linear(512, 1)` head, MSE on random data.
    EvenMlp,
}

impl BubbleModel {
    fn name(self) -> &'static str {
        match self {
            BubbleModel::SeedCnn => "seed-cnn",
            BubbleModel::EvenMlp => "mlp-8x512",
        }
    }
    /// The model (built on the CPU), a batch of [`PIPELINE_BATCH`] and its loss.
    fn build(self) -> Result<(tandem::nn::Sequential, Batch, Loss)> {
        let all: Vec<usize> = (0..PIPELINE_BATCH).collect();
        match self {
            BubbleModel::SeedCnn => {
                Ok((SeedModel::Cnn.build(0, &Device::cpu())?, synthetic::seed_images(PIPELINE_BATCH, 0)?.batch(&all)?, Loss::CrossEntropy))
            }
            BubbleModel::EvenMlp => {
                const WIDTH: usize = 512;
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
                let cpu = Device::cpu();
                let mut model = tandem::nn::Sequential::new();
                for i in 0..8 {
                    model = model
                        .push(format!("fc{i}"), tandem::nn::Linear::new(WIDTH, WIDTH, &mut rng, &cpu)?)
                        .push(format!("relu{i}"), tandem::nn::ReLU);
                }
                model = model.push("head", tandem::nn::Linear::new(WIDTH, 1, &mut rng, &cpu)?);
                Ok((model, synthetic::regression(PIPELINE_BATCH, WIDTH, 0)?.batch(&all)?, Loss::Mse))
            }
        }
    }
}

/// Median measured bubble, its theory, the median bubble of the split and the median step time
/// (ms) of a 1F1B pipeline of `model` over two logical devices like `dev`, split by measured
/// layer times.
fn pipeline_bubble(dev: &Device, model: BubbleModel, micro_batches: usize, reps: usize) -> Result<(f64, f64, f64, f64)> {
    let info = dev.info();
    let devices = [Device::open(info.backend, info.ordinal)?, Device::open(info.backend, info.ordinal)?];
    let (model, b, loss) = model.build()?;
    let optim = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let stages = Stages::Split(&model, Split::Auto);
    let mut pipe = Pipeline::builder(stages, &devices, &optim, loss).micro_batches(micro_batches).schedule(Schedule::OneFOneB).build()?;
    // The first step measures the layers and splits; the next few correct the split by the
    // stages' measured times.
    for _ in 0..4 {
        pipe.step(&b)?;
    }
    let (mut bubbles, mut of_split, mut theory) = (Vec::new(), Vec::new(), 0.0);
    let (step, _) = timed(reps, || {
        pipe.step(&b)?;
        let st = pipe.last_stats().ok_or_else(|| tandem::Error::invalid("bench", "a pipeline step left no statistics"))?;
        bubbles.push(st.bubble_measured);
        of_split.push(st.bubble_of_split.unwrap_or(f64::NAN));
        theory = st.bubble_theoretical;
        Ok(())
    })?;
    Ok((median(bubbles), theory, median(of_split), step * 1e3))
}

/// Logical devices, batch and bucket size of the data-parallel figure: 16 KiB buckets give the
/// seed CNN five, so that the last layers' gradients travel while the convolutions' backward runs.
const DP_DEVICES: usize = 2;
const DP_BATCH: usize = 256;
const DP_BUCKET_BYTES: usize = 16 << 10;

/// The seed CNN's SGD step at batch [`DP_BATCH`] on one device like `dev` and data parallel on
/// [`DP_DEVICES`] of them, alternated step by step so that both see the same machine load;
/// medians of the step times and of each step's all-reduce figures.
fn dp_overlap(dev: &Device, reps: usize) -> Result<Figure> {
    let info = dev.info();
    let devices = (0..DP_DEVICES).map(|_| Device::open(info.backend, info.ordinal)).collect::<Result<Vec<_>>>()?;
    let data = synthetic::seed_images(DP_BATCH, 0)?;
    let b = data.batch(&(0..DP_BATCH).collect::<Vec<_>>())?;
    let optim = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let model = SeedModel::Cnn.build(0, &Device::cpu())?;
    let mut single = Single::new(SeedModel::Cnn.build(0, &Device::cpu())?, &optim, Loss::CrossEntropy, dev)?;
    let cfg = DataParallelConfig { bucket_bytes: DP_BUCKET_BYTES, ..Default::default() };
    let mut dp = DataParallel::new(&model, &devices, &optim, Loss::CrossEntropy, cfg)?;
    // Warm-up (kernel compilation, pools), then pairs of steps.
    single.step(&b)?;
    dp.step(&b)?;
    let (mut one, mut many, mut allreduce, mut hidden, mut device_clock) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), true);
    let (mut host_allreduce, mut host_hidden) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) * 3 {
        let t = Instant::now();
        single.step(&b)?;
        one.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        dp.step(&b)?;
        many.push(t.elapsed().as_secs_f64() * 1e3);
        let o = dp.last_overlap().ok_or_else(|| tandem::Error::invalid("bench", "a data-parallel step reported no overlap"))?;
        allreduce.push(o.mean_allreduce_s() * 1e3);
        hidden.push(o.hidden_fraction());
        host_allreduce.push(o.host_allreduce_s.iter().sum::<f64>() / o.host_allreduce_s.len().max(1) as f64 * 1e3);
        host_hidden.push(o.host_hidden_fraction());
        device_clock &= o.device_clock.iter().all(|&c| c);
    }
    Ok(Figure::DpOverlap {
        device: dev.spec(),
        devices: DP_DEVICES,
        batch: DP_BATCH,
        bucket_bytes: DP_BUCKET_BYTES,
        clock: if device_clock { "device" } else { "host" },
        allreduce_ms: median(allreduce),
        hidden_fraction: median(hidden),
        host_allreduce_ms: median(host_allreduce),
        host_hidden_fraction: median(host_hidden),
        step_ms_1: median(one),
        step_ms_n: median(many),
    })
}

/// The GPT of the figure: 4 layers, 4 heads, 128 wide, block 64, batch 16, on the built-in
/// corpus's vocabulary, with AdamW.
pub(super) const GPT_BENCH: GptConfig = GptConfig { n_layer: 4, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 0, dropout: 0.0, bias: true };
const GPT_BATCH: usize = 16;

/// Two train-step figures per device for [`GPT_BENCH`]: plain, then with `--recompute`.
fn gpt_figures(args: &BenchArgs, devices: &[Device]) -> Result<()> {
    let corpus = TextCorpus::builtin(0);
    let cfg = GptConfig { vocab_size: corpus.vocab.len(), ..GPT_BENCH };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let tb = corpus.batch(TextSplit::Train, GPT_BATCH, cfg.block_size, &mut rng)?;
    let batch = Batch::tokens(tb.x, tb.y, tb.block, cfg.vocab_size)?;
    let reps = if args.quick { 2 } else { 10 };
    let mut rows = Vec::new();
    for dev in devices {
        for recompute in [false, true] {
            let model = Gpt::new(cfg, 0, dev)?;
            model.set_recompute(recompute);
            let activation_bytes = activation_bytes(&model, &batch, dev)?;
            let optim = OptimConfig::adam(AdamConfig { lr: 1e-3, ..AdamConfig::adamw() });
            let mut s = Single::new(model, &optim, Loss::CrossEntropy, dev)?;
            let (median, _) = timed(reps, || s.step(&batch).map(drop))?;
            let tokens_per_sec = (GPT_BATCH * cfg.block_size) as f64 / median;
            let (device, block_size, median_ms) = (dev.spec(), cfg.block_size, median * 1e3);
            let f = Figure::GptStep { model: "gpt", device, batch: GPT_BATCH, block_size, median_ms, tokens_per_sec, activation_bytes, recompute };
            emit(args.log_format, &mut rows, f);
        }
    }
    if args.log_format == LogFormat::Text {
        print_table(&["BENCH", "DEVICE", "CASE", "RESULT"], &rows);
    }
    Ok(())
}

/// Bytes autograd holds for backward after one forward and loss of `batch` (the graph's
/// tensors that are not parameters).
fn activation_bytes(model: &Gpt, batch: &Batch, dev: &Device) -> Result<u64> {
    let (x, y) = batch_to_device(batch, dev)?;
    let loss = Loss::CrossEntropy.compute(&model.forward(&x)?, &y)?;
    let params: HashSet<u64> = model.parameters().iter().map(|(_, t)| t.id()).collect();
    Ok(graph_bytes(&loss, &params))
}
