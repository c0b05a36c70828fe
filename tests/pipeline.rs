//! Pipeline parallelism: GPipe and 1F1B give `Single`'s losses and weights; schedules are
//! checked by simulation; recompute, traces, statistics and every construction error.
//!
//! Devices are independent CPU reference devices, or `TANDEM_TEST_DEVICES` (such as
//! `cpu,wgpu:0,wgpu:1`), cycled to the number of stages a test needs.
mod common;
#[path = "common/watched.rs"]
mod watched;
use common::{cpu_devices, cycled_devices, seed_image_batches};
use tandem::data::Batch;
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::pipeline::{schedule, simulate, Action, Pipeline, Plan, Schedule};
use tandem::parallel::{Loss, OptimConfig, PipelineGrid, Single, Split, Stages, Strategy};
use tandem::tolerance::assert_close;
use tandem::{Device, Result};
use watched::{watched_cpu, Call};

fn opt() -> OptimConfig {
    OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })
}

/// Losses of every step and the final weights (flattened, in state_dict order).
fn train(strategy: &mut dyn Strategy, data: &[Batch]) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let losses = data.iter().map(|b| strategy.step(b).unwrap().loss).collect();
    let weights = strategy.state_dict().unwrap().into_iter().map(|(n, t)| (n, t.to_vec().unwrap())).collect();
    (losses, weights)
}

fn reference(data: &[Batch]) -> (Vec<f32>, Vec<(String, Vec<f32>)>) {
    let dev = cycled_devices(1).remove(0);
    let model = SeedModel::Cnn.build(7, &dev).unwrap();
    train(&mut Single::new(model, &opt(), Loss::CrossEntropy, &dev).unwrap(), data)
}

fn same_as_reference(what: &str, got: &(Vec<f32>, Vec<(String, Vec<f32>)>), want: &(Vec<f32>, Vec<(String, Vec<f32>)>)) {
    assert_close(&format!("{what}: losses"), &got.0, &want.0, 1e-5, 1e-4);
    let names = |w: &[(String, Vec<f32>)]| w.iter().map(|p| p.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got.1), names(&want.1), "{what}: parameter names");
    for ((name, g), (_, w)) in got.1.iter().zip(&want.1) {
        assert_close(&format!("{what}: {name}"), g, w, 1e-5, 1e-4);
    }
}

fn pipeline(stages_n: usize, split: Split, m: usize, kind: Schedule, recompute: bool) -> Pipeline {
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    let stages = Stages::Split(&model, split);
    Pipeline::builder(stages, &cycled_devices(stages_n), &opt(), Loss::CrossEntropy)
        .micro_batches(m)
        .schedule(kind)
        .recompute(recompute)
        .build()
        .unwrap()
}

#[test]
fn gpipe_and_1f1b_match_single_over_ten_steps() {
    let data = seed_image_batches(16, 10, 11);
    let want = reference(&data);
    for kind in [Schedule::GPipe, Schedule::OneFOneB] {
        for (stages, split) in [(2, Split::At(vec![4])), (3, Split::At(vec![3, 7]))] {
            for m in [2, 4] {
                let got = train(&mut pipeline(stages, split.clone(), m, kind, false), &data);
                same_as_reference(&format!("{kind:?} p={stages} m={m}"), &got, &want);
            }
        }
    }
}

#[test]
fn recompute_and_auto_split_match_single() {
    let data = seed_image_batches(16, 10, 11);
    let want = reference(&data);
    let got = train(&mut pipeline(3, Split::At(vec![2, 8]), 4, Schedule::OneFOneB, true), &data);
    same_as_reference("1F1B with recompute", &got, &want);
    let got = train(&mut pipeline(2, Split::At(vec![5]), 2, Schedule::GPipe, true), &data);
    same_as_reference("GPipe with recompute", &got, &want);
    let mut auto = pipeline(2, Split::Auto, 2, Schedule::OneFOneB, false);
    let got = train(&mut auto, &data);
    same_as_reference("1F1B with Split::Auto", &got, &want);
    let ranges = auto.ranges();
    assert_eq!((ranges[0].start, ranges[1].end), (0, 10), "{ranges:?}");
}

