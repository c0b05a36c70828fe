//! DataParallel against the single-device reference: 10 steps of the seed CNN, losses and
//! weights compared with the one tolerance helper.
//!
//! Devices come from `devices(n)`: `n` independent CPU devices, or the devices named by
//! `TANDEM_TEST_DEVICES` (such as `cpu,wgpu:0,wgpu:1`) when it is set.
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::data::{synthetic, Batch};
use tandem::nn::models::SeedModel;
use tandem::nn::Sequential;
use tandem::optim::{AdamConfig, SgdConfig};
use tandem::parallel::comm::PeerRing;
use tandem::parallel::{assign_buckets, DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Single, StepEvent, Strategy};
use tandem::tolerance::assert_close;
use tandem::{Device, Error};

const STEPS: usize = 10;

fn cpu_devices(n: usize) -> Vec<Device> {
    (0..n).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect()
}

/// `n` devices: independent CPU devices, or `TANDEM_TEST_DEVICES`' first `n` (all of them if
/// it names fewer).
fn devices(n: usize) -> Vec<Device> {
    match std::env::var("TANDEM_TEST_DEVICES") {
        Ok(spec) => {
            let mut d = Device::parse(&spec).expect("TANDEM_TEST_DEVICES names devices");
            d.truncate(n.max(1));
            d
        }
        Err(_) => cpu_devices(n),
    }
}

fn model() -> Sequential {
    SeedModel::Cnn.build(7, &Device::cpu()).unwrap()
}

fn sgd() -> OptimConfig {
    OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })
}

/// `STEPS` batches of `size` seed images (different each step).
fn batches(size: usize) -> Vec<Batch> {
    let ds = synthetic::seed_images(size * STEPS, 3).unwrap();
    (0..STEPS).map(|s| ds.batch(&(s * size..(s + 1) * size).collect::<Vec<_>>()).unwrap()).collect()
}

/// Losses of every step and the final weights (flattened, state_dict order).
fn train(strategy: &mut dyn Strategy, batches: &[Batch]) -> (Vec<f32>, Vec<f32>) {
    let losses = batches.iter().map(|b| strategy.step(b).unwrap().loss).collect();
    (losses, flat_weights(strategy))
}

fn flat_weights(strategy: &dyn Strategy) -> Vec<f32> {
    strategy.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect()
}

fn reference(opt: &OptimConfig, batches: &[Batch]) -> (Vec<f32>, Vec<f32>) {
    let mut single = Single::new(model(), opt, Loss::CrossEntropy, &cpu_devices(1)[0]).unwrap();
    train(&mut single, batches)
}

/// Every replica holds the same weights as replica 0, bit for bit.
fn assert_replicas_identical(dp: &DataParallel) {
    let replicas = dp.replica_parameters();
    for (r, params) in replicas.iter().enumerate().skip(1) {
        for ((name, t), (_, t0)) in params.iter().zip(&replicas[0]) {
            assert_close(&format!("replica {r} {name}"), &t.to_vec().unwrap(), &t0.to_vec().unwrap(), 0.0, 0.0);
        }
    }
}

fn data_parallel(n: usize, cfg: DataParallelConfig, opt: &OptimConfig) -> DataParallel {
    DataParallel::new(&model(), &devices(n), opt, Loss::CrossEntropy, cfg).unwrap()
}

fn check_against_single(what: &str, dp: &mut DataParallel, opt: &OptimConfig, batches: &[Batch]) {
    let (want_l, want_w) = reference(opt, batches);
    let (got_l, got_w) = train(dp, batches);
    assert_close(&format!("{what} losses"), &got_l, &want_l, 1e-5, 1e-4);
    assert_close(&format!("{what} weights"), &got_w, &want_w, 1e-4, 1e-4);
    assert_replicas_identical(dp);
}

