//! The GPT model: 10 AdamW steps against a nanoGPT-shaped PyTorch reference (the fixture
//! tests/fixtures/gpt_tiny.safetensors, made by scripts/gpt_parity.py) on each device, and its
//! names, initialisation, causality, dropout, sampling and errors.
mod common;
#[path = "common/gpt_fixture.rs"]
mod gpt_fixture;
use common::{assert_close, on_each_device};
use gpt_fixture::Fixture;
use std::collections::BTreeMap;
use tandem::checkpoint::{to_host, write_safetensors};
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::Module;
use tandem::optim::{clip_grad_norm, AdamConfig, OptimConfig, ParamGroups};
use tandem::{Device, Error, Result, Tensor};

/// `[B, T]` token ids: batch `step` of `name` (`[S, B, T]`), or the whole of a `[B, T]` one.
fn batch(fx: &Fixture, name: &str, step: Option<usize>, dev: &Device) -> Result<Tensor> {
    let (v, shape) = fx.ids(name);
    let (b, t) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let at = step.unwrap_or(0) * b * t;
    Tensor::from_labels(v[at..at + b * t].to_vec(), [b, t], dev)
}

/// The reference's 10 steps on `dev`: losses within 1e-4 relative, final weights within 1e-3;
/// then the checkpoint for `gpt_parity.py check`, with tandem's validation loss in its metadata.
fn parity(dev: &Device) -> Result<()> {
    let (info, dev) = (dev.info().clone(), dev.clone());
    let fx = Fixture::load();
    let train = fx.json("train");
    let hp = |k: &str| train[k].as_f64().expect("a number") as f32;
    let gpt = Gpt::new(fx.config(), 0, &dev).expect("model");
    gpt.load_state_dict(&fx.state("init.", &dev)).expect("nanoGPT's state_dict loads");
    let params = gpt.parameters();
    // nanoGPT's groups: weight decay on rank >= 2 (matrices, embeddings), none on the rest.
    let adamw =
        AdamConfig { lr: hp("lr"), beta1: hp("beta1"), beta2: hp("beta2"), eps: hp("eps"), weight_decay: hp("weight_decay"), decoupled: true };
    let mut opt = OptimConfig::adam(adamw).with_groups(ParamGroups::no_decay_for_biases_and_norms()).build(params.clone()).expect("adamw");
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for step in 0..train["steps"].as_u64().expect("steps") as usize {
        let x = batch(&fx, "x", Some(step), &dev).expect("x");
        let y = batch(&fx, "y", Some(step), &dev).expect("y");
        let loss = Gpt::loss(&gpt.forward(&x).expect("forward"), &y).expect("loss");
        losses.push(loss.to_scalar().expect("loss value"));
        loss.backward().expect("backward");
        norms.push(clip_grad_norm(&params, hp("grad_clip")).expect("clip"));
        opt.step().expect("step");
        opt.zero_grad();
    }
    eprintln!("{} ({}): losses {losses:?}", dev, info.name);
    assert_close(&format!("losses on {dev}"), &losses, fx.f32s("losses"), 0.0, 1e-4);
    assert_close(&format!("gradient norms on {dev}"), &norms, fx.f32s("grad_norms"), 0.0, 1e-3);
    for (name, p) in &params {
        assert_close(&format!("{name} after 10 steps on {dev}"), &p.to_vec().expect("weights"), fx.f32s(&format!("final.{name}")), 1e-3, 0.0);
    }
    gpt.eval();
    let val = Gpt::loss(&gpt.forward(&batch(&fx, "val_x", None, &dev).unwrap()).unwrap(), &batch(&fx, "val_y", None, &dev).unwrap()).unwrap();
    let val = val.to_scalar().unwrap();
    assert_close(&format!("validation loss on {dev}"), &[val], fx.f32s("val_loss"), 0.0, 1e-3);
    let path = common::target_tmp().join(format!("gpt_tiny_tandem_{}_{}.safetensors", info.backend.name(), info.ordinal));
    let meta = BTreeMap::from([("val_loss".to_string(), format!("{val:.9}"))]);
    write_safetensors(&path, &to_host(&gpt.state_dict()).unwrap(), &meta).unwrap();
    eprintln!("checkpoint for `python scripts/gpt_parity.py check`: {}", path.display());
    Ok(())
}