/// Positions of each micro-batch's forward and backward in one stage's list.
fn position(list: &[Action], a: Action) -> usize {
    list.iter().position(|x| *x == a).unwrap_or_else(|| panic!("{a} missing from {list:?}"))
}

#[test]
fn schedules_respect_dependencies_and_bound_activations() {
    for kind in [Schedule::GPipe, Schedule::OneFOneB] {
        for p in 1..=4 {
            for m in 1..=8 {
                let plan = schedule(kind, p, m);
                let text = Plan(&plan).to_string();
                // Finishing the dataflow simulation means no deadlock.
                let sim = simulate(&plan, m, 1.0, 2.0).unwrap_or_else(|e| panic!("{kind:?} p={p} m={m}: {e}\n{text}"));
                for (s, list) in plan.iter().enumerate() {
                    for mb in 0..m {
                        assert!(position(list, Action::Forward(mb)) < position(list, Action::Backward(mb)), "{text}");
                        let (f, b) = (position(list, Action::Forward(mb)), position(list, Action::Backward(mb)));
                        if s + 1 < p {
                            let next = &plan[s + 1];
                            let (nf, nb) = (position(next, Action::Forward(mb)), position(next, Action::Backward(mb)));
                            assert!(sim.timeline[s + 1][nf].0 >= sim.timeline[s][f].1, "forward {mb} on {} before {s}\n{text}", s + 1);
                            assert!(sim.timeline[s][b].0 >= sim.timeline[s + 1][nb].1, "backward {mb} on {s} before {}\n{text}", s + 1);
                        }
                    }
                    let mut in_flight: i64 = 0;
                    let mut most = 0;
                    for a in list {
                        in_flight += if matches!(a, Action::Forward(_)) { 1 } else { -1 };
                        most = most.max(in_flight);
                    }
                    assert_eq!(most as usize, sim.max_in_flight[s]);
                    match kind {
                        Schedule::GPipe => assert_eq!(most as usize, m, "{text}"),
                        Schedule::OneFOneB => assert!(most as usize <= p.min(m), "stage {s}: {most} in flight\n{text}"),
                    }
                }
            }
        }
    }
}

#[test]
fn trace_has_one_track_per_device_and_parses() {
    let mut pipe = pipeline(3, Split::At(vec![3, 7]), 2, Schedule::OneFOneB, false);
    let trace = tandem::parallel::trace::Trace::new();
    pipe.set_trace(trace.clone());
    pipe.step(&seed_image_batches(8, 1, 11)[0]).unwrap();
    let path = std::env::temp_dir().join(format!("tandem-pipeline-trace-{}.json", std::process::id()));
    trace.write(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let tracks: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "M").collect();
    assert_eq!(tracks.len(), 3, "{tracks:?}");
    for cat in ["forward", "backward", "optimizer"] {
        for tid in 0..3 {
            assert!(events.iter().any(|e| e["cat"] == cat && e["tid"] == tid), "no {cat} span on track {tid}");
        }
    }
    assert!(events.iter().any(|e| e["cat"] == "comm"), "no comm span");
}

/// Bubble and activation memory of the seed CNN over two CPU stages, printed as a table.
#[test]
fn bubble_and_activation_memory_are_measured() {
    let data = seed_image_batches(32, 3, 11);
    // Split::Auto balances the stages by measured time, so that the bubble is the schedule's
    // and not the imbalance's.
    println!("p=2, batch 32, seed CNN, Split::Auto | bubble measured / theoretical, busy and idle s per stage, peak activation bytes per stage");
    for m in [1, 2, 4, 8] {
        for kind in [Schedule::GPipe, Schedule::OneFOneB] {
            let mut pipe = pipeline(2, Split::Auto, m, kind, false);
            for b in &data {
                pipe.step(b).unwrap();
            }
            let st = pipe.last_stats().unwrap().clone();
            let ms = |v: &[f64]| v.iter().map(|x| format!("{:.1}ms", x * 1e3)).collect::<Vec<_>>().join(" ");
            println!(
                "{kind:?} m={m} stages {:?}: {:.3} / {:.3}, busy {} idle {}, activations {:?}",
                pipe.ranges(),
                st.bubble_measured,
                st.bubble_theoretical,
                ms(&st.busy_s),
                ms(&st.idle_s),
                st.peak_activation_bytes
            );
            assert!((0.0..1.0).contains(&st.bubble_measured), "{st:?}");
            assert!((st.bubble_theoretical - 1.0 / (m as f64 + 1.0)).abs() < 1e-12);
            assert!(st.peak_activation_bytes.iter().all(|&b| b > 0));
        }
    }
    // Stage 0 keeps every micro-batch under GPipe but at most p = 2 under 1F1B.
    let peak = |kind, recompute| {
        let mut pipe = pipeline(2, Split::At(vec![4]), 8, kind, recompute);
        pipe.step(&data[0]).unwrap();
        pipe.last_stats().unwrap().peak_activation_bytes[0]
    };
    let (gpipe, ofob, recomputed) = (peak(Schedule::GPipe, false), peak(Schedule::OneFOneB, false), peak(Schedule::GPipe, true));
    println!("stage 0 peak activations, m=8: GPipe {gpipe} B, 1F1B {ofob} B, GPipe+recompute {recomputed} B");
    assert_eq!(gpipe, 4 * ofob, "8 micro-batches in flight against 2");
    assert!(recomputed < ofob);
}

