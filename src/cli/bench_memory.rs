//! `tandem bench --bench memory`: each device's memory under data parallelism in every sharding
//! mode (plain, ZeRO-1, ZeRO-2, ZeRO-3) and each `--precision` for a GPT, measured by the
//! allocators, with the state's split into parameters, gradients and optimizer state, what a
//! step allocates beyond it (activations and transients), and the step time. In bf16 and f16
//! ZeRO-2/3 keep their gradient shards in the half type (`--grad-dtype`). A last mode,
//! `full+offload`, is ZeRO-3 with the optimizer state in host memory (`--offload-optimizer`).
use super::devices::print_table;
use super::{BenchArgs, LogFormat};
use rand::{Rng, SeedableRng};
use std::time::Instant;
use tandem::backend::format_bytes;
use tandem::data::Batch;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::optim::AdamConfig;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Strategy};
use tandem::{BackendKind, Device, Error, Result};

/// One device's figures in one mode; `*_bytes` of the state are what the mode keeps on it
/// between steps by construction, `held` and `peak` what its allocator counted.
#[derive(serde::Serialize)]
struct MemoryFigure {
    bench: &'static str,
    model: &'static str,
    shard: &'static str,
    precision: &'static str,
    device: String,
    devices: usize,
    /// Blocks recompute their activations in the backward (GPT-2 small: to fit four devices
    /// in a 24 GB host; at block 1024 its kept activations are about 4 GB per device).
    recompute: bool,
    parameter_bytes: u64,
    gradient_bytes: u64,
    optimizer_bytes: u64,
    held_bytes: u64,
    /// The most the steps held at once (the peak is reset after the model is set up).
    peak_bytes: u64,
    /// `peak_bytes - held_bytes`: the activations and transients of a step.
    step_bytes: u64,
    /// The most the setup held: every mode builds the whole model on each device first.
    setup_peak_bytes: u64,
    step_ms: f64,
    /// The last step's communication seconds (all-reduce, reduce-scatter, all-gathers) and the
    /// fraction of them the devices did not wait for.
    comm_ms: f64,
    hidden_fraction: f64,
}

