//! Data-parallel replicas on devices of different backends (the CPU reference, lavapipe Vulkan,
//! llvmpipe GL) stay one model: after every step each replica's weights, and every copy of the
//! optimizer state, are the same bits; a run stopped and resumed from its saved state repeats
//! the uninterrupted run bit for bit (in the library and through `tandem train --resume`); and
//! a replica whose thread fails or panics makes `step` an error that names the replica and its
//! device, without hanging.
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use tandem::backend::cpu::CpuBackend;
use tandem::data::{synthetic, Batch};
use tandem::nn::models::SeedModel;
use tandem::nn::Module;
use tandem::optim::{AdamConfig, SgdConfig};
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Strategy};
use tandem::{Device, Error, Result, Tensor};

const STEPS: usize = 20;
const BATCH: usize = 12;

fn optimizers() -> [(&'static str, OptimConfig); 2] {
    [
        ("adam", OptimConfig::adam(AdamConfig { lr: 1e-3, ..Default::default() })),
        ("sgd", OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })),
    ]
}

fn batches() -> Vec<Batch> {
    let ds = synthetic::seed_images(BATCH * STEPS, 11).unwrap();
    (0..STEPS).map(|s| ds.batch(&(s * BATCH..(s + 1) * BATCH).collect::<Vec<_>>()).unwrap()).collect()
}

