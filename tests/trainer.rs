//! The Trainer's own behaviour, on the CPU reference: run length in steps and epochs,
//! validation and its metrics against hand computations, the LR schedule, the non-finite stop
//! naming the newest finite checkpoint, resume refusals, the stop token, observers.
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use tandem::data::{synthetic, Batch, DataLoader, Dataset, Targets};
use tandem::nn::{Linear, ReLU, Sequential};
use tandem::optim::{LrSchedule, SgdConfig};
use tandem::parallel::{Loss, OptimConfig, Single};
use tandem::train::{Accuracy, Checkpoints, MeanLoss, Metric, Mse, Observer, Perplexity, StepInfo, StopToken, Trainer, R2};
use tandem::{Device, Error, Tensor};

fn mlp(inputs: usize, outputs: usize) -> Sequential {
    let dev = Device::cpu();
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
    Sequential::new()
        .push("0", Linear::new(inputs, 8, &mut rng, &dev).unwrap())
        .push("1", ReLU)
        .push("2", Linear::new(8, outputs, &mut rng, &dev).unwrap())
}

fn regression_trainer(lr: f32) -> Trainer<Single> {
    let opt = OptimConfig::sgd(SgdConfig { lr, ..Default::default() });
    Trainer::new(Single::new(mlp(3, 1), &opt, Loss::Mse, &Device::cpu()).unwrap())
}

fn loader(n: usize, batch: usize) -> DataLoader {
    DataLoader::new(Arc::new(synthetic::regression(n, 3, 4).unwrap()), batch, true, 0).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-trainer-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Records what observers are told.
#[derive(Clone, Default)]
struct Log(Rc<RefCell<Vec<String>>>);

impl Observer for Log {
    fn step(&mut self, s: &StepInfo<'_>) {
        self.0.borrow_mut().push(format!("step {} lr {:?}", s.step, s.lr));
    }
    fn validated(&mut self, step: u64, m: &[(String, f64)]) {
        self.0.borrow_mut().push(format!("val {step} {}", m.iter().map(|x| x.0.clone()).collect::<Vec<_>>().join(",")));
    }
    fn checkpointed(&mut self, step: u64, _: &std::path::Path) {
        self.0.borrow_mut().push(format!("ckpt {step}"));
    }
}

#[test]
fn epochs_count_batches_and_validation_runs_every_n_and_at_the_end() {
    let log = Log::default();
    // 10 samples in batches of 4: 3 batches per epoch, the last of 2.
    let val = DataLoader::new(Arc::new(synthetic::regression(7, 3, 5).unwrap()), 3, false, 0).unwrap();
    let mut t =
        regression_trainer(0.01).epochs(3).validate(4, val, vec![Box::new(MeanLoss::new(Loss::Mse)), Box::new(Mse::new())]).observe(log.clone());
    let fit = t.fit(&mut loader(10, 4)).unwrap();
    assert_eq!((fit.first_step, fit.step, fit.total), (0, 9, 9));
    assert_eq!(fit.samples, 30);
    let steps: Vec<u64> = fit.validations.iter().map(|v| v.0).collect();
    assert_eq!(steps, [4, 8, 9]);
    // MeanLoss with Loss::Mse over equal-sized targets is the MSE metric.
    for (_, m) in &fit.validations {
        assert!((m[0].1 - m[1].1).abs() <= 1e-6 * m[1].1.abs(), "{m:?}");
    }
    assert_eq!(log.0.borrow().iter().filter(|l| l.starts_with("step")).count(), 9);
}

#[test]
fn the_schedule_sets_each_steps_learning_rate() {
    let log = Log::default();
    let sch = LrSchedule::Step { lr: 0.1, step_size: 2, gamma: 0.5 };
    let mut t = regression_trainer(0.1).steps(5).schedule(sch).observe(log.clone());
    t.fit(&mut loader(16, 4)).unwrap();
    let lrs: Vec<String> = log.0.borrow().clone();
    let want: Vec<String> = (0..5).map(|s| format!("step {} lr {:?}", s + 1, Some(sch.lr_at(s)))).collect();
    assert_eq!(lrs, want);
}

#[test]
fn a_schedule_over_the_run_is_given_the_runs_total_steps() {
    let log = Log::default();
    // 10 samples in batches of 4: 3 batches per epoch, 4 epochs.
    let t = regression_trainer(0.1).epochs(4);
    assert_eq!(t.total_steps(&loader(10, 4)).unwrap(), 12);
    let mut t = t.schedule_over_run(|total| LrSchedule::one_cycle(0.1, total)).observe(log.clone());
    t.fit(&mut loader(10, 4)).unwrap();
    let want: Vec<String> = (0..12).map(|s| format!("step {} lr {:?}", s + 1, Some(LrSchedule::one_cycle(0.1, 12).lr_at(s)))).collect();
    assert_eq!(*log.0.borrow(), want);
}

/// Metrics are named after the source measured when it is named (`test_loss`, not `val_loss`);
/// each epoch's mean training loss weighs its batches by their samples.
#[test]
fn metrics_carry_the_sources_name_and_epochs_their_mean_loss() {
    let test = || DataLoader::new(Arc::new(synthetic::regression(7, 3, 5).unwrap()), 3, false, 0).unwrap();
    let metrics = || -> Vec<Box<dyn Metric>> { vec![Box::new(MeanLoss::new(Loss::Mse)), Box::new(Mse::new())] };
    let mut t = regression_trainer(0.01).epochs(2).validate_named("test", 100, test(), metrics());
    let fit = t.fit(&mut loader(10, 4)).unwrap();
    let names: Vec<&str> = fit.validations[0].1.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(names, ["test_loss", "test_mse"]);
    assert!(fit.metric("val_loss").is_none() && fit.metric("test_loss").is_some());
    let named = t.evaluate_named("test", &mut test(), &mut metrics()).unwrap();
    assert_eq!(named.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), ["test_loss", "test_mse"]);
    let own = t.evaluate(&mut test(), &mut metrics()).unwrap();
    assert_eq!(own.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), ["val_loss", "mse"]);
    assert_eq!(own.iter().map(|m| m.1).collect::<Vec<_>>(), named.iter().map(|m| m.1).collect::<Vec<_>>());

    // Batches of 4, 4 and 2 samples per epoch; the final loss is the 2-sample batch's.
    let l: Vec<f64> = fit.losses.iter().map(|s| s.1 as f64).collect();
    let want = [(0, (4.0 * l[0] + 4.0 * l[1] + 2.0 * l[2]) / 10.0), (1, (4.0 * l[3] + 4.0 * l[4] + 2.0 * l[5]) / 10.0)];
    assert_eq!(fit.epoch_losses, want);
    assert_eq!(fit.mean_loss_last_epoch(), Some(want[1].1));
    assert_eq!(fit.final_loss(), Some(l[5] as f32));
}

