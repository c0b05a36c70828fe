//! Tensor-parallel GPT and per-block recomputation: the PyTorch fixture's 10 AdamW steps
//! (tests/fixtures/gpt_tiny.safetensors, scripts/gpt_parity.py) under `TensorParallelGpt` on two
//! CPU devices and two logical `wgpu:0` devices; gathered checkpoints equal the single-device
//! model's; dropout masks equal `Single`'s; recomputation gives the plain run's gradients;
//! `--strategy tensor` and `--recompute` on the command line; bad head splits are errors.
mod common;
#[path = "common/gpt_fixture.rs"]
mod gpt_fixture;
use common::assert_close;
use gpt_fixture::Fixture;
use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::checkpoint::read_safetensors;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::{with_samples, Module, SampleContext};
use tandem::parallel::{Loss, Single, Strategy, TensorParallelGpt};
use tandem::{Device, Error, Result, Tensor};

fn cpu() -> Device {
    Device::from_backend(Arc::new(CpuBackend::new()))
}

/// A tensor-parallel model over `devs` holding the fixture's initial weights.
fn tensor_parallel(fx: &Fixture, cfg: GptConfig, devs: &[Device]) -> Result<TensorParallelGpt> {
    let mut tp = TensorParallelGpt::new(Gpt::new(cfg, 0, &devs[0])?, devs, &fx.adamw(), Loss::CrossEntropy)?;
    tp.load_state_dict(&fx.init(&devs[0]))?;
    Ok(tp)
}

fn names_and_shapes(state: &[(String, Tensor)]) -> Vec<(String, Vec<usize>)> {
    state.iter().map(|(n, t)| (n.clone(), t.dims().to_vec())).collect()
}

#[test]
fn tensor_parallel_matches_pytorch() {
    let _guard = common::shared();
    let fx = Fixture::load();
    for (_, devs) in common::device_families(2) {
        let mut tp = tensor_parallel(&fx, fx.config(), &devs).expect("tensor-parallel model");
        fx.check_steps(&mut tp, &format!("tensor on {} + {}", devs[0], devs[1]));
    }
}

/// The gathered weights and optimizer state have the single-device model's names and shapes;
/// loading scatters and gathering gives the same values back, bit for bit.
#[test]
fn checkpoints_are_the_single_device_ones() -> Result<()> {
    let fx = Fixture::load();
    let devs = [cpu(), cpu()];
    let mut single = Single::new(Gpt::new(fx.config(), 0, &devs[0])?, &fx.adamw(), Loss::CrossEntropy, &devs[0])?;
    single.load_state_dict(&fx.init(&devs[0]))?;
    let mut tp = tensor_parallel(&fx, fx.config(), &devs)?;
    assert_eq!(names_and_shapes(&tp.state_dict()?), names_and_shapes(&single.state_dict()?));
    let no_bias = GptConfig { bias: false, ..fx.config() };
    let tp_no_bias = TensorParallelGpt::new(Gpt::new(no_bias, 0, &devs[0])?, &devs, &fx.adamw(), Loss::CrossEntropy)?;
    assert_eq!(names_and_shapes(&tp_no_bias.state_dict()?), names_and_shapes(&Gpt::new(no_bias, 0, &devs[0])?.state_dict()), "without biases");
    for ((name, a), (_, b)) in tp.state_dict()?.iter().zip(single.state_dict()?) {
        assert_eq!(a.to_vec()?, b.to_vec()?, "{name} after a scatter and a gather");
    }
    single.step(&fx.batch(0))?;
    tp.step(&fx.batch(0))?;
    let (s_state, s_steps) = single.optimizer_state()?;
    let (t_state, t_steps) = tp.optimizer_state()?;
    assert_eq!(names_and_shapes(&t_state), names_and_shapes(&s_state));
    assert_eq!(t_steps, s_steps);
    for ((name, a), (_, b)) in t_state.iter().zip(&s_state) {
        assert_close(&format!("optimizer state {name}"), &a.to_vec()?, &b.to_vec()?, 1e-6, 1e-4);
    }
    // A resumed tensor-parallel run continues exactly as the one that saved.
    let mut resumed = tensor_parallel(&fx, fx.config(), &devs)?;
    resumed.load_state_dict(&tp.state_dict()?)?;
    resumed.load_optimizer_state(&t_state, t_steps)?;
    assert_eq!(resumed.step(&fx.batch(1))?.loss, tp.step(&fx.batch(1))?.loss);
    for ((name, a), (_, b)) in resumed.state_dict()?.iter().zip(tp.state_dict()?) {
        assert_eq!(a.to_vec()?, b.to_vec()?, "{name} after a resumed step");
    }
    Ok(())
}