fn config(deterministic: bool) -> DataParallelConfig {
    DataParallelConfig { deterministic, deterministic_shards: 4, ..Default::default() }
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Every replica's weights equal replica 0's, bit for bit; every state tensor that more than
/// one replica holds is the same bits in each; every parameter's state is held somewhere, and
/// the gathered state (what a checkpoint saves) is those bits.
fn assert_one_model(what: &str, dp: &DataParallel) {
    let replicas = dp.replica_parameters();
    for (r, params) in replicas.iter().enumerate().skip(1) {
        for ((name, t), (_, t0)) in params.iter().zip(&replicas[0]) {
            assert!(bits(t) == bits(t0), "{what}: replica {r} ({}) {name} differs from replica 0", t.device());
        }
    }
    let (gathered, steps) = dp.optimizer_state().unwrap();
    let mut held = 0;
    for i in 0..replicas.len() {
        let (state, s) = dp.replica_optimizer_state(i).unwrap();
        assert_eq!(s, steps, "{what}: replica {i}'s step count");
        for (name, t) in &state {
            let (_, want) = gathered.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{what}: {name} of replica {i} not gathered"));
            assert!(bits(t) == bits(want), "{what}: replica {i} ({}) holds a different {name}", t.device());
        }
        held += state.len();
    }
    assert!(held >= gathered.len(), "{what}: {} state tensors gathered, {held} held", gathered.len());
}

#[test]
fn replicas_on_cpu_vulkan_and_gl_are_bit_identical_after_every_step() {
    let Some(devs) = common::mixed_devices() else { return };
    let _only = common::exclusive();
    let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
    let data = batches();
    for (name, opt) in optimizers() {
        for det in [false, true] {
            let mut dp = DataParallel::new(&model, &devs, &opt, Loss::CrossEntropy, config(det)).unwrap();
            assert!(dp.parameter_owners().is_some(), "three kernel families: every parameter has one owner");
            for (s, b) in data.iter().enumerate() {
                let loss = dp.step(b).unwrap().loss;
                assert!(loss.is_finite());
                assert_one_model(&format!("{name}, deterministic {det}, step {}", s + 1), &dp);
            }
        }
    }
}

#[test]
fn replicas_of_one_kernel_family_update_locally() {
    let mut pairs = vec![(0..2).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect::<Vec<_>>()];
    // Two logical devices on one adapter run the same kernels too.
    if let Some(mixed) = common::mixed_devices() {
        let spec = mixed[1].spec();
        pairs.push(Device::parse(&format!("{spec},{spec}")).unwrap());
    }
    let _only = common::exclusive();
    let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
    let (_, adam) = &optimizers()[0];
    for devs in pairs {
        let what = format!("{},{}", devs[0], devs[1]);
        assert!(!devs[0].same(&devs[1]), "{what}: two logical devices");
        let mut dp = DataParallel::new(&model, &devs, adam, Loss::CrossEntropy, config(false)).unwrap();
        assert_eq!(dp.parameter_owners(), None, "{what}: no owners, no broadcast");
        for b in &batches()[..3] {
            dp.step(b).unwrap();
            assert_one_model(&what, &dp);
        }
        let full = dp.replica_optimizer_state(0).unwrap().0.len();
        assert!(full == 16 && dp.replica_optimizer_state(1).unwrap().0.len() == full, "{what}: each replica holds all state");
        assert!(dp.replica_optimizer_state(2).is_none());
    }
}

/// The state a checkpoint holds, copied to host tensors (as a file would).
type Saved = (Vec<(String, Tensor)>, Vec<(String, Tensor)>, u64);

fn save(dp: &DataParallel) -> Saved {
    let host = |v: Vec<(String, Tensor)>| v.into_iter().map(|(n, t)| (n, t.to(&Device::cpu()).unwrap())).collect();
    let (opt, steps) = dp.optimizer_state().unwrap();
    (host(dp.state_dict().unwrap()), host(opt), steps)
}

#[test]
fn resumed_run_on_cpu_vulkan_and_gl_equals_the_uninterrupted_one() {
    let Some(devs) = common::mixed_devices() else { return };
    let _only = common::exclusive();
    let data = batches();
    let stop = STEPS / 2;
    for (name, opt) in optimizers() {
        let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
        let mut straight = DataParallel::new(&model, &devs, &opt, Loss::CrossEntropy, config(true)).unwrap();
        let want: Vec<f32> = data.iter().map(|b| straight.step(b).unwrap().loss).collect();

        let mut first = DataParallel::new(&model, &devs, &opt, Loss::CrossEntropy, config(true)).unwrap();
        let mut got: Vec<f32> = data[..stop].iter().map(|b| first.step(b).unwrap().loss).collect();
        let (weights, opt_state, steps) = save(&first);
        drop(first);
        // Another initialisation, so that only the loaded state can give the same run.
        let other = SeedModel::Cnn.build(4, &Device::cpu()).unwrap();
        let mut resumed = DataParallel::new(&other, &devs, &opt, Loss::CrossEntropy, config(true)).unwrap();
        resumed.load_state_dict(&weights).unwrap();
        resumed.load_optimizer_state(&opt_state, steps).unwrap();
        assert_one_model(&format!("{name}, resumed"), &resumed);
        got.extend(data[stop..].iter().map(|b| resumed.step(b).unwrap().loss));

        let loss_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(loss_bits(&got), loss_bits(&want), "{name}: losses of the resumed run (stopped after step {stop}) {got:?} vs {want:?}");
        for ((n, a), (_, b)) in resumed.state_dict().unwrap().iter().zip(&straight.state_dict().unwrap()) {
            assert!(bits(a) == bits(b), "{name}: final {n} differs after resume");
        }
        assert_one_model(&format!("{name}, resumed, final"), &resumed);
    }
}

/// An identity layer whose copy for one replica fails (an error or a panic) in its first
/// forward; copies are numbered in the order `DataParallel::new` makes them, replica order.
struct Faulty {
    copies: Arc<AtomicUsize>,
    copy: Option<usize>,
    bad: usize,
    panic: bool,
    armed: Arc<AtomicBool>,
}

impl Module for Faulty {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.copy == Some(self.bad) && self.armed.swap(false, Ordering::SeqCst) {
            if self.panic {
                panic!("injected panic in replica {}", self.bad);
            }
            return Err(Error::invalid("Faulty::forward", "injected failure"));
        }
        Ok(x.clone())
    }
    fn to_device(&self, _device: &Device) -> Result<Box<dyn Module>> {
        let copy = Some(self.copies.fetch_add(1, Ordering::SeqCst));
        Ok(Box::new(Faulty { copies: self.copies.clone(), copy, bad: self.bad, panic: self.panic, armed: self.armed.clone() }))
    }
    fn describe(&self) -> String {
        "Faulty".into()
    }
}

