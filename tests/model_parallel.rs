//! Layer placement and tensor parallelism: both give `Single`'s losses and weights over ten
//! steps of the seed CNN; column/row-parallel Linear equal the unsplit Linear forward and
//! backward.
//!
//! Devices are independent CPU reference devices, or `TANDEM_TEST_DEVICES` (such as
//! `cpu,wgpu:0,wgpu:1`), cycled to the number a test needs.
mod common;
use common::{cycled_devices, seed_image_batches};
use rand::SeedableRng;
use tandem::data::Batch;
use tandem::nn::models::SeedModel;
use tandem::nn::{Linear, Module};
use tandem::optim::{AdamConfig, SgdConfig};
use tandem::parallel::{ColumnParallelLinear, LayerPlacement, Loss, OptimConfig, RowParallelLinear, Single, Split, Strategy, TensorParallel};
use tandem::tolerance::assert_close;
use tandem::{Device, Tensor};

type Run = (Vec<f32>, Vec<(String, Vec<usize>, Vec<f32>)>);

fn train(strategy: &mut dyn Strategy, data: &[Batch]) -> Run {
    let losses = data.iter().map(|b| strategy.step(b).unwrap().loss).collect();
    let weights = strategy.state_dict().unwrap().into_iter().map(|(n, t)| (n, t.dims().to_vec(), t.to_vec().unwrap())).collect();
    (losses, weights)
}

fn same(what: &str, got: &Run, want: &Run) {
    assert_close(&format!("{what}: losses"), &got.0, &want.0, 1e-5, 1e-4);
    assert_eq!(got.1.len(), want.1.len(), "{what}: parameter count");
    for ((gn, gs, g), (wn, ws, w)) in got.1.iter().zip(&want.1) {
        assert_eq!((gn, gs), (wn, ws), "{what}: names and shapes");
        assert_close(&format!("{what}: {gn}"), g, w, 1e-5, 1e-4);
    }
}

fn check_strategies(opt: OptimConfig) {
    let data = seed_image_batches(16, 10, 5);
    let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
    let dev = cycled_devices(1).remove(0);
    let want = train(&mut Single::new(SeedModel::Cnn.build(3, &dev).unwrap(), &opt, Loss::CrossEntropy, &dev).unwrap(), &data);
    let loss = Loss::CrossEntropy;
    let cases: Vec<(String, Box<dyn Strategy>)> = vec![
        ("placement At [7]".into(), Box::new(LayerPlacement::new(&model, &cycled_devices(2), Split::At(vec![7]), &opt, loss.clone()).unwrap())),
        ("placement At [2, 5]".into(), Box::new(LayerPlacement::new(&model, &cycled_devices(3), Split::At(vec![2, 5]), &opt, loss.clone()).unwrap())),
        ("placement Auto".into(), Box::new(LayerPlacement::new(&model, &cycled_devices(3), Split::Auto, &opt, loss.clone()).unwrap())),
        ("tensor parallel x2".into(), Box::new(TensorParallel::new(&model, &cycled_devices(2), &opt, loss.clone()).unwrap())),
        ("tensor parallel x3".into(), Box::new(TensorParallel::new(&model, &cycled_devices(3), &opt, loss.clone()).unwrap())),
    ];
    for (name, mut s) in cases {
        same(&format!("{name} {opt:?}"), &train(&mut *s, &data), &want);
    }
}

#[test]
fn placement_and_tensor_parallel_match_single_with_sgd_momentum() {
    check_strategies(OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() }));
}

#[test]
fn placement_and_tensor_parallel_match_single_with_adam() {
    check_strategies(OptimConfig::adam(AdamConfig { lr: 1e-3, ..Default::default() }));
}

fn rng() -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(9)
}

