//! ZeRO-3 unit by unit: each unit's parameters all-gathered when an op first needs them and
//! released after, the next unit prefetched; against plain data parallelism, and a GPT whose
//! training state is several times each device's memory budget trained on four devices.
use tandem::data::text::TextCorpus;
use tandem::nn::models::Gpt;
use tandem::optim::AdamConfig;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Strategy};
use tandem::tolerance::assert_close;
use tandem::Device;

#[path = "common/zero3_gpt.rs"]
mod zero3_gpt;
use zero3_gpt::{adamw, configured, data_parallel, devices, gpt, gpt_batches, out_of_memory, train};

/// ZeRO-3 gathers unit by unit: every unit at least twice a step (forward, and backward's
/// recomputation and gradients), most of them prefetched from the second step on; the losses
/// and weights are plain data parallelism's, with one micro-batch and with two.
#[test]
fn gathering_unit_by_unit_matches_plain_data_parallelism() {
    let corpus = TextCorpus::builtin(0);
    let cfg = gpt(3, &corpus);
    let batches = gpt_batches(&cfg, &corpus, 8, 4);
    for micro in [1, 2] {
        let (want_l, want_w) = train(&mut data_parallel(cfg, &devices(4), Shard::None, 8 << 10, micro).unwrap(), &batches).unwrap();
        let mut s = data_parallel(cfg, &devices(4), Shard::Full, 8 << 10, micro).unwrap();
        let units = s.buckets().len();
        let mut gathers = Vec::new();
        let losses = batches
            .iter()
            .map(|b| {
                let loss = s.step(b).unwrap().loss;
                gathers.push(s.last_gathers().expect("ZeRO-3 with equal micro-batches gathers unit by unit").clone());
                loss
            })
            .collect::<Vec<_>>();
        let weights: Vec<f32> = s.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
        assert_close(&format!("losses, {micro} micro-batches"), &losses, &want_l, 1e-5, 1e-4);
        assert_close(&format!("weights, {micro} micro-batches"), &weights, &want_w, 1e-5, 1e-4);
        for (step, g) in gathers.iter().enumerate() {
            println!("{micro} micro-batches, step {step}: {units} units, {g:?}");
            assert_eq!(g.per_device.len(), 4);
            for d in &g.per_device {
                assert!(d.gathers >= 2 * units * micro, "step {step}: {d:?} for {units} units");
                // A CPU device's clock is the host's: its wait is the worker's, to the fill.
                assert!(!d.device_clock && d.waited_s >= d.host_waited_s * 0.5 && d.waited_s <= d.host_waited_s * 2.0 + 1e-3, "step {step}: {d:?}");
                if step == 0 {
                    assert_eq!(d.prefetched, 0, "nothing to prefetch by before a first step");
                } else {
                    assert!(d.prefetched * 10 >= d.gathers * 8, "step {step}: too few prefetched: {d:?}");
                }
            }
        }
    }
}

/// The demonstration in f32, as far as f32 gradient shards allow: a GPT whose f32 training state
/// (weights, gradients, AdamW's two moments: 16 bytes a parameter) is three times each
/// device's budget trains under it on four devices with ZeRO-3 (units of about one Linear,
/// blocks recomputed) and matches plain data parallelism without a budget; plain data
/// parallelism and ZeRO-2 under the same budget stop with the out-of-memory error naming the
/// device, the bytes asked and the budget. (Four times is out of reach in f32: a device's
/// shards of the weights, gradients and moments alone are a quarter of the state; the next
/// test reaches it with bf16 gradient shards.)
#[test]
fn gpt_three_times_the_budget_trains_on_four_devices() {
    let corpus = TextCorpus::builtin(0);
    let cfg = gpt(12, &corpus);
    let state = 16 * cfg.parameter_count().unwrap();
    let budget = state / 3;
    let batches = gpt_batches(&cfg, &corpus, 8, 3);
    let bucket = 32 << 10;
    let (want_l, want_w) = train(&mut data_parallel(cfg, &devices(4), Shard::None, bucket, 1).unwrap(), &batches).unwrap();

    let budgeted = || {
        let devs = devices(4);
        devs.iter().for_each(|d| d.set_memory_budget(Some(budget)));
        devs
    };
    let devs = budgeted();
    let mut s = data_parallel(cfg, &devs, Shard::Full, bucket, 1).unwrap();
    let (losses, weights) = train(&mut s, &batches).unwrap();
    let peaks: Vec<u64> = devs.iter().map(|d| d.memory().peak).collect();
    println!("state {state} B, budget {budget} B per device, ZeRO-3 peaks {peaks:?}");
    assert!(peaks.iter().all(|&p| p <= budget), "{peaks:?} against {budget}");
    assert_close("ZeRO-3 under the budget: losses", &losses, &want_l, 1e-5, 1e-4);
    assert_close("ZeRO-3 under the budget: weights", &weights, &want_w, 1e-5, 1e-4);

    for shard in [Shard::None, Shard::Grads] {
        let failed = data_parallel(cfg, &budgeted(), shard, bucket, 1).and_then(|mut s| train(&mut s, &batches[..1]));
        out_of_memory(failed, &format!("{shard:?} under a third of the state"), &["memory budget is 3.07 MiB", "data-parallel replica"]);
    }
}