/// Runs `f` on its own thread; a hang past a minute fails the test instead of stalling it.
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("still running after a minute: it hangs"),
        Err(mpsc::RecvTimeoutError::Disconnected) => std::panic::resume_unwind(thread.join().expect_err("the checks panicked")),
    }
}

#[test]
fn a_failing_or_panicking_replica_is_an_error_naming_it() {
    let devs = common::mixed_devices().unwrap_or_else(|| (0..3).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect());
    let _only = common::exclusive();
    let data = batches();
    for det in [false, true] {
        for panic in [false, true] {
            let (devs, data) = (devs.clone(), data[..2].to_vec());
            let bad_device = devs[2].to_string();
            let result = within_a_minute(move || {
                let mut model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
                let armed = Arc::new(AtomicBool::new(true));
                model.push_boxed("faulty".into(), Box::new(Faulty { copies: Arc::new(AtomicUsize::new(0)), copy: None, bad: 2, panic, armed }));
                let mut dp = DataParallel::new(&model, &devs, &optimizers()[0].1, Loss::CrossEntropy, config(det)).unwrap();
                let err = dp.step(&data[0]).expect_err("replica 2 fails");
                // The failed step changed nothing: the next one runs, and the replicas agree.
                dp.step(&data[1]).unwrap();
                assert_one_model("after a failed step", &dp);
                err
            });
            let text = result.to_string();
            let what = format!("deterministic {det}, panic {panic}: {text}");
            assert!(matches!(&result, Error::Worker { index: 2, .. }), "{what}");
            assert!(text.contains(&format!("replica 2 on {bad_device}")), "{what}");
            let cause = if panic { "injected panic in replica 2" } else { "injected failure" };
            assert!(text.contains(cause), "{what}");
        }
    }
}

/// Per-step losses from `tandem train --log-format json` output.
fn logged_losses(stdout: &[u8]) -> Vec<(u64, u32)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|j| Some((j.get("step")?.as_u64()?, (j.get("loss")?.as_f64()? as f32).to_bits())))
        .collect()
}

#[test]
fn cli_run_stopped_and_resumed_on_cpu_vulkan_and_gl_equals_the_straight_run() {
    if common::mixed_devices().is_none() {
        return;
    }
    let _only = common::exclusive();
    let dir = std::env::temp_dir().join(format!("tandem-replicas-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let train = |steps: &str, extra: &[String]| {
        let base = ["train", "--data", "synthetic", "--batch", "24", "--seed", "4", "--deterministic", "--strategy", "data", "--optimizer", "adam"];
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(base)
            .args(["--devices", "cpu,wgpu:0,wgpu:1", "--log-format", "json", "--steps", steps])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "tandem train failed:\n{}", String::from_utf8_lossy(&out.stderr));
        logged_losses(&out.stdout)
    };
    let ck = vec!["--checkpoint-dir".to_string(), path("ck")];
    let straight = train("20", &["--save".into(), path("straight.safetensors")]);
    let mut resumed = train("10", &ck);
    resumed.extend(train("20", &[ck.clone(), vec!["--resume".into(), "--save".into(), path("resumed.safetensors")]].concat()));
    assert_eq!(straight.len(), 20);
    assert_eq!(resumed, straight, "per-step (step, loss bits) of the stopped-and-resumed run");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    assert!(read("resumed.safetensors") == read("straight.safetensors"), "final weights differ after resume");
    let _ = std::fs::remove_dir_all(&dir);
}
