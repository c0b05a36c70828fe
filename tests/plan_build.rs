//! Strategies built from a plan (tandem::parallel::plan::Plan::build) are the strategies the
//! builders make by hand: the same losses, step for step, for every layout a `Sequential` can
//! take (single, data parallel with uneven shares and accumulation, tensor, pipeline, a grid),
//! and so `Single`'s losses within tolerance; the layouts no strategy makes are refused with
//! the reason; plans round-trip through JSON exactly and bad plan files are refused naming
//! the file and the field, and version-1 files still load; GPT plans build the GPT strategies
//! (sharded data parallelism, a tied pipeline) with the losses of those built by hand.
mod common;
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::plan::{estimate, plan_within, unbuildable, Cluster, DeviceSpec, LayerCost, Layout, Link, Plan, Workload};
use tandem::parallel::{Loss, OptimConfig, Parallel, Schedule, Shard, Split, Stages, Strategy};
use tandem::{Device, Error};

const BATCH: usize = 16;

fn opt() -> OptimConfig {
    OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })
}

/// `n` equal described devices named as `devices` are, and a cost per seed-CNN layer.
fn described(devices: &[Device], layers: usize) -> (Workload, Cluster) {
    let layer = LayerCost {
        name: "layer".into(),
        forward_s: 1e-4,
        backward_s: 2e-4,
        fixed_s: 1e-5,
        param_bytes: 1 << 16,
        largest_param_bytes: 1 << 15,
        activation_bytes: 1 << 12,
        output_bytes: 1 << 10,
        tensor_parallel: false,
        tied: None,
        update_s: 0.0,
    };
    let mut layers = vec![layer; layers];
    // The CNN's fc1 and fc2, which TensorParallel shards.
    let n = layers.len();
    layers[n - 2..].iter_mut().for_each(|l| l.tensor_parallel = true);
    let specs = devices.iter().map(|d| DeviceSpec { name: d.spec(), speed: 1.0, memory: 1 << 30, server: 0 }).collect();
    let link = Link { latency_s: 1e-5, bytes_per_s: 1e9 };
    (
        Workload { layers, batch: BATCH, state_per_param_byte: 3, grad_dtype: tandem::DType::F32, offloaded_states: 0 },
        Cluster { devices: specs, within: link, across: link, contention: 1.0, step_overheads: vec![], links: vec![] },
    )
}

/// A plan whose best layout is `layout`, with batch `shares`.
fn plan_of(devices: &[Device], layout: Layout, shares: Vec<usize>) -> Plan {
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let (work, cluster) = described(devices, model.len());
    let best = estimate(&work, &cluster, &layout);
    Plan {
        model: String::new(),
        devices: devices.iter().map(Device::spec).collect(),
        batch: BATCH,
        shares,
        best,
        alternatives: vec![],
        rejected: vec![],
        grad_dtype: tandem::DType::F32,
        offloaded_states: 0,
        processes: vec![],
        tried: vec![],
        precision: None,
        precisions: vec![],
    }
}

fn layout(data: usize, tensor: usize, pipeline: usize, micro_batches: usize, cuts: Vec<usize>) -> Layout {
    Layout { data, tensor, pipeline, micro_batches, recompute: false, cuts, shard: Shard::None, offload: false, bucket: None, data_inner: false }
}

fn losses(s: &mut dyn Strategy) -> Vec<f32> {
    common::seed_image_batches(BATCH, 4, 3).iter().map(|b| s.step(b).unwrap().loss).collect()
}

/// The plan's strategy against `by_hand`: equal losses (same strategy, same arithmetic), and
/// `Single`'s within tolerance.
fn same_as(plan: &Plan, devices: &[Device], by_hand: Box<dyn Strategy>) {
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let mut planned = plan.build(&model, devices, &opt(), Loss::CrossEntropy).unwrap();
    let mut by_hand = by_hand;
    let (got, want) = (losses(&mut *planned), losses(&mut *by_hand));
    assert_eq!(got, want, "{}: the plan's strategy differs from the one built by hand", plan.best.layout);
    let cnn = |d: &Device| SeedModel::Cnn.build(0, d);
    let mut single = Parallel::single(cnn, &devices[0], &opt(), Loss::CrossEntropy).boxed().unwrap();
    common::assert_close(&format!("{} against single", plan.best.layout), &got, &losses(&mut *single), 1e-4, 1e-4);
}

