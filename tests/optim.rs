//! Optimizers follow PyTorch's update rules, checked against the formulas computed by hand,
//! and checkpoints of weights round-trip bit for bit.
use tandem::nn::{models::SeedModel, Module};
use tandem::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tandem::tolerance::assert_close;
use tandem::{Device, Tensor};

/// Runs three steps on p with constant gradient g (set directly), returning p after each.
fn run(opt: &mut dyn Optimizer, p: &Tensor, grads: &[[f32; 2]]) -> Vec<Vec<f32>> {
    grads
        .iter()
        .map(|g| {
            p.set_grad(Some(Tensor::from_vec(g.to_vec(), [2], &Device::cpu()).unwrap()));
            opt.step().unwrap();
            p.to_vec().unwrap()
        })
        .collect()
}

fn param() -> Tensor {
    Tensor::from_vec(vec![1.0, -2.0], [2], &Device::cpu()).unwrap().requires_grad()
}

#[test]
fn sgd_momentum_dampening_nesterov_weight_decay() {
    let grads = [[0.5, -1.0], [0.25, 2.0], [-1.0, 0.5]];
    for (momentum, dampening, nesterov, wd) in [(0.0, 0.0, false, 0.0), (0.9, 0.0, false, 0.0), (0.9, 0.3, false, 0.01), (0.8, 0.0, true, 0.05)] {
        let p = param();
        let cfg = SgdConfig { lr: 0.1, momentum, dampening, nesterov, weight_decay: wd };
        let mut opt = Sgd::new(vec![("p".into(), p.clone())], cfg).unwrap();
        let got = run(&mut opt, &p, &grads);
        // PyTorch's torch.optim.SGD, written out per element
        let mut w = [1.0f32, -2.0];
        let mut buf: Option<[f32; 2]> = None;
        for (s, g) in grads.iter().enumerate() {
            let mut d = [g[0] + wd * w[0], g[1] + wd * w[1]];
            if momentum != 0.0 {
                let b = match buf {
                    None => d,
                    Some(b) => [momentum * b[0] + (1.0 - dampening) * d[0], momentum * b[1] + (1.0 - dampening) * d[1]],
                };
                buf = Some(b);
                d = if nesterov { [d[0] + momentum * b[0], d[1] + momentum * b[1]] } else { b };
            }
            w = [w[0] - 0.1 * d[0], w[1] - 0.1 * d[1]];
            assert_close(&format!("sgd m={momentum} step {s}"), &got[s], &w, 1e-7, 1e-6);
        }
    }
}

#[test]
fn adam_and_adamw() {
    let grads = [[0.5, -1.0], [0.25, 2.0], [-1.0, 0.5]];
    for cfg in [
        AdamConfig { lr: 0.01, ..Default::default() },
        AdamConfig { lr: 0.01, weight_decay: 0.1, ..Default::default() },
        AdamConfig { lr: 0.01, ..AdamConfig::adamw() },
    ] {
        let p = param();
        let mut opt = Adam::new(vec![("p".into(), p.clone())], cfg).unwrap();
        let got = run(&mut opt, &p, &grads);
        let (mut w, mut m, mut v) = ([1.0f32, -2.0], [0.0f32; 2], [0.0f32; 2]);
        for (s, g) in grads.iter().enumerate() {
            let t = (s + 1) as i32;
            for i in 0..2 {
                let mut gi = g[i];
                if cfg.decoupled {
                    w[i] *= 1.0 - cfg.lr * cfg.weight_decay;
                } else {
                    gi += cfg.weight_decay * w[i];
                }
                m[i] = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * gi;
                v[i] = cfg.beta2 * v[i] + (1.0 - cfg.beta2) * gi * gi;
                let bc1 = 1.0 - cfg.beta1.powi(t);
                let bc2 = 1.0 - cfg.beta2.powi(t);
                w[i] -= cfg.lr / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + cfg.eps);
            }
            assert_close(&format!("adam {cfg:?} step {s}"), &got[s], &w, 1e-7, 1e-5);
        }
    }
}

#[test]
fn optimizer_state_round_trip_continues_identically() {
    let dev = Device::cpu();
    let p1 = param();
    let mut a = Sgd::new(vec![("p".into(), p1.clone())], SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() }).unwrap();
    run(&mut a, &p1, &[[1.0, 2.0]]);
    let (state, steps) = a.state();
    let p2 = Tensor::from_vec(p1.to_vec().unwrap(), [2], &dev).unwrap().requires_grad();
    let mut b = Sgd::new(vec![("p".into(), p2.clone())], SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() }).unwrap();
    b.load_state(&state, steps).unwrap();
    assert_eq!(run(&mut a, &p1, &[[0.5, 0.5]]), run(&mut b, &p2, &[[0.5, 0.5]]));
}

#[test]
fn bad_settings_are_errors() {
    assert!(Sgd::new(vec![], SgdConfig { lr: -1.0, ..Default::default() }).is_err());
    assert!(Sgd::new(vec![], SgdConfig { lr: f32::NAN, ..Default::default() }).is_err());
    assert!(Sgd::new(vec![], SgdConfig { nesterov: true, ..Default::default() }).is_err());
    assert!(Adam::new(vec![], AdamConfig { beta1: 1.0, ..Default::default() }).is_err());
}

