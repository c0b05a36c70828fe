//! Sharded data parallelism (ZeRO-2, ZeRO-3) against plain data parallelism and one device:
//! losses and weights with Adam and clipping, deterministic mode bit for bit, checkpoints
//! between sharded and plain runs, and the bytes each device holds.
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::data::{synthetic, Batch};
use tandem::nn::models::SeedModel;
use tandem::nn::Sequential;
use tandem::nn::{Linear, ReLU};
use tandem::optim::AdamConfig;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Single, Strategy};
use tandem::tolerance::assert_close;
use tandem::{Device, Tensor};

const STEPS: usize = 6;
const CLIP: f32 = 0.5;

fn cpu_devices(n: usize) -> Vec<Device> {
    (0..n).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect()
}

fn cnn() -> Sequential {
    SeedModel::Cnn.build(7, &Device::cpu()).unwrap()
}

/// A 132k-parameter MLP (64 -> 256 -> 256 -> 192 -> 1) on `dev`.
fn mlp(dev: &Device) -> Sequential {
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
    let mut m = Sequential::new();
    for (i, w) in [64, 256, 256, 192, 1].windows(2).enumerate() {
        if i > 0 {
            m = m.push(format!("relu{i}"), ReLU);
        }
        m = m.push(format!("fc{i}"), Linear::new(w[0], w[1], &mut rng, dev).unwrap());
    }
    m
}

fn adam() -> OptimConfig {
    OptimConfig::adam(AdamConfig { lr: 2e-3, ..Default::default() })
}

fn image_batches(size: usize) -> Vec<Batch> {
    let ds = synthetic::seed_images(size * STEPS, 3).unwrap();
    (0..STEPS).map(|s| ds.batch(&(s * size..(s + 1) * size).collect::<Vec<_>>()).unwrap()).collect()
}

fn vector_batches(size: usize) -> Vec<Batch> {
    let ds = synthetic::regression(size * STEPS, 64, 5).unwrap();
    (0..STEPS).map(|s| ds.batch(&(s * size..(s + 1) * size).collect::<Vec<_>>()).unwrap()).collect()
}

/// Losses of every step and the final weights (flattened, state_dict order).
fn train(s: &mut dyn Strategy, batches: &[Batch]) -> (Vec<f32>, Vec<f32>) {
    let losses = batches.iter().map(|b| s.step(b).unwrap().loss).collect();
    (losses, weights(s))
}

fn weights(s: &dyn Strategy) -> Vec<f32> {
    s.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect()
}

fn dp(devices: &[Device], cfg: DataParallelConfig) -> DataParallel {
    let mut dp = DataParallel::new(&cnn(), devices, &adam(), Loss::CrossEntropy, cfg).unwrap();
    dp.set_grad_clip(Some(CLIP)).unwrap();
    dp
}

fn cfg(shard: Shard) -> DataParallelConfig {
    DataParallelConfig { shard, ..Default::default() }
}

/// One device, plain data parallelism, ZeRO-2 and ZeRO-3 on `devices`, each with `extra`
/// options: the same losses and weights, and clipping's norm (over shards) the same.
fn all_modes_agree(devices: &[Device], extra: DataParallelConfig) {
    let b = image_batches(24);
    let mut single = Single::new(cnn(), &adam(), Loss::CrossEntropy, &cpu_devices(1)[0]).unwrap();
    single.set_grad_clip(Some(CLIP)).unwrap();
    let (want_l, want_w) = train(&mut single, &b);
    let mut norms = Vec::new();
    for shard in [Shard::None, Shard::Grads, Shard::Full] {
        let mut s = dp(devices, DataParallelConfig { shard, ..extra.clone() });
        let reports: Vec<_> = b.iter().map(|x| s.step(x).unwrap()).collect();
        let losses: Vec<f32> = reports.iter().map(|r| r.loss).collect();
        norms.push(reports.iter().map(|r| r.grad_norm.unwrap()).collect::<Vec<_>>());
        assert_close(&format!("{shard:?} losses"), &losses, &want_l, 1e-5, 1e-4);
        assert_close(&format!("{shard:?} weights"), &weights(&s), &want_w, 1e-4, 1e-4);
    }
    assert!(norms[0].iter().any(|&n| n > CLIP), "clipping took part: norms {:?}", norms[0]);
    assert_close("ZeRO-2 grad norms", &norms[1], &norms[0], 1e-5, 1e-5);
    assert_close("ZeRO-3 grad norms", &norms[2], &norms[0], 1e-5, 1e-5);
}