#[test]
fn a_planned_single_device_is_single() {
    let devices = common::cpu_devices(2);
    let p = plan_of(&devices, layout(1, 1, 1, 1, vec![]), vec![BATCH]);
    let cnn = |d: &Device| SeedModel::Cnn.build(0, d);
    same_as(&p, &devices, Parallel::single(cnn, &devices[0], &opt(), Loss::CrossEntropy).boxed().unwrap());
}

#[test]
fn planned_data_parallelism_takes_the_plans_uneven_shares() {
    let devices = common::cpu_devices(2);
    let p = plan_of(&devices, layout(2, 1, 1, 2, vec![]), vec![11, 5]);
    let cnn = |d: &Device| SeedModel::Cnn.build(0, d);
    let by_hand = Parallel::data(cnn, &devices, &opt(), Loss::CrossEntropy).micro_batches(2).split_weights(vec![11.0, 5.0]).boxed().unwrap();
    same_as(&p, &devices, by_hand);
}

#[test]
fn a_planned_tensor_split_is_tensor_parallel() {
    let devices = common::cpu_devices(2);
    let p = plan_of(&devices, layout(1, 2, 1, 1, vec![]), vec![BATCH]);
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    same_as(&p, &devices, Parallel::tensor(&model, &devices, &opt(), Loss::CrossEntropy).boxed().unwrap());
}

#[test]
fn a_planned_pipeline_is_the_1f1b_pipeline_cut_where_the_plan_says() {
    let devices = common::cpu_devices(2);
    let p = plan_of(&devices, layout(1, 1, 2, 4, vec![3]), vec![BATCH]);
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let by_hand = Parallel::pipeline(Stages::Split(&model, Split::At(vec![3])), &devices, &opt(), Loss::CrossEntropy)
        .micro_batches(4)
        .schedule(Schedule::OneFOneB)
        .boxed()
        .unwrap();
    same_as(&p, &devices, by_hand);
}

#[test]
fn a_planned_grid_is_data_parallel_pipelines() {
    let devices = common::cpu_devices(4);
    let p = plan_of(&devices, layout(2, 1, 2, 2, vec![4]), vec![8, 8]);
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let by_hand =
        Parallel::grid(|_| Ok(Stages::Split(&model, Split::At(vec![4]))), &devices, 2, &opt(), Loss::CrossEntropy).micro_batches(2).boxed().unwrap();
    same_as(&p, &devices, by_hand);
}

#[test]
fn a_planned_data_tensor_mesh_is_data_parallel_tensor_groups() {
    let devices = common::cpu_devices(4);
    let p = plan_of(&devices, layout(2, 2, 1, 1, vec![]), vec![10, 6]);
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    assert_eq!(unbuildable(&p.best.layout, &p.shares, &model), None);
    let by_hand = Parallel::data_tensor(|_| Ok(&model), &devices, 2, &opt(), Loss::CrossEntropy).split_weights(vec![10.0, 6.0]).boxed().unwrap();
    same_as(&p, &devices, by_hand);
}

#[test]
fn layouts_no_strategy_makes_are_refused_with_the_reason() {
    let devices = common::cpu_devices(4);
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let why = unbuildable(&layout(1, 2, 2, 1, vec![4]), &[16], &model).expect("tensor x pipeline is refused");
    assert!(why.contains("does not combine with pipeline parallelism"), "{why}");
    let recompute = Layout { recompute: true, ..layout(1, 1, 1, 1, vec![]) };
    assert!(unbuildable(&recompute, &[BATCH], &model).unwrap().contains("recomputation"));
    assert!(unbuildable(&layout(1, 1, 2, 3, vec![4]), &[BATCH], &model).unwrap().contains("do not divide"));
    assert_eq!(unbuildable(&layout(1, 1, 2, 4, vec![4]), &[BATCH], &model), None);
    let p = plan_of(&devices, layout(1, 2, 2, 1, vec![4]), vec![16]);
    let err = p.build(&model, &devices, &opt(), Loss::CrossEntropy).err().expect("refused");
    assert!(matches!(&err, Error::Invalid { op: "Plan::build", .. }), "{err}");
    // The search keeps to what can be built, and says so of the rest.
    let (work, cluster) = described(&devices, model.len());
    let searched = plan_within(&work, &cluster, &|l, shares| unbuildable(l, shares, &model)).unwrap();
    for e in std::iter::once(&searched.best).chain(&searched.alternatives) {
        assert_eq!(unbuildable(&e.layout, &[BATCH / e.layout.data; 4][..e.layout.data], &model), None, "{}", e.layout);
    }
    assert!(searched.rejected.iter().any(|r| r.why.contains("does not combine")), "{searched}");
}