#[test]
fn weights_checkpoint_round_trip_is_bit_exact() {
    let dev = Device::cpu();
    let model = SeedModel::Cnn.build(3, &dev).unwrap();
    let dir = std::env::temp_dir().join(format!("tandem-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    tandem::checkpoint::save_weights(&path, &model.parameters()).unwrap();
    let other = SeedModel::Cnn.build(4, &dev).unwrap();
    other.load_state_dict(&tandem::checkpoint::load_weights(&path, &dev).unwrap()).unwrap();
    for ((n, a), (m, b)) in model.parameters().iter().zip(other.parameters()) {
        assert_eq!(n, &m);
        let bits = |t: &Tensor| t.to_vec().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(&b), "{n}");
    }
    let names: Vec<String> = model.parameters().into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn pytorch_default_init_ranges() {
    let model = SeedModel::Cnn.build(0, &Device::cpu()).unwrap();
    for (name, p) in model.parameters() {
        let fan_in = match name.as_str() {
            n if n.starts_with("conv1") => 25.0,
            n if n.starts_with("conv2") => 250.0,
            n if n.starts_with("fc1") => 320.0,
            _ => 50.0,
        };
        let bound = 1.0 / f32::sqrt(fan_in);
        let v = p.to_vec().unwrap();
        assert!(v.iter().all(|x| x.abs() <= bound), "{name} outside ±{bound}");
        let max = v.iter().fold(0.0f32, |a, x| a.max(x.abs()));
        assert!(max > 0.5 * bound, "{name} does not fill its range");
    }
}

/// Optimizer state offloaded to host memory: the same updates bit for bit (SGD with momentum
/// and AdamW with groups, on the CPU, on lavapipe and on cuda:0 where there is one), none of
/// the state on the device between steps, and a checkpoint of it loads into an optimizer that
/// keeps its state on the device.
#[test]
fn offloaded_state_updates_the_same_and_leaves_the_device() {
    use tandem::optim::{OptimConfig, ParamGroups};
    let mut devices = vec![Device::cpu_independent()];
    for spec in ["wgpu:0", "cuda:0"] {
        match Device::parse(spec) {
            Ok(d) => devices.extend(d),
            Err(e) => eprintln!("skipping {spec}: {e}"),
        }
    }
    let configs = [
        OptimConfig::sgd(SgdConfig { lr: 0.1, momentum: 0.9, nesterov: true, ..Default::default() }),
        OptimConfig::adam(AdamConfig { lr: 1e-2, weight_decay: 0.1, ..AdamConfig::adamw() })
            .with_groups(ParamGroups::no_decay_for_biases_and_norms()),
    ];
    for dev in &devices {
        for cfg in &configs {
            let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
            let init: Vec<Tensor> = [vec![37, 19], vec![19]].into_iter().map(|s| Tensor::randn(s, &mut rng, &Device::cpu()).unwrap()).collect();
            let grads: Vec<Vec<Tensor>> =
                (0..3).map(|_| init.iter().map(|t| Tensor::randn(t.shape().clone(), &mut rng, dev).unwrap()).collect()).collect();
            let params = || init.iter().enumerate().map(|(i, t)| (format!("p{i}"), t.to(dev).unwrap().requires_grad())).collect::<Vec<_>>();
            let train = |opt: &mut dyn Optimizer| -> (Vec<Vec<f32>>, Vec<u64>) {
                let before = dev.memory().in_use;
                let mut in_use = Vec::new();
                let weights = grads
                    .iter()
                    .map(|step| {
                        opt.params().iter().zip(step).for_each(|((_, p), g)| p.set_grad(Some(g.clone())));
                        opt.step().unwrap();
                        opt.zero_grad();
                        in_use.push(dev.memory().in_use - before);
                        opt.params().iter().flat_map(|(_, p)| p.to_vec().unwrap()).collect()
                    })
                    .collect();
                (weights, in_use)
            };
            let mut on_device = cfg.build(params()).unwrap();
            let (want, used) = train(&mut *on_device);
            drop(on_device);
            let mut offloaded = cfg.clone().offloaded(true).build(params()).unwrap();
            let (got, used_offloaded) = train(&mut *offloaded);
            let what = format!("{:?} on {}", cfg, dev.spec());
            assert_eq!(got, want, "{what}: offloaded updates differ");
            // Bytes in use after each step beyond the parameters and gradients: the state's (a
            // backend may round each buffer up), or nothing.
            let state_bytes = 4 * cfg.states_per_parameter() * (37 * 19 + 19);
            assert!(
                used.iter().all(|&b| b >= state_bytes) && used_offloaded.iter().all(|&b| b == 0),
                "{what}: state in use {used:?}, offloaded {used_offloaded:?}, state {state_bytes} B"
            );
            let (state, steps) = offloaded.state();
            assert!(state.iter().all(|(_, t)| !t.device().same(dev)), "{what}: offloaded state on the device");
            let mut resumed = cfg.build(offloaded.params().to_vec()).unwrap();
            resumed.load_state(&state, steps).unwrap();
            let (state_back, _) = resumed.state();
            for ((n, a), (_, b)) in state.iter().zip(&state_back) {
                assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap(), "{what}: {n} reloaded");
                assert!(b.device().same(dev), "{what}: {n} not back on the device");
            }
        }
    }
}