#[test]
fn zero2_and_zero3_match_one_device_on_4_cpus() {
    all_modes_agree(&cpu_devices(4), DataParallelConfig::default());
}

/// Three devices, small buckets: many units, most of them not a multiple of three long, so
/// blocks end in padding and pieces start mid-parameter; two micro-batches accumulate.
#[test]
fn zero2_and_zero3_match_with_small_buckets_and_micro_batches() {
    all_modes_agree(&cpu_devices(3), DataParallelConfig { bucket_bytes: 4096, micro_batches: 2, ..Default::default() });
}

/// A CPU and a lavapipe device (kernels that round differently): each piece has one owner, so
/// the replicas cannot drift.
#[test]
fn zero2_and_zero3_match_on_cpu_and_wgpu() {
    let devices = match Device::parse("cpu,wgpu:0") {
        Ok(d) => d,
        Err(e) => return eprintln!("skipped: no wgpu adapter ({e})"),
    };
    all_modes_agree(&devices, DataParallelConfig::default());
}

/// Deterministic mode: ZeRO-2 and ZeRO-3 are plain data parallelism bit for bit (the same
/// sums; Adam is elementwise, so a piece updates as its whole parameter does).
#[test]
fn deterministic_sharding_is_bit_identical() {
    let b = image_batches(24);
    let det = |shard| DataParallelConfig { shard, deterministic: true, ..Default::default() };
    let (pl, pw) = train(&mut dp(&cpu_devices(3), det(Shard::None)), &b);
    for shard in [Shard::Grads, Shard::Full] {
        let (l, w) = train(&mut dp(&cpu_devices(3), det(shard)), &b);
        assert_close(&format!("{shard:?} losses"), &l, &pl, 0.0, 0.0);
        assert_close(&format!("{shard:?} weights"), &w, &pw, 0.0, 0.0);
    }
}

/// The gathered optimizer state has the unsharded optimizer's names, shapes and values; a
/// checkpoint of a ZeRO-3 run resumes in a plain run and one of a plain run in ZeRO-2 and
/// ZeRO-3 (on another device count), continuing the same curve.
#[test]
fn checkpoints_move_between_sharded_and_plain_runs() {
    let b = image_batches(24);
    let (first, rest) = b.split_at(3);
    let mut plain = dp(&cpu_devices(2), cfg(Shard::None));
    let mut zero3 = dp(&cpu_devices(2), cfg(Shard::Full));
    train(&mut plain, first);
    train(&mut zero3, first);
    let (ps, psteps) = plain.optimizer_state().unwrap();
    let ps: Vec<(String, Tensor)> =
        ps.iter().map(|(n, t)| (n.clone(), Tensor::from_vec(t.to_vec().unwrap(), t.dims().to_vec(), &Device::cpu()).unwrap())).collect();
    let (zs, zsteps) = zero3.optimizer_state().unwrap();
    assert_eq!(psteps, zsteps);
    let names = |s: &[(String, Tensor)]| s.iter().map(|(n, t)| (n.clone(), t.dims().to_vec())).collect::<Vec<_>>();
    assert_eq!(names(&zs), names(&ps), "the same entries, PyTorch's names and shapes");
    for ((name, a), (_, z)) in ps.iter().zip(&zs) {
        assert_close(name, &z.to_vec().unwrap(), &a.to_vec().unwrap(), 1e-5, 1e-5);
    }
    let (want_l, want_w) = train(&mut plain, rest);

    // ZeRO-3 -> plain, and plain -> ZeRO-2 / ZeRO-3 on three devices.
    let (w3, o3) = (zero3.state_dict().unwrap(), zero3.optimizer_state().unwrap());
    // The plain optimizer's state tensors are its live buffers, which `rest` has updated since.
    let (wp, op) = (plain_after(first), plain_after_state(first));
    assert_close(
        "a second plain run's state",
        &op.iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<_>>(),
        &ps.iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<_>>(),
        0.0,
        0.0,
    );
    for (what, shard, n, (w, o)) in [
        ("ZeRO-3 into plain", Shard::None, 2, (&w3, &o3.0)),
        ("plain into ZeRO-2", Shard::Grads, 3, (&wp, &op)),
        ("plain into ZeRO-3", Shard::Full, 3, (&wp, &op)),
    ] {
        let mut resumed = dp(&cpu_devices(n), cfg(shard));
        resumed.load_state_dict(w).unwrap();
        resumed.load_optimizer_state(o, psteps).unwrap();
        let (l, w) = train(&mut resumed, rest);
        assert_close(&format!("{what} losses"), &l, &want_l, 1e-5, 1e-4);
        assert_close(&format!("{what} weights"), &w, &want_w, 1e-4, 1e-4);
    }
}

