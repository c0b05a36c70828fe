//! Every strategy trains a module the user wrote (skip connection, one Linear used twice,
//! dropout) with a loss the user wrote (label-smoothed cross-entropy) on per-token `[B, T]`
//! targets, and gives `Single`'s losses and weights over ten steps with dropout and clipping
//! on: DataParallel (overlapped and deterministic), LayerPlacement, and GPipe (recomputing)
//! and 1F1B pipelines, on CPU devices and on logical devices of `wgpu:0`. Also: deterministic
//! data parallelism is bit-identical on 1 and 2 devices with dropout, and `set_lr` and
//! `set_grad_clip` reach every strategy.
mod common;

use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::data::{Batch, Dataset, Targets};
use tandem::nn::{self, Dropout, Linear, Module, Sequential};
use tandem::optim::SgdConfig;
use tandem::parallel::pipeline::{Pipeline, Schedule};
use tandem::parallel::{DataParallel, DataParallelConfig, LayerPlacement, Loss, OptimConfig, Single, Split, Stages, Strategy};
use tandem::{CrossEntropy, Device, Result, Tensor};

/// Batch, tokens per sample, input width, hidden width, vocabulary.
const B: usize = 8;
const T: usize = 3;
const D: usize = 4;
const H: usize = 6;
const V: usize = 5;

/// `[B, T, in] -> [B, T, out]`: a Linear over the last dimension of a token sequence.
struct Proj {
    fc: Linear,
    seed: u64,
}

impl Proj {
    fn new(inputs: usize, outputs: usize, seed: u64, dev: &Device) -> Result<Self> {
        Ok(Proj { fc: Linear::new(inputs, outputs, &mut common::rng(seed), dev)?, seed })
    }
}

impl Module for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let y = self.fc.forward(&x.reshape([b * t, c])?)?;
        y.reshape([b, t, y.dims()[1]])
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("fc".into(), &self.fc)]
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        let (o, i) = (self.fc.weight.dims()[0], self.fc.weight.dims()[1]);
        Ok(Box::new(nn::to_device(self, device, |d| Proj::new(i, o, self.seed, d))?))
    }
    fn describe(&self) -> String {
        "Proj".into()
    }
}

/// `x + fc(drop(relu(fc(x))))` with dropout twice: one weight used twice and a skip connection.
struct Block {
    fc: Proj,
    drop: Dropout,
    seed: u64,
}

impl Block {
    fn new(seed: u64, dev: &Device) -> Result<Self> {
        Ok(Block { fc: Proj::new(H, H, seed, dev)?, drop: Dropout::new(0.25)?.seed(seed), seed })
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.drop.forward(&self.fc.forward(x)?.relu()?)?;
        x.add(&self.drop.forward(&self.fc.forward(&h)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("fc".into(), &self.fc), ("drop".into(), &self.drop)]
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(nn::to_device(self, device, |d| Block::new(self.seed, d))?))
    }
    fn describe(&self) -> String {
        "Block".into()
    }
}

/// The model's two halves (stage 0 and stage 1), each built on its device.
fn first_half(dev: &Device) -> Result<Sequential> {
    Ok(Sequential::new().push("inp", Proj::new(D, H, 1, dev)?).push("b0", Block::new(2, dev)?))
}
fn second_half(dev: &Device) -> Result<Sequential> {
    Ok(Sequential::new().push("b1", Block::new(3, dev)?).push("head", Proj::new(H, V, 4, dev)?))
}
fn model(dev: &Device) -> Result<Sequential> {
    let (a, b) = (first_half(dev)?, second_half(dev)?);
    let mut m = Sequential::new();
    for (name, layer) in a.layers().iter().chain(b.layers()) {
        m.push_boxed(name.clone(), layer.to_device(dev)?);
    }
    Ok(m)
}