/// A split that leaves the last stage almost nothing (relu3 and fc2 against both
/// convolutions) has a bubble of about 1/2 whatever m is, and `bubble_of_split` says so, far
/// above the equal-stage theory.
#[test]
fn bubble_of_split_shows_an_unequal_split() {
    let mut pipe = pipeline(2, Split::At(vec![8]), 4, Schedule::OneFOneB, false);
    pipe.step(&seed_image_batches(16, 1, 11)[0]).unwrap();
    let st = pipe.last_stats().unwrap();
    let of_split = st.bubble_of_split.unwrap();
    assert!((st.bubble_theoretical - 0.2).abs() < 1e-12);
    assert!(of_split > 0.35 && of_split < 0.5, "{st:?}");
}

/// A `Linear` that sleeps before its forward: `BASE_MS` while `Split::Auto` times the layers (its
/// first `PROFILE_CALLS` forwards), then `BASE_MS` on device 0 and 10x that on device 1: a device
/// that is slower when the stages run than when it was profiled, as CPU devices sharing cores
/// are. The sleeps are long against scheduling noise on a loaded machine.
struct Sleepy {
    inner: Box<dyn tandem::nn::Module>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    slow: Device,
    here: Option<Device>,
}

/// The profile times each layer three times on each of the two stage devices.
const PROFILE_CALLS: usize = 3 * 2;
const BASE_MS: u64 = 4;

impl tandem::nn::Module for Sleepy {
    fn forward(&self, x: &tandem::Tensor) -> Result<tandem::Tensor> {
        let profiling = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < PROFILE_CALLS;
        let slow = !profiling && self.here.as_ref().is_some_and(|d| d.same(&self.slow));
        std::thread::sleep(std::time::Duration::from_millis(if slow { 10 * BASE_MS } else { BASE_MS }));
        self.inner.forward(x)
    }
    fn children(&self) -> Vec<(String, &dyn tandem::nn::Module)> {
        vec![("inner".into(), &*self.inner)]
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn tandem::nn::Module>> {
        let inner = self.inner.to_device(device)?;
        Ok(Box::new(Sleepy { inner, calls: self.calls.clone(), slow: self.slow.clone(), here: Some(device.clone()) }))
    }
    fn describe(&self) -> String {
        "Sleepy".into()
    }
}

/// `Split::Auto` corrects its split by the stages' measured times (placement's unit tests check
/// the decisions without timing). Four equal layers profile equal, so the first step splits
/// 2 | 2 (unless the machine's noise decides otherwise); device 1 then runs 10x slower, and
/// within the correcting steps the split reaches 3 | 1, the best at 1 : 10. Moving layers
/// mid-training keeps weights and momentum: losses and weights stay `Single`'s.
#[test]
fn auto_split_is_corrected_by_measured_stage_times() {
    let cpu = Device::cpu();
    let devs = cpu_devices(2);
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5);
    let build = |rng: &mut rand_chacha::ChaCha8Rng| {
        let mut model = tandem::nn::Sequential::new().push("flat", tandem::nn::Flatten);
        let mut model_layers = Vec::new();
        for (i, (fan_in, fan_out)) in [(784, 16), (16, 16), (16, 16), (16, 10)].into_iter().enumerate() {
            let inner = Box::new(tandem::nn::Linear::new(fan_in, fan_out, rng, &cpu).unwrap());
            model_layers.push((format!("l{i}"), Sleepy { inner, calls: Default::default(), slow: devs[1].clone(), here: None }));
        }
        for (name, layer) in model_layers {
            model = model.push(&name, layer);
        }
        model
    };
    let model = build(&mut rng);
    let data = seed_image_batches(8, 5, 11);
    // Flatten has no cost of its own: the four Sleepy layers decide the split.
    let mut pipe = Pipeline::builder(Stages::Split(&model, Split::Auto), &devs, &opt(), Loss::CrossEntropy).micro_batches(2).build().unwrap();
    let mut ranges = Vec::new();
    let mut losses = Vec::new();
    for b in &data {
        losses.push(pipe.step(b).unwrap().loss);
        ranges.push(pipe.ranges());
    }
    assert_eq!(ranges[4], vec![0..4, 4..5], "device 1 measured 10x slower: the last layer alone goes there; splits by step {ranges:?}");
    let weights: Vec<(String, Vec<f32>)> = pipe.state_dict().unwrap().into_iter().map(|(n, t)| (n, t.to_vec().unwrap())).collect();
    let single_model = build(&mut <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5));
    let want = train(&mut Single::new(single_model, &opt(), Loss::CrossEntropy, &cpu).unwrap(), &data);
    same_as_reference("Split::Auto corrected mid-training", &(losses, weights), &want);
}

