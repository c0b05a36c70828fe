//! The layout planner's cost model and search (tandem::parallel::plan) on described clusters:
//! its arithmetic on simple cases, memory as a hard constraint with the reason named, and its
//! choices on published configurations against Megatron-LM's rules (tensor parallelism inside a
//! server, pipelines across servers); the sharding modes' memory and communication, and memory
//! too small for plain data parallelism making the search shard.
use tandem::parallel::plan::{estimate, plan, Cluster, DeviceSpec, LayerCost, Layout, Link, Workload};
use tandem::parallel::Shard;

fn block(params_mib: u64, act_mib: u64, out_mib: u64, f_ms: f64) -> LayerCost {
    LayerCost {
        name: "block".into(),
        forward_s: f_ms * 1e-3,
        backward_s: 2.0 * f_ms * 1e-3,
        fixed_s: 0.0,
        param_bytes: params_mib << 20,
        // Four tensors of equal size, as an MLP's two matrices and attention's two.
        largest_param_bytes: params_mib << 18,
        activation_bytes: act_mib << 20,
        output_bytes: out_mib << 20,
        tensor_parallel: true,
        tied: None,
        update_s: 0.0,
    }
}

fn single_layout() -> Layout {
    Layout {
        data: 1,
        tensor: 1,
        pipeline: 1,
        micro_batches: 1,
        recompute: false,
        cuts: vec![],
        shard: Shard::None,
        offload: false,
        bucket: None,
        data_inner: false,
    }
}