#[test]
fn parity_with_pytorch() {
    common::on_every_device(parity);
}

fn tiny(bias: bool) -> GptConfig {
    GptConfig { n_layer: 2, n_head: 2, n_embd: 8, block_size: 6, vocab_size: 11, dropout: 0.0, bias }
}

fn names(state: &[(String, Tensor)]) -> Vec<String> {
    state.iter().map(|p| p.0.clone()).collect()
}

#[test]
fn state_dict_names_are_nanogpts_in_order() -> Result<()> {
    let fx = Fixture::load();
    let want = |key: &str| -> Vec<String> { fx.json(key).as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect() };
    let dev = Device::cpu();
    let gpt = Gpt::new(fx.config(), 0, &dev)?;
    assert_eq!(names(&gpt.state_dict()), want("state_dict_names"));
    let no_bias = Gpt::new(GptConfig { bias: false, ..fx.config() }, 0, &dev)?;
    assert_eq!(names(&no_bias.state_dict()), want("state_dict_names_no_bias"));
    // lm_head is the embedding itself, listed once among the parameters
    let params = gpt.parameters();
    assert_eq!(params.len() + 1, gpt.state_dict().len());
    assert_eq!(gpt.state_dict().last().unwrap().1.id(), gpt.transformer.wte.weight.id());
    Ok(())
}

#[test]
fn init_is_gpt2s() -> Result<()> {
    let cfg = GptConfig { n_layer: 4, n_head: 2, n_embd: 64, block_size: 8, vocab_size: 50, dropout: 0.0, bias: true };
    let gpt = Gpt::new(cfg, 3, &Device::cpu())?;
    let std = |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
    for (name, p) in gpt.parameters() {
        let v = p.to_vec()?;
        let want_std = if name.ends_with("c_proj.weight") { 0.02 / 8f32.sqrt() } else { 0.02 };
        if name.contains("ln_") {
            let want = if name.ends_with("weight") { 1.0 } else { 0.0 };
            assert!(v.iter().all(|&x| x == want), "{name} is not all {want}");
        } else if name.ends_with("bias") {
            assert!(v.iter().all(|&x| x == 0.0), "{name} is not zero");
        } else {
            let s = std(&v);
            assert!((s / want_std - 1.0).abs() < 0.1, "{name}: std {s}, want {want_std}");
        }
    }
    // same seed, same weights; another seed, others
    let again = Gpt::new(cfg, 3, &Device::cpu())?.parameters()[0].1.to_vec()?;
    let other = Gpt::new(cfg, 4, &Device::cpu())?.parameters()[0].1.to_vec()?;
    assert_eq!(again, gpt.parameters()[0].1.to_vec()?);
    assert_ne!(other, again);
    Ok(())
}

#[test]
fn forward_gives_logits_per_position() -> Result<()> {
    let dev = Device::cpu();
    let gpt = Gpt::new(tiny(false), 1, &dev)?;
    for t in [1, 4, 6] {
        let ids = Tensor::from_labels((0..3 * t as i32).map(|i| i % 11).collect(), [3, t], &dev)?;
        assert_eq!(gpt.forward(&ids)?.dims(), [3, t, 11]);
    }
    Ok(())
}