/// Deterministic mode under the same budget: ZeRO-3 gathers unit by unit there too (each
/// device on its own schedule: six micro-shards on four devices, so two devices compute two
/// and two compute one), each micro-shard's gradients leave the device bucket by bucket, and
/// the pieces take their slices of the host's sum; losses and weights are plain deterministic
/// data parallelism's without a budget, bit for bit, clipping included.
#[test]
fn deterministic_zero3_under_a_third_of_the_state_is_plain_bit_for_bit() {
    let corpus = TextCorpus::builtin(0);
    let cfg = gpt(12, &corpus);
    let budget = 16 * cfg.parameter_count().unwrap() / 3;
    let batches = gpt_batches(&cfg, &corpus, 12, 3);
    let det = |shard| DataParallelConfig { shard, bucket_bytes: 32 << 10, deterministic: true, deterministic_shards: 6, ..Default::default() };
    let (want_l, want_w) = train(&mut configured(cfg, &devices(4), det(Shard::None)).unwrap(), &batches).unwrap();

    let devs = devices(4);
    devs.iter().for_each(|d| d.set_memory_budget(Some(budget)));
    let mut s = configured(cfg, &devs, det(Shard::Full)).unwrap();
    let units = s.buckets().len();
    let mut losses = Vec::new();
    for b in &batches {
        let report = s.step(b).unwrap();
        losses.push(report.loss);
        let g = s.last_gathers().expect("deterministic ZeRO-3 in one process gathers unit by unit");
        // Recomputed blocks: forward, then backward's recomputation, per micro-shard.
        let counts: Vec<usize> = g.per_device.iter().map(|d| d.gathers).collect();
        assert!(counts[0] >= 2 * 2 * units && counts[3] >= 2 * units && counts[3] < counts[0], "{counts:?} for {units} units");
        assert!(report.grad_norm.is_some_and(f32::is_finite));
    }
    let weights: Vec<f32> = s.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
    let peaks: Vec<u64> = devs.iter().map(|d| d.memory().peak).collect();
    println!("budget {budget} B per device, deterministic ZeRO-3 peaks {peaks:?}");
    assert!(peaks.iter().all(|&p| p <= budget), "{peaks:?} against {budget}");
    assert_close("deterministic ZeRO-3 losses", &losses, &want_l, 0.0, 0.0);
    assert_close("deterministic ZeRO-3 weights", &weights, &want_w, 0.0, 0.0);
}

