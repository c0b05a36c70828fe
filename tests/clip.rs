//! Global-norm gradient clipping as PyTorch's `clip_grad_norm_`: the norm it returns, the scale
//! it applies (and when), NaN and infinite norms, gradients shared between parameters, and the
//! squared norm summed over devices; every strategy's refusal of a bad bound.
mod common;
use common::assert_close;
use tandem::nn::models::SeedModel;
use tandem::optim::{clip_grad_norm, grad_norm_sq, scale_grads, SgdConfig};
use tandem::parallel::{Loss, OptimConfig, Pipeline, PipelineGrid, Single, Split, Stages, Strategy, TensorParallel};
use tandem::{Device, Tensor};

fn with_grads(grads: &[&[f32]], dev: &Device) -> Vec<(String, Tensor)> {
    grads
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let p = Tensor::zeros([g.len()], dev).unwrap().requires_grad();
            p.set_grad(Some(Tensor::from_vec(g.to_vec(), [g.len()], dev).unwrap()));
            (format!("p{i}"), p)
        })
        .collect()
}

fn grads(params: &[(String, Tensor)]) -> Vec<Vec<f32>> {
    params.iter().filter_map(|(_, p)| p.grad()).map(|g| g.to_vec().unwrap()).collect()
}

/// torch 2.15: grads [3, 4], max_norm 1 -> norm 5, grads [0.5999999, 0.79999983]
/// (the scale is 1 / (5 + 1e-6) in f32).
#[test]
fn clips_to_max_norm_as_pytorch() {
    common::on_every_device(|dev| {
        let p = with_grads(&[&[3.0], &[4.0]], dev);
        let norm = clip_grad_norm(&p, 1.0).unwrap();
        assert_eq!(norm, 5.0, "on {dev}");
        let g = grads(&p).concat();
        assert_close(&format!("clipped on {dev}"), &g, &[0.5999999, 0.79999983], 0.0, 1e-7);
        // Three tensors, 3^2 + 4^2 + 12^2 = 13^2, with a parameter that has no gradient.
        let mut p = with_grads(&[&[3.0, 4.0], &[12.0]], dev);
        p.push(("frozen".into(), Tensor::zeros([3], dev).unwrap()));
        assert_eq!(grad_norm_sq(&p).unwrap(), 169.0);
        assert_eq!(clip_grad_norm(&p, 6.5).unwrap(), 13.0);
        let scale = 6.5f32 / (13.0 + 1e-6);
        assert_close(&format!("three on {dev}"), &grads(&p).concat(), &[3.0 * scale, 4.0 * scale, 12.0 * scale], 0.0, 1e-6);
        Ok(())
    });
}

#[test]
fn under_max_norm_leaves_gradients_alone() {
    let p = with_grads(&[&[0.3, 0.4]], &Device::cpu());
    let before = p[0].1.grad().unwrap();
    assert_close("norm", &[clip_grad_norm(&p, 1.0).unwrap()], &[0.5], 0.0, 1e-6);
    assert_eq!(p[0].1.grad().unwrap().id(), before.id(), "a scale of 1 or more is not applied");
    assert_eq!(clip_grad_norm(&[], 1.0).unwrap(), 0.0);
    assert_close("measured only", &[clip_grad_norm(&p, f32::INFINITY).unwrap()], &[0.5], 0.0, 1e-6);
    assert_eq!(p[0].1.grad().unwrap().id(), before.id(), "max_norm = inf only measures");
}

/// torch 2.15 with max_norm 1: grads [nan, 1] -> norm nan, grads [nan, nan]; grads [inf, 1] ->
/// norm inf, grads [nan, 0] (scale 0, and inf * 0 = nan).
#[test]
fn nan_and_infinite_norms_as_pytorch() {
    common::on_every_device(|dev| {
        let p = with_grads(&[&[f32::NAN, 1.0]], dev);
        assert!(clip_grad_norm(&p, 1.0).unwrap().is_nan(), "on {dev}");
        assert!(grads(&p)[0].iter().all(|g| g.is_nan()), "on {dev}: {:?}", grads(&p));
        let p = with_grads(&[&[f32::INFINITY, 1.0]], dev);
        assert_eq!(clip_grad_norm(&p, 1.0).unwrap(), f32::INFINITY, "on {dev}");
        let g = grads(&p).concat();
        assert!(g[0].is_nan() && g[1] == 0.0, "on {dev}: {g:?}");
        Ok(())
    });
}

/// Autograd hands one gradient tensor to both inputs of an add: each parameter is scaled once.
#[test]
fn a_gradient_shared_by_two_parameters_is_scaled_once() {
    let dev = Device::cpu();
    let a = Tensor::from_vec(vec![1.0, 2.0], [2], &dev).unwrap().requires_grad();
    let b = Tensor::from_vec(vec![3.0, 4.0], [2], &dev).unwrap().requires_grad();
    let g = Tensor::from_vec(vec![3.0, 4.0], [2], &dev).unwrap();
    a.set_grad(Some(g.clone()));
    b.set_grad(Some(g));
    let p = vec![("a".to_string(), a), ("b".to_string(), b)];
    scale_grads(&p, 0.5).unwrap();
    assert_eq!(grads(&p), [[1.5, 2.0], [1.5, 2.0]]);
}

/// Gradients on several devices: each sends back its own sum, added on the host.
#[test]
fn squared_norm_sums_over_devices() {
    let mut p = Vec::new();
    let mut want = 0.0;
    for (i, dev) in common::every_device().into_iter().enumerate() {
        let v = (i + 1) as f32;
        p.extend(with_grads(&[&[v, -v], &[2.0 * v]], &dev));
        want += 6.0 * (v * v) as f64;
    }
    assert_eq!(grad_norm_sq(&p).unwrap(), want);
}

#[test]
fn a_negative_or_nan_max_norm_is_an_error() {
    let p = with_grads(&[&[1.0]], &Device::cpu());
    for m in [-1.0, f32::NAN] {
        let e = clip_grad_norm(&p, m).err().unwrap().to_string();
        assert!(e.contains("clip_grad_norm") && e.contains("max_norm"), "{e}");
    }
}

/// A strategy's clipping bound must be positive and finite (each strategy with its own step
/// loop, the pipeline grid included), and `None` turns clipping off.
#[test]
fn every_strategy_refuses_a_max_norm_that_is_not_positive_and_finite() {
    let model = SeedModel::Cnn.build(0, &Device::cpu()).unwrap();
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.1, ..Default::default() });
    let devs = common::cpu_devices(4);
    let pipeline = |row: &[Device]| Pipeline::builder(Stages::Split(&model, Split::Auto), row, &opt, Loss::CrossEntropy).build();
    let strategies: Vec<(&str, Box<dyn Strategy>)> = vec![
        ("single", Box::new(Single::new(model.slice(0..model.len(), &devs[0]).unwrap(), &opt, Loss::CrossEntropy, &devs[0]).unwrap())),
        ("tensor parallel", Box::new(TensorParallel::new(&model, &devs[..2], &opt, Loss::CrossEntropy).unwrap())),
        ("pipeline grid", Box::new(PipelineGrid::from_factory(&devs, 2, pipeline).unwrap())),
    ];
    for (what, mut s) in strategies {
        for m in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = s.set_grad_clip(Some(m)).err().unwrap_or_else(|| panic!("{what} took max norm {m}")).to_string();
            assert!(e.contains("set_grad_clip") && e.contains("positive and finite"), "{what}: {e}");
        }
        s.set_grad_clip(None).unwrap();
    }
}