/// Forward values, input gradient and weight/bias gradients of `y·c` (a fixed random
/// cotangent `c`) through `layer`.
fn grads(layer: &dyn Module, x: &Tensor, c: &Tensor) -> (Vec<f32>, Vec<f32>) {
    let x = x.detach().requires_grad();
    let y = layer.forward(&x).unwrap();
    assert_eq!(y.dims(), c.dims());
    y.mul(&c.to(y.device()).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
    (y.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap())
}

#[test]
fn column_and_row_parallel_equal_linear_on_odd_sizes() {
    let home = cycled_devices(1).remove(0);
    for (inputs, outputs, batch, k) in [(7, 5, 3, 2), (7, 5, 3, 3), (13, 11, 1, 3), (4, 9, 5, 4)] {
        let what = format!("in {inputs} out {outputs} batch {batch} over {k}");
        let x = Tensor::randn([batch, inputs], &mut rng(), &home).unwrap();
        let c = Tensor::randn([batch, outputs], &mut rng(), &home).unwrap();
        let lin = Linear::new(inputs, outputs, &mut rng(), &home).unwrap();
        let (y, gx) = grads(&lin, &x, &c);
        let (gw, gb) = (lin.weight.grad().unwrap().to_vec().unwrap(), lin.bias.as_ref().unwrap().grad().unwrap().to_vec().unwrap());

        let col = ColumnParallelLinear::from_linear(&lin, &cycled_devices(k)).unwrap();
        assert_close(&format!("{what}: column weight"), &col.weight().unwrap().to_vec().unwrap(), &lin.weight.to_vec().unwrap(), 0.0, 0.0);
        let (cy, cgx) = grads(&col, &x, &c);
        assert_close(&format!("{what}: column forward"), &cy, &y, 1e-6, 1e-5);
        assert_close(&format!("{what}: column input grad"), &cgx, &gx, 1e-6, 1e-5);
        assert_close(&format!("{what}: column weight grad"), &col.weight_grad().unwrap().unwrap().to_vec().unwrap(), &gw, 1e-6, 1e-5);
        assert_close(&format!("{what}: column bias grad"), &col.bias_grad().unwrap().unwrap().to_vec().unwrap(), &gb, 1e-6, 1e-5);

        let row = RowParallelLinear::from_linear(&lin, &cycled_devices(k)).unwrap();
        let (ry, rgx) = grads(&row, &x, &c);
        assert_close(&format!("{what}: row forward"), &ry, &y, 1e-6, 1e-5);
        assert_close(&format!("{what}: row input grad"), &rgx, &gx, 1e-6, 1e-5);
        assert_close(&format!("{what}: row weight grad"), &row.weight_grad().unwrap().unwrap().to_vec().unwrap(), &gw, 1e-6, 1e-5);
        assert_close(&format!("{what}: row bias grad"), &row.bias().unwrap().grad().unwrap().to_vec().unwrap(), &gb, 1e-6, 1e-5);

        let back = col.to_device(&home).unwrap();
        assert_close(&format!("{what}: gathered Linear"), &back.forward(&x).unwrap().to_vec().unwrap(), &y, 1e-6, 1e-5);
    }
    let lin = Linear::new(3, 2, &mut rng(), &home).unwrap();
    let err = ColumnParallelLinear::from_linear(&lin, &cycled_devices(3)).err().expect("2 outputs over 3 devices").to_string();
    assert!(err.contains("2 features over 3 devices"), "{err}");
}

#[test]
fn tensor_parallel_state_round_trips_under_the_original_names() {
    let opt = OptimConfig::adam(AdamConfig::default());
    let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
    let mut tp = TensorParallel::new(&model, &cycled_devices(3), &opt, Loss::CrossEntropy).unwrap();
    let names = |s: Vec<(String, Tensor)>| s.into_iter().map(|(n, t)| (n, t.dims().to_vec())).collect::<Vec<_>>();
    assert_eq!(names(tp.state_dict().unwrap()), names(model.parameters()));
    let data = seed_image_batches(8, 2, 5);
    tp.step(&data[0]).unwrap();
    let (state, steps) = tp.optimizer_state().unwrap();
    let weights = tp.state_dict().unwrap();
    assert!(state.iter().any(|(n, t)| n == "fc1.weight.exp_avg" && t.dims() == [50, 320]), "{:?}", names(state.clone()));

    // A fresh copy loaded from that state takes the same next step.
    let mut other = TensorParallel::new(&model, &cycled_devices(3), &opt, Loss::CrossEntropy).unwrap();
    other.load_state_dict(&weights).unwrap();
    other.load_optimizer_state(&state, steps).unwrap();
    let (a, b) = (tp.step(&data[1]).unwrap().loss, other.step(&data[1]).unwrap().loss);
    assert_close("loss after loading", &[b], &[a], 0.0, 0.0);
    for ((n, x), (_, y)) in tp.state_dict().unwrap().iter().zip(other.state_dict().unwrap()) {
        assert_close(n, &y.to_vec().unwrap(), &x.to_vec().unwrap(), 0.0, 0.0);
    }
    let err = other.load_state_dict(&weights[1..]).unwrap_err().to_string();
    assert!(err.contains("conv1.weight"), "{err}");
}

#[test]
fn placement_errors_and_predict() {
    let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
    let opt = OptimConfig::sgd(SgdConfig::default());
    let err = LayerPlacement::new(&model, &cycled_devices(2), Split::At(vec![10]), &opt, Loss::CrossEntropy).err().unwrap().to_string();
    assert!(err.contains("split points"), "{err}");
    let lp = LayerPlacement::new(&model, &cycled_devices(3), Split::At(vec![3, 8]), &opt, Loss::CrossEntropy).unwrap();
    assert_eq!(lp.ranges(), vec![0..3, 3..8, 8..10]);
    let batch = &seed_image_batches(4, 1, 5)[0];
    let dev = cycled_devices(1).remove(0);
    let single = Single::new(SeedModel::Cnn.build(3, &dev).unwrap(), &opt, Loss::CrossEntropy, &dev).unwrap();
    let x = tandem::parallel::inputs_to_device(batch, &dev).unwrap();
    assert_close("predict", &lp.predict(&x).unwrap().to_vec().unwrap(), &single.predict(&x).unwrap().to_vec().unwrap(), 1e-6, 1e-5);
    let one_linear = tandem::nn::Sequential::new().push("fc", Linear::new(3, 2, &mut rng(), &dev).unwrap());
    let err = TensorParallel::new(&one_linear, &cycled_devices(2), &opt, Loss::CrossEntropy).err().unwrap().to_string();
    assert!(err.contains("two Linear layers"), "{err}");
}

#[test]
fn strategies_on_the_models_own_device_leave_the_model_untouched() {
    let dev = cycled_devices(1).remove(0);
    let model = SeedModel::Cnn.build(3, &dev).unwrap();
    let before: Vec<Vec<f32>> = model.parameters().iter().map(|(_, t)| t.to_vec().unwrap()).collect();
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.1, ..Default::default() });
    let mut lp = LayerPlacement::new(&model, &[dev.clone(), dev.clone()], Split::At(vec![5]), &opt, Loss::CrossEntropy).unwrap();
    let mut tp = TensorParallel::new(&model, &[dev.clone(), dev.clone()], &opt, Loss::CrossEntropy).unwrap();
    let batch = &seed_image_batches(4, 1, 5)[0];
    lp.step(batch).unwrap();
    tp.step(batch).unwrap();
    for ((name, t), want) in model.parameters().iter().zip(&before) {
        assert_close(name, &t.to_vec().unwrap(), want, 0.0, 0.0);
    }
}

