//! The data axis over multi-device replicas (`DataGrid`, `Parallel::data_tensor`,
//! `--strategy data,tensor`): data × tensor of the GPT fixture gives PyTorch's losses on CPU and
//! lavapipe devices; every data × tensor factorisation of 8 CPU devices equals `Single` for the
//! GPT (dropout on) and the seed CNN; a checkpoint of one layout resumes under another; the
//! planner builds data × tensor; bad groups are errors naming the flag.
mod common;
#[path = "common/gpt_fixture.rs"]
mod gpt_fixture;
#[path = "common/mesh.rs"]
mod mesh_common;
use common::assert_close;
use gpt_fixture::Fixture;
use mesh_common::{same_as_single, token_batches, train};
use tandem::nn::models::{Gpt, GptConfig, SeedModel};
use tandem::parallel::{DataGrid, Loss, OptimConfig, Parallel, Single, Strategy, TensorParallelGpt};
use tandem::{Device, Result};

fn gpt_grid(fx: &Fixture, cfg: GptConfig, devs: &[Device], tensor: usize) -> Result<DataGrid<TensorParallelGpt>> {
    let mut grid = Parallel::data_tensor(|d: &Device| Gpt::new(cfg, 0, d), devs, tensor, &fx.adamw(), Loss::CrossEntropy).build()?;
    grid.load_state_dict(&fx.init(&devs[0]))?;
    Ok(grid)
}

/// data 2 × tensor 2 (4 devices) and data 4 × tensor 2 (8 devices): the fixture's 10 AdamW
/// steps with nanoGPT's clipping give PyTorch's losses, gradient norms and weights.
#[test]
fn data_over_tensor_groups_matches_pytorch() {
    let _guard = common::shared();
    let fx = Fixture::load();
    for (family, devs) in common::device_families(4) {
        let mut grid = gpt_grid(&fx, fx.config(), &devs, 2).expect("data 2 x tensor 2");
        assert_eq!(grid.replicas().len(), 2);
        fx.check_steps(&mut grid, &format!("data 2 x tensor 2 on {family}"));
    }
    let mut grid = gpt_grid(&fx, fx.config(), &common::cpu_devices(8), 2).expect("data 4 x tensor 2");
    assert_eq!(grid.replicas().len(), 4);
    fx.check_steps(&mut grid, "data 4 x tensor 2 on cpu");
}