/// A CPU device that reports `memory` bytes of device memory.
fn small_device(memory: u64) -> Device {
    watched_cpu(
        |info| {
            info.memory = Some(memory);
            info.name = format!("CPU with {memory} bytes");
        },
        |_| {},
    )
}

/// The first stage's copies of its micro-batches onto its device are its work (busy time),
/// not bubble: with uploads of 100 ms, 2 micro-batches make stage 0 busy at least 200 ms.
#[test]
fn the_first_stage_counts_its_uploads_as_busy() {
    let slow = watched_cpu(
        |info| info.name = "CPU with slow uploads".into(),
        |call| {
            // A micro-batch of 2 seed images of 28 x 28 floats.
            if matches!(call, Call::Upload(bytes) if bytes.len() == 2 * 784 * 4) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        },
    );
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    let devs = [slow, cycled_devices(1).remove(0)];
    let mut pipe = Pipeline::builder(Stages::Split(&model, Split::At(vec![4])), &devs, &opt(), Loss::CrossEntropy).micro_batches(2).build().unwrap();
    pipe.step(&seed_image_batches(4, 1, 11)[0]).unwrap();
    let st = pipe.last_stats().unwrap();
    assert!(st.busy_s[0] >= 0.2, "{st:?}");
    assert!(st.bubble_of_split.is_some_and(|b| (0.0..1.0).contains(&b)), "{st:?}");
}