/// Clipping and `set_lr` reach every tensor-parallel shard: the norm is over each shard once
/// (the trunk and the row bias, which live on the first device only, once too).
#[test]
fn tensor_parallel_clips_the_global_norm_and_sets_lr_like_single() {
    const CLIP: f32 = 0.3;
    let data = seed_image_batches(8, 8, 5);
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    let run = |s: &mut dyn Strategy| {
        s.set_grad_clip(Some(CLIP)).unwrap();
        let mut norms = Vec::new();
        let mut losses = Vec::new();
        for (i, b) in data.iter().enumerate() {
            if i == 4 {
                s.set_lr(0.02);
            }
            let r = s.step(b).unwrap();
            norms.push(r.grad_norm.unwrap());
            losses.push(r.loss);
        }
        let weights = s.state_dict().unwrap().into_iter().map(|(n, t)| (n, t.dims().to_vec(), t.to_vec().unwrap())).collect();
        (norms, (losses, weights))
    };
    let dev = cycled_devices(1).remove(0);
    let (want_norms, want) = run(&mut Single::new(SeedModel::Cnn.build(3, &dev).unwrap(), &opt, Loss::CrossEntropy, &dev).unwrap());
    assert!(want_norms[0] > CLIP, "the first norm {} should exceed the bound {CLIP}", want_norms[0]);
    let model = SeedModel::Cnn.build(3, &Device::cpu()).unwrap();
    for n in [2, 3] {
        let (norms, got) = run(&mut TensorParallel::new(&model, &cycled_devices(n), &opt, Loss::CrossEntropy).unwrap());
        assert_close(&format!("tensor parallel x{n}: gradient norms"), &norms, &want_norms, 1e-5, 1e-4);
        same(&format!("tensor parallel x{n}, clipped"), &got, &want);
    }
}

/// A parameterless layer that takes 30 ms: it makes the measured split differ from the
/// split by parameter bytes that `Split::Auto` starts from.
struct Slow;

impl Module for Slow {
    fn forward(&self, x: &Tensor) -> tandem::Result<Tensor> {
        std::thread::sleep(std::time::Duration::from_millis(30));
        Ok(x.clone())
    }
    fn to_device(&self, _: &Device) -> tandem::Result<Box<dyn Module>> {
        Ok(Box::new(Slow))
    }
    fn describe(&self) -> String {
        "Slow".into()
    }
}

/// The first step's rebalancing rebuilds the stages' optimizers; a learning rate set before
/// it must survive (here 0, so the step must leave the weights alone).
#[test]
fn a_learning_rate_set_before_the_first_step_survives_rebalancing() {
    let cpu = Device::cpu();
    let model = tandem::nn::Sequential::new()
        .push("slow", Slow)
        .push("a", Linear::new(4, 4, &mut rng(), &cpu).unwrap())
        .push("b", Linear::new(4, 4, &mut rng(), &cpu).unwrap())
        .push("c", Linear::new(4, 2, &mut rng(), &cpu).unwrap());
    let x: Vec<f32> = (0..16).map(|i| i as f32 / 16.0).collect();
    let ds = tandem::data::Dataset { x, sample_shape: vec![4], y: tandem::data::Targets::Classes { labels: vec![0, 1, 1, 0], classes: 2 } };
    let batch = ds.batch(&[0, 1, 2, 3]).unwrap();
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.5, ..Default::default() });
    let before: Vec<f32> = model.parameters().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
    let mut lp = LayerPlacement::new(&model, &cycled_devices(2), Split::Auto, &opt, Loss::CrossEntropy).unwrap();
    assert_eq!(lp.ranges(), vec![0..2, 2..4], "split by parameter bytes before the first step");
    lp.set_lr(0.0);
    lp.step(&batch).unwrap();
    assert_eq!(lp.ranges(), vec![0..1, 1..4], "the slow layer alone after measuring");
    let after: Vec<f32> = lp.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
    assert_eq!(after, before, "lr 0 set before the first step must hold after rebalancing");
}