fn batch_of(x: Vec<f32>, shape: Vec<usize>, y: Targets) -> Batch {
    let ds = Dataset { x, sample_shape: shape, y };
    let n = ds.len();
    ds.batch(&(0..n).collect::<Vec<_>>()).unwrap()
}

#[test]
fn accuracy_mse_r2_and_perplexity_match_hand_computations() {
    let dev = Device::cpu();
    // Accuracy: argmax of [0.1, 0.9], [0.8, 0.2], [0.3, 0.7] against labels 1, 1, 1 -> 2/3; a
    // tie takes the first class and a NaN is the largest value (torch.argmax): 3/5.
    let logits = Tensor::from_vec(vec![0.1, 0.9, 0.8, 0.2, 0.3, 0.7, 0.5, 0.5, f32::NAN, 1.0], [5, 2], &dev).unwrap();
    let b = batch_of(vec![0.0; 5], vec![1], Targets::Classes { labels: vec![1, 1, 1, 0, 1], classes: 2 });
    let mut acc = Accuracy::new();
    acc.update(&logits, &b).unwrap();
    assert!((acc.finish() - 3.0 / 5.0).abs() < 1e-12);

    // MSE and R² over two batches of two output columns, against sklearn's definitions.
    let (p1, y1) = (vec![1.0, 2.0, 3.0, 5.0], vec![1.5, 2.0, 2.0, 4.0]);
    let (p2, y2) = (vec![0.0, 1.0], vec![0.5, 3.0]);
    let mut mse = Mse::new();
    let mut r2 = R2::new();
    for (p, y) in [(&p1, &y1), (&p2, &y2)] {
        let rows = p.len() / 2;
        let out = Tensor::from_vec(p.clone(), [rows, 2], &dev).unwrap();
        let b = batch_of(vec![0.0; rows], vec![1], Targets::Values { data: y.clone(), shape_per_sample: vec![2] });
        mse.update(&out, &b).unwrap();
        r2.update(&out, &b).unwrap();
    }
    let (p, y): (Vec<f64>, Vec<f64>) = (p1.iter().chain(&p2).map(|&v| v as f64).collect(), y1.iter().chain(&y2).map(|&v| v as f64).collect());
    let want_mse = p.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f64>() / 6.0;
    assert!((mse.finish() - want_mse).abs() < 1e-9);
    let col_r2 = |c: usize| {
        let ys: Vec<f64> = (0..3).map(|r| y[r * 2 + c]).collect();
        let mean = ys.iter().sum::<f64>() / 3.0;
        let ss_tot: f64 = ys.iter().map(|v| (v - mean).powi(2)).sum();
        let ss_res: f64 = (0..3).map(|r| (y[r * 2 + c] - p[r * 2 + c]).powi(2)).sum();
        1.0 - ss_res / ss_tot
    };
    let want_r2 = (col_r2(0) + col_r2(1)) / 2.0;
    assert!((r2.finish() - want_r2).abs() < 1e-9, "R² differs from sklearn's r2_score");

    // Perplexity of per-token logits [B, T, V] is exp of the mean cross-entropy.
    let logits = Tensor::from_vec((0..12).map(|i| (i as f32 * 0.37).sin()).collect(), [1, 4, 3], &dev).unwrap();
    let b = Batch::tokens(vec![0, 1, 2, 0], vec![2, 0, 1, 1], 4, 3).unwrap();
    let mut ppl = Perplexity::new();
    ppl.update(&logits, &b).unwrap();
    let ce = logits.reshape([4, 3]).unwrap().cross_entropy(&Tensor::from_labels(vec![2, 0, 1, 1], [4], &dev).unwrap()).unwrap().to_scalar().unwrap();
    assert!((ppl.finish() - (ce as f64).exp()).abs() < 1e-5);

    // A metric on the wrong kind of targets says so.
    let values = batch_of(vec![0.0; 2], vec![1], Targets::Values { data: vec![0.0, 1.0], shape_per_sample: vec![1] });
    let e = Accuracy::new().update(&Tensor::zeros([2, 1], &dev).unwrap(), &values).unwrap_err();
    assert!(e.to_string().contains("Accuracy"), "{e}");
}

