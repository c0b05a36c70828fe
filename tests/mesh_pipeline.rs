//! Tensor × pipeline and data × tensor × pipeline (`Gpt::tensor_stages` in a pipeline, and
//! grids of such pipelines): every such layout of 8 CPU devices trains a GPT with dropout to
//! `Single`'s losses and weights; 2 × 2 × 2 gives PyTorch's losses on CPU and lavapipe devices;
//! a checkpoint of one layout resumes under another; bad groups are errors.
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
use tandem::parallel::{Loss, OptimConfig, Parallel, Pipeline, PipelineGrid, Single, Split, Stages, Strategy};
use tandem::{Device, Result};

/// `data` pipelines of `devs.len() / data` devices, each stage a group of `tensor`, the
/// stages `host`'s (1F1B, `micro` micro-batches).
fn mesh(host: &Gpt, devs: &[Device], data: usize, tensor: usize, micro: usize, opt: &OptimConfig) -> Result<PipelineGrid> {
    mesh_common::gpt_mesh(host, devs, (data, tensor, micro), tandem::parallel::Shard::None, opt)
}

/// Every (data, tensor, pipeline) with product 8, tensor and pipeline both above 1, over 8
/// CPU devices: a 4-block GPT of 8 heads with dropout on, 2 micro-batches, trains to
/// `Single`'s losses and weights (the same masks: keyed by global sample index).
#[test]
fn every_layout_with_tensor_and_pipeline_of_8_equals_single() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 4, n_head: 8, n_embd: 32, block_size: 8, vocab_size: 40, dropout: 0.1, bias: true };
    let fx = Fixture::load();
    let batches = token_batches(cfg, 8, 3, 11);
    let cpu = Device::cpu();
    let want = train(&mut Single::new(Gpt::new(cfg, 3, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap(), &batches);
    let host = Gpt::new(cfg, 3, &cpu).unwrap();
    for (data, tensor, pipeline) in [(1, 2, 4), (1, 4, 2), (2, 2, 2)] {
        let what = format!("data {data} x tensor {tensor} x pipeline {pipeline}");
        let mut grid = mesh(&host, &common::cpu_devices(8), data, tensor, 2, &fx.adamw()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(grid.replicas().len(), data, "{what}");
        assert_eq!(grid.replicas()[0].ranges().len(), pipeline, "{what}: stages");
        assert_eq!(grid.devices().len(), 8, "{what}");
        same_as_single(&what, &train(&mut grid, &batches), &want);
    }
}

/// The seed CNN (a `Sequential` of 10 layers ending in fc1, relu3, fc2) under every (data,
/// tensor, pipeline) of 8 CPU devices with tensor and pipeline above 1: the stages cut before
/// fc1 at the latest, the last stage's fc1 and fc2 split over its group, SGD with momentum,
/// 2 micro-batches; the same losses and weights as `Single`.
#[test]
fn every_layout_of_a_sequential_with_tensor_and_pipeline_of_8_equals_single() {
    let _guard = common::shared();
    let batches = common::seed_image_batches(12, 3, 5);
    let cpu = Device::cpu();
    let model = SeedModel::Cnn.build(0, &cpu).unwrap();
    let opt = OptimConfig::sgd(tandem::optim::SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let want = train(&mut Single::new(SeedModel::Cnn.build(0, &cpu).unwrap(), &opt, Loss::CrossEntropy, &cpu).unwrap(), &batches);
    for (data, tensor, cuts) in [(1, 2, vec![2, 4, 7]), (1, 4, vec![4]), (2, 2, vec![7])] {
        let what = format!("seed CNN, data {data} x tensor {tensor} x pipeline {}", cuts.len() + 1);
        let stages = |row: &[Device]| Ok(Stages::Sharded(model.tensor_stages(row, tensor, Split::At(cuts.clone()))?));
        let mut grid = Parallel::grid(stages, &common::cpu_devices(8), data, &opt, Loss::CrossEntropy)
            .micro_batches(2)
            .build()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(grid.replicas()[0].ranges().len(), cuts.len() + 1, "{what}");
        same_as_single(&what, &train(&mut grid, &batches), &want);
    }
    // The last stage must hold both Linears it splits.
    let e = model.tensor_stages(&common::cpu_devices(4), 2, Split::At(vec![8])).err().expect("a cut between fc1 and fc2");
    assert!(e.to_string().contains("cut later"), "{e}");
}

/// data 2 × tensor 2 × pipeline 2 of the PyTorch GPT fixture: its 10 AdamW steps with
/// nanoGPT's clipping give PyTorch's losses, gradient norms and weights, on CPU devices and on
/// 8 logical lavapipe devices; tensor 2 × pipeline 2 alone on CPU devices too.
#[test]
fn data_tensor_pipeline_2x2x2_matches_pytorch() {
    let _guard = common::shared();
    let fx = Fixture::load();
    for (family, devs) in common::device_families(8) {
        let host = Gpt::new(fx.config(), 0, &devs[0]).unwrap();
        host.load_state_dict(&fx.init(&devs[0])).unwrap();
        let mut grid = mesh(&host, &devs, 2, 2, 1, &fx.adamw()).unwrap();
        fx.check_steps(&mut grid, &format!("data 2 x tensor 2 x pipeline 2 on {family}"));
    }
    let devs = common::cpu_devices(4);
    let host = Gpt::new(fx.config(), 0, &devs[0]).unwrap();
    host.load_state_dict(&fx.init(&devs[0])).unwrap();
    let stages = Stages::Sharded(host.tensor_stages(&devs, 2, None).unwrap());
    let mut pipe: Pipeline = Parallel::pipeline(stages, &devs, &fx.adamw(), Loss::CrossEntropy).micro_batches(2).build().unwrap();
    fx.check_steps(&mut pipe, "tensor 2 x pipeline 2 on cpu");
}

/// Two steps under data 2 × tensor 2 × pipeline 2; its checkpoint (weights, AdamW state, step
/// count) resumes under `Single` and under tensor 4 × pipeline 2, and `Single`'s under the
/// mesh: every third step equals the mesh's own.
#[test]
fn a_checkpoint_of_one_layout_resumes_under_another() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 16, block_size: 8, vocab_size: 30, dropout: 0.0, bias: true };
    let fx = Fixture::load();
    let batches = token_batches(cfg, 4, 3, 11);
    let cpu = Device::cpu();
    let host = Gpt::new(cfg, 5, &cpu).unwrap();
    let mut grid = mesh(&host, &common::cpu_devices(8), 2, 2, 2, &fx.adamw()).unwrap();
    let first = train(&mut grid, &batches[..2]);
    // Copies: a state_dict's tensors are the live parameters, which the next step updates.
    let (weights, (opt_state, steps)) = (snapshot(grid.state_dict().unwrap()), grid.optimizer_state().unwrap());
    let opt_state = snapshot(opt_state);
    let third = grid.step(&batches[2]).unwrap().loss;
    let after = grid.state_dict().unwrap();

    let mut single = Single::new(Gpt::new(cfg, 9, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap();
    single.set_grad_clip(Some(1.0)).unwrap();
    single.load_state_dict(&weights).unwrap();
    single.load_optimizer_state(&opt_state, steps).unwrap();
    assert_close("Single resumed: third loss", &[single.step(&batches[2]).unwrap().loss], &[third], 0.0, 1e-5);
    let tp4 = mesh(&host, &common::cpu_devices(8), 1, 4, 2, &fx.adamw());
    let mut tp4 = tp4.unwrap();
    tp4.set_grad_clip(Some(1.0)).unwrap();
    tp4.load_state_dict(&weights).unwrap();
    tp4.load_optimizer_state(&opt_state, steps).unwrap();
    assert_close("tensor 4 x pipeline 2 resumed: third loss", &[tp4.step(&batches[2]).unwrap().loss], &[third], 0.0, 1e-5);
    for ((name, a), (_, b)) in tp4.state_dict().unwrap().iter().zip(&after) {
        assert_close(&format!("tensor 4 x pipeline 2 resumed: {name}"), &a.to_vec().unwrap(), &b.to_vec().unwrap(), 1e-5, 1e-4);
    }
    // And back: Single's two steps resume under the mesh.
    let mut single = Single::new(Gpt::new(cfg, 5, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap();
    let alone = train(&mut single, &batches[..2]);
    assert_close("Single's first two losses", &alone.0, &first.0, 0.0, 1e-5);
    let mut back = mesh(&Gpt::new(cfg, 9, &cpu).unwrap(), &common::cpu_devices(8), 2, 2, 2, &fx.adamw()).unwrap();
    back.set_grad_clip(Some(1.0)).unwrap();
    back.load_state_dict(&single.state_dict().unwrap()).unwrap();
    let (st, n) = single.optimizer_state().unwrap();
    back.load_optimizer_state(&st, n).unwrap();
    assert_close("the mesh resumed from Single: third loss", &[back.step(&batches[2]).unwrap().loss], &[third], 0.0, 1e-5);
}

/// Groups that do not divide the devices, heads that do not split, and stages given other
/// devices than they were made on are errors naming what is wrong.
#[test]
fn bad_groups_are_errors() {
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, block_size: 4, vocab_size: 10, dropout: 0.0, bias: true };
    let devs = common::cpu_devices(4);
    let host = Gpt::new(cfg, 0, &devs[0]).unwrap();
    let err = |r: Result<Vec<tandem::parallel::ShardedStage>>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err(host.tensor_stages(&devs[..3], 2, None)).contains("3 devices do not make groups of 2"),
        "{}",
        err(host.tensor_stages(&devs[..3], 2, None))
    );
    assert!(err(host.tensor_stages(&devs, 4, None)).contains("n_head 2"), "{}", err(host.tensor_stages(&devs, 4, None)));
    let stages = Stages::Sharded(host.tensor_stages(&devs, 2, None).unwrap());
    let other = common::cpu_devices(4);
    let e = Parallel::pipeline(stages, &other, &OptimConfig::sgd(Default::default()), Loss::CrossEntropy).build().err().expect("other devices");
    assert!(e.to_string().contains("the devices the stages were made on"), "{e}");
}

/// `--strategy pipeline --tensor 2` and `--strategy data,pipeline --tensor 2` train the GPT
/// to single-device losses (dropout on); a `--tensor` that does not divide the devices, and
/// tensor-parallel stages of a seed model, are usage errors naming the flag.
#[test]
fn the_command_line_trains_pipelines_of_tensor_groups() {
    let args = mesh_common::TINY_GPT_TRAIN;
    let losses = mesh_common::tiny_gpt_losses;
    let single = losses(&["--devices", "cpu"]);
    assert_eq!(single.len(), 3, "{single:?}");
    let tp_pp = losses(&["--strategy", "pipeline", "--tensor", "2", "--micro-batches", "2", "--devices", "cpu,cpu,cpu,cpu"]);
    assert_close("--strategy pipeline --tensor 2 against single", &tp_pp, &single, 0.0, 1e-5);
    let cube = losses(&["--strategy", "data,pipeline", "--pipelines", "2", "--tensor", "2", "--devices", "cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu"]);
    assert_close("--strategy data,pipeline --tensor 2 against single", &cube, &single, 0.0, 1e-5);
    let o = common::run(&[&args[..], &["--strategy", "pipeline", "--tensor", "3", "--devices", "cpu,cpu,cpu,cpu"]].concat());
    assert_eq!(o.status.code(), Some(2), "a bad --tensor is a usage error");
    assert!(common::text(&o.stderr).contains("--tensor"), "{}", common::text(&o.stderr));
    let seed = ["train", "--model", "seed-cnn", "--data", "synthetic", "--batch", "8", "--steps", "2", "--devices", "cpu,cpu,cpu,cpu"];
    common::fails(&[&seed[..], &["--strategy", "pipeline", "--tensor", "2"]].concat(), "written for --model gpt");
}