/// With dropout on, the tensor-parallel run draws the single-device run's masks: the same
/// losses over a few steps (a different mask would change them by far more than rounding).
#[test]
fn dropout_masks_equal_single_devices() -> Result<()> {
    let fx = Fixture::load();
    let cfg = GptConfig { dropout: 0.2, ..fx.config() };
    let devs = [cpu(), cpu()];
    let mut single = Single::new(Gpt::new(cfg, 0, &devs[0])?, &fx.adamw(), Loss::CrossEntropy, &devs[0])?;
    single.load_state_dict(&fx.init(&devs[0]))?;
    let mut tp = tensor_parallel(&fx, cfg, &devs)?;
    let mut plain = tensor_parallel(&fx, fx.config(), &devs)?;
    for step in 0..3 {
        let (a, b, c) = (single.step(&fx.batch(step))?.loss, tp.step(&fx.batch(step))?.loss, plain.step(&fx.batch(step))?.loss);
        assert_close(&format!("loss with dropout at step {step}"), &[b], &[a], 0.0, 1e-5);
        assert!((b - c).abs() > 1e-3, "dropout changed nothing at step {step}: {b} vs {c}");
    }
    Ok(())
}

/// Every parameter's gradient of one loss, in state_dict order, from a forward under a fixed
/// sample context (as a strategy's step runs it).
fn gpt_grads(gpt: &Gpt, fx: &Fixture) -> Result<Vec<(String, Vec<f32>)>> {
    let dev = gpt.parameters()[0].1.device().clone();
    let batch = fx.batch(0);
    let (x, y) = tandem::parallel::batch_to_device(&batch, &dev)?;
    gpt.zero_grad();
    let ctx = SampleContext { step: 3, first_sample: 0, samples: batch.len() };
    let loss = with_samples(ctx, || Gpt::loss(&gpt.forward(&x)?, &y))?;
    loss.backward()?;
    gpt.parameters()
        .into_iter()
        .map(|(n, p)| Ok((n.clone(), p.grad().ok_or_else(|| Error::Msg(format!("{n} has no gradient")))?.to_vec()?)))
        .collect()
}

/// Recomputation gives the plain run's gradients bit for bit on the CPU, dropout included,
/// and keeps fewer activations; under tensor parallelism too.
#[test]
fn recompute_gives_the_plain_gradients() -> Result<()> {
    let fx = Fixture::load();
    let cfg = GptConfig { dropout: 0.1, ..fx.config() };
    let dev = cpu();
    let gpt = Gpt::new(cfg, 0, &dev)?;
    gpt.load_state_dict(&fx.init(&dev))?;
    let plain = gpt_grads(&gpt, &fx)?;
    gpt.set_recompute(true);
    let again = gpt_grads(&gpt, &fx)?;
    for ((name, a), (_, b)) in plain.iter().zip(&again) {
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{name}: recomputed gradient differs from the plain one");
    }
    // Only each block's input is kept: the activations fall.
    let (x, _) = tandem::parallel::batch_to_device(&fx.batch(0), &dev)?;
    let kept = |recompute: bool| -> Result<u64> {
        gpt.set_recompute(recompute);
        Ok(tandem::autograd::activation_bytes(&gpt.forward(&x)?))
    };
    let (with, without) = (kept(true)?, kept(false)?);
    eprintln!("activation bytes: {without} plain, {with} with recompute");
    assert!(with < without, "recompute keeps {with} bytes, the plain forward {without}");

    let devs = [cpu(), cpu()];
    let grads = |recompute: bool| -> Result<Vec<Vec<f32>>> {
        let mut tp = tensor_parallel(&fx, fx.config(), &devs)?;
        tp.set_recompute(recompute);
        tp.set_grad_clip(Some(1e9))?;
        tp.step(&fx.batch(0))?;
        tp.gathered_grads()?.into_iter().map(|(n, g)| g.ok_or_else(|| Error::Msg(format!("{n} has no gradient")))?.to_vec()).collect()
    };
    let (a, b) = (grads(false)?, grads(true)?);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()), "tensor-parallel parameter {i}: recomputed gradient differs");
    }
    Ok(())
}

