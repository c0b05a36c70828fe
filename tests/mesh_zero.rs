//! ZeRO on the data axis of every layout (`DataGrid::shard`, `--shard` with `data,tensor` and
//! `data,pipeline`): every (data, tensor, pipeline) of 8 CPU devices with data above 1, in each
//! shard mode, trains a GPT with dropout and a `Sequential` to `Single`'s losses and weights;
//! 2 × 2 × 2 with ZeRO-2 gives PyTorch's losses on CPU and lavapipe devices; a sharded
//! checkpoint resumes unsharded and the other way; each device keeps only its share of the
//! optimizer state.
mod common;
#[path = "common/gpt_fixture.rs"]
mod gpt_fixture;
#[path = "common/mesh.rs"]
mod mesh_common;
use common::assert_close;
use gpt_fixture::Fixture;
use mesh_common::{same_as_single, snapshot, token_batches, train};
use tandem::nn::models::{Gpt, GptConfig, SeedModel};
use tandem::nn::Module;
use tandem::parallel::{DataParallelConfig, Loss, OptimConfig, Parallel, PipelineGrid, Shard, Single, Split, Stages, Strategy};
use tandem::{Device, Result};

const MODES: [Shard; 3] = [Shard::Optimizer, Shard::Grads, Shard::Full];

/// `data` pipelines over `devs`, each stage a group of `tensor` of `host`'s blocks, the data
/// axis sharded as `shard` (1F1B, `micro` micro-batches).
fn mesh(host: &Gpt, devs: &[Device], data: usize, tensor: usize, micro: usize, shard: Shard, opt: &OptimConfig) -> Result<PipelineGrid> {
    mesh_common::gpt_mesh(host, devs, (data, tensor, micro), shard, opt)
}