/// The demonstration: a GPT whose f32 training state (weights, gradients, AdamW's two
/// moments: 16 bytes a parameter) is four times each device's budget trains under it on four
/// devices. ZeRO-3 with every replica built deferred (no device ever holds the whole model),
/// bf16 autocast, gradient shards kept in bf16 (`grad_dtype`: 14 of the 16 bytes a parameter
/// sharded, which leaves an eighth of the budget for the gathered units, the gradients in
/// flight and the activations) and blocks recomputed. 48 layers (GPT-2 XL's depth) at width
/// 64: what is left over grows with the depth (25 KB a layer), what a step needs besides the
/// shards mostly with one block (0.73 MB at 12 layers, 1.03 MB at 48), so it takes about 38.
///
/// Against plain data parallelism in bf16 without a budget, the difference is each gradient
/// shard rounded to bf16 (relative error at most 2^-9) before AdamW, and the sums' order. So
/// the weights are held to 2^-9 apart in relative 2-norm (measured 7e-5); element by element
/// only to AdamW's reach, 2 lr a step after the first (an element whose gradient is rounding
/// noise may step the other way, and a weight moved by a bf16 ulp's boundary changes the next
/// forward), measured 7.2e-4 at most. The losses are held to 2^-12 relative, a sixteenth of
/// bf16's rounding (measured 3e-5).
#[test]
fn gpt_four_times_the_budget_trains_on_four_devices_in_bf16() {
    use tandem::optim::Precision;
    use tandem::DType;
    let corpus = TextCorpus::builtin(0);
    let cfg = gpt(48, &corpus);
    let state = 16 * cfg.parameter_count().unwrap();
    let budget = state / 4;
    let steps = 3;
    let batches = gpt_batches(&cfg, &corpus, 8, steps);
    let bf16 = |devs: &[Device], shard: Shard, grad_dtype: DType| -> tandem::Result<DataParallel> {
        let build = |d: &Device| {
            let g = Gpt::new(cfg, 1, d)?;
            g.set_recompute(true);
            Ok(g)
        };
        let dp = DataParallelConfig { shard, bucket_bytes: 16 << 10, grad_dtype, ..Default::default() };
        let mut s = DataParallel::from_factory(build, devs, &adamw(), Loss::CrossEntropy, dp)?;
        s.set_grad_clip(Some(0.5))?;
        s.set_precision(Precision::Bf16, None)?;
        Ok(s)
    };
    let (want_l, want_w) = train(&mut bf16(&devices(4), Shard::None, DType::F32).unwrap(), &batches).unwrap();
    let budgeted = || {
        let devs = devices(4);
        devs.iter().for_each(|d| d.set_memory_budget(Some(budget)));
        devs
    };
    let devs = budgeted();
    let mut s = bf16(&devs, Shard::Full, DType::Bf16).unwrap();
    let built: Vec<u64> = devs.iter().map(|d| d.memory().peak).collect();
    let (losses, weights) = train(&mut s, &batches).unwrap();
    let peaks: Vec<u64> = devs.iter().map(|d| d.memory().peak).collect();
    println!(
        "{} parameters, f32 state {state} B, budget {budget} B per device; peak while building {built:?}, in training {peaks:?}",
        cfg.parameter_count().unwrap()
    );
    // The whole model's f32 weights are the budget itself; built deferred, a device holds its
    // pieces (a sixteenth of the state) and a few 64 KiB parameters being cut at a time.
    assert!(built.iter().all(|&p| p <= state / 16 + (256 << 10)), "a deferred build holds the shards and a few parameters: {built:?}");
    assert!(peaks.iter().all(|&p| p <= budget), "{peaks:?} against {budget}");
    let diff: Vec<f32> = weights.iter().zip(&want_w).map(|(a, b)| a - b).collect();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let relative = norm(&diff) / norm(&want_w);
    println!("losses {losses:?} against {want_l:?}; weights {relative:.2e} apart (relative 2-norm)");
    assert_close("ZeRO-3 bf16 under the budget: losses", &losses, &want_l, 0.0, 2f32.powi(-12));
    assert!(relative <= 2f64.powi(-9), "the weights are {relative} apart");
    assert_close("ZeRO-3 bf16 under the budget: weights", &weights, &want_w, 2.0 * (steps - 1) as f32 * 1e-3, 0.0);

    for (shard, grad_dtype) in [(Shard::None, DType::F32), (Shard::Grads, DType::Bf16)] {
        let failed = bf16(&budgeted(), shard, grad_dtype).and_then(|mut s| train(&mut s, &batches[..1]));
        out_of_memory(failed, &format!("{shard:?} under a quarter of the state"), &[]);
    }
}

