//! Parameter groups: each group's lr and weight decay reach the fused updates on every device,
//! `set_lr` scales every group with the base, and the rules put each parameter where they say.
mod common;
use common::{assert_close, on_each_device, rng};
use std::sync::Arc;
use tandem::nn::{LayerNorm, Linear, Module};
use tandem::optim::{AdamConfig, GroupRule, OptimConfig, ParamGroup, ParamGroups, SgdConfig};
use tandem::{Device, Result, Tensor};

const W0: [f32; 6] = [0.5, -1.0, 2.0, 0.25, 0.75, -0.5];
const B0: [f32; 2] = [1.0, -2.0];
const GW: [[f32; 6]; 3] = [[0.1, -0.2, 0.3, 0.4, 0.5, -0.6], [-0.3, 0.1, 0.2, 0.0, -0.5, 0.25], [0.2, 0.2, -0.1, 0.3, -0.4, 0.1]];
const GB: [[f32; 2]; 3] = [[0.5, -1.0], [0.25, 2.0], [-1.0, 0.5]];

/// Bias group: lr 0.03 over the base 0.01, no weight decay; the weight keeps the base 0.1.
fn bias_group() -> ParamGroups {
    ParamGroups::new(GroupRule::RankBelow(2), vec![ParamGroup::default(), ParamGroup { lr: Some(0.03), weight_decay: Some(0.0) }])
}

/// Three steps with the gradients above, the base lr halved before the third (PyTorch: a
/// LambdaLR giving 1, 1, 0.5); returns the weight and the bias.
fn three_steps(cfg: &OptimConfig, dev: &Device) -> Result<(Vec<f32>, Vec<f32>)> {
    let w = Tensor::from_vec(W0.to_vec(), [2, 3], dev)?.requires_grad();
    let b = Tensor::from_vec(B0.to_vec(), [2], dev)?.requires_grad();
    let mut opt = cfg.build(vec![("fc.weight".into(), w.clone()), ("fc.bias".into(), b.clone())])?;
    for k in 0..3 {
        if k == 2 {
            opt.set_lr(opt.lr() * 0.5);
        }
        w.set_grad(Some(Tensor::from_vec(GW[k].to_vec(), [2, 3], dev)?));
        b.set_grad(Some(Tensor::from_vec(GB[k].to_vec(), [2], dev)?));
        opt.step()?;
    }
    Ok((w.to_vec()?, b.to_vec()?))
}

/// torch 2.15: `AdamW([{'params': [w]}, {'params': [b], 'lr': 0.03, 'weight_decay': 0.0}],
/// lr=0.01, weight_decay=0.1)` with a LambdaLR (1, 1, 0.5), the gradients above.
const TORCH_ADAMW_W: [f32; 6] = [0.49361148, -0.98621845, 1.9725609, 0.22870451, 0.74041814, -0.48466358];
const TORCH_ADAMW_B: [f32; 2] = [0.94513, -1.9872179];
/// The same with `SGD(..., lr=0.01, momentum=0.9, weight_decay=0.1)`.
const TORCH_SGD_W: [f32; 6] = [0.49891984, -0.9935922, 1.982189, 0.23822658, 0.74454546, -0.4881821];
const TORCH_SGD_B: [f32; 2] = [0.96955, -2.02535];

fn check_against_torch(dev: &Device) -> Result<()> {
    let adamw = OptimConfig::adam(AdamConfig { lr: 0.01, weight_decay: 0.1, ..AdamConfig::adamw() }).with_groups(bias_group());
    let (w, b) = three_steps(&adamw, dev)?;
    assert_close(&format!("adamw weight on {dev}"), &w, &TORCH_ADAMW_W, 1e-6, 1e-5);
    assert_close(&format!("adamw bias on {dev}"), &b, &TORCH_ADAMW_B, 1e-6, 1e-5);
    let sgd = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, weight_decay: 0.1, ..Default::default() }).with_groups(bias_group());
    let (w, b) = three_steps(&sgd, dev)?;
    assert_close(&format!("sgd weight on {dev}"), &w, &TORCH_SGD_W, 1e-6, 1e-5);
    assert_close(&format!("sgd bias on {dev}"), &b, &TORCH_SGD_B, 1e-6, 1e-5);
    Ok(())
}

#[test]
fn groups_match_pytorch_on_the_cpu() {
    check_against_torch(&Device::cpu()).unwrap();
}

#[test]
fn groups_match_pytorch_on_every_device() {
    on_each_device(|dev, _| check_against_torch(dev));
}