/// Changing the last token changes the last position's logits and none before it.
#[test]
fn attention_is_causal_on_every_device() {
    let cpu = Device::cpu();
    let check = |dev: &Device| -> Result<()> {
        let gpt = Gpt::new(tiny(true), 2, dev)?;
        let (b, t, v) = (2, 6, 11);
        let mut ids: Vec<i32> = (0..(b * t) as i32).map(|i| (i * 5 + 1) % 11).collect();
        let before = gpt.forward(&Tensor::from_labels(ids.clone(), [b, t], dev)?)?.to_vec()?;
        ids[t - 1] = (ids[t - 1] + 3) % 11;
        ids[2 * t - 1] = (ids[2 * t - 1] + 7) % 11;
        let after = gpt.forward(&Tensor::from_labels(ids, [b, t], dev)?)?.to_vec()?;
        for r in 0..b {
            let row = |x: &[f32], p: usize| x[(r * t + p) * v..(r * t + p + 1) * v].to_vec();
            for p in 0..t - 1 {
                assert_close(&format!("{dev}: row {r} position {p}"), &row(&after, p), &row(&before, p), 1e-6, 1e-6);
            }
            assert!(row(&after, t - 1) != row(&before, t - 1), "{dev}: the changed token did not change its own logits");
        }
        Ok(())
    };
    check(&cpu).expect("cpu");
    on_each_device(|dev, _| check(dev));
}

#[test]
fn loads_nanogpt_state_with_or_without_lm_head_and_moves() -> Result<()> {
    let fx = Fixture::load();
    let dev = Device::cpu();
    let gpt = Gpt::new(fx.config(), 0, &dev)?;
    let full = fx.state("init.", &dev);
    gpt.load_state_dict(&full)?;
    let without: Vec<_> = full.iter().filter(|p| p.0 != "lm_head.weight").cloned().collect();
    gpt.load_state_dict(&without)?;
    // nanoGPT on PyTorch < 2 also saves each block's causal mask, a constant
    let mut with_masks = full.clone();
    let block = fx.config().block_size;
    with_masks.push(("transformer.h.1.attn.bias".into(), Tensor::ones([1, 1, block, block], &dev)?.tril(0)?));
    gpt.load_state_dict(&with_masks)?;
    let mut untied = full.clone();
    let head = untied.iter_mut().find(|p| p.0 == "lm_head.weight").unwrap();
    head.1 = head.1.add_scalar(1.0)?;
    assert!(matches!(gpt.load_state_dict(&untied), Err(Error::Invalid { .. })), "an lm_head that differs from wte is refused");
    let missing: Vec<_> = full.iter().filter(|p| p.0 != "transformer.ln_f.bias").cloned().collect();
    assert!(gpt.load_state_dict(&missing).is_err(), "strict: a missing parameter is an error");
    // a moved copy computes the same logits and trains on its own
    let moved = gpt.to_device(&dev)?;
    let ids = batch(&fx, "val_x", None, &dev)?;
    assert_eq!(moved.forward(&ids)?.to_vec()?, gpt.forward(&ids)?.to_vec()?);
    assert_ne!(moved.parameters()[0].1.id(), gpt.parameters()[0].1.id());
    Ok(())
}

#[test]
fn dropout_acts_in_training_only() -> Result<()> {
    let dev = Device::cpu();
    let gpt = Gpt::new(GptConfig { dropout: 0.5, ..tiny(true) }, 5, &dev)?;
    let ids = Tensor::from_labels(vec![1, 2, 3, 4], [1, 4], &dev)?;
    let (a, b) = (gpt.forward(&ids)?.to_vec()?, gpt.forward(&ids)?.to_vec()?);
    assert_ne!(a, b, "training draws a new mask each call");
    gpt.eval();
    let (c, d) = (gpt.forward(&ids)?.to_vec()?, gpt.forward(&ids)?.to_vec()?);
    assert_eq!(c, d);
    let plain = Gpt::new(tiny(true), 5, &dev)?;
    assert_eq!(plain.forward(&ids)?.to_vec()?, c, "eval is the model without dropout");
    Ok(())
}

