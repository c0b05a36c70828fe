//! PyTorch parity through a plan: the GPT fixture's 10 AdamW steps (tests/fixtures/gpt_tiny.safetensors,
//! scripts/gpt_parity.py) under the strategies `Plan::build_gpt` makes (ZeRO-2 data parallelism
//! with uneven shares, tensor parallelism, a 1F1B pipeline) on CPU devices and on logical
//! devices of `wgpu:0`, and under the plan the planner chooses from a real calibration of this
//! machine's CPU devices: PyTorch's losses within 1e-4 relative, its final weights within 1e-3.
mod common;
#[path = "common/gpt_fixture.rs"]
mod gpt_fixture;
use gpt_fixture::Fixture;
use tandem::nn::models::Gpt;
use tandem::parallel::plan::{self, estimate, gpt_cuttable, gpt_unbuildable, Cluster, DeviceSpec, LayerCost, Layout, Link, Plan, Workload};
use tandem::parallel::Shard;
use tandem::Device;

/// A plan on `devices` whose best layout is `layout` with batch `shares`, costed on described
/// devices (the costs do not matter to what the plan builds).
fn plan_of(fx: &Fixture, devices: &[Device], layout: Layout, shares: Vec<usize>) -> Plan {
    let layer = LayerCost {
        name: "layer".into(),
        forward_s: 1e-4,
        backward_s: 2e-4,
        fixed_s: 1e-5,
        param_bytes: 1 << 14,
        largest_param_bytes: 1 << 13,
        activation_bytes: 1 << 12,
        output_bytes: 1 << 10,
        tensor_parallel: true,
        tied: None,
        update_s: 0.0,
    };
    let layers = vec![layer; fx.config().n_layer + 3];
    let specs = devices.iter().map(|d| DeviceSpec { name: d.spec(), speed: 1.0, memory: 1 << 30, server: 0 }).collect();
    let link = Link { latency_s: 1e-5, bytes_per_s: 1e9 };
    let batch = shares.iter().sum();
    let work = Workload { layers, batch, state_per_param_byte: 3, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let cluster = Cluster { devices: specs, within: link, across: link, contention: 1.0, step_overheads: vec![], links: vec![] };
    let best = estimate(&work, &cluster, &layout);
    let model = tandem::nn::Module::describe(&Gpt::new(fx.config(), 0, &Device::cpu()).unwrap());
    Plan {
        model,
        devices: devices.iter().map(Device::spec).collect(),
        batch,
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

fn layout(data: usize, tensor: usize, pipeline: usize, micro_batches: usize, cuts: Vec<usize>, shard: Shard) -> Layout {
    Layout { data, tensor, pipeline, micro_batches, recompute: false, cuts, shard, offload: false, bucket: None, data_inner: false }
}

/// `plan`'s strategy on `devices`, holding the fixture's initial weights, trained for the
/// fixture's 10 steps: PyTorch's losses, gradient norms and final weights.
fn parity(what: &str, plan: &Plan, devices: &[Device], fx: &Fixture) {
    let cfg = fx.config();
    let mut s = plan.build_gpt(&|d: &Device| Gpt::new(cfg, 0, d), devices, &fx.adamw()).unwrap_or_else(|e| panic!("{what}: {e}"));
    s.load_state_dict(&fx.init(&Device::cpu())).unwrap();
    fx.check_steps(&mut *s, what);
}

#[test]
fn planned_layouts_match_pytorch() {
    let _guard = common::shared();
    let fx = Fixture::load();
    let batch: usize = fx.batch(0).len();
    assert_eq!(batch, 4, "the fixture's batch");
    for (family, devs) in common::device_families(2) {
        let zero2 = plan_of(&fx, &devs, layout(2, 1, 1, 1, vec![], Shard::Grads), vec![3, 1]);
        parity(&format!("planned data 2, ZeRO-2, shares 3 + 1, on {family}"), &zero2, &devs, &fx);
        let tensor = plan_of(&fx, &devs, layout(1, 2, 1, 1, vec![], Shard::None), vec![4]);
        parity(&format!("planned tensor 2 on {family}"), &tensor, &devs, &fx);
        // Planner layer 2 is the second block: one block a stage.
        let pipeline = plan_of(&fx, &devs, layout(1, 1, 2, 2, vec![2], Shard::None), vec![4]);
        parity(&format!("planned pipeline 2, 2 micro-batches, on {family}"), &pipeline, &devs, &fx);
    }
}

/// Whatever the planner chooses from this machine's timings (they vary run to run), its
/// strategy trains as PyTorch does.
#[test]
fn the_searched_plans_match_pytorch() {
    let _guard = common::shared();
    let fx = Fixture::load();
    let cfg = fx.config();
    let devs = common::cpu_devices(2);
    let gpt = Gpt::new(cfg, 0, &devs[0]).unwrap();
    let probe = fx.batch(0);
    let probe = tandem::parallel::inputs_to_device(&probe, &devs[0]).unwrap();
    let (work, cluster) = plan::measure_gpt(&gpt, &probe, &devs, 4, 2).unwrap();
    let search =
        |w: &Workload, c: &Cluster| plan::plan_cut_within(w, c, &|l, shares| gpt_unbuildable(l, shares, &cfg), &gpt_cuttable(cfg.n_layer)).unwrap();
    let chosen = search(&work, &cluster);
    eprintln!("{chosen}");
    parity(&format!("the searched plan ({})", chosen.best.layout), &chosen, &devs, &fx);
    // At this size one device is fastest. The same search with each layer's compute made a
    // thousand times dearer (communication as cheap beside it as in a large model) and the
    // second device three times slower, the two not sharing the host's cores (no contention),
    // chooses data parallelism with uneven shares.
    let mut heavy = work.clone();
    heavy.layers.iter_mut().for_each(|l| (l.forward_s, l.backward_s) = (l.forward_s * 1e3, l.backward_s * 1e3));
    let mut slow = cluster.clone();
    slow.devices[1].speed /= 3.0;
    slow.contention = 1.0;
    let chosen = search(&heavy, &slow);
    eprintln!("{chosen}");
    assert!(
        chosen.best.layout.data == 2 && chosen.shares.len() == 2 && chosen.shares[0] != chosen.shares[1],
        "expected uneven data parallelism: {chosen}"
    );
    parity(&format!("the searched plan with one slow device ({})", chosen.best.layout), &chosen, &devs, &fx);
}