/// With zero gradients AdamW's only change is the decay `p *= 1 - lr * wd`: the matrix decays,
/// the Linear's bias and the LayerNorm's weight and bias (rank 1) do not.
#[test]
fn no_decay_for_biases_and_norms_spares_rank_one() {
    common::on_every_device(|dev| {
        let fc = Linear::new(3, 4, &mut rng(1), dev).unwrap();
        let ln = LayerNorm::new(&[4], dev).unwrap();
        let mut params: Vec<(String, Tensor)> = fc.parameters().into_iter().map(|(n, t)| (format!("fc.{n}"), t)).collect();
        params.extend(ln.parameters().into_iter().map(|(n, t)| (format!("ln.{n}"), t)));
        let before: Vec<Vec<f32>> = params.iter().map(|(_, t)| t.to_vec().unwrap()).collect();
        let cfg = OptimConfig::adam(AdamConfig { lr: 0.1, weight_decay: 0.5, ..AdamConfig::adamw() })
            .with_groups(ParamGroups::no_decay_for_biases_and_norms());
        let mut opt = cfg.build(params.clone()).unwrap();
        for (_, t) in &params {
            t.set_grad(Some(Tensor::zeros(t.shape().clone(), dev).unwrap()));
        }
        opt.step().unwrap();
        for ((name, t), old) in params.iter().zip(&before) {
            let factor = if t.rank() >= 2 { 1.0 - 0.1 * 0.5 } else { 1.0 };
            let want: Vec<f32> = old.iter().map(|v| v * factor).collect();
            assert_close(&format!("{name} on {dev}"), &t.to_vec().unwrap(), &want, 1e-7, 1e-6);
        }
        Ok(())
    });
}

/// Plain SGD with lr 1 and gradient 1: each parameter moves by its group's lr.
fn moves(cfg: &OptimConfig, names: &[&str]) -> Vec<f32> {
    let dev = Device::cpu();
    let params: Vec<(String, Tensor)> = names.iter().map(|n| (n.to_string(), Tensor::zeros([2], &dev).unwrap().requires_grad())).collect();
    let mut opt = cfg.build(params.clone()).unwrap();
    for (_, t) in &params {
        t.set_grad(Some(Tensor::ones([2], &dev).unwrap()));
    }
    opt.step().unwrap();
    params.iter().map(|(_, t)| -t.to_vec().unwrap()[0]).collect()
}

#[test]
fn name_and_custom_rules_pick_groups() {
    let groups = vec![ParamGroup::default(), ParamGroup { lr: Some(2.0), ..Default::default() }, ParamGroup { lr: Some(3.0), ..Default::default() }];
    let base = OptimConfig::sgd(SgdConfig { lr: 1.0, ..Default::default() });
    let by_name = GroupRule::NameContains(vec![("emb".into(), 2), ("bias".into(), 1)]);
    let cfg = base.clone().with_groups(ParamGroups::new(by_name, groups.clone()));
    assert_eq!(moves(&cfg, &["fc.weight", "fc.bias", "wte.emb.bias", "head"]), [1.0, 2.0, 3.0, 1.0]);
    let custom = GroupRule::Custom { label: "by length".into(), rule: Arc::new(|name: &str, _: &Tensor| name.len() % 3) };
    let cfg = base.with_groups(ParamGroups::new(custom, groups));
    assert_eq!(moves(&cfg, &["abc", "abcd", "abcde"]), [1.0, 2.0, 3.0]);
    assert!(format!("{cfg:?}").contains("Custom(\"by length\")"), "{cfg:?}");
}

#[test]
fn bad_groups_are_errors_naming_the_parameter() {
    let dev = Device::cpu();
    let params = vec![("fc.weight".to_string(), Tensor::zeros([2, 2], &dev).unwrap().requires_grad())];
    let two = GroupRule::Custom { label: "always 2".into(), rule: Arc::new(|_: &str, _: &Tensor| 2) };
    let cfg = OptimConfig::sgd(SgdConfig::default()).with_groups(ParamGroups::new(two, vec![ParamGroup::default(); 2]));
    let e = cfg.build(params.clone()).err().expect("group 2 of 2").to_string();
    assert!(e.contains("fc.weight") && e.contains("group 2"), "{e}");
    let zero_base = OptimConfig::adam(AdamConfig { lr: 0.0, ..Default::default() }).with_groups(bias_group());
    let e = zero_base.build(params.clone()).err().expect("group lr over a zero base").to_string();
    assert!(e.contains("base lr is 0"), "{e}");
    let negative = ParamGroups::new(GroupRule::RankBelow(2), vec![ParamGroup { lr: Some(-1.0), weight_decay: None }]);
    assert!(OptimConfig::sgd(SgdConfig::default()).with_groups(negative).build(params.clone()).is_err());
    let nan_decay = ParamGroups::new(GroupRule::RankBelow(2), vec![ParamGroup { lr: None, weight_decay: Some(f32::NAN) }]);
    assert!(OptimConfig::sgd(SgdConfig::default()).with_groups(nan_decay).build(params).is_err());
}

/// A run's config records the optimizer's Debug text and a resume compares it: without groups
/// it is what the old `OptimConfig` enum printed, so earlier checkpoints still resume.
#[test]
fn debug_text_without_groups_is_unchanged() {
    assert_eq!(
        format!("{:?}", OptimConfig::sgd(SgdConfig::default())),
        "Sgd(SgdConfig { lr: 0.01, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0 })"
    );
    let with = OptimConfig::adam(AdamConfig::adamw()).with_groups(ParamGroups::no_decay_for_biases_and_norms());
    assert!(format!("{with:?}").starts_with("Adam(AdamConfig { lr: 0.001,") && format!("{with:?}").contains("RankBelow(2)"), "{with:?}");
}