#[test]
fn a_non_finite_loss_stops_naming_the_newest_finite_checkpoint() {
    let dir = temp("nan");
    // A learning rate this large diverges within a few dozen steps.
    let mut t = regression_trainer(1e4).steps(500).checkpoints(Checkpoints::new(&dir).every(1));
    let err = t.fit(&mut loader(32, 8)).unwrap_err();
    let Error::NonFinite { step, kept, .. } = &err else { panic!("expected NonFinite, got {err}") };
    let kept = kept.as_ref().expect("a checkpoint was written before the blow-up");
    assert!(kept.exists());
    assert!(kept.to_string_lossy().contains(&format!("ckpt-{:08}", step - 1)), "{err}");
    assert!(err.to_string().contains("newest finite checkpoint"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_refuses_other_settings_and_a_fresh_run_refuses_a_used_directory() {
    let dir = temp("mismatch");
    let mut t = regression_trainer(0.01).steps(4).checkpoints(Checkpoints::new(&dir).every(2)).settings(serde_json::json!({"batch": 8}), 0);
    t.fit(&mut loader(32, 8)).unwrap();
    drop(t);
    let mut again = regression_trainer(0.01).steps(4).checkpoints(Checkpoints::new(&dir));
    assert!(matches!(again.fit(&mut loader(32, 8)), Err(Error::CheckpointsPresent { count: 2, .. })));
    drop(again);
    let mut other = regression_trainer(0.01).steps(8).checkpoints(Checkpoints::new(&dir).resume()).settings(serde_json::json!({"batch": 4}), 3);
    let err = other.fit(&mut loader(32, 4)).unwrap_err();
    let Error::ResumeMismatch { changed, .. } = &err else { panic!("expected ResumeMismatch, got {err}") };
    assert_eq!(changed, &["batch 4 (checkpoint: 8)", "seed 3 (checkpoint: 0)"]);
    drop(other);
    let mut past = regression_trainer(0.01).steps(3).checkpoints(Checkpoints::new(&dir).resume()).settings(serde_json::json!({"batch": 8}), 0);
    let err = past.fit(&mut loader(32, 8)).unwrap_err();
    assert!(err.to_string().contains("past the 3 steps"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stop_before_the_first_step_runs_none_and_one_mid_run_checkpoints_there() {
    let token = StopToken::new();
    token.stop_with(15);
    let mut t = regression_trainer(0.01).steps(10).stop_token(token);
    let fit = t.fit(&mut loader(16, 4)).unwrap();
    assert_eq!((fit.step, fit.stopped), (0, Some(15)));

    /// Asks for a stop at step 3.
    struct StopAt(StopToken);
    impl Observer for StopAt {
        fn step(&mut self, s: &StepInfo<'_>) {
            if s.step == 3 {
                self.0.stop();
            }
        }
    }
    let dir = temp("stop");
    let log = Log::default();
    let t = regression_trainer(0.01).steps(10).checkpoints(Checkpoints::new(&dir).every(5)).observe(log.clone());
    let token = t.stopper();
    let mut t = t.observe(StopAt(token));
    let fit = t.fit(&mut loader(16, 4)).unwrap();
    assert_eq!((fit.step, fit.stopped), (3, Some(1)));
    assert!(log.0.borrow().contains(&"ckpt 3".to_string()), "a stopped run checkpoints where it stopped: {:?}", log.0.borrow());
    assert!(fit.checkpoint.unwrap().ends_with("ckpt-00000003.safetensors"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn retention_keeps_the_newest_files_of_the_run() {
    let dir = temp("keep");
    let mut t = regression_trainer(0.01).steps(6).checkpoints(Checkpoints::new(&dir).every(1).keep(2));
    t.fit(&mut loader(16, 4)).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("ckpt-")).collect();
    names.sort();
    assert_eq!(names, ["ckpt-00000005.safetensors", "ckpt-00000006.safetensors"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The training guide's hand-written loop: forwards under `nn::with_samples` keyed by the step,
/// and weights, optimizer state and loader position saved, resume bit for bit.
#[test]
fn a_hand_written_loop_resumes_exactly() {
    use tandem::nn::{with_samples, Dropout, Module, SampleContext};
    use tandem::optim::{Adam, AdamConfig, Optimizer};
    let dev = Device::cpu();
    let build = || {
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
        Sequential::new()
            .push("0", Linear::new(3, 16, &mut rng, &dev).unwrap())
            .push("1", ReLU)
            .push("2", Dropout::new(0.5).unwrap().seed(4))
            .push("3", Linear::new(16, 1, &mut rng, &dev).unwrap())
    };
    let train = |model: &Sequential, opt: &mut Adam, loader: &mut DataLoader, steps: std::ops::Range<u64>| {
        for step in steps {
            let batch = loader.next_batch();
            let (x, y) = tandem::parallel::batch_to_device(&batch, &dev).unwrap();
            let ctx = SampleContext { step, first_sample: 0, samples: batch.len() };
            let loss = with_samples(ctx, || model.forward(&x)).unwrap().mse_loss(&y).unwrap();
            opt.zero_grad();
            loss.backward().unwrap();
            opt.step().unwrap();
        }
    };
    let cfg = AdamConfig { lr: 1e-2, ..Default::default() };
    let whole = build();
    let mut opt = Adam::new(whole.parameters(), cfg).unwrap();
    train(&whole, &mut opt, &mut loader(20, 6), 0..8);

    let first = build();
    let mut opt = Adam::new(first.parameters(), cfg).unwrap();
    let mut data = loader(20, 6);
    train(&first, &mut opt, &mut data, 0..4);
    let (weights, (state, steps), position) = (first.state_dict(), opt.state(), data.state());
    drop((first, opt, data));

    let resumed = build();
    resumed.load_state_dict(&weights).unwrap();
    let mut opt = Adam::new(resumed.parameters(), cfg).unwrap();
    opt.load_state(&state, steps).unwrap();
    let mut data = loader(20, 6);
    data.set_state(position).unwrap();
    train(&resumed, &mut opt, &mut data, 4..8);
    for ((n, a), (_, b)) in whole.state_dict().iter().zip(resumed.state_dict().iter()) {
        let (a, b) = (a.to_vec().unwrap(), b.to_vec().unwrap());
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{n} differs after resuming");
    }
}

/// A source whose short last batch a pipeline cannot split is refused before the first step.
#[test]
fn batches_a_strategy_cannot_take_are_refused_before_the_first_step() {
    use tandem::parallel::{Pipeline, Split, Stages};
    let cpu = || Device::from_backend(std::sync::Arc::new(tandem::backend::cpu::CpuBackend::new()));
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, ..Default::default() });
    let pipe = Pipeline::builder(Stages::Split(&mlp(3, 1), Split::At(vec![2])), &[cpu(), cpu()], &opt, Loss::Mse).micro_batches(4).build().unwrap();
    let log = Log::default();
    let mut t = Trainer::new(pipe).steps(10).observe(log.clone());
    // 18 samples in batches of 8: the last batch of 2 does not split into 4 micro-batches.
    let err = t.fit(&mut loader(18, 8)).unwrap_err();
    assert!(err.to_string().contains("micro"), "{err}");
    assert!(log.0.borrow().is_empty(), "a step ran before the refusal");
}

/// A directory opened before training (as the command line does, to fail before reading data)
/// stays locked until the trainer is dropped: no gap in which another run could take it.
#[test]
fn an_opened_run_directory_stays_locked_through_training() {
    use tandem::train::{Claim, RunDir};
    let dir = temp("opened");
    let open = RunDir::open(&dir, Claim::Fresh).unwrap();
    let mut t = regression_trainer(0.01).steps(4).checkpoints(Checkpoints::opened(open).every(2));
    assert!(matches!(RunDir::open(&dir, Claim::Resume), Err(Error::InUse { .. })), "the lock was let go before training");
    let fit = t.fit(&mut loader(16, 4)).unwrap();
    assert!(fit.checkpoint.unwrap().ends_with("ckpt-00000004.safetensors"));
    assert!(matches!(RunDir::open(&dir, Claim::Resume), Err(Error::InUse { .. })), "the lock was let go after training");
    drop(t);
    RunDir::open(&dir, Claim::Resume).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each forward's thread name and whether it recorded history.
type Seen = Arc<std::sync::Mutex<Vec<(Option<String>, bool)>>>;

/// A model that notes the thread and the history mode of each forward.
struct Watched {
    inner: Sequential,
    seen: Seen,
}

impl tandem::nn::Module for Watched {
    fn forward(&self, x: &Tensor) -> tandem::Result<Tensor> {
        self.seen.lock().unwrap().push((std::thread::current().name().map(str::to_string), tandem::autograd::is_enabled()));
        self.inner.forward(x)
    }
    fn describe(&self) -> String {
        "Watched".into()
    }
    fn children(&self) -> Vec<(String, &dyn tandem::nn::Module)> {
        vec![("inner".into(), &self.inner)]
    }
}

/// Steps and validation of a strategy on the CPU run on the CPU pool's threads (no hand-off
/// per op), with the settings they would have had on the caller's; on a GPU alone they stay
/// on the caller's thread.
#[test]
fn a_cpu_strategy_steps_and_validates_on_the_cpu_pool() {
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, ..Default::default() });
    let caller = std::thread::current().name().map(str::to_string);
    let wgpu = Device::open(tandem::BackendKind::Wgpu, 0).expect("a wgpu adapter (lavapipe in CI)");
    for dev in [Device::cpu(), wgpu] {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
        let inner = Sequential::new()
            .push("0", Linear::new(3, 8, &mut rng, &dev).unwrap())
            .push("1", ReLU)
            .push("2", Linear::new(8, 1, &mut rng, &dev).unwrap());
        let model = Watched { inner, seen: seen.clone() };
        let val = DataLoader::new(Arc::new(synthetic::regression(6, 3, 5).unwrap()), 3, false, 0).unwrap();
        let mut t = Trainer::new(Single::new(model, &opt, Loss::Mse, &dev).unwrap()).steps(3).validate(3, val, vec![Box::new(Mse::new())]);
        t.fit(&mut loader(12, 4)).unwrap();
        let seen = seen.lock().unwrap().clone();
        // Three steps with history, then the two validation batches without.
        assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), [true, true, true, false, false], "on {}", dev.spec());
        let on_cpu = dev.info().backend == tandem::BackendKind::Cpu;
        for (thread, _) in &seen {
            let pool = thread.as_deref().is_some_and(|n| n.starts_with("tandem-cpu-"));
            assert!(if on_cpu { pool } else { *thread == caller }, "a forward on {} ran on {thread:?}", dev.spec());
        }
    }
}