/// Label-smoothed cross-entropy over every token of `[B, T, V]` logits and `[B, T]` ids.
fn smoothed() -> Loss {
    Loss::custom(|out, y| {
        let tokens = y.numel();
        out.reshape([tokens, V])?.cross_entropy_with(&y.reshape([tokens])?, CrossEntropy { label_smoothing: 0.1, ..Default::default() })
    })
}

fn opt() -> OptimConfig {
    OptimConfig::sgd(SgdConfig { lr: 0.2, momentum: 0.9, ..Default::default() })
}

/// Ten batches of token sequences `[B, T, D]` with next-token ids `[B, T]`.
fn batches() -> Vec<Batch> {
    let n = 10 * B;
    let mut r = common::rng(11);
    let x = common::uniform(&mut r, n * T * D, -1.0, 1.0);
    let ids = common::uniform(&mut r, n * T, 0.0, V as f32).into_iter().map(|v| v as i32).collect();
    let ds = Dataset { x, sample_shape: vec![T, D], y: Targets::Tokens { ids, shape_per_sample: vec![T], classes: V } };
    (0..10).map(|s| ds.batch(&(s * B..(s + 1) * B).collect::<Vec<_>>()).unwrap()).collect()
}

/// A bound the first steps' gradients exceed, so clipping really scales.
const CLIP: f32 = 0.5;

/// Predictions for the first batch in eval mode, after checking that they differ from the
/// training-mode ones (dropout on): `set_training` reaches every replica and stage.
fn eval_predictions(s: &mut dyn Strategy, data: &[Batch]) -> Vec<f32> {
    let x = tandem::parallel::inputs_to_device(&data[0], &Device::cpu()).unwrap();
    let train = s.predict(&x).unwrap().to_vec().unwrap();
    s.set_training(false);
    let eval = s.predict(&x).unwrap().to_vec().unwrap();
    s.set_training(true);
    assert_ne!(train, eval, "eval mode must switch dropout off");
    eval
}

/// Losses, gradient norms and final weights of ten steps; the learning rate drops after step 5.
fn run(s: &mut dyn Strategy, data: &[Batch]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    s.set_grad_clip(Some(CLIP)).unwrap();
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for (i, b) in data.iter().enumerate() {
        if i == 5 {
            s.set_lr(0.05);
        }
        let r = s.step(b).unwrap();
        losses.push(r.loss);
        norms.push(r.grad_norm.expect("clipping is on, so the step reports the norm"));
    }
    let mut weights = Vec::new();
    for (_, t) in s.state_dict().unwrap() {
        weights.extend(t.to_vec().unwrap());
    }
    (losses, norms, weights)
}