/// `build_deferred`: a model built under it holds no device memory, and computes what the
/// same model built as usual computes (every tensor, BatchNorm's running statistics included,
/// fills from its host values when an op first reads it); a tensor made by an op inside it, or
/// on another device, is an ordinary one. On the CPU and on lavapipe.
#[test]
fn a_model_built_deferred_holds_no_memory_and_computes_the_same() {
    use tandem::nn::{BatchNorm2d, Conv2d, Flatten, Linear, Module, ReLU, Sequential};
    use tandem::tensor::build_deferred;
    use tandem::Tensor;
    let mut devs = vec![Device::cpu_independent()];
    match Device::parse("wgpu:0") {
        Ok(d) => devs.extend(d),
        Err(e) => eprintln!("wgpu skipped: no adapter ({e})"),
    }
    let build = |dev: &Device| -> tandem::Result<Sequential> {
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(7);
        Ok(Sequential::new()
            .push("conv", Conv2d::new(1, 4, 5, &mut rng, dev)?)
            .push("bn", BatchNorm2d::new(4, dev)?)
            .push("relu", ReLU)
            .push("flatten", Flatten)
            .push("fc", Linear::new(4 * 24 * 24, 10, &mut rng, dev)?))
    };
    for dev in &devs {
        let plain = build(dev).unwrap();
        let before = dev.memory().in_use;
        let other = Device::cpu_independent();
        let (model, made, elsewhere) = build_deferred(dev, || {
            let m = build(dev)?;
            let made = Tensor::ones([3], dev)?.mul_scalar(2.0)?;
            Ok::<_, tandem::Error>((m, made, Tensor::ones([5], &other)?))
        })
        .unwrap();
        assert_eq!(made.to_vec().unwrap(), [2.0; 3]);
        drop(made);
        assert_eq!(dev.memory().in_use, before, "{dev}: a deferred model holds no device memory");
        assert_eq!((elsewhere.to_vec().unwrap(), other.memory().in_use), (vec![1.0; 5], 20));
        let x = Tensor::randn([2, 1, 28, 28], &mut <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1), dev).unwrap();
        plain.train();
        model.train();
        assert_close(
            &format!("{dev}: forward"),
            &model.forward(&x).unwrap().to_vec().unwrap(),
            &plain.forward(&x).unwrap().to_vec().unwrap(),
            0.0,
            0.0,
        );
        let state = |m: &dyn Module| m.state_dict().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<f32>>();
        assert_close(&format!("{dev}: state after a training forward"), &state(&model), &state(&plain), 0.0, 0.0);
    }
}

/// A device that runs out of memory in the middle of a step, while the others wait for a
/// unit it was to help gather: the step ends with that device's error, not a hang.
#[test]
fn a_device_that_fails_mid_step_releases_the_others() {
    let corpus = TextCorpus::builtin(0);
    let cfg = gpt(4, &corpus);
    let batches = gpt_batches(&cfg, &corpus, 8, 1);
    let devs = devices(4);
    let mut s = data_parallel(cfg, &devs, Shard::Full, 8 << 10, 1).unwrap();
    // Room for the shards, not for the first gathered unit.
    devs[2].set_memory_budget(Some(devs[2].memory().in_use + 1024));
    let err = match s.step(&batches[0]) {
        Ok(_) => panic!("the step fit a budget of 1 KiB past the shards"),
        Err(e) => e,
    };
    assert!(matches!(err.root_cause(), tandem::Error::OutOfMemory { .. }), "{err}");
    assert!(err.to_string().contains("replica 2"), "names the device that failed: {err}");
    // Room again: the next step trains.
    devs[2].set_memory_budget(None);
    assert!(s.step(&batches[0]).unwrap().loss.is_finite());
}