#[test]
fn one_device_costs_forward_and_backward_of_the_batch() {
    let work =
        Workload { layers: vec![block(1, 1, 1, 1.0); 4], batch: 8, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let e = estimate(&work, &Cluster::dual_m60(1), &single_layout());
    // 4 layers x (1 + 2) ms x 8 samples.
    assert!((e.step_s - 0.096).abs() < 1e-9, "{}", e.step_s);
    assert_eq!(e.memory[0], 4 * (1 << 20) * 4 + 4 * 8 * (1 << 20));
    let pipe = Layout { pipeline: 4, micro_batches: 4, cuts: vec![1, 2, 3], ..single_layout() };
    let e = estimate(&work, &Cluster::dual_m60(1), &pipe);
    assert!((e.bubble - 3.0 / 7.0).abs() < 1e-12);
}

#[test]
fn a_small_model_on_equal_devices_is_data_parallel_over_all_of_them() {
    let work =
        Workload { layers: vec![block(4, 8, 1, 1.0); 8], batch: 64, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let p = plan(&work, &Cluster::dual_m60(1)).unwrap();
    assert_eq!((p.best.layout.data, p.best.layout.tensor, p.best.layout.pipeline), (4, 1, 1), "{p}");
    let alone = estimate(&work, &Cluster::dual_m60(1), &single_layout());
    assert!(p.best.step_s < alone.step_s / 3.0, "{p}");
}

#[test]
fn a_model_too_big_for_one_device_is_split_and_never_over_memory() {
    // 24 blocks of 220 MiB: 5.2 GiB of weights, 21 GiB with gradients and Adam's state.
    let work = Workload {
        layers: vec![block(220, 24, 2, 2.0); 24],
        batch: 32,
        state_per_param_byte: 4,
        grad_dtype: tandem::DType::F32,
        offloaded_states: 0,
    };
    let cluster = Cluster::dual_m60(2);
    let p = plan(&work, &cluster).unwrap();
    println!("{p}");
    for e in std::iter::once(&p.best).chain(&p.alternatives) {
        assert!(e.memory.iter().zip(&cluster.devices).all(|(m, d)| *m <= d.memory), "{} is over memory", e.layout);
    }
    let single = p.rejected.iter().find(|r| r.layout.devices() == 1).expect("one device is rejected");
    assert!(single.why.contains("needs") && single.why.contains("GiB on M60"), "{}", single.why);
    // Megatron: a tensor-parallel group stays inside a server (4 GPUs) on PCIe and 10 GbE.
    assert!(p.best.layout.tensor <= 4, "{p}");
}

#[test]
fn on_nvlink_servers_tensor_parallelism_stays_inside_and_pipelines_go_across() {
    // A GPT-3-like block of 470M parameters (hidden 6144, sequence 2048): 1.9 TFLOP per
    // sequence forward (0.4 s on the 4.8 TFLOP/s reference), 48 MiB of output and ~2.9 GiB of
    // f32 activations per sequence (Megatron's 34·s·h + 5·a·s² bytes in half precision,
    // doubled); 32 of them on 4 servers of 8 H100s. Megatron-LM's layout is tensor 8 inside a
    // server and pipeline stages across servers.
    let mut gpt_block = block(1800, 2900, 48, 400.0);
    gpt_block.fixed_s = 20e-6;
    let layers = vec![gpt_block; 32];
    let work = Workload { layers, batch: 64, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let cluster = Cluster::h100_nvlink(4);
    let p = plan(&work, &cluster).unwrap();
    println!("{p}");
    let l = &p.best.layout;
    assert!(l.tensor > 1 && l.tensor <= 8, "{p}");
    assert!(l.pipeline > 1, "{p}");
    // No tensor group spans two servers.
    for r in 0..l.data {
        for s in 0..l.pipeline {
            let servers: Vec<usize> = (0..l.tensor).map(|t| cluster.devices[l.device(r, s, t)].server).collect();
            assert!(servers.windows(2).all(|w| w[0] == w[1]), "{l}: a tensor group spans servers");
        }
    }
}

#[test]
fn a_slow_device_gets_less_work_or_none() {
    // A GPU ten times faster than the CPU beside it, one machine.
    let gpu = DeviceSpec { name: "gpu".into(), speed: 10.0, memory: 8 << 30, server: 0 };
    let cpu = DeviceSpec { name: "cpu".into(), speed: 1.0, memory: 16 << 30, server: 0 };
    let link = Link { latency_s: 20e-6, bytes_per_s: 10e9 };
    let cluster = Cluster { devices: vec![gpu, cpu], within: link, across: link, contention: 1.0, step_overheads: vec![], links: vec![] };
    let work =
        Workload { layers: vec![block(2, 4, 1, 1.0); 10], batch: 64, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let p = plan(&work, &cluster).unwrap();
    println!("{p}");
    let alone = estimate(&work, &cluster, &single_layout());
    // Batch shares by speed (10:1) beat the GPU alone: 64 x 30 ms / 11 against 64 x 30 ms / 10.
    assert_eq!((p.best.layout.data, p.best.layout.pipeline), (2, 1), "{p}");
    assert!((p.best.compute_s - 0.192 * 10.0 / 11.0).abs() < 1e-9, "{p}");
    assert!(p.best.step_s < alone.step_s, "{p}");
    // Devices that slow each other down by half when run together (sharing the host's cores)
    // are better used one at a time: the GPU alone.
    let shared = Cluster { contention: 2.0, ..cluster.clone() };
    let p = plan(&work, &shared).unwrap();
    assert_eq!(p.best.layout.devices(), 1, "{p}");
    assert_eq!(p.devices[0], "gpu", "{p}");
}

#[test]
fn the_fastest_devices_are_planned_first_whatever_their_order() {
    let slow = DeviceSpec { name: "slow".into(), speed: 1.0, memory: 8 << 30, server: 0 };
    let fast = DeviceSpec { name: "fast".into(), speed: 20.0, memory: 8 << 30, server: 0 };
    let link = Link { latency_s: 20e-6, bytes_per_s: 10e9 };
    let cluster = Cluster { devices: vec![slow, fast], within: link, across: link, contention: 1.5, step_overheads: vec![], links: vec![] };
    let work =
        Workload { layers: vec![block(2, 4, 1, 1.0); 10], batch: 64, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let p = plan(&work, &cluster).unwrap();
    assert_eq!(p.devices, ["fast", "slow"]);
    assert_eq!(p.best.layout.devices(), 1, "{p}");
    assert!(p.to_string().contains("left out: slow"), "{p}");
}

#[test]
fn each_pair_of_devices_is_costed_over_its_own_link() {
    // Three equal GPUs listed slow-linked first: the second and third share a fast link, the
    // first reaches them over a slow one (no peer-to-peer between those boards, say).
    let gpu = |i: usize, speed: f64| DeviceSpec { name: format!("gpu{i}"), speed, memory: 8 << 30, server: 0 };
    let (fast, slow) = (Link { latency_s: 10e-6, bytes_per_s: 50e9 }, Link { latency_s: 1e-3, bytes_per_s: 10e6 });
    let inf = Link { latency_s: 0.0, bytes_per_s: f64::INFINITY };
    let links = vec![vec![inf, slow, slow], vec![slow, inf, fast], vec![slow, fast, inf]];
    let work =
        Workload { layers: vec![block(2, 4, 1, 1.0); 10], batch: 64, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let paired = Cluster {
        devices: vec![gpu(0, 1.0), gpu(1, 1.0), gpu(2, 1.0)],
        within: slow,
        across: slow,
        contention: 1.0,
        step_overheads: vec![],
        links: links.clone(),
    };
    assert_eq!(paired.link(1, 2), fast);
    assert_eq!(paired.group_link(&[0, 1, 2]), slow, "a ring through the first device is as slow as its link");
    assert_eq!(paired.group_link(&[1, 2]), fast);
    // The slightly slower first device is placed last, and its links move with it: the plan
    // over the two fast-linked GPUs costs their fast link, not the slow one of the first pair
    // in listed order.
    let cluster = Cluster { devices: vec![gpu(0, 0.99), gpu(1, 1.0), gpu(2, 1.0)], ..paired };
    let p = plan(&work, &cluster).unwrap();
    println!("{p}");
    assert_eq!(p.devices, ["gpu1", "gpu2", "gpu0"]);
    assert_eq!(p.best.layout.devices(), 2, "{p}");
    let only_slow = Cluster { links: vec![], ..cluster.clone() };
    let p_slow = plan(&work, &only_slow).unwrap();
    assert_eq!(p_slow.best.layout.devices(), 1, "every pair slow: one device: {p_slow}");
}

/// Calibration on this machine: the seed CNN's layers on two CPU devices, then the plan for
/// them. Times are not asserted (the machine is shared); what they are made of is.
#[test]
fn measured_inputs_describe_the_model_and_the_devices() {
    use std::sync::Arc;
    use tandem::nn::{models::SeedModel, Module};
    use tandem::{backend::cpu::CpuBackend, Device, Tensor};
    let devices: Vec<Device> = (0..2).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect();
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let mut rng = tandem::rand::rng();
    let probe = Tensor::randn([4, 1, 28, 28], &mut rng, &devices[0]).unwrap();
    let (work, cluster) = tandem::parallel::plan::measure(&model, &probe, &devices, 64, 1).unwrap();
    assert_eq!(work.layers.len(), model.len());
    let params: u64 = model.parameters().iter().map(|(_, p)| p.numel() as u64 * 4).sum();
    assert_eq!(work.layers.iter().map(|l| l.param_bytes).sum::<u64>(), params);
    // The logits: 10 f32 per sample.
    assert_eq!(work.layers.last().unwrap().output_bytes, 40);
    assert!(work.layers.iter().any(|l| l.tensor_parallel), "fc1/fc2 are Linear");
    assert!(work.layers.iter().all(|l| l.forward_s >= 0.0 && l.backward_s >= 0.0 && l.fixed_s >= 0.0));
    assert!(work.layers.iter().map(|l| l.forward_s + l.backward_s + l.fixed_s).sum::<f64>() > 0.0);
    assert_eq!(cluster.devices.len(), 2);
    assert!(cluster.devices.iter().all(|d| d.speed > 0.0 && d.memory > 0));
    // The pair's link, both ways, and the within link is the first pair's.
    assert_eq!(cluster.links.len(), 2);
    assert_eq!(cluster.links[0][1], cluster.links[1][0]);
    assert_eq!(cluster.links[0][1], cluster.within);
    assert!(cluster.links[0][1].bytes_per_s > 0.0 && cluster.links[0][1].latency_s >= 0.0);
    assert!(cluster.within.bytes_per_s > 0.0);
    assert!(cluster.contention >= 1.0 && cluster.contention.is_finite(), "{}", cluster.contention);
    // Two devices of one name are one kind: equal speeds, whatever the timing noise.
    assert_eq!(cluster.devices[0].speed, cluster.devices[1].speed);
    let p = plan(&work, &cluster).unwrap();
    println!("{p}");
    assert!(p.best.step_s > 0.0);
}

/// Two equal devices of `memory` bytes on one fast link (gradient sync cheaper than a
/// pipeline's bubble), and a model of 8 layers of 64 MiB of
/// parameters and little activation: its state, not its activations, decides what fits.
fn state_bound(memory: u64) -> (Workload, Cluster) {
    let dev = |i: usize| DeviceSpec { name: format!("gpu{i}"), speed: 1.0, memory, server: 0 };
    let link = Link { latency_s: 1e-5, bytes_per_s: 100e9 };
    let mut layer = block(64, 1, 1, 1.0);
    layer.tensor_parallel = false;
    (
        Workload { layers: vec![layer; 8], batch: 8, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 },
        Cluster { devices: vec![dev(0), dev(1)], within: link, across: link, contention: 1.0, step_overheads: vec![], links: vec![] },
    )
}

#[test]
fn sharding_modes_keep_what_zero_keeps_and_send_what_it_sends() {
    let (work, cluster) = state_bound(64 << 30);
    let p = 8 * (64u64 << 20);
    let data = |shard| Layout { data: 2, shard, ..single_layout() };
    let [none, zero1, zero2, zero3] = [Shard::None, Shard::Optimizer, Shard::Grads, Shard::Full].map(|s| estimate(&work, &cluster, &data(s)));
    // Activations: 8 layers x 1 MiB x 4 samples per replica; one 25 MiB bucket in flight.
    let act = 8 * 4 * (1u64 << 20);
    let bucket = 25u64 << 20;
    assert_eq!(none.memory[0], 4 * p + bucket + act);
    assert_eq!(zero1.memory[0], 2 * p + p + bucket + act, "Adam's two states halved over two replicas");
    assert_eq!(
        zero2.memory[0],
        p + 3 * p / 2 + 2 * bucket + bucket + act,
        "full parameters, a shard of the rest, two buckets of gradients in flight"
    );
    // ZeRO-3 holds its shards of all four (Adam: 16 bytes a parameter over two replicas) and
    // the units it has gathered: the one computing, the one prefetched and the flat values.
    assert_eq!(zero3.memory[0], 4 * p / 2 + 3 * bucket + 2 * bucket + bucket + act, "shards, three units gathered, gradients in flight");
    // bf16 gradient shards: half of the sharded gradients' bytes, in ZeRO-2 and ZeRO-3 only.
    let halves = Workload { grad_dtype: tandem::DType::Bf16, ..work.clone() };
    let [none_h, zero1_h, zero2_h, zero3_h] =
        [Shard::None, Shard::Optimizer, Shard::Grads, Shard::Full].map(|s| estimate(&halves, &cluster, &data(s)));
    assert_eq!((none_h.memory[0], zero1_h.memory[0]), (none.memory[0], zero1.memory[0]), "no gradient shards to halve");
    assert_eq!(zero2.memory[0] - zero2_h.memory[0], p / 4, "half of a half of the gradients");
    assert_eq!(zero3.memory[0] - zero3_h.memory[0], p / 4);
    // Reduce-scatter + all-gather move what an all-reduce moves; ZeRO-1 adds the owners'
    // broadcast of the updated parameters, ZeRO-3 a second all-gather (forward and backward).
    assert_eq!(zero2.step_s, none.step_s);
    // Each of the 21 buckets of 25 MiB is a collective of its own.
    let gather = 21.0 * cluster.within.all_gather_s(p as f64 / 21.0, 2);
    assert!((zero1.step_s - none.step_s - gather).abs() < 1e-12, "{} {} {gather}", zero1.step_s, none.step_s);
    assert!((zero3.step_s - none.step_s - gather).abs() < 1e-12, "{} {} {gather}", zero3.step_s, none.step_s);
}

#[test]
fn memory_too_small_for_plain_data_parallelism_makes_the_search_shard() {
    // Plenty of memory: plain data parallelism is as fast as ZeRO-2 and simpler, so kept.
    let (work, roomy) = state_bound(64 << 30);
    let p = plan(&work, &roomy).unwrap();
    assert_eq!((p.best.layout.data, p.best.layout.shard), (2, Shard::None), "{p}");
    // 85% of 2.15 GiB holds ZeRO-1's and ZeRO-2's state (1.5 and 1.25 GiB with the buckets),
    // not plain data parallelism's 2 GiB and a bucket, nor the whole model on one device.
    let (work, tight) = state_bound(2200 << 20);
    let p = plan(&work, &tight).unwrap();
    println!("{p}");
    assert_eq!(p.best.layout.data, 2, "{p}");
    assert_ne!(p.best.layout.shard, Shard::None, "{p}");
    let plain = p
        .rejected
        .iter()
        .find(|r| r.layout.data == 2 && r.layout.shard == Shard::None && r.layout.micro_batches == 1)
        .expect("plain data parallelism is rejected");
    assert!(
        plain.why.starts_with("memory: needs") && plain.why.contains("on gpu") && plain.why.contains("over 85% of its 2.15 GiB"),
        "{}",
        plain.why
    );
    for e in std::iter::once(&p.best).chain(&p.alternatives) {
        assert!(e.memory.iter().all(|m| (*m as f64) <= 0.85 * (2200u64 << 20) as f64), "{} is over memory", e.layout);
    }
    assert!(p.to_string().contains("shard"), "{p}");
}

/// Optimizer state offloaded to host memory (`offloaded_states`, with `state_per_param_byte`
/// counting weights and gradients only) takes its bytes off every device and puts them on the
/// host link twice a step, each layer's share around its update: sharded by the modes that
/// shard optimizer state, whole otherwise; the device holds one tensor's state while updating.
#[test]
fn offloaded_state_is_counted_as_transfers_not_memory() {
    let (work, cluster) = state_bound(64 << 30);
    let offloaded = Workload { state_per_param_byte: 2, offloaded_states: 2, ..work.clone() };
    let p = 8 * (64u64 << 20);
    let data = |shard| Layout { data: 2, shard, ..single_layout() };
    for (shard, share) in [(Shard::None, 1), (Shard::Full, 2)] {
        let (kept, off) = (estimate(&work, &cluster, &data(shard)), estimate(&offloaded, &cluster, &data(shard)));
        // Adam's two moments (the device's share) leave it, but for the largest tensor's (16
        // MiB of a layer's 64) while it is updated.
        assert_eq!(kept.memory[0] - off.memory[0], 2 * p / share - 2 * (16 << 20) / share, "{shard:?}");
        // Each of the 8 layers' moments (2 x 64 MiB over the share) once over the link: to
        // the device for the update and back are one host-staged transfer.
        let link = 8.0 * cluster.within.send_s((2 * (64u64 << 20) / share) as f64);
        assert!((off.step_s - kept.step_s - link).abs() < 1e-12, "{shard:?}: {} against {} + {link}", off.step_s, kept.step_s);
    }
    // 85% of 1.1 GiB is under half the state (1 GiB a device on two, however split), so
    // nothing fits with the optimizer state on the devices; with it in host memory a layout
    // does, within the memory.
    let (_, tight) = state_bound(1100 << 20);
    let asked = plan(&offloaded, &tight).unwrap();
    println!("{asked}");
    assert!(asked.best.memory.iter().all(|m| (*m as f64) <= 0.85 * (1100u64 << 20) as f64), "{asked}");
    // Not asked for, the search offloads by itself, and only there: the same layout, memory
    // and prediction as when asked, each layout's kept-state variant rejected for memory.
    let searched = plan(&work, &tight).unwrap();
    println!("{searched}");
    assert!(searched.best.layout.offload && searched.offloaded_states == 2, "{searched}");
    assert_eq!(Layout { offload: false, ..searched.best.layout.clone() }, asked.best.layout, "{searched}");
    assert_eq!(searched.best.memory, asked.best.memory);
    assert!((searched.best.step_s - asked.best.step_s).abs() < 1e-12);
    let kept = Layout { offload: false, ..searched.best.layout.clone() };
    let why = &searched.rejected.iter().find(|r| r.layout == kept).expect("the layout with its state kept is rejected").why;
    assert!(why.starts_with("memory: needs"), "{why}");
    assert!(searched.to_string().contains(", offload") && searched.to_string().contains("optimizer state in host memory"), "{searched}");
    let roomy = plan(&work, &cluster).unwrap();
    assert!(!roomy.best.layout.offload && roomy.offloaded_states == 0 && roomy.alternatives.iter().all(|e| !e.layout.offload), "{roomy}");
}

/// A layout on more devices is chosen only when predicted at least `MORE_DEVICES_MARGIN`
/// faster than the best on fewer: two equal devices whose link makes data parallelism a near
/// tie keep one device (data parallelism listed first among the alternatives), and a clear
/// gain takes both.
#[test]
fn more_devices_must_win_by_the_margin() {
    let (work, _) = state_bound(64 << 30);
    let work =
        Workload { layers: work.layers.iter().map(|l| LayerCost { param_bytes: 1 << 20, tensor_parallel: false, ..l.clone() }).collect(), ..work };
    let on = |bytes_per_s: f64| {
        let (_, mut cluster) = state_bound(64 << 30);
        cluster.within = Link { latency_s: 1e-5, bytes_per_s };
        cluster.across = cluster.within;
        cluster
    };
    let ratio = |c: &Cluster| estimate(&work, c, &Layout { data: 2, ..single_layout() }).step_s / estimate(&work, c, &single_layout()).step_s;
    // The link speed at which data parallelism is predicted 2-4% faster than one device.
    let near = (0..400).map(|i| 1e6 * 1.05f64.powi(i)).find(|&b| (0.96..0.98).contains(&ratio(&on(b)))).expect("a near tie");
    let p = plan(&work, &on(near)).unwrap();
    assert_eq!(p.best.layout.devices(), 1, "{p}");
    assert_eq!(p.alternatives[0].layout.data, 2, "{p}");
    assert!(p.alternatives[0].step_s < p.best.step_s);
    assert!(p.to_string().contains("left out: gpu1 (predicted less than 5% faster with them)"), "{p}");
    let clear = (0..400).map(|i| 1e6 * 1.05f64.powi(i)).find(|&b| ratio(&on(b)) < 0.9).expect("a clear gain");
    assert_eq!(plan(&work, &on(clear)).unwrap().best.layout.data, 2);
}

/// Gradient shards in bf16 are planned for: at a memory where ZeRO-3 fits only with them, the
/// f32 search rejects it for memory and the bf16 one keeps it, and a plan that shards says the
/// type its shards take (what `Plan::build` gives `DataParallel`).
#[test]
fn half_gradient_shards_are_planned_for() {
    // ZeRO-3 on two devices: 2p (f32) or 1.75p (bf16) of shards, six buckets, the activations:
    // 1206 or 1078 MiB, against 85% of 1350 MiB (1147).
    let (work, cluster) = state_bound(1350 << 20);
    let zero3 = |l: &Layout| l.data == 2 && l.shard == Shard::Full && !l.recompute && l.micro_batches == 1;
    let f32_plan = plan(&work, &cluster).unwrap();
    assert_eq!(f32_plan.grad_dtype, tandem::DType::F32);
    let why = &f32_plan.rejected.iter().find(|r| zero3(&r.layout)).expect("f32 ZeRO-3 is rejected").why;
    assert!(why.starts_with("memory:"), "{why}");
    let halves = Workload { grad_dtype: tandem::DType::Bf16, ..work };
    let p = plan(&halves, &cluster).unwrap();
    assert_eq!(p.grad_dtype, tandem::DType::Bf16);
    let kept = std::iter::once(&p.best).chain(&p.alternatives).find(|e| zero3(&e.layout)).expect("bf16 ZeRO-3 fits");
    assert!(kept.memory.iter().all(|&m| (m as f64) <= 0.85 * (1350u64 << 20) as f64), "{:?}", kept.memory);
    assert_eq!(p.grad_dtype_of(&kept.layout), tandem::DType::Bf16);
    assert_eq!(p.grad_dtype_of(&single_layout()), tandem::DType::F32, "a layout without shards keeps f32 gradients");
    let sharded = tandem::parallel::plan::Plan { best: kept.clone(), ..p.clone() };
    assert!(sharded.to_string().contains("gradient shards in bf16"), "{sharded}");
}

/// A GPT's head is a copy of its embedding on every stage list: measured, the head layer says
/// so; planned, a stage holding both counts the embedding's bytes once (one device's model
/// holds one tensor), while a pipeline whose first and last stages hold one each counts both.
#[test]
fn a_tied_head_counts_once_where_a_stage_holds_its_embedding() {
    use tandem::nn::models::{Gpt, GptConfig};
    use tandem::{Device, Tensor};
    let dev = Device::cpu_independent();
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 32, block_size: 8, vocab_size: 50, dropout: 0.0, bias: true };
    let gpt = Gpt::new(cfg, 0, &dev).unwrap();
    let probe = Tensor::from_labels((0..16).map(|i| i % 50).collect(), [2, 8], &dev).unwrap();
    let (work, _) = tandem::parallel::plan::measure_gpt(&gpt, &probe, std::slice::from_ref(&dev), 8, 2).unwrap();
    let wte = 50 * 32 * 4;
    assert_eq!(work.layers.last().unwrap().tied, Some((0, wte)), "{:?}", work.layers.iter().map(|l| (&l.name, l.tied)).collect::<Vec<_>>());
    assert!(work.layers[..work.layers.len() - 1].iter().all(|l| l.tied.is_none()));

    // Three layers of 64 MiB, the last a copy of the first.
    let mut layers = vec![block(64, 1, 1, 1.0); 3];
    layers.iter_mut().for_each(|l| l.tensor_parallel = false);
    layers[2].tied = Some((0, 64 << 20));
    let work = Workload { layers, batch: 8, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let big = 64u64 << 30;
    let dev = |i: usize| DeviceSpec { name: format!("gpu{i}"), speed: 1.0, memory: big, server: 0 };
    let link = Link { latency_s: 1e-5, bytes_per_s: 100e9 };
    let cluster = Cluster { devices: vec![dev(0), dev(1)], within: link, across: link, contention: 1.0, step_overheads: vec![], links: vec![] };
    let one = estimate(&work, &cluster, &single_layout());
    let act = 3 * 8 * (1u64 << 20);
    assert_eq!(one.memory[0], 4 * 2 * (64 << 20) + act, "two tensors' state on one device, not three");
    let piped = estimate(&work, &cluster, &Layout { pipeline: 2, cuts: vec![2], ..single_layout() });
    assert_eq!(piped.memory.len(), 2);
    assert!(piped.memory[0] + piped.memory[1] > 4 * 3 * (64 << 20), "each stage keeps its copy: {:?}", piped.memory);
}

/// The optimizer's update is part of the step: a layer's `update_s` is added once, divided by
/// the data degree where sharding divides the update; measured, every layer with parameters
/// costs some.
#[test]
fn the_optimizer_update_is_part_of_the_step() {
    let (mut work, cluster) = state_bound(64 << 30);
    let data = |shard| Layout { data: 2, shard, ..single_layout() };
    let before = [Shard::None, Shard::Grads].map(|s| estimate(&work, &cluster, &data(s)).step_s);
    work.layers.iter_mut().for_each(|l| l.update_s = 1e-3);
    let after = [Shard::None, Shard::Grads].map(|s| estimate(&work, &cluster, &data(s)).step_s);
    assert!((after[0] - before[0] - 8e-3).abs() < 1e-12, "plain: every replica updates all 8 layers: {before:?} {after:?}");
    assert!((after[1] - before[1] - 4e-3).abs() < 1e-12, "ZeRO-2 over two: half each: {before:?} {after:?}");

    let dev = tandem::Device::cpu_independent();
    let model = tandem::nn::models::SeedModel::Cnn.build(0, &dev).unwrap();
    let weights: Vec<f32> = model.state_dict().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
    let probe = tandem::Tensor::randn([4, 1, 28, 28], &mut tandem::rand::rng(), &dev).unwrap();
    let (work, _) = tandem::parallel::plan::measure(&model, &probe, std::slice::from_ref(&dev), 64, 2).unwrap();
    use tandem::nn::Module;
    for (l, (_, layer)) in work.layers.iter().zip(model.layers()) {
        assert_eq!(l.update_s > 0.0, !layer.parameters().is_empty(), "{}: {}", l.name, l.update_s);
    }
    let after: Vec<f32> = model.state_dict().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
    assert_eq!(after, weights, "measuring the update leaves the model's weights");
}

#[test]
fn the_fastest_precision_is_chosen_and_the_others_reported() {
    use tandem::optim::Precision;
    use tandem::parallel::plan::fastest_precision;
    let work =
        Workload { layers: vec![block(1, 1, 1, 1.0); 4], batch: 8, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let cluster = Cluster::dual_m60(1);
    // Halves run the layers at half the time here; f16 has no layout.
    let plan_in = |scale: f64| plan(&work.scaled(scale), &cluster);
    let all = [Precision::F32, Precision::Bf16, Precision::F16];
    let p = fastest_precision(&all, &mut |c| match c {
        Precision::F32 => plan_in(1.0),
        Precision::Bf16 => plan_in(0.5),
        Precision::F16 => Err(tandem::Error::invalid("plan", "no layout fits the devices' memory")),
    })
    .unwrap();
    assert_eq!(p.precision, Some(Precision::Bf16));
    assert_eq!(p.precisions.len(), 2);
    assert!(p.precisions[0].0 == Precision::F32 && p.precisions[0].1.contains("ms/step"), "{:?}", p.precisions);
    assert!(p.precisions[1].1.contains("no layout fits"), "{:?}", p.precisions);
    assert!(p.to_string().contains("precision bf16 (searched; f32: "), "{p}");
    // A tie keeps the earlier candidate; no plan in any precision is an error naming each.
    let tie = fastest_precision(&all[..2], &mut |_| plan_in(1.0)).unwrap();
    assert_eq!(tie.precision, Some(Precision::F32));
    let none = fastest_precision(&all, &mut |_| Err(tandem::Error::invalid("plan", "too small"))).unwrap_err().to_string();
    assert!(none.contains("no precision has a plan") && none.contains("bf16: ") && none.contains("too small"), "{none}");
}

/// ZeRO-3's unit (the gradient bucket) is searched: a layout that fits only with smaller
/// buckets is kept with them and the default rejected for memory; a bucket holds at least
/// the largest parameter; each bucket pays its messages' latency. Where nothing fits, the
/// error sums the rejections up by reason.
#[test]
fn smaller_buckets_are_searched_where_the_default_does_not_fit() {
    let (mut work, _) = state_bound(64 << 30);
    work.layers.iter_mut().for_each(|l| l.largest_param_bytes = 1 << 20);
    let (_, cluster) = state_bound(1294 << 20);
    let (p, act) = (8 * (64u64 << 20), 8 * 4 * (1u64 << 20));
    let zero3 = |bucket| Layout { data: 2, shard: Shard::Full, bucket, ..single_layout() };
    // Shards of all four, three units gathered, two buckets of gradients in flight, one reduced.
    assert_eq!(estimate(&work, &cluster, &zero3(None)).memory[0], 2 * p + 6 * (25 << 20) + act);
    assert_eq!(estimate(&work, &cluster, &zero3(Some(1 << 20))).memory[0], 2 * p + 6 * (1 << 20) + act);
    // A bucket below the largest parameter holds that parameter.
    work.layers[0].largest_param_bytes = 8 << 20;
    assert_eq!(estimate(&work, &cluster, &zero3(Some(1 << 20))).memory[0], 2 * p + 6 * (8 << 20) + act);
    work.layers[0].largest_param_bytes = 1 << 20;
    let sync = |bucket| estimate(&work, &cluster, &zero3(bucket)).comm_s;
    assert!(sync(Some(1 << 20)) > sync(None), "512 buckets pay more latency than 21");
    let planned = plan(&work, &cluster).unwrap();
    let kept: Vec<&Layout> = std::iter::once(&planned.best).chain(&planned.alternatives).map(|e| &e.layout).collect();
    assert!(kept.iter().any(|l| l.shard == Shard::Full && !l.offload && l.bucket.is_some()), "{planned}");
    assert!(!kept.iter().any(|l| l.shard == Shard::Full && l.bucket.is_none() && !l.offload), "{planned}");
    assert!(planned.rejected.iter().any(|r| r.layout == zero3(None) && r.why.starts_with("memory:")), "{planned}");
    assert!(zero3(Some(1 << 20)).to_string().ends_with("shard full, buckets of 1 MiB"), "{}", zero3(Some(1 << 20)));
    let err = plan(&work, &state_bound(256 << 20).1).unwrap_err().to_string();
    assert!(err.contains("no layout fits") && err.contains("layouts rejected: ") && err.contains(" over memory, the closest "), "{err}");
}

/// Recomputation without pipeline stages is the GPT's per block: the blocks (the layers tensor
/// parallelism splits) keep their inputs and one block's intermediates, the other layers all
/// of theirs, and only the blocks run their forward twice.
#[test]
fn per_block_recomputation_keeps_the_blocks_inputs() {
    let mut ends = block(1, 3, 2, 1.0);
    ends.tensor_parallel = false;
    let mut layers = vec![ends.clone()];
    layers.extend(vec![block(1, 5, 1, 1.0); 4]);
    layers.push(ends);
    let work = Workload { layers, batch: 2, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
    let cluster = Cluster::dual_m60(1);
    let (plain, again) = (estimate(&work, &cluster, &single_layout()), estimate(&work, &cluster, &Layout { recompute: true, ..single_layout() }));
    let (state, mib) = (6 * 4 * (1u64 << 20), 1u64 << 20);
    assert_eq!(plain.memory[0], state + 2 * (3 + 4 * 5 + 3) * mib);
    // Inputs: the first block's is the opening layer's 2 MiB output, the others' 1 MiB each.
    assert_eq!(again.memory[0], state + 2 * (3 + (2 + 1 + 1 + 1) + 3) * mib + 2 * 5 * mib);
    // Four blocks of 1 ms forward a sample, twice a batch of 2.
    assert!((again.step_s - plain.step_s - 4.0 * 2.0 * 1e-3).abs() < 1e-9, "{} {}", again.step_s, plain.step_s);
}