#[test]
fn every_strategy_trains_a_user_model_like_single() {
    let _guard = common::shared();
    let data = batches();
    for (family, devs) in common::device_families(3) {
        let (d0, pair) = (&devs[0], &devs[1..]);
        let want = run(&mut Single::new(model(d0).unwrap(), &opt(), smoothed(), d0).unwrap(), &data);
        assert!(want.1[0] > CLIP, "{family}: the first step's norm {} should exceed the bound {CLIP}", want.1[0]);
        let full = model(d0).unwrap();
        let built = || Stages::Built(vec![first_half(&pair[0]).unwrap(), second_half(&pair[1]).unwrap()]);
        let dp = |cfg| DataParallel::from_factory(model, pair, &opt(), smoothed(), cfg).unwrap();
        let cases: Vec<(&str, Box<dyn Strategy>)> = vec![
            ("data parallel", Box::new(dp(DataParallelConfig::default()))),
            ("data parallel, deterministic", Box::new(dp(DataParallelConfig { deterministic: true, ..Default::default() }))),
            (
                "data parallel, 2 micro-batches, ZeRO-1",
                Box::new(dp(DataParallelConfig { micro_batches: 2, shard: tandem::parallel::Shard::Optimizer, ..Default::default() })),
            ),
            ("layer placement", Box::new(LayerPlacement::with_stages(Stages::Split(&full, Split::At(vec![2])), pair, &opt(), smoothed()).unwrap())),
            (
                "GPipe, recomputing",
                Box::new(
                    Pipeline::builder(Stages::Split(&full, Split::At(vec![2])), pair, &opt(), smoothed())
                        .micro_batches(2)
                        .schedule(Schedule::GPipe)
                        .recompute(true)
                        .build()
                        .unwrap(),
                ),
            ),
            ("1F1B", Box::new(Pipeline::builder(built(), pair, &opt(), smoothed()).micro_batches(4).build().unwrap())),
        ];
        let mut single = Single::new(model(d0).unwrap(), &opt(), smoothed(), d0).unwrap();
        let want_eval = eval_predictions(&mut single, &data);
        for (name, mut s) in cases {
            let what = format!("{name} on {family}");
            common::assert_close(&format!("{what}: eval predictions"), &eval_predictions(&mut *s, &data), &want_eval, 1e-5, 1e-4);
            let got = run(&mut *s, &data);
            common::assert_close(&format!("{what}: losses"), &got.0, &want.0, 1e-5, 1e-4);
            common::assert_close(&format!("{what}: gradient norms"), &got.1, &want.1, 1e-5, 1e-4);
            common::assert_close(&format!("{what}: weights"), &got.2, &want.2, 1e-5, 1e-4);
        }
    }
}

#[test]
fn deterministic_data_parallel_with_dropout_is_bit_identical_on_one_and_two_devices() {
    let _guard = common::shared();
    let data = batches();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (family, devs) in common::device_families(3) {
        let cfg = DataParallelConfig { deterministic: true, deterministic_shards: 4, ..Default::default() };
        let mut one = DataParallel::from_factory(model, &devs[..1], &opt(), smoothed(), cfg.clone()).unwrap();
        let mut two = DataParallel::from_factory(model, &devs[1..], &opt(), smoothed(), cfg).unwrap();
        let (a, b) = (run(&mut one, &data), run(&mut two, &data));
        assert_eq!(bits(&a.0), bits(&b.0), "{family}: losses on 1 and 2 devices");
        assert_eq!(bits(&a.2), bits(&b.2), "{family}: weights on 1 and 2 devices");
    }
}

/// The closure form of the loss and the set_lr and clipping calls do change training: the
/// equality above would also hold if every strategy ignored them alike.
#[test]
fn set_lr_and_clipping_change_the_run_and_bad_bounds_are_refused() {
    let dev = Device::cpu();
    let data = batches();
    let steps = |lr_drop: bool, clip: Option<f32>| {
        let mut s = Single::new(model(&dev).unwrap(), &opt(), smoothed(), &dev).unwrap();
        s.set_grad_clip(clip).unwrap();
        let mut losses = Vec::new();
        for (i, b) in data.iter().enumerate() {
            if i == 5 && lr_drop {
                s.set_lr(0.0);
            }
            let r = s.step(b).unwrap();
            assert_eq!(r.grad_norm.is_some(), clip.is_some());
            losses.push(r.loss);
        }
        (losses, s.state_dict().unwrap()[0].1.to_vec().unwrap())
    };
    let plain = steps(false, Some(CLIP));
    let frozen = steps(true, Some(CLIP));
    assert_ne!(plain.1, frozen.1, "lr 0 from step 5 on must change the final weights");
    assert_eq!(plain.0[..6], frozen.0[..6], "the first six losses come before the change");
    assert_ne!(steps(false, None).0, plain.0, "clipping at {CLIP} must change the losses");

    let mut s = Single::new(model(&dev).unwrap(), &opt(), smoothed(), &dev).unwrap();
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let err = s.set_grad_clip(Some(bad)).unwrap_err().to_string();
        assert!(err.contains("set_grad_clip"), "{err}");
    }
    // Built stages must sit on their devices.
    let cpus: Vec<Device> = (0..2).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect();
    let wrong = Stages::Built(vec![first_half(&cpus[0]).unwrap(), second_half(&cpus[0]).unwrap()]);
    let err = LayerPlacement::with_stages(wrong, &cpus, &opt(), smoothed()).err().expect("stage 1 is off its device").to_string();
    assert!(err.contains("stage 1") && err.contains("build each stage on its device"), "{err}");
}