#[test]
fn a_plan_for_other_devices_is_refused() {
    let devices = common::cpu_devices(2);
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let p = plan_of(&devices, layout(2, 1, 1, 1, vec![]), vec![8, 8]);
    let err = p.build(&model, &devices[..1], &opt(), Loss::CrossEntropy).err().expect("one device is not two");
    assert!(err.to_string().contains("the plan is for devices cpu,cpu, not cpu"), "{err}");
}

#[test]
fn plans_round_trip_through_json_exactly() {
    let devices = common::cpu_devices(2);
    let dir = common::scratch("plan_build", "round_trip");
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let (work, mut cluster) = described(&devices, model.len());
    // Costs with every bit of an f64 in use.
    cluster.devices[1].speed = 1.0 / 3.0;
    let p = plan_within(&work, &cluster, &|l, shares| unbuildable(l, shares, &model)).unwrap();
    let path = dir.join("plan.json");
    p.save(&path).unwrap();
    let back = Plan::load(&path, &devices).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.best.step_s.to_bits(), p.best.step_s.to_bits());
}

#[test]
fn bad_plan_files_name_the_file_and_the_field() {
    let devices = common::cpu_devices(2);
    let dir = common::scratch("plan_build", "bad_files");
    let p = plan_of(&devices, layout(1, 1, 2, 4, vec![3]), vec![BATCH]);
    let good = dir.join("good.json");
    p.save(&good).unwrap();
    let text = std::fs::read_to_string(&good).unwrap();
    let cases = [
        ("not-json", "{ nope".to_string(), "not JSON"),
        ("no-version", text.replace("\"version\": 3,", ""), "no \"version\""),
        ("version", text.replace("\"version\": 3,", "\"version\": 9,"), "plan version 9"),
        ("shard", text.replacen("\"shard\": \"none\"", "\"shard\": \"full\"", 1), "field plan.best.layout.shard"),
        ("bucket", text.replacen("\"shard\": \"none\"", "\"shard\": \"none\", \"bucket\": 0", 1), "field plan.best.layout.bucket: 0 bytes"),
        ("shard-word", text.replacen("\"shard\": \"none\"", "\"shard\": \"half\"", 1), "field plan"),
        ("cuts", text.replace("\"cuts\": [\n          3\n        ]", "\"cuts\": [3, 2]"), "field plan.best.layout.cuts"),
        ("shares", text.replace("\"shares\": [\n      16\n    ]", "\"shares\": [15]"), "field plan.shares"),
        ("devices", text.replace("\"cpu\"", "\"wgpu:7\""), "field plan.devices"),
        ("missing", text.replace("\"batch\": 16,", ""), "field plan"),
    ];
    for (name, body, needle) in cases {
        assert_ne!(body, text, "{name}: the edit did not apply");
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, body).unwrap();
        let err = Plan::load(&path, &devices).err().unwrap_or_else(|| panic!("{name}: loaded"));
        let msg = err.to_string();
        assert!(msg.contains(needle) && msg.contains(&format!("{name}.json")), "{name}: {msg}");
    }
    let err = Plan::load(&good, &devices[..1]).expect_err("other devices");
    assert!(err.to_string().contains("field plan.devices"), "{err}");
}

#[test]
fn a_version_1_plan_file_loads_unsharded() {
    let devices = common::cpu_devices(2);
    let dir = common::scratch("plan_build", "version_1");
    let p = plan_of(&devices, layout(2, 1, 1, 1, vec![]), vec![8, 8]);
    let path = dir.join("v2.json");
    p.save(&path).unwrap();
    // What version 1 wrote: no shard, no model.
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("shard");
                m.remove("model");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    strip(&mut doc);
    doc["version"] = 1.into();
    let old = dir.join("v1.json");
    std::fs::write(&old, doc.to_string()).unwrap();
    assert!(!doc.to_string().contains("shard"));
    assert_eq!(Plan::load(&old, &devices).unwrap(), p);
}