#[test]
fn matches_single_on_2_and_3_devices() {
    let b = batches(24);
    for n in [2, 3] {
        let mut dp = data_parallel(n, DataParallelConfig::default(), &sgd());
        check_against_single(&format!("{n} devices"), &mut dp, &sgd(), &b);
    }
}

#[test]
fn peer_ring_communicator_matches_single() {
    // The CUDA algorithm, staged through the host here; 25 samples over 3 devices.
    let b = batches(25);
    let comm = Box::new(PeerRing::new(&devices(3)).unwrap());
    let mut dp =
        DataParallel::with_communicator(&model(), comm, &sgd(), Loss::CrossEntropy, DataParallelConfig { bucket_bytes: 4096, ..Default::default() })
            .unwrap();
    assert_eq!(dp.communicator().name(), "peer-ring");
    check_against_single("peer ring", &mut dp, &sgd(), &b);
}

#[test]
fn uneven_and_weighted_splits() {
    // 25 samples over 3 devices (9, 8, 8), and 3:1 weights over 2 (19, 6 of 25).
    let b = batches(25);
    let mut dp = data_parallel(3, DataParallelConfig::default(), &sgd());
    check_against_single("25 over 3", &mut dp, &sgd(), &b);
    let cfg = DataParallelConfig { weights: Some(vec![3.0, 1.0]), ..Default::default() };
    let mut dp = data_parallel(2, cfg, &sgd());
    check_against_single("weights 3:1", &mut dp, &sgd(), &b);
    assert_eq!(dp.split_weights(), Some(&[3.0, 1.0][..]));
}

#[test]
fn calibrated_split_matches_single() {
    let b = batches(24);
    let cfg = DataParallelConfig { calibrate: true, ..Default::default() };
    let mut dp = data_parallel(2, cfg, &sgd());
    check_against_single("calibrated", &mut dp, &sgd(), &b);
    let w = dp.split_weights().expect("measured on the first step");
    assert!(w.len() == 2 && w.iter().all(|x| x.is_finite() && *x > 0.0), "{w:?}");
}

#[test]
fn gradient_accumulation_equals_one_micro_batch() {
    let b = batches(24);
    let cfg = DataParallelConfig { micro_batches: 2, ..Default::default() };
    let mut dp = data_parallel(2, cfg, &sgd());
    check_against_single("2 micro-batches", &mut dp, &sgd(), &b);
    // 3 micro-batches of an uneven shard (25 over 2: 13 and 12 samples).
    let b = batches(25);
    let cfg = DataParallelConfig { micro_batches: 3, ..Default::default() };
    let mut dp = data_parallel(2, cfg, &sgd());
    check_against_single("3 micro-batches", &mut dp, &sgd(), &b);
}

#[test]
fn deterministic_mode_is_bit_identical_across_device_counts() {
    let b = batches(24);
    let cfg = DataParallelConfig { deterministic: true, deterministic_shards: 4, ..Default::default() };
    // Devices of different kernels (TANDEM_TEST_DEVICES=cpu,wgpu:0,...) compute their
    // micro-shards' gradients with different rounding, so the count then changes the bits; the
    // promise left is that the same devices repeat the same run.
    let kernels = |d: &Device| (d.info().backend, d.info().name.clone(), d.info().driver.clone());
    let all = devices(4);
    let counts: &[usize] = if all.iter().all(|d| kernels(d) == kernels(&all[0])) { &[1, 2, 4] } else { &[4, 4] };
    let runs: Vec<(Vec<f32>, Vec<f32>)> = counts
        .iter()
        .map(|&n| {
            let mut dp = data_parallel(n, cfg.clone(), &sgd());
            let out = train(&mut dp, &b);
            assert_replicas_identical(&dp);
            out
        })
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for (i, (l, w)) in runs.iter().enumerate().skip(1) {
        assert_eq!(bits(l), bits(&runs[0].0), "losses of run {i} differ in bits");
        assert_eq!(bits(w), bits(&runs[0].1), "weights of run {i} differ in bits");
    }
    // Deterministic is still the full-batch step, within rounding.
    let (want_l, want_w) = reference(&sgd(), &b);
    assert_close("deterministic losses", &runs[0].0, &want_l, 1e-5, 1e-4);
    assert_close("deterministic weights", &runs[0].1, &want_w, 1e-4, 1e-4);
}