/// Fresh logical devices for `spec`, CPU ones independent of the shared CPU device so that each
/// mode's peak is its own.
fn fresh_devices(spec: &str) -> Result<Vec<Device>> {
    Ok(Device::parse(spec)?.into_iter().map(|d| if d.info().backend == BackendKind::Cpu { Device::cpu_independent() } else { d }).collect())
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let (name, cfg, recompute) = match args.model.as_deref() {
        // GPT-2 small as OpenAI shipped it: the default shape with the unpadded vocabulary.
        None | Some("gpt2-small") => ("gpt2-small", GptConfig { vocab_size: 50257, ..GptConfig::default() }, true),
        Some("gpt") => ("gpt", GptConfig { vocab_size: 65, ..super::bench::GPT_BENCH }, false),
        Some(m) => return Err(Error::invalid("--model", format!("'{m}': --bench memory measures gpt2-small (the default) or gpt"))),
    };
    let n = Device::parse(&args.devices)?.len();
    if n < 2 {
        return Err(Error::invalid("--devices", "--bench memory compares sharding across devices: name at least two (cpu,cpu,cpu,cpu)"));
    }
    // One window per device: the smallest batch every mode can split.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let ids = |rng: &mut rand_chacha::ChaCha8Rng| (0..n * cfg.block_size).map(|_| rng.random_range(0..cfg.vocab_size as i32)).collect::<Vec<i32>>();
    let batch = Batch::tokens(ids(&mut rng), ids(&mut rng), cfg.block_size, cfg.vocab_size)?;
    let optim = OptimConfig::adam(AdamConfig { lr: 1e-4, ..AdamConfig::adamw() });
    let p = cfg.parameter_bytes().ok_or_else(|| Error::invalid("--model", "too many parameters to count"))?;
    let k = optim.states_per_parameter();
    // Every sharding mode, then ZeRO-3 with the optimizer state offloaded.
    let modes = Shard::ALL.map(|s| (s, false)).into_iter().chain([(Shard::Full, true)]);
    let steps = if args.quick { 1 } else { 2 };
    let mut rows = Vec::new();
    for (precision, (shard, offload)) in args.precision.iter().flat_map(|&p| modes.clone().map(move |m| (p, m))) {
        let shard_name = if offload { "full+offload" } else { shard.name() };
        // In a half precision the sharded gradients are kept in it too (--grad-dtype).
        let grad_dtype = match (shard, precision.autocast()) {
            (Shard::Grads | Shard::Full, Some(half)) => half,
            _ => tandem::DType::F32,
        };
        let devices = fresh_devices(&args.devices)?;
        let mut dp = DataParallel::from_factory(
            |d| {
                let g = Gpt::new(cfg, 0, d)?;
                g.set_recompute(recompute);
                Ok(g)
            },
            &devices,
            &optim.clone().offloaded(offload),
            Loss::CrossEntropy,
            DataParallelConfig { shard, grad_dtype, ..Default::default() },
        )?;
        dp.set_precision(precision, None)?;
        let setup_peaks: Vec<u64> = devices.iter().map(|d| d.memory().peak).collect();
        devices.iter().for_each(Device::reset_peak_memory);
        let (mut step_s, mut report) = (0.0, None);
        for _ in 0..steps {
            let t = Instant::now();
            report = Some(dp.step(&batch)?);
            step_s = t.elapsed().as_secs_f64();
        }
        let (comm_s, hidden) = report.map_or((0.0, 0.0), |r| (r.comm_s, r.overlap));
        let nn = n as u64;
        let (params, grads, opt) = match shard {
            _ if offload => (p / nn, p / nn / 4 * grad_dtype.size() as u64, 0),
            Shard::None => (p, p, k * p),
            Shard::Optimizer => (p, p, k * p / nn),
            Shard::Grads => (p, p / nn / 4 * grad_dtype.size() as u64, k * p / nn),
            Shard::Full => (p / nn, p / nn / 4 * grad_dtype.size() as u64, k * p / nn),
        };
        for (i, d) in devices.iter().enumerate() {
            let m = d.memory();
            let f = MemoryFigure {
                bench: "memory",
                model: name,
                shard: shard_name,
                precision: precision.name(),
                device: format!("{} ({} of {n})", d.spec(), i + 1),
                devices: n,
                recompute,
                parameter_bytes: params,
                gradient_bytes: grads,
                optimizer_bytes: opt,
                held_bytes: m.in_use,
                peak_bytes: m.peak,
                step_bytes: m.peak.saturating_sub(m.in_use),
                setup_peak_bytes: setup_peaks[i],
                step_ms: step_s * 1e3,
                comm_ms: comm_s * 1e3,
                hidden_fraction: hidden,
            };
            if args.log_format == LogFormat::Json {
                out!("{}", serde_json::to_string(&f).unwrap_or_default());
            } else {
                let state = format!(
                    "params {} + grads {} + optimizer {}",
                    format_bytes(f.parameter_bytes),
                    format_bytes(f.gradient_bytes),
                    format_bytes(f.optimizer_bytes)
                );
                let result = format!(
                    "peak {} (setup {}), held between steps {} ({state}); step {:.0} ms, communication {:.0} ms ({:.0}% hidden)",
                    format_bytes(f.peak_bytes),
                    format_bytes(f.setup_peak_bytes),
                    format_bytes(f.held_bytes),
                    f.step_ms,
                    f.comm_ms,
                    100.0 * f.hidden_fraction
                );
                let case = format!("{name} {} shard={shard_name}{}", f.precision, if recompute { " recompute" } else { "" });
                rows.push(vec!["memory".into(), f.device, case, result]);
            }
        }
    }
    if args.log_format == LogFormat::Text {
        print_table(&["BENCH", "DEVICE", "CASE", "RESULT"], &rows);
    }
    Ok(())
}