/// Token batches of 4 windows of 8 ids below 11, drawn from a fixed sequence.
fn token_batches() -> Vec<tandem::data::Batch> {
    let mut x = 7u32;
    let mut next = move || {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        ((x >> 16) % 11) as i32
    };
    (0..3)
        .map(|_| {
            let ids: Vec<i32> = (0..32).map(|_| next()).collect();
            let targets: Vec<i32> = (0..32).map(|_| next()).collect();
            tandem::data::Batch::tokens(ids, targets, 8, 11).unwrap()
        })
        .collect()
}

#[test]
fn a_gpt_plan_builds_the_gpt_strategy_it_names() {
    use tandem::nn::models::{Gpt, GptConfig};
    use tandem::parallel::plan::gpt_unbuildable;
    use tandem::parallel::{DataParallel, DataParallelConfig, Pipeline};
    let devices = common::cpu_devices(2);
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 16, block_size: 8, vocab_size: 11, dropout: 0.0, bias: true };
    let gpt = |d: &Device| Gpt::new(cfg, 0, d);
    let adam = OptimConfig::adam(tandem::optim::AdamConfig::adamw());
    let plan_on = |devices: &[Device], l: Layout, shares: Vec<usize>| {
        let (work, cluster) = described(devices, cfg.n_layer + 3);
        let best = estimate(&work, &cluster, &l);
        Plan {
            model: tandem::nn::Module::describe(&gpt(&Device::cpu()).unwrap()),
            devices: devices.iter().map(Device::spec).collect(),
            batch: 4,
            shares,
            best,
            alternatives: vec![],
            rejected: vec![],
            grad_dtype: tandem::DType::F32,
            offloaded_states: 0,
            processes: vec![],
            tried: vec![],
            precision: None,
            precisions: vec![],
        }
    };
    let plan_for = |l: Layout, shares: Vec<usize>| plan_on(&devices, l, shares);
    let run = |s: &mut dyn Strategy| token_batches().iter().map(|b| s.step(b).unwrap().loss).collect::<Vec<f32>>();
    // ZeRO-2 data parallelism, as built by hand.
    let zero2 = plan_for(Layout { shard: Shard::Grads, ..layout(2, 1, 1, 1, vec![]) }, vec![2, 2]);
    let mut planned = zero2.build_gpt(&gpt, &devices, &adam).unwrap();
    let cfg_dp = DataParallelConfig { shard: Shard::Grads, ..Default::default() };
    let mut by_hand = DataParallel::from_factory(gpt, &devices, &adam, Loss::CrossEntropy, cfg_dp).unwrap();
    assert_eq!(run(&mut *planned), run(&mut by_hand), "a sharded plan differs from DataParallel with --shard grads");
    // A pipeline cut before the second block (planner layer 2), its embedding and head tied.
    let pipe = plan_for(layout(1, 1, 2, 2, vec![2]), vec![4]);
    let mut planned = pipe.build_gpt(&gpt, &devices, &adam).unwrap();
    let stages = Stages::Built(gpt(&Device::cpu()).unwrap().stages(&devices, Some(&[1])).unwrap());
    let mut by_hand = Pipeline::builder(stages, &devices, &adam, Loss::CrossEntropy)
        .micro_batches(2)
        .schedule(Schedule::OneFOneB)
        .tie((0, Gpt::WTE), (1, Gpt::LM_HEAD))
        .build()
        .unwrap();
    assert_eq!(run(&mut *planned), run(&mut by_hand), "a pipeline plan differs from the pipeline built by hand");
    // Data 2 x tensor 2 on four devices: two TensorParallelGpt groups, as built by hand.
    let four = common::cpu_devices(4);
    let mesh = plan_on(&four, layout(2, 2, 1, 1, vec![]), vec![2, 2]);
    let mut planned = mesh.build_gpt(&gpt, &four, &adam).unwrap();
    let mut by_hand = Parallel::data_tensor(gpt, &four, 2, &adam, Loss::CrossEntropy).build().unwrap();
    assert_eq!(planned.describe(), by_hand.describe());
    assert_eq!(run(&mut *planned), run(&mut by_hand), "a data x tensor plan differs from the grid built by hand");
    // Tensor 2 x pipeline 2, and data 2 x tensor 2 x pipeline 2 on eight devices: pipelines of
    // tensor-parallel stages, as built by hand.
    let host = gpt(&Device::cpu()).unwrap();
    assert_eq!(gpt_unbuildable(&layout(1, 2, 2, 2, vec![2]), &[4], &cfg), None);
    let tp_pp = plan_on(&four, layout(1, 2, 2, 2, vec![2]), vec![4]);
    let mut planned = tp_pp.build_gpt(&gpt, &four, &adam).unwrap();
    let stages = Stages::Sharded(host.tensor_stages(&four, 2, Some(&[1])).unwrap());
    let mut by_hand = Pipeline::builder(stages, &four, &adam, Loss::CrossEntropy).micro_batches(2).build().unwrap();
    assert_eq!(planned.devices().len(), 4);
    assert_eq!(run(&mut *planned), run(&mut by_hand), "a tensor x pipeline plan differs from the pipeline built by hand");
    let eight = common::cpu_devices(8);
    let cube = plan_on(&eight, layout(2, 2, 2, 1, vec![2]), vec![2, 2]);
    let mut planned = cube.build_gpt(&gpt, &eight, &adam).unwrap();
    let mut by_hand =
        Parallel::grid(|row| Ok(Stages::Sharded(host.tensor_stages(row, 2, Some(&[1]))?)), &eight, 2, &adam, Loss::CrossEntropy).build().unwrap();
    assert_eq!(run(&mut *planned), run(&mut by_hand), "a data x tensor x pipeline plan differs from the grid built by hand");
    // The same cube with ZeRO-2 on its data axis and the data axis inside the stages: each
    // pipeline takes devices [0, 1, 4, 5] and [2, 3, 6, 7] (stage by stage, two replicas of
    // a stage side by side), as the grid built by hand over those rows.
    let inner = Layout { shard: Shard::Grads, data_inner: true, ..layout(2, 2, 2, 1, vec![2]) };
    assert_eq!((0..2).flat_map(|s| (0..2).map(move |t| (s, t))).map(|(s, t)| inner.device(1, s, t)).collect::<Vec<_>>(), [2, 3, 6, 7]);
    let cube = plan_on(&eight, inner.clone(), vec![2, 2]);
    let mut planned = cube.build_gpt(&gpt, &eight, &adam).unwrap();
    let rows: Vec<Device> = [0, 1, 4, 5, 2, 3, 6, 7].iter().map(|&i| eight[i].clone()).collect();
    let placed: Vec<bool> = planned.devices().iter().zip(&rows).map(|(a, b)| a.same(b)).collect();
    assert!(placed.iter().all(|&p| p), "{inner}: the grid's devices replica by replica are not [0, 1, 4, 5, 2, 3, 6, 7]: {placed:?}");
    let stages = |row: &[Device]| Ok(Stages::Sharded(host.tensor_stages(row, 2, Some(&[1]))?));
    let mut by_hand = Parallel::grid(stages, &rows, 2, &adam, Loss::CrossEntropy).shard(Shard::Grads).build().unwrap();
    assert_eq!(planned.describe(), by_hand.describe());
    assert_eq!(run(&mut *planned), run(&mut by_hand), "{inner}: the plan differs from the sharded grid built by hand");
    // What the GPT's strategies cannot make is refused with the reason.
    let odd_heads = GptConfig { n_head: 1, ..cfg };
    assert!(gpt_unbuildable(&layout(1, 2, 1, 1, vec![]), &[4], &odd_heads).unwrap().contains("n_head 1"));
    assert!(gpt_unbuildable(&layout(1, 1, 3, 4, vec![2, 3]), &[4], &cfg).unwrap().contains("every stage needs a block"));
    assert!(gpt_unbuildable(&Layout { shard: Shard::Full, ..layout(1, 1, 2, 2, vec![2]) }, &[4], &cfg).unwrap().contains("sharding"));
    let other = Plan { model: "Gpt(n_layer=9)".into(), ..zero2 };
    let err = other.build_gpt(&gpt, &devices, &adam).err().expect("a plan for another model");
    assert!(err.to_string().contains("the plan is for Gpt(n_layer=9)"), "{err}");
}