/// The same on two logical lavapipe devices: wgpu ops find a released parameter and gather
/// its unit as the CPU's do.
#[test]
fn gathering_unit_by_unit_on_wgpu_matches_plain() {
    let corpus = TextCorpus::builtin(0);
    let cfg = gpt(2, &corpus);
    let batches = gpt_batches(&cfg, &corpus, 4, 3);
    let mut runs = Vec::new();
    for shard in [Shard::None, Shard::Full] {
        let devs = match Device::parse("wgpu:0,wgpu:0") {
            Ok(d) => d,
            Err(e) => return eprintln!("skipped: no wgpu adapter ({e})"),
        };
        let mut s = data_parallel(cfg, &devs, shard, 8 << 10, 1).unwrap();
        runs.push(train(&mut s, &batches).unwrap());
        if shard == Shard::Full {
            let g = s.last_gathers().expect("gathered unit by unit");
            println!("lavapipe x2, {} units: {g:?}", s.buckets().len());
            assert!(g.per_device.iter().all(|d| d.gathers >= 2 * s.buckets().len() && d.prefetched > 0), "{g:?}");
            // The waits are on each device's own clock where it keeps one, as the all-reduce's.
            let clocks = &s.last_overlap().expect("the overlap of the step").device_clock;
            assert_eq!(&g.per_device.iter().map(|d| d.device_clock).collect::<Vec<_>>(), clocks);
            assert!(g.per_device.iter().all(|d| d.waited_s.is_finite() && d.waited_s >= 0.0 && d.host_waited_s > 0.0), "{g:?}");
        }
    }
    assert_close("ZeRO-3 on lavapipe: losses", &runs[1].0, &runs[0].0, 1e-5, 1e-4);
    assert_close("ZeRO-3 on lavapipe: weights", &runs[1].1, &runs[0].1, 1e-5, 1e-4);
}