/// A plain run's weights after `batches`.
fn plain_after(batches: &[Batch]) -> Vec<(String, Tensor)> {
    let mut plain = dp(&cpu_devices(2), cfg(Shard::None));
    train(&mut plain, batches);
    plain.state_dict().unwrap()
}

/// A plain run's optimizer state after `batches`.
fn plain_after_state(batches: &[Batch]) -> Vec<(String, Tensor)> {
    let mut plain = dp(&cpu_devices(2), cfg(Shard::None));
    train(&mut plain, batches);
    plain.optimizer_state().unwrap().0
}

/// Bytes (peak, held between steps) on the most loaded of 4 CPU devices training the
/// 132k-parameter MLP with Adam under each mode, with `bucket_bytes`; checks every mode
/// trains as plain data parallelism does.
fn memory_figures(bucket_bytes: usize) -> Vec<(Shard, u64, u64)> {
    let b = vector_batches(32);
    let mut figures = Vec::new();
    let mut results = Vec::new();
    for shard in [Shard::None, Shard::Optimizer, Shard::Grads, Shard::Full] {
        let devices = cpu_devices(4);
        let mut s = DataParallel::from_factory(
            |d| Ok(mlp(d)),
            &devices,
            &adam(),
            Loss::Mse,
            DataParallelConfig { shard, bucket_bytes, ..Default::default() },
        )
        .unwrap();
        let losses: Vec<f32> = b.iter().map(|x| s.step(x).unwrap().loss).collect();
        let peak = devices.iter().map(|d| d.memory().peak).max().unwrap();
        let held = devices.iter().map(|d| d.memory().in_use).max().unwrap();
        results.push((losses, weights(&s)));
        figures.push((shard, peak, held));
    }
    let (plain_peak, plain_held) = (figures[0].1, figures[0].2);
    for &(shard, peak, held) in &figures {
        println!(
            "buckets of {bucket_bytes} B, {shard:?}: peak {peak} B ({:.2}x), held between steps {held} B ({:.2}x)",
            peak as f64 / plain_peak as f64,
            held as f64 / plain_held as f64
        );
    }
    for ((shard, _, _), (l, w)) in figures.iter().zip(&results).skip(1) {
        assert_close(&format!("{shard:?} losses"), l, &results[0].0, 1e-5, 1e-4);
        assert_close(&format!("{shard:?} weights"), w, &results[0].1, 1e-5, 1e-4);
    }
    figures
}