/// Every (data, tensor, pipeline) of 8 with data above 1 (one-device pipelines for data 8),
/// each shard mode on the data axis: a 4-block GPT of 8 heads with dropout, AdamW, clipped,
/// 2 micro-batches, trains to `Single`'s losses and weights.
#[test]
fn every_layout_of_8_in_every_shard_mode_equals_single() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 4, n_head: 8, n_embd: 32, block_size: 8, vocab_size: 40, dropout: 0.1, bias: true };
    let fx = Fixture::load();
    let batches = token_batches(cfg, 16, 3, 11);
    let cpu = Device::cpu();
    let want = train(&mut Single::new(Gpt::new(cfg, 3, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap(), &batches);
    let host = Gpt::new(cfg, 3, &cpu).unwrap();
    for (data, tensor, pipeline) in [(2, 2, 2), (2, 4, 1), (2, 1, 4), (4, 2, 1), (4, 1, 2), (8, 1, 1)] {
        for shard in MODES {
            let what = format!("data {data} x tensor {tensor} x pipeline {pipeline}, --shard {}", shard.name());
            let mut grid = mesh(&host, &common::cpu_devices(8), data, tensor, 2, shard, &fx.adamw()).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!((grid.replicas().len(), grid.replicas()[0].ranges().len(), grid.shard_mode()), (data, pipeline, shard), "{what}");
            same_as_single(&what, &train(&mut grid, &batches), &want);
        }
    }
}

/// The tensor-parallel GPT replicas of `Parallel::data_tensor` shard their data axis too.
#[test]
fn data_over_tensor_groups_shards_its_data_axis() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 16, block_size: 8, vocab_size: 30, dropout: 0.1, bias: true };
    let fx = Fixture::load();
    let batches = token_batches(cfg, 8, 3, 7);
    let cpu = Device::cpu();
    let want = train(&mut Single::new(Gpt::new(cfg, 2, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap(), &batches);
    for shard in MODES {
        let what = format!("data 2 x tensor 2 (TensorParallelGpt), --shard {}", shard.name());
        let mut grid = Parallel::data_tensor(|d: &Device| Gpt::new(cfg, 2, d), &common::cpu_devices(4), 2, &fx.adamw(), Loss::CrossEntropy)
            .shard(shard)
            .build()
            .unwrap();
        same_as_single(&what, &train(&mut grid, &batches), &want);
    }
}

/// The seed CNN (SGD with momentum) under data 2 × tensor 2 × pipeline 2, data 4 × pipeline 2
/// and data 4 × tensor 2, each shard mode: `Single`'s losses and weights.
#[test]
fn a_sequential_in_every_shard_mode_equals_single() {
    let _guard = common::shared();
    let batches = common::seed_image_batches(16, 3, 5);
    let cpu = Device::cpu();
    let model = SeedModel::Cnn.build(0, &cpu).unwrap();
    let opt = OptimConfig::sgd(tandem::optim::SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let want = train(&mut Single::new(SeedModel::Cnn.build(0, &cpu).unwrap(), &opt, Loss::CrossEntropy, &cpu).unwrap(), &batches);
    for (data, tensor, cuts) in [(2, 2, vec![7]), (4, 1, vec![6]), (4, 2, vec![])] {
        for shard in MODES {
            let what = format!("seed CNN, data {data} x tensor {tensor} x pipeline {}, --shard {}", cuts.len() + 1, shard.name());
            let stages = |row: &[Device]| Ok(Stages::Sharded(model.tensor_stages(row, tensor, Split::At(cuts.clone()))?));
            let mut grid = Parallel::grid(stages, &common::cpu_devices(8), data, &opt, Loss::CrossEntropy)
                .micro_batches(2)
                .shard(shard)
                .build()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            same_as_single(&what, &train(&mut grid, &batches), &want);
        }
    }
}

/// data 2 × tensor 2 × pipeline 2 with ZeRO-2 on the data axis: the PyTorch GPT fixture's 10
/// AdamW steps give PyTorch's losses, gradient norms and weights on CPU devices, on 8 logical
/// lavapipe devices, and with one replica on CPU devices and the other on lavapipe.
#[test]
fn zero_2_on_data_tensor_pipeline_2x2x2_matches_pytorch() {
    let _guard = common::shared();
    let fx = Fixture::load();
    for (family, devs) in common::device_families(8) {
        let host = Gpt::new(fx.config(), 0, &devs[0]).unwrap();
        host.load_state_dict(&fx.init(&devs[0])).unwrap();
        let mut grid = mesh(&host, &devs, 2, 2, 1, Shard::Grads, &fx.adamw()).unwrap();
        fx.check_steps(&mut grid, &format!("data 2 (ZeRO-2) x tensor 2 x pipeline 2 on {family}"));
    }
    // One replica on CPU devices, the other on lavapipe: the data axis spans two kernel
    // families, whose replicas stay one model because every piece is all-gathered.
    let families = common::device_families(4);
    if let [(_, cpus), (gpu, wgpus)] = &families[..] {
        let devs = [cpus.clone(), wgpus.clone()].concat();
        let host = Gpt::new(fx.config(), 0, &devs[0]).unwrap();
        host.load_state_dict(&fx.init(&devs[0])).unwrap();
        let mut grid = mesh(&host, &devs, 2, 2, 1, Shard::Grads, &fx.adamw()).unwrap();
        fx.check_steps(&mut grid, &format!("data 2 (ZeRO-2) over cpu and {gpu} x tensor 2 x pipeline 2"));
    }
}

/// Two steps under 2 × 2 × 2 with ZeRO-3; its checkpoint resumes under `Single` and under
/// 2 × 2 × 2 with ZeRO-1, and `Single`'s under ZeRO-2: each third loss the sharded run's own.
#[test]
fn a_sharded_checkpoint_resumes_unsharded_and_back() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 16, block_size: 8, vocab_size: 30, dropout: 0.0, bias: true };
    let fx = Fixture::load();
    let batches = token_batches(cfg, 4, 3, 11);
    let cpu = Device::cpu();
    let host = Gpt::new(cfg, 5, &cpu).unwrap();
    let mut grid = mesh(&host, &common::cpu_devices(8), 2, 2, 2, Shard::Full, &fx.adamw()).unwrap();
    train(&mut grid, &batches[..2]);
    let (weights, (opt_state, steps)) = (snapshot(grid.state_dict().unwrap()), grid.optimizer_state().unwrap());
    let opt_state = snapshot(opt_state);
    let third = grid.step(&batches[2]).unwrap().loss;

    let mut single = Single::new(Gpt::new(cfg, 9, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap();
    single.set_grad_clip(Some(1.0)).unwrap();
    single.load_state_dict(&weights).unwrap();
    single.load_optimizer_state(&opt_state, steps).unwrap();
    assert_close("Single resumed from ZeRO-3: third loss", &[single.step(&batches[2]).unwrap().loss], &[third], 0.0, 1e-5);
    let mut zero1 = mesh(&Gpt::new(cfg, 9, &cpu).unwrap(), &common::cpu_devices(8), 2, 2, 2, Shard::Optimizer, &fx.adamw()).unwrap();
    zero1.set_grad_clip(Some(1.0)).unwrap();
    zero1.load_state_dict(&weights).unwrap();
    zero1.load_optimizer_state(&opt_state, steps).unwrap();
    assert_close("ZeRO-1 resumed from ZeRO-3: third loss", &[zero1.step(&batches[2]).unwrap().loss], &[third], 0.0, 1e-5);

    let mut single = Single::new(Gpt::new(cfg, 5, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap();
    train(&mut single, &batches[..2]);
    let mut zero2 = mesh(&Gpt::new(cfg, 9, &cpu).unwrap(), &common::cpu_devices(8), 2, 2, 2, Shard::Grads, &fx.adamw()).unwrap();
    zero2.set_grad_clip(Some(1.0)).unwrap();
    zero2.load_state_dict(&single.state_dict().unwrap()).unwrap();
    let (st, n) = single.optimizer_state().unwrap();
    zero2.load_optimizer_state(&st, n).unwrap();
    assert_close("ZeRO-2 resumed from Single: third loss", &[zero2.step(&batches[2]).unwrap().loss], &[third], 0.0, 1e-5);
}

/// Under every shard mode each device of data 4 × pipeline 2 keeps about a quarter of its
/// stage's AdamW state (its pieces; the whole of it summed over the data axis), where unsharded
/// every replica keeps all of it.
#[test]
fn each_device_keeps_its_share_of_the_optimizer_state() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 16, block_size: 8, vocab_size: 30, dropout: 0.0, bias: true };
    let batches = token_batches(cfg, 8, 1, 3);
    let cpu = Device::cpu();
    let host = Gpt::new(cfg, 1, &cpu).unwrap();
    let opt = OptimConfig::adam(tandem::optim::AdamConfig::adamw());
    let mut whole = mesh(&host, &common::cpu_devices(8), 4, 1, 1, Shard::None, &opt).unwrap();
    whole.step(&batches[0]).unwrap();
    let full = whole.optimizer_state_bytes();
    // Slot by slot: replica r's stage s is device 2r + s.
    let per_stage: Vec<u64> = full[..2].to_vec();
    assert_eq!(
        full,
        [per_stage.clone(), per_stage.clone(), per_stage.clone(), per_stage.clone()].concat(),
        "unsharded, every replica holds its stages' whole state"
    );
    for shard in MODES {
        let mut grid = mesh(&host, &common::cpu_devices(8), 4, 1, 1, shard, &opt).unwrap();
        grid.step(&batches[0]).unwrap();
        let held = grid.optimizer_state_bytes();
        for s in 0..2 {
            let column: Vec<u64> = (0..4).map(|r| held[2 * r + s]).collect();
            // Each block is a quarter of the stage's parameters rounded up, per bucket.
            assert_eq!(column.iter().sum::<u64>(), per_stage[s], "--shard {}: stage {s}'s state over the data axis {column:?}", shard.name());
            assert!(column.iter().all(|&b| b <= per_stage[s] / 4 + 64), "--shard {}: stage {s} holds {column:?} of {}", shard.name(), per_stage[s]);
        }
    }
}

/// The options of one-device replicas are refused by name.
#[test]
fn what_a_grid_does_not_shard_is_an_error() {
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, block_size: 4, vocab_size: 10, dropout: 0.0, bias: true };
    let cpu = Device::cpu();
    let host = Gpt::new(cfg, 0, &cpu).unwrap();
    let opt = OptimConfig::sgd(Default::default());
    for (cfg, want) in [
        (DataParallelConfig { shard: Shard::Grads, deterministic: true, ..Default::default() }, "deterministic mode"),
        (DataParallelConfig { shard: Shard::Grads, micro_batches: 2, ..Default::default() }, "micro-batches"),
        (DataParallelConfig { shard: Shard::Optimizer, grad_dtype: tandem::DType::Bf16, ..Default::default() }, "needs sharded gradients"),
    ] {
        let e = Parallel::grid(|row| Ok(Stages::Sharded(host.tensor_stages(row, 1, None)?)), &common::cpu_devices(4), 2, &opt, Loss::CrossEntropy)
            .data_config(cfg)
            .build()
            .err()
            .expect(want);
        assert!(e.to_string().contains(want) && e.to_string().contains("DataGrid::shard"), "{e}");
    }
}

/// `--shard` on the data axis of `data,pipeline --tensor 2` and `data,tensor` (GPT, dropout
/// on; ZeRO-3 with bf16 gradient shards too) and of a seed model's `data,tensor` trains to one
/// device's losses; `--shard` with a layout that has no data axis is a usage error naming it.
#[test]
fn the_command_line_shards_the_data_axis_of_every_layout() {
    let args = mesh_common::TINY_GPT_TRAIN;
    let losses = mesh_common::tiny_gpt_losses;
    let single = losses(&["--devices", "cpu"]);
    assert_eq!(single.len(), 3, "{single:?}");
    let eight = ["--devices", "cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu"];
    for (what, extra) in [
        ("data 2 x tensor 2 x pipeline 2, ZeRO-2", vec!["--strategy", "data,pipeline", "--pipelines", "2", "--tensor", "2", "--shard", "grads"]),
        ("data 2 x tensor 2 x pipeline 2, ZeRO-3", vec!["--strategy", "data,pipeline", "--pipelines", "2", "--tensor", "2", "--shard", "full"]),
        ("data 4 x tensor 2, ZeRO-1", vec!["--strategy", "data,tensor", "--tensor", "2", "--shard", "optimizer"]),
    ] {
        assert_close(what, &losses(&[&extra[..], &eight[..]].concat()), &single, 0.0, 1e-5);
    }
    // bf16 gradient shards round each reduced gradient once: close, not equal.
    let half = losses(&["--strategy", "data,tensor", "--tensor", "2", "--shard", "full", "--grad-dtype", "bf16", "--devices", "cpu,cpu,cpu,cpu"]);
    assert_close("data 2 x tensor 2, ZeRO-3, bf16 gradient shards", &half, &single, 0.0, 2e-2);
    let seed = ["train", "--model", "seed-two-layer", "--data", "synthetic", "--batch", "8", "--steps", "2"];
    let seed_losses = |extra: &[&str]| common::logged_losses(&[&seed[..], extra].concat());
    let alone = seed_losses(&["--devices", "cpu"]);
    let sharded = seed_losses(&["--strategy", "data,tensor", "--tensor", "2", "--shard", "grads", "--devices", "cpu,cpu,cpu,cpu"]);
    assert_close("seed two-layer, data 2 x tensor 2, ZeRO-2", &sharded, &alone, 0.0, 1e-5);
    common::fails(&[&args[..], &["--strategy", "pipeline", "--shard", "grads", "--devices", "cpu,cpu"]].concat(), "--strategy pipeline has none");
}