#[test]
fn buckets_by_size_in_reverse_order() {
    // Sizes in bytes, state_dict order; cap 100.
    let sizes = [40, 30, 500, 20, 50, 60];
    let b = assign_buckets(&sizes, 100);
    assert_eq!(b, vec![vec![5], vec![4, 3], vec![2], vec![1, 0]]);
    for bucket in &b {
        let bytes: usize = bucket.iter().map(|&p| sizes[p]).sum();
        assert!(bytes <= 100 || bucket.len() == 1, "cap respected except for one oversized parameter");
    }
    assert_eq!(assign_buckets(&sizes, 0).len(), sizes.len(), "cap 0: one parameter per bucket");
    assert_eq!(assign_buckets(&sizes, usize::MAX), vec![vec![5, 4, 3, 2, 1, 0]]);

    // The seed CNN: fc1.weight (64000 bytes) is over a 10 000-byte cap and stands alone.
    let cfg = DataParallelConfig { bucket_bytes: 10_000, ..Default::default() };
    let dp = data_parallel(2, cfg, &sgd());
    let names = dp.buckets();
    assert_eq!(names[0], ["fc2.bias", "fc2.weight", "fc1.bias"]);
    assert!(names.contains(&vec!["fc1.weight".to_string()]));
    assert_eq!(names.last().unwrap().last().unwrap(), "conv1.weight");
}

#[test]
fn first_bucket_all_reduce_starts_before_backward_ends() {
    // A 1-byte cap gives every parameter its own bucket: the fc2 buckets finish long before
    // the conv layers' gradients.
    let cfg = DataParallelConfig { bucket_bytes: 1, ..Default::default() };
    let mut dp = data_parallel(2, cfg, &sgd());
    let trace = tandem::parallel::trace::Trace::new();
    dp.set_trace(trace.clone());
    let b = batches(32);
    let report = dp.step(&b[0]).unwrap();
    let tracks = trace.tracks();
    for (i, d) in dp.devices().iter().enumerate() {
        for t in [format!("dp{i}:{}", d.spec()), format!("dp{i}:{} comm", d.spec())] {
            assert!(tracks.contains(&t), "track {t} in {tracks:?}");
        }
    }
    assert!(trace.to_json().contains("all-reduce bucket 0"));
    let events = dp.last_step_events();
    let first_launch = events.iter().find_map(|e| match e {
        StepEvent::BucketLaunched { at, .. } => Some(*at),
        _ => None,
    });
    let last_backward = events.iter().filter_map(|e| match e {
        StepEvent::BackwardDone { at, .. } => Some(*at),
        _ => None,
    });
    let (first_launch, last_backward) = (first_launch.expect("a bucket was launched"), last_backward.max().expect("backward finished"));
    assert!(first_launch < last_backward, "events: {events:?}");
    assert_eq!(events.iter().filter(|e| matches!(e, StepEvent::BucketLaunched { .. })).count(), 8);
    assert!(report.overlap > 0.0 && report.overlap <= 1.0, "overlap {}", report.overlap);
    assert!(report.comm_s > 0.0 && report.compute_s > 0.0);
    assert_eq!(report.peak_memory.len(), 2);
}