fn new_err(model_layers: usize, devices: &[Device], split: Split, m: usize) -> String {
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    assert_eq!(model.len(), model_layers);
    match Pipeline::builder(Stages::Split(&model, split), devices, &opt(), Loss::CrossEntropy).micro_batches(m).schedule(Schedule::GPipe).build() {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn errors_come_before_any_work() {
    // Micro-batches that do not divide the batch: both numbers named, nothing trained.
    let mut pipe = pipeline(2, Split::At(vec![4]), 3, Schedule::GPipe, false);
    let before = pipe.state_dict().unwrap()[0].1.to_vec().unwrap();
    let err = pipe.step(&seed_image_batches(16, 1, 11)[0]).unwrap_err().to_string();
    assert!(err.contains('3') && err.contains("16"), "{err}");
    assert_eq!(pipe.state_dict().unwrap()[0].1.to_vec().unwrap(), before);
    assert!(pipe.last_stats().is_none());

    let err = new_err(10, &cycled_devices(11), Split::Auto, 2);
    assert!(err.contains("11 stages") && err.contains("10 layers"), "{err}");
    for points in [vec![0], vec![10], vec![12]] {
        let err = new_err(10, &cycled_devices(2), Split::At(points.clone()), 2);
        assert!(err.contains("split points"), "{points:?}: {err}");
    }
    let err = new_err(10, &cycled_devices(3), Split::At(vec![6, 4]), 2);
    assert!(err.contains("strictly increasing"), "{err}");
    let err = new_err(10, &cycled_devices(3), Split::At(vec![4]), 2);
    assert!(err.contains("for 3 devices"), "{err}");
    let err = new_err(10, &cycled_devices(2), Split::At(vec![4]), 0);
    assert!(err.contains("at least 1"), "{err}");

    // fc1 alone has 320*50+50 weights: 64 200 bytes, x4 = 256 800 bytes with grads and state.
    let tight = [cycled_devices(1).remove(0), small_device(100_000)];
    let err = new_err(10, &tight, Split::At(vec![4]), 2);
    assert!(err.contains("out of memory") && err.contains("stage 1"), "{err}");
    // Auto moves the big layers to the device that can hold them... when there is one.
    let err = new_err(10, &[small_device(100_000), small_device(100_000)], Split::Auto, 2);
    assert!(err.contains("no split"), "{err}");
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    let fits = [cycled_devices(1).remove(0), small_device(50_000)];
    let pipe = Pipeline::builder(Stages::Split(&model, Split::Auto), &fits, &opt(), Loss::CrossEntropy)
        .micro_batches(2)
        .schedule(Schedule::GPipe)
        .build()
        .unwrap();
    assert_eq!(pipe.ranges()[1], 8..10, "only relu3 and fc2 fit in 50 000 bytes");
}

/// A layer whose forward fails as told: a fault injected into one stage.
#[derive(Clone, Copy)]
enum Faulty {
    Panics,
    Errors,
}

impl tandem::nn::Module for Faulty {
    fn forward(&self, _x: &tandem::Tensor) -> Result<tandem::Tensor> {
        match self {
            Faulty::Panics => panic!("injected fault"),
            Faulty::Errors => Err(tandem::Error::invalid("Faulty", "injected fault")),
        }
    }
    fn to_device(&self, _device: &Device) -> Result<Box<dyn tandem::nn::Module>> {
        Ok(Box::new(*self))
    }
    fn describe(&self) -> String {
        "Faulty".into()
    }
}

/// A stage whose forward panics or errors makes `step` an error naming that stage and its
/// device (not the closed channels its neighbours see), on every step; nothing hangs, and the
/// pipeline drops cleanly afterwards.
#[test]
fn a_failing_stage_is_an_error_naming_it() {
    use tandem::nn::{Flatten, Linear};
    use tandem::Error;
    for fault in [Faulty::Panics, Faulty::Errors] {
        let cpu = Device::cpu();
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
        let model = tandem::nn::Sequential::new()
            .push("flat", Flatten)
            .push("fc1", Linear::new(784, 16, &mut rng, &cpu).unwrap())
            .push("boom", fault)
            .push("fc2", Linear::new(16, 10, &mut rng, &cpu).unwrap());
        let devs = cycled_devices(3);
        let stages = Stages::Split(&model, Split::At(vec![2, 3]));
        let mut pipe = Pipeline::builder(stages, &devs, &opt(), Loss::CrossEntropy).micro_batches(2).build().unwrap();
        for _ in 0..2 {
            let e = pipe.step(&seed_image_batches(4, 1, 11)[0]).unwrap_err();
            let text = e.to_string();
            match &e {
                Error::Worker { role: "pipeline stage", index: 1, device, source } => {
                    assert_eq!(device, &devs[1].to_string());
                    assert!(text.contains("pipeline stage 1") && text.contains(device.as_str()), "{text}");
                    match (fault, &**source) {
                        (Faulty::Panics, Error::Panicked(m)) => assert!(m.contains("injected fault"), "{text}"),
                        (Faulty::Errors, Error::Invalid { op: "Faulty", .. }) => {}
                        _ => panic!("wrong cause: {text}"),
                    }
                }
                _ => panic!("expected stage 1's failure, got {text}"),
            }
        }
        drop(pipe);
    }
}

/// A grid's batch must give every pipeline a sample; the error names the split.
#[test]
fn a_grid_batch_too_small_for_its_pipelines_is_an_error() {
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    let pipeline = |row: &[Device]| Pipeline::builder(Stages::Split(&model, Split::At(vec![4])), row, &opt(), Loss::CrossEntropy).build();
    let mut grid = PipelineGrid::from_factory(&cycled_devices(4), 2, pipeline).unwrap();
    let err = grid.step(&seed_image_batches(1, 1, 11)[0]).unwrap_err().to_string();
    assert!(err.contains("a batch of 1 samples split [1, 0] leaves a pipeline of the 2 without samples"), "{err}");
    grid.step(&seed_image_batches(2, 1, 11)[0]).unwrap();
}

/// A `Linear` that sleeps `BASE_MS` before its forward, 10x that on the `slow` devices.
struct SlowOn {
    inner: Box<dyn tandem::nn::Module>,
    slow: Vec<Device>,
    here: Option<Device>,
}

impl tandem::nn::Module for SlowOn {
    fn forward(&self, x: &tandem::Tensor) -> Result<tandem::Tensor> {
        let slow = self.here.as_ref().is_some_and(|d| self.slow.iter().any(|s| s.same(d)));
        std::thread::sleep(std::time::Duration::from_millis(if slow { 10 * BASE_MS } else { BASE_MS }));
        self.inner.forward(x)
    }
    fn children(&self) -> Vec<(String, &dyn tandem::nn::Module)> {
        vec![("inner".into(), &*self.inner)]
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn tandem::nn::Module>> {
        Ok(Box::new(SlowOn { inner: self.inner.to_device(device)?, slow: self.slow.clone(), here: Some(device.clone()) }))
    }
    fn describe(&self) -> String {
        "SlowOn".into()
    }
}

/// Two `Split::Auto` pipelines whose slow device is stage 1 in one and stage 0 in the other
/// would each measure their own cut (3 | 1 and 1 | 3 layers), and stage s's gradients would
/// differ in length across the grid; every replica takes replica 0's measured cut instead, and
/// the grid still trains as `Single`. Replicas built with different fixed cuts are refused.
#[test]
fn grid_replicas_share_replica_zeros_auto_split() {
    let cpu = Device::cpu();
    let devs = cpu_devices(4);
    let slow = vec![devs[1].clone(), devs[2].clone()];
    let build = || {
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
        let mut model = tandem::nn::Sequential::new().push("flat", tandem::nn::Flatten);
        for (i, (fan_in, fan_out)) in [(784, 16), (16, 16), (16, 16), (16, 10)].into_iter().enumerate() {
            let inner = Box::new(tandem::nn::Linear::new(fan_in, fan_out, &mut rng, &cpu).unwrap());
            model = model.push(format!("l{i}"), SlowOn { inner, slow: slow.clone(), here: None });
        }
        model
    };
    let model = build();
    let data = seed_image_batches(8, 3, 11);
    let pipe = |row: &[Device]| Pipeline::builder(Stages::Split(&model, Split::Auto), row, &opt(), Loss::CrossEntropy).build();
    let mut grid = PipelineGrid::from_factory(&devs, 2, pipe).unwrap();
    let got = train(&mut grid, &data);
    let cuts: Vec<_> = grid.replicas().iter().map(Pipeline::ranges).collect();
    assert_eq!(cuts[0], vec![0..4, 4..5], "replica 0's stage 1 is 10x slower: {cuts:?}");
    assert_eq!(cuts[1], cuts[0], "every replica is cut as replica 0");
    let want = train(&mut Single::new(build(), &opt(), Loss::CrossEntropy, &cpu).unwrap(), &data);
    same_as_reference("grid of Split::Auto pipelines", &got, &want);

    let at =
        |cut: usize, row: &[Device]| Pipeline::builder(Stages::Split(&model, Split::At(vec![cut])), row, &opt(), Loss::CrossEntropy).build().unwrap();
    let replicas = vec![at(2, &devs[..2]), at(4, &devs[2..])];
    let err = PipelineGrid::new(replicas).err().expect("different cuts are refused").to_string();
    assert!(err.contains("pipeline 1 cuts the layers [0..4, 4..5], pipeline 0 [0..2, 2..5]"), "{err}");
}