/// Per-token targets: checked ids, split by sample, uploaded as `[b, T]` I32, and
/// `Loss::CrossEntropy` over `[B, T, V]` logits is the mean over every token.
#[test]
fn token_targets_split_upload_and_score_per_token() {
    let dev = Device::cpu();
    let data = batches();
    let b = &data[0];
    let part = b.slice(2..5).unwrap();
    assert_eq!((part.x_shape.clone(), part.y.len()), (vec![3, T, D], 3));
    let (Targets::Tokens { ids: all, .. }, Targets::Tokens { ids, .. }) = (&b.y, &part.y) else { panic!("token targets") };
    assert_eq!(ids[..], all[2 * T..5 * T]);
    let err = b.slice(6..9).unwrap_err().to_string();
    assert!(err.contains("6..9"), "{err}");

    let (_, y) = tandem::parallel::batch_to_device(&part, &dev).unwrap();
    assert_eq!((y.dims().to_vec(), y.dtype()), (vec![3, T], tandem::DType::I32));
    let logits = Tensor::from_vec(common::uniform(&mut common::rng(2), 3 * T * V, -2.0, 2.0), [3, T, V], &dev).unwrap();
    let got = Loss::CrossEntropy.compute(&logits, &y).unwrap().to_scalar().unwrap();
    let flat = logits.reshape([3 * T, V]).unwrap().cross_entropy(&y.reshape([3 * T]).unwrap()).unwrap().to_scalar().unwrap();
    assert_eq!(got, flat);

    let bad = Dataset {
        x: vec![0.0; 2 * T * D],
        sample_shape: vec![T, D],
        y: Targets::Tokens { ids: vec![0, 1, 2, 3, 4, 5], shape_per_sample: vec![T], classes: 5 },
    };
    let err = bad.validate().unwrap_err().to_string();
    assert!(err.contains("label 5 at index 5"), "{err}");
}

/// Masks follow (seed, step, global sample index, call within the forward), not the split.
#[test]
fn dropout_masks_follow_the_global_sample_index() {
    use tandem::nn::{with_samples, SampleContext};
    let dev = Device::cpu();
    let d = Dropout::new(0.5).unwrap().seed(3);
    let x = Tensor::ones([8, 10], &dev).unwrap();
    let ctx = |step, first_sample, samples| SampleContext { step, first_sample, samples };
    let mask = |c: SampleContext, x: &Tensor| with_samples(c, || d.forward(x)).unwrap().to_vec().unwrap();
    let whole = mask(ctx(2, 0, 8), &x);
    let tail = mask(ctx(2, 4, 4), &x.narrow(0, 4, 4).unwrap());
    assert_eq!(whole[40..], tail[..], "samples 4..8 alone get the whole batch's masks");
    assert_eq!(mask(ctx(2, 0, 8), &x), whole, "the same forward again replays its masks");
    assert_ne!(mask(ctx(3, 0, 8), &x), whole, "the next step draws new masks");
    let (first, second) = with_samples(ctx(2, 0, 8), || (d.forward(&x).unwrap().to_vec().unwrap(), d.forward(&x).unwrap().to_vec().unwrap()));
    assert_eq!(first, whole);
    assert_ne!(second, whole, "a second call within one forward draws its own masks");
    let err = with_samples(ctx(2, 0, 3), || d.forward(&x)).unwrap_err().to_string();
    assert!(err.contains("Dropout") && err.contains("3 samples"), "{err}");
}