#[test]
fn generation_is_seeded_and_crops_to_the_block() -> Result<()> {
    let dev = Device::cpu();
    let gpt = Gpt::new(tiny(true), 6, &dev)?;
    gpt.eval();
    let prompt = Tensor::from_labels(vec![1, 2, 3, 4, 5, 6], [2, 3], &dev)?;
    // 3 + 10 tokens is past block_size 6: the context is cropped
    let a = gpt.generate(&prompt, 10, 1.0, None, 42)?;
    assert_eq!(a.dims(), [2, 13]);
    let a = a.to_vec_i32()?;
    assert_eq!(&a[..3], [1, 2, 3]);
    assert_eq!(&a[13..16], [4, 5, 6]);
    assert!(a.iter().all(|&t| (0..11).contains(&t)));
    assert_eq!(gpt.generate(&prompt, 10, 1.0, None, 42)?.to_vec_i32()?, a, "same seed, same tokens");
    assert_ne!(gpt.generate(&prompt, 10, 1.0, None, 43)?.to_vec_i32()?, a, "another seed, other tokens");
    // top_k = 1 is greedy decoding: the argmax of the last logits, whatever the seed
    let greedy = gpt.generate(&prompt, 8, 0.7, Some(1), 9)?.to_vec_i32()?;
    let mut seqs: Vec<Vec<i32>> = vec![vec![1, 2, 3], vec![4, 5, 6]];
    for _ in 0..8 {
        for s in &mut seqs {
            let ctx = s[s.len().saturating_sub(6)..].to_vec();
            let n = ctx.len();
            let logits = gpt.forward(&Tensor::from_labels(ctx, [1, n], &dev)?)?.to_vec()?;
            let last = &logits[(n - 1) * 11..];
            let best = (0..11).max_by(|&i, &j| last[i].total_cmp(&last[j]).then(j.cmp(&i))).unwrap();
            s.push(best as i32);
        }
    }
    assert_eq!(greedy, seqs.concat());
    Ok(())
}

#[test]
fn bad_input_is_an_error() -> Result<()> {
    let dev = Device::cpu();
    let bad = GptConfig { n_embd: 10, n_head: 4, ..tiny(true) };
    assert!(matches!(Gpt::new(bad, 0, &dev), Err(Error::Invalid { op: "Gpt", .. })));
    assert!(matches!(Gpt::new(GptConfig { n_layer: 0, ..tiny(true) }, 0, &dev), Err(Error::Invalid { .. })));
    assert!(matches!(Gpt::new(GptConfig { dropout: 1.0, ..tiny(true) }, 0, &dev), Err(Error::Invalid { .. })));
    let gpt = Gpt::new(tiny(true), 0, &dev)?;
    let long = Tensor::from_labels(vec![0; 7], [1, 7], &dev)?;
    let err = gpt.forward(&long).expect_err("T > block_size");
    assert!(matches!(err, Error::Shape { .. }) && err.to_string().contains("block_size 6"), "{err}");
    let outside = Tensor::from_labels(vec![0, 11], [1, 2], &dev)?;
    assert!(matches!(gpt.forward(&outside), Err(Error::Label { label: 11, index: 1, classes: 11, .. })));
    let negative = Tensor::from_labels(vec![-1, 0], [1, 2], &dev)?;
    assert!(matches!(gpt.forward(&negative), Err(Error::Label { label: -1, .. })));
    let floats = Tensor::zeros([1, 2], &dev)?;
    assert!(matches!(gpt.forward(&floats), Err(Error::DType { .. })));
    let flat = Tensor::from_labels(vec![0, 1], [2], &dev)?;
    assert!(matches!(gpt.forward(&flat), Err(Error::Shape { .. })));
    let prompt = Tensor::from_labels(vec![0, 1], [1, 2], &dev)?;
    assert!(matches!(gpt.generate(&prompt, 1, 0.0, None, 0), Err(Error::Invalid { .. })));
    assert!(matches!(gpt.generate(&prompt, 1, 1.0, Some(0), 0), Err(Error::Invalid { .. })));
    let logits = gpt.forward(&prompt)?;
    assert!(matches!(Gpt::loss(&logits, &flat), Err(Error::Shape { .. })));
    Ok(())
}