#[test]
fn zero1_matches_unsharded_with_less_state_per_device() {
    let adam = OptimConfig::adam(AdamConfig { lr: 1e-3, ..Default::default() });
    let b = batches(24);
    let mut plain = data_parallel(2, DataParallelConfig::default(), &adam);
    let mut sharded = data_parallel(2, DataParallelConfig { shard: Shard::Optimizer, ..Default::default() }, &adam);
    let (pl, pw) = train(&mut plain, &b);
    let (sl, sw) = train(&mut sharded, &b);
    assert_close("zero1 losses", &sl, &pl, 1e-6, 1e-6);
    assert_close("zero1 weights", &sw, &pw, 1e-6, 1e-6);
    assert_replicas_identical(&sharded);

    let full = plain.optimizer_state_bytes();
    let parts = sharded.optimizer_state_bytes();
    println!("optimizer state bytes per device: unsharded {full:?}, ZeRO-1 {parts:?}");
    assert!(parts.iter().all(|&p| p < full[0]), "each device holds less: {parts:?} vs {full:?}");
    assert_eq!(parts.iter().sum::<u64>(), full[0], "the shards cover the state exactly once");

    // The gathered state equals the unsharded optimizer's, name for name.
    let (ps, psteps) = plain.optimizer_state().unwrap();
    let (ss, ssteps) = sharded.optimizer_state().unwrap();
    assert_eq!(psteps, ssteps);
    assert_eq!(ps.iter().map(|(n, _)| n).collect::<Vec<_>>(), ss.iter().map(|(n, _)| n).collect::<Vec<_>>());
    for ((name, a), (_, b)) in ps.iter().zip(&ss) {
        assert_close(name, &b.to_vec().unwrap(), &a.to_vec().unwrap(), 1e-6, 1e-6);
    }
}

#[test]
fn checkpoint_round_trip_and_predict() {
    let b = batches(24);
    let mut dp = data_parallel(2, DataParallelConfig::default(), &sgd());
    dp.step(&b[0]).unwrap();
    let state = dp.state_dict().unwrap();
    let (opt_state, steps) = dp.optimizer_state().unwrap();
    let mut other = data_parallel(3, DataParallelConfig::default(), &sgd());
    other.load_state_dict(&state).unwrap();
    other.load_optimizer_state(&opt_state, steps).unwrap();
    assert_replicas_identical(&other);
    let (a, c) = (dp.step(&b[1]).unwrap().loss, other.step(&b[1]).unwrap().loss);
    assert_close("loss after loading", &[c], &[a], 1e-5, 1e-4);
    let out = dp.predict(&tandem::parallel::inputs_to_device(&b[2], &Device::cpu()).unwrap()).unwrap();
    assert_eq!(out.dims(), &[24, 10]);
}

#[test]
fn bad_input_is_an_error() {
    let no_devices = DataParallel::new(&model(), &[], &sgd(), Loss::CrossEntropy, DataParallelConfig::default());
    assert!(matches!(no_devices, Err(Error::Invalid { .. })));

    let mut dp = data_parallel(3, DataParallelConfig::default(), &sgd());

    // Regression rows of 10 features into a CNN that wants [1, 28, 28]: the op's error, as
    // the failure of the replica that met it.
    let rows = synthetic::regression(6, 10, 1).unwrap().batch(&[0, 1, 2, 3, 4, 5]).unwrap();
    let err = dp.step(&rows).expect_err("rows into a CNN");
    assert!(matches!(&err, Error::Worker { source, .. } if matches!(**source, Error::Shape { .. })), "{err}");
    // MSE against class labels: the loss's error, from inside a worker.
    let mut mse = DataParallel::new(&model(), &devices(2), &sgd(), Loss::Mse, DataParallelConfig::default()).unwrap();
    assert!(mse.step(&batches(4)[0]).is_err());

    let bad_weights = DataParallelConfig { weights: Some(vec![1.0]), ..Default::default() };
    assert!(DataParallel::new(&model(), &devices(2), &sgd(), Loss::CrossEntropy, bad_weights).is_err());
    let zero_micro = DataParallelConfig { micro_batches: 0, ..Default::default() };
    assert!(DataParallel::new(&model(), &devices(2), &sgd(), Loss::CrossEntropy, zero_micro).is_err());
}