/// Every (data, tensor) with data × tensor = 8 over 8 CPU devices trains a GPT of 8 heads with
/// dropout on (masks keyed by global sample index, so every replica draws Single's) to
/// `Single`'s losses and weights.
#[test]
fn every_data_tensor_factorisation_of_8_equals_single() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 2, n_head: 8, n_embd: 32, block_size: 8, vocab_size: 40, dropout: 0.1, bias: true };
    let fx = Fixture::load();
    let batches = token_batches(cfg, 8, 3, 7);
    let cpu = Device::cpu();
    let want = train(&mut Single::new(Gpt::new(cfg, 3, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap(), &batches);
    for tensor in [1, 2, 4, 8] {
        let devs = common::cpu_devices(8);
        let mut grid = Parallel::data_tensor(|d: &Device| Gpt::new(cfg, 3, d), &devs, tensor, &fx.adamw(), Loss::CrossEntropy).build().unwrap();
        assert_eq!(grid.replicas().len(), 8 / tensor);
        same_as_single(&format!("data {} x tensor {tensor}", 8 / tensor), &train(&mut grid, &batches), &want);
    }
}

/// The seed CNN's last two Linears sharded in groups of 2, data parallelism over 2 groups,
/// uneven batch shares included.
#[test]
fn seed_cnn_over_tensor_groups_equals_single() {
    let _guard = common::shared();
    let batches = common::seed_image_batches(12, 3, 5);
    let cpu = Device::cpu();
    let model = SeedModel::Cnn.build(0, &cpu).unwrap();
    let opt = OptimConfig::sgd(tandem::optim::SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let want = train(&mut Single::new(SeedModel::Cnn.build(0, &cpu).unwrap(), &opt, Loss::CrossEntropy, &cpu).unwrap(), &batches);
    let devs = common::cpu_devices(4);
    let mut even = Parallel::data_tensor(|_| Ok(&model), &devs, 2, &opt, Loss::CrossEntropy).build().unwrap();
    same_as_single("seed CNN, data 2 x tensor 2", &train(&mut even, &batches), &want);
    let devs = common::cpu_devices(4);
    let mut uneven = Parallel::data_tensor(|_| Ok(&model), &devs, 2, &opt, Loss::CrossEntropy).split_weights(vec![2.0, 1.0]).build().unwrap();
    same_as_single("seed CNN, data 2 x tensor 2 split 2:1", &train(&mut uneven, &batches), &want);
}

/// Two steps under data 2 × tensor 2, its checkpoint (weights, AdamW state, step count) loaded
/// into `Single` and into tensor 4: the third step equals the grid's own.
#[test]
fn a_checkpoint_of_one_layout_resumes_under_another() {
    let _guard = common::shared();
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 16, block_size: 8, vocab_size: 30, dropout: 0.0, bias: true };
    let fx = Fixture::load();
    let batches = token_batches(cfg, 4, 3, 7);
    let devs = common::cpu_devices(4);
    let mut grid = Parallel::data_tensor(|d: &Device| Gpt::new(cfg, 1, d), &devs, 2, &fx.adamw(), Loss::CrossEntropy).build().unwrap();
    for b in &batches[..2] {
        grid.step(b).unwrap();
    }
    // Host copies: a state_dict may share storage with the parameters the next step updates.
    let host = |state: Vec<(String, tandem::Tensor)>| -> Vec<(String, tandem::Tensor)> {
        state.into_iter().map(|(n, t)| (n, tandem::Tensor::from_vec(t.to_vec().unwrap(), t.dims().to_vec(), &Device::cpu()).unwrap())).collect()
    };
    let (opt_state, steps) = grid.optimizer_state().unwrap();
    let (weights, opt_state) = (host(grid.state_dict().unwrap()), host(opt_state));
    assert_eq!(steps, 2);
    let cpu = Device::cpu();
    let mut single = Single::new(Gpt::new(cfg, 9, &cpu).unwrap(), &fx.adamw(), Loss::CrossEntropy, &cpu).unwrap();
    let tensor4 = common::cpu_devices(4);
    let mut tp = Parallel::tensor(Gpt::new(cfg, 9, &tensor4[0]).unwrap(), &tensor4, &fx.adamw(), Loss::CrossEntropy).build().unwrap();
    let want = grid.step(&batches[2]).unwrap().loss;
    for (what, s) in [("single", &mut single as &mut dyn Strategy), ("tensor 4", &mut tp)] {
        s.load_state_dict(&weights).unwrap();
        s.load_optimizer_state(&opt_state, steps).unwrap();
        assert_close(&format!("the third step resumed under {what}"), &[s.step(&batches[2]).unwrap().loss], &[want], 0.0, 1e-5);
    }
    // And the other way: Single's checkpoint into a fresh grid.
    let mut again =
        Parallel::data_tensor(|d: &Device| Gpt::new(cfg, 5, d), &common::cpu_devices(4), 2, &fx.adamw(), Loss::CrossEntropy).build().unwrap();
    again.load_state_dict(&single.state_dict().unwrap()).unwrap();
    let (s_state, s_steps) = single.optimizer_state().unwrap();
    again.load_optimizer_state(&s_state, s_steps).unwrap();
    let next = token_batches(cfg, 4, 4, 7).pop().unwrap();
    assert_close("a grid resumed from Single", &[again.step(&next).unwrap().loss], &[single.step(&next).unwrap().loss], 0.0, 1e-5);
}

#[test]
fn groups_that_do_not_divide_the_devices_are_errors() {
    let fx = Fixture::load();
    let err = gpt_grid(&fx, fx.config(), &common::cpu_devices(6), 4).err().expect("6 devices in groups of 4").to_string();
    assert!(err.contains("6 devices do not make groups of 4"), "{err}");
    let err = gpt_grid(&fx, fx.config(), &common::cpu_devices(6), 3).err().expect("2 heads over 3 devices").to_string();
    assert!(err.contains("n_head 2 does not split evenly over 3 devices"), "{err}");
}

/// `--strategy data,tensor` trains the single device's losses; `--tensor` is checked and
/// belongs to data,tensor alone.
#[test]
fn the_command_line_trains_data_over_tensor_groups() {
    let args = mesh_common::TINY_GPT_TRAIN;
    let losses = mesh_common::tiny_gpt_losses;
    let single = losses(&["--devices", "cpu"]);
    assert_eq!(single.len(), 3, "{single:?}");
    let mesh = losses(&["--strategy", "data,tensor", "--tensor", "2", "--devices", "cpu,cpu,cpu,cpu"]);
    assert_close("--strategy data,tensor against single", &mesh, &single, 0.0, 1e-5);
    let seed = ["train", "--model", "seed-cnn", "--data", "synthetic", "--batch", "8", "--steps", "2", "--devices", "cpu,cpu,cpu,cpu"];
    common::ok(&[&seed[..], &["--strategy", "data,tensor"]].concat());
    common::fails(&[&args[..], &["--strategy", "data,tensor", "--tensor", "3", "--devices", "cpu,cpu,cpu,cpu"]].concat(), "--tensor");
    common::fails(&[&args[..], &["--strategy", "data,tensor", "--tensor", "4", "--devices", "cpu,cpu,cpu,cpu"]].concat(), "at least 2 groups");
    common::fails(&[&args[..], &["--strategy", "data", "--tensor", "2", "--devices", "cpu,cpu"]].concat(), "needs --strategy data,tensor");
    let o = common::run(&[&args[..], &["--strategy", "data,tensor", "--tensor", "3", "--devices", "cpu,cpu,cpu,cpu"]].concat());
    assert_eq!(o.status.code(), Some(2), "a bad --tensor is a usage error");
}