/// The same from the command line: `tandem train --shard full --precision bf16 --grad-dtype
/// bf16 --memory-limit` trains the GPT whose f32 state is four times the limit, checkpoints,
/// resumes and saves under it, ending on the weights of the plain uninterrupted bf16 run
/// without a limit (within the library test's tolerance); plain data parallelism under the
/// limit is refused before a weight is drawn, and ZeRO-3 with f32 gradient shards too.
#[test]
fn cli_trains_resumes_and_saves_a_model_four_times_the_limit() {
    let dir = std::env::temp_dir().join(format!("tandem-zero3-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let gpt = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--n-layer",
        "48",
        "--n-embd",
        "64",
        "--n-head",
        "4",
        "--block-size",
        "16",
        "--batch",
        "8",
        "--optimizer",
        "adamw",
        "--lr",
        "0.001",
        "--precision",
        "bf16",
        "--devices",
        "cpu,cpu,cpu,cpu",
        "--strategy",
        "data",
        "--recompute",
        "--bucket-size",
        "16KiB",
    ];
    // 2,403,200 parameters: 38.45 MB of f32 weights, gradients and moments; a quarter is 9.61 MB.
    let limit = ["--memory-limit", "9387KiB"];
    let zero3 = ["--shard", "full", "--grad-dtype", "bf16"];
    let (whole, resumed, ck) = (path("whole.safetensors"), path("resumed.safetensors"), path("ck"));
    let ok = |args: Vec<&str>| {
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let steps = 4;
    ok([&gpt[..], &["--steps", "4", "--save", &whole]].concat());
    ok([&gpt[..], &limit, &zero3, &["--steps", "2", "--checkpoint-dir", &ck]].concat());
    ok([&gpt[..], &limit, &zero3, &["--steps", "4", "--checkpoint-dir", &ck, "--resume", "--save", &resumed]].concat());
    let load =
        |p: &str| tandem::checkpoint::load_weights(p, &Device::cpu()).unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<f32>>();
    let (got, want) = (load(&resumed), load(&whole));
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let relative = norm(&mut got.iter().zip(&want).map(|(a, b)| a - b)) / norm(&mut want.iter().copied());
    println!("resumed under the limit: {relative:.2e} from the plain run (relative 2-norm)");
    assert!(relative <= 2f64.powi(-9), "{relative}");
    assert_close("resumed under the limit with ZeRO-3", &got, &want, 2.0 * (steps - 1) as f32 * 1e-3, 0.0);

    for refused in [vec![], vec!["--shard", "full"]] {
        let out = run(&[&gpt[..], &limit, &refused, &["--steps", "1"]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{refused:?}: {err}");
        assert!(err.contains("out of memory on cpu") && err.contains("memory budget is 9.17 MiB"), "{refused:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tandem train --deterministic --shard full --memory-limit` at a third of the f32 state: the
/// 12-layer GPT trains under the limit and saves the weights the plain deterministic run
/// without a limit saves, bit for bit; plain data parallelism under the limit is refused.
#[test]
fn cli_deterministic_zero3_under_the_limit_saves_the_plain_weights() {
    let dir = std::env::temp_dir().join(format!("tandem-zero3-det-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let gpt = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--n-layer",
        "12",
        "--n-embd",
        "64",
        "--n-head",
        "4",
        "--block-size",
        "16",
        "--batch",
        "8",
        "--optimizer",
        "adamw",
        "--lr",
        "0.001",
        "--grad-clip",
        "0.5",
        "--devices",
        "cpu,cpu,cpu,cpu",
        "--strategy",
        "data",
        "--recompute",
        "--bucket-size",
        "32KiB",
        "--deterministic",
        "--steps",
        "3",
    ];
    // 603,776 parameters: 9.66 MB of f32 weights, gradients and moments; a third is 3.22 MB.
    let limit = ["--memory-limit", "3144KiB"];
    let (plain, zero3) = (path("plain.safetensors"), path("zero3.safetensors"));
    for args in [vec!["--save", &plain], vec!["--shard", "full", limit[0], limit[1], "--save", &zero3]] {
        let out = run(&[&gpt[..], &args].concat());
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let load =
        |p: &str| tandem::checkpoint::load_weights(p, &Device::cpu()).unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<f32>>();
    assert_close("deterministic ZeRO-3 under the limit, from the command line", &load(&zero3), &load(&plain), 0.0, 0.0);
    let out = run(&[&gpt[..], &limit].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("out of memory on cpu"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CUDA smoke test's ZeRO-3 run (tests/cuda_smoke.rs) on CPU devices: an MLP without
/// recomputation, a unit per layer; every unit gathered at least once a step, most prefetched;
/// with bf16 gradient shards within their rounding.
#[test]
fn mlp_units_are_gathered_and_prefetched() {
    use tandem::nn::{Linear, ReLU, Sequential};
    let mlp = |dev: &Device| -> tandem::Result<Sequential> {
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
        let mut m = Sequential::new();
        for (i, w) in [64, 512, 512, 1].windows(2).enumerate() {
            if i > 0 {
                m = m.push(format!("relu{i}"), ReLU);
            }
            m = m.push(format!("fc{i}"), Linear::new(w[0], w[1], &mut rng, dev)?);
        }
        Ok(m)
    };
    let ds = tandem::data::synthetic::regression(16 * 4, 64, 5).unwrap();
    let batches: Vec<_> = (0..4).map(|s| ds.batch(&(s * 16..(s + 1) * 16).collect::<Vec<_>>()).unwrap()).collect();
    let opt = OptimConfig::adam(AdamConfig { lr: 2e-3, ..Default::default() });
    let mut runs = Vec::new();
    let mut weights = Vec::new();
    for (shard, grad_dtype) in [(Shard::None, tandem::DType::F32), (Shard::Full, tandem::DType::F32), (Shard::Full, tandem::DType::Bf16)] {
        let mut s = DataParallel::from_factory(
            mlp,
            &devices(2),
            &opt,
            Loss::Mse,
            DataParallelConfig { shard, bucket_bytes: 64 << 10, grad_dtype, ..Default::default() },
        )
        .unwrap();
        let losses: Vec<f32> = batches.iter().map(|b| s.step(b).unwrap().loss).collect();
        weights.push(s.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<f32>>());
        if shard == Shard::Full {
            let g = s.last_gathers().expect("gathered unit by unit");
            println!("{} units: {g:?}", s.buckets().len());
            assert!(g.per_device.iter().all(|d| d.gathers >= s.buckets().len() && d.prefetched > 0), "{g:?}");
        }
        runs.push(losses);
    }
    assert_close("ZeRO-3 MLP losses", &runs[1], &runs[0], 1e-5, 1e-4);
    // With bf16 gradient shards, as the CUDA test holds them.
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let apart = norm(&mut weights[2].iter().zip(&weights[0]).map(|(a, b)| a - b)) / norm(&mut weights[0].iter().copied());
    println!("bf16 gradient shards: weights {apart:.2e} from plain, losses {:?} against {:?}", runs[2], runs[0]);
    assert!(apart <= 2f64.powi(-9), "bf16 gradient shards: weights {apart} from plain");
    assert_close("ZeRO-3 bf16-gradient MLP losses", &runs[2], &runs[0], 0.0, 2f32.powi(-8));
}