#[test]
fn heads_that_do_not_split_are_an_error() -> Result<()> {
    let fx = Fixture::load();
    let devs = [cpu(), cpu(), cpu()];
    let err =
        TensorParallelGpt::new(Gpt::new(fx.config(), 0, &devs[0])?, &devs, &fx.adamw(), Loss::CrossEntropy).err().expect("2 heads over 3 devices");
    assert!(matches!(err, Error::Invalid { .. }) && err.to_string().contains("n_head 2") && err.to_string().contains("3 devices"), "{err}");
    let elsewhere = Gpt::new(fx.config(), 0, &devs[1])?;
    let err = TensorParallelGpt::new(elsewhere, &devs[..2], &fx.adamw(), Loss::CrossEntropy).err().expect("a model off the first device");
    assert!(err.to_string().contains("not on the first device"), "{err}");
    let mut tp = tensor_parallel(&fx, fx.config(), &devs[..2])?;
    let mut bad = fx.init(&devs[0]);
    bad.retain(|p| p.0 != "transformer.h.1.attn.c_attn.bias");
    let err = tp.load_state_dict(&bad).expect_err("a missing parameter");
    assert!(err.to_string().contains("transformer.h.1.attn.c_attn.bias"), "{err}");
    let mut wrong = fx.init(&devs[0]);
    let w = wrong.iter_mut().find(|p| p.0 == "transformer.h.0.mlp.c_fc.weight").unwrap();
    w.1 = Tensor::zeros([4, 4], &devs[0])?;
    let err = tp.load_state_dict(&wrong).expect_err("a parameter of another shape");
    assert!(matches!(err, Error::Shape { .. }) && err.to_string().contains("transformer.h.0.mlp.c_fc.weight"), "{err}");
    Ok(())
}

/// The per-step losses a `tandem train` run prints with `--log-format json`.
fn cli_losses(args: &[&str]) -> Vec<f64> {
    let out = common::ok(&[args, &["--log-format", "json"]].concat());
    let lines = common::text(&out.stdout);
    lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["step"].is_u64())
        .filter_map(|v| v["loss"].as_f64())
        .collect()
}

/// `--recompute` prints the plain run's losses under each strategy, dropout on; the tensor
/// split prints the single device's within rounding.
#[test]
fn cli_recompute_keeps_every_strategys_losses() {
    let args = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "8",
        "--batch",
        "4",
        "--steps",
        "3",
        "--dropout",
        "0.1",
    ];
    let single = cli_losses(&[&args[..], &["--devices", "cpu"]].concat());
    assert_eq!(single.len(), 3, "{single:?}");
    for (strategy, devices) in [("single", "cpu"), ("data", "cpu,cpu"), ("tensor", "cpu,cpu")] {
        let run = |extra: &[&str]| cli_losses(&[&args[..], &["--strategy", strategy, "--devices", devices], extra].concat());
        let (plain, recomputed) = (run(&[]), run(&["--recompute"]));
        assert_eq!(recomputed, plain, "--strategy {strategy}: --recompute changed the losses");
        let single: Vec<f32> = single.iter().map(|&v| v as f32).collect();
        assert_close(&format!("--strategy {strategy} against single"), &plain.iter().map(|&v| v as f32).collect::<Vec<_>>(), &single, 0.0, 1e-5);
    }
}

#[test]
fn cli_trains_tensor_parallel_with_recompute() {
    let dir = common::scratch("gpt_tensor", "cli");
    let save = dir.join("tp.safetensors");
    let args = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "8",
        "--batch",
        "4",
        "--steps",
        "2",
    ];
    let run = |extra: &[&str]| common::ok(&[&args[..], extra].concat());
    run(&["--strategy", "tensor", "--devices", "cpu,cpu", "--recompute", "--save", common::s(&save)]);
    let (tensors, _) = read_safetensors(&save).expect("the --save file reads");
    let single =
        Gpt::new(GptConfig { n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, vocab_size: 1, dropout: 0.0, bias: true }, 0, &Device::cpu()).unwrap();
    let mut want: Vec<String> = single.state_dict().into_iter().map(|p| p.0).collect();
    let mut got: Vec<String> = tensors.into_iter().map(|t| t.0).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "a single-device GPT's names");
    common::fails(&[&args[..], &["--strategy", "tensor", "--devices", "cpu,cpu,cpu"]].concat(), "n_head 2 does not split evenly over 3 devices");
    common::fails(&["train", "--model", "seed-linear", "--data", "synthetic", "--recompute"], "--recompute: applies to --model gpt only");
}