/// ZeRO-2 shards gradients and optimizer state, ZeRO-3 the parameters too: each holds less,
/// between steps and at the peak.
#[test]
fn sharding_reduces_memory_per_device() {
    let figures = memory_figures(25 << 20);
    let [plain, zero1, zero2, zero3] = [0, 1, 2, 3].map(|i| figures[i]);
    assert!(zero2.2 < zero1.2 && zero1.2 < plain.2, "held: {figures:?}");
    assert!(zero3.2 < zero2.2, "ZeRO-3 holds less than ZeRO-2 between steps: {figures:?}");
    // The full gradients are dropped bucket by bucket as backward packs them.
    assert!((zero2.1 as f64) < 0.75 * plain.1 as f64 && zero3.1 <= zero2.1 + 1024, "peaks: {figures:?}");
    // Between steps ZeRO-3 holds about a quarter of plain (4 devices; plus activations' pool).
    assert!((zero3.2 as f64) < 0.3 * plain.2 as f64, "held: {figures:?}");

    // With a bucket per layer, ZeRO-3 releases each layer's parameters once backward is done
    // with them: its peak falls below ZeRO-2's.
    let figures = memory_figures(64 << 10);
    let (zero2, zero3) = (figures[2], figures[3]);
    assert!(zero3.1 < zero2.1, "peaks with small buckets: {figures:?}");
}

/// ZeRO-3 keeps the parameters released between steps: reading one is a clear error, not a
/// panic, and `state_dict` and `predict` gather them.
#[test]
fn zero3_parameters_are_released_between_steps() {
    let devices = cpu_devices(2);
    let mut s = DataParallel::from_factory(|d| Ok(mlp(d)), &devices, &adam(), Loss::Mse, cfg(Shard::Full)).unwrap();
    let b = vector_batches(8);
    s.step(&b[0]).unwrap();
    let (_, w) = &s.replica_parameters()[0][0];
    let err = w.to_vec().unwrap_err().to_string();
    assert!(err.contains("released"), "{err}");
    let x = Tensor::from_vec(vec![0.5; 64], [1, 64], &devices[0]).unwrap();
    assert_eq!(s.predict(&x).unwrap().dims(), &[1, 1]);
    assert_eq!(s.state_dict().unwrap().len(), 8);
    assert!(w.to_vec().is_err(), "released again after state_dict");
    s.gather_full().unwrap();
    assert_eq!(w.to_vec().unwrap().len(), 64 * 256, "kept after gather_full");
    s.step(&b[1]).unwrap();
    assert!(w.to_vec().is_err(), "released again by the next step");
}

/// ZeRO-3 on two logical lavapipe devices: the parameters' memory goes back to the pool between
/// steps (wgpu releases as the CPU and CUDA do), and training equals plain data parallelism.
#[test]
fn zero3_releases_wgpu_memory() {
    let mut runs = Vec::new();
    for shard in [Shard::None, Shard::Full] {
        let devices = match Device::parse("wgpu:0,wgpu:0") {
            Ok(d) => d,
            Err(e) => return eprintln!("skipped: no wgpu adapter ({e})"),
        };
        let mut s = DataParallel::from_factory(|d| Ok(mlp(d)), &devices, &adam(), Loss::Mse, cfg(shard)).unwrap();
        let losses: Vec<f32> = vector_batches(8).iter().map(|b| s.step(b).unwrap().loss).collect();
        let held = devices.iter().map(|d| d.memory().in_use).max().unwrap();
        if shard == Shard::Full {
            match s.replica_parameters()[1][0].1.to_vec() {
                Ok(_) => panic!("a ZeRO-3 parameter was readable between steps: its memory was kept"),
                Err(e) => assert!(e.to_string().contains("released"), "{e}"),
            }
        }
        println!("{shard:?} on lavapipe: held between steps {held} B per device");
        runs.push((losses, weights(&s), held));
    }
    assert_close("ZeRO-3 losses", &runs[1].0, &runs[0].0, 1e-5, 1e-4);
    assert_close("ZeRO-3 weights", &runs[1].1, &runs[0].1, 1e-5, 1e-4);
    // Plain holds weights, gradients and Adam's two moments: 4 bytes per weight byte (2.1 MB
    // measured). ZeRO-3 on two devices holds half the weights as pieces and half the moments,
    // 3/8 of plain, in blocks of the pool's size classes (at most 25% more): under half of
    // plain (0.42 measured). Were the full weights kept, they would add a quarter: over 0.6.
    assert!(2 * runs[1].2 <= runs[0].2, "held between steps: ZeRO-3 {} B, plain {} B", runs[1].2, runs[0].2);
}

/// `tandem train --shard`: a ZeRO-3 run's checkpoint resumes as plain data parallelism and a
/// plain run's as ZeRO-2, each ending with the weights of the uninterrupted run.
#[test]
fn cli_checkpoints_resume_under_another_shard_mode() {
    let dir = std::env::temp_dir().join(format!("tandem-zero-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tandem = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let common = [
        "train",
        "--data",
        "digits",
        "--batch",
        "16",
        "--steps",
        "6",
        "--devices",
        "cpu,cpu",
        "--strategy",
        "data",
        "--optimizer",
        "adam",
        "--lr",
        "0.01",
        "--checkpoint-every",
        "3",
    ];
    let load =
        |p: &str| tandem::checkpoint::load_weights(p, &Device::cpu()).unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect::<Vec<f32>>();
    for (first, then) in [("full", "none"), ("none", "grads")] {
        let ck = path(&format!("ck-{first}"));
        let whole = path(&format!("whole-{first}.safetensors"));
        tandem(&[&common[..], &["--shard", first, "--checkpoint-dir", &ck, "--save", &whole]].concat());
        // Back to step 3: the last checkpoint goes, as if the run had stopped there.
        std::fs::remove_file(dir.join(format!("ck-{first}")).join("ckpt-00000006.safetensors")).unwrap();
        let resumed = path(&format!("resumed-{then}.safetensors"));
        let log = tandem(&[&common[..], &["--shard", then, "--checkpoint-dir", &ck, "--resume", "--save", &resumed]].concat());
        assert!(log.contains("resuming from"), "{log}");
        assert_close(&format!("--shard {first}, resumed under --shard {then}"), &load(&resumed), &load(&whole), 1e-5, 1e-4);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPT (tied embedding, dropout 0.2) with AdamW whose biases and norms take no weight decay
/// (a rule by rank, which every piece must follow as its parameter does), clipped: ZeRO-2 and
/// ZeRO-3 on 3 CPU devices match one device.
#[test]
fn gpt_with_adamw_groups_matches_one_device() {
    use tandem::data::text::{Split, TextCorpus};
    use tandem::nn::models::{Gpt, GptConfig};
    use tandem::optim::ParamGroups;
    let corpus = TextCorpus::builtin(0);
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 16, block_size: 8, vocab_size: corpus.vocab.len(), dropout: 0.2, bias: true };
    let opt = OptimConfig::adam(AdamConfig { lr: 3e-3, weight_decay: 0.5, ..AdamConfig::adamw() })
        .with_groups(ParamGroups::no_decay_for_biases_and_norms());
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5);
    let batches: Vec<Batch> = (0..5)
        .map(|_| {
            let b = corpus.batch(Split::Train, 6, 8, &mut rng).unwrap();
            Batch::tokens(b.x, b.y, b.block, corpus.vocab.len()).unwrap()
        })
        .collect();
    let run = |s: &mut dyn Strategy| {
        s.set_grad_clip(Some(CLIP)).unwrap();
        train(s, &batches)
    };
    let dev = cpu_devices(1).remove(0);
    let (want_l, want_w) = run(&mut Single::new(Gpt::new(cfg, 1, &dev).unwrap(), &opt, Loss::CrossEntropy, &dev).unwrap());
    for shard in [Shard::Grads, Shard::Full] {
        let mut s = DataParallel::from_factory(
            |d| Gpt::new(cfg, 1, d),
            &cpu_devices(3),
            &opt,
            Loss::CrossEntropy,
            DataParallelConfig { shard, bucket_bytes: 8192, ..Default::default() },
        )
        .unwrap();
        let (l, w) = run(&mut s);
        assert_close(&format!("GPT {shard:?} losses"), &l, &want_l, 1e-5, 1e-4);
        assert_close(&format!("GPT {shard:?} weights"), &w, &want_w, 1e-5, 1e-3);
    }
}
