//! `Parallel` builds every strategy the same way and each equals `Single`: losses, weights and
//! the gradient norm of the one clip-and-update path, step by step; `predict` takes inputs
//! alone, with no targets; the learning rate and training mode set once reach every part.
mod common;
use common::{assert_close, cycled_devices, seed_image_batches};
use tandem::data::Batch;
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::{Loss, OptimConfig, Parallel, Shard, Split, Stages, Strategy};
use tandem::{Device, Tensor};

fn opt() -> OptimConfig {
    OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })
}

fn cnn(d: &Device) -> tandem::Result<tandem::nn::Sequential> {
    SeedModel::Cnn.build(3, d)
}

/// Every kind of strategy from the builder, named, with clipping at `clip`.
fn every_strategy(clip: Option<f32>) -> Vec<(&'static str, Box<dyn Strategy>)> {
    let d = cycled_devices(4);
    let model = cnn(&d[0]).unwrap();
    let loss = || Loss::CrossEntropy;
    vec![
        ("single", Parallel::single(cnn, &d[0], &opt(), loss()).grad_clip(clip).boxed().unwrap()),
        ("data", Parallel::data(cnn, &d[..2], &opt(), loss()).grad_clip(clip).boxed().unwrap()),
        (
            "data, 2 micro-batches, ZeRO-1",
            Parallel::data(cnn, &d[..2], &opt(), loss()).micro_batches(2).shard_optimizer().grad_clip(clip).boxed().unwrap(),
        ),
        ("data, deterministic", Parallel::data(cnn, &d[..2], &opt(), loss()).deterministic(4).grad_clip(clip).boxed().unwrap()),
        ("data, ZeRO-2", Parallel::data(cnn, &d[..2], &opt(), loss()).shard(Shard::Grads).grad_clip(clip).boxed().unwrap()),
        (
            "data, 2 micro-batches, ZeRO-3",
            Parallel::data(cnn, &d[..2], &opt(), loss()).micro_batches(2).shard(Shard::Full).grad_clip(clip).boxed().unwrap(),
        ),
        ("layers", Parallel::layers(Stages::Split(&model, Split::At(vec![6])), &d[..2], &opt(), loss()).grad_clip(clip).boxed().unwrap()),
        (
            "pipeline",
            Parallel::pipeline(Stages::Split(&model, Split::At(vec![6])), &d[..2], &opt(), loss()).micro_batches(2).grad_clip(clip).boxed().unwrap(),
        ),
        ("tensor", Parallel::tensor(&model, &d[..2], &opt(), loss()).grad_clip(clip).boxed().unwrap()),
        (
            "grid",
            Parallel::grid(|_| Ok(Stages::Split(&model, Split::At(vec![6]))), &d, 2, &opt(), loss())
                .micro_batches(2)
                .grad_clip(clip)
                .boxed()
                .unwrap(),
        ),
    ]
}

/// Losses, gradient norms and weights of `steps` steps.
fn run(s: &mut dyn Strategy, batches: &[Batch]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for b in batches {
        let r = s.step(b).unwrap();
        losses.push(r.loss);
        norms.extend(r.grad_norm);
    }
    let weights = s.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
    (losses, norms, weights)
}

#[test]
fn the_builder_builds_every_strategy_and_each_equals_single() {
    let batches = seed_image_batches(8, 3, 5);
    let mut all = every_strategy(None);
    let (want_loss, norms, want_w) = run(&mut *all[0].1, &batches);
    assert!(norms.is_empty(), "no clipping, no norm");
    for (name, s) in &mut all[1..] {
        let (loss, _, w) = run(&mut **s, &batches);
        assert_close(&format!("{name}: losses"), &loss, &want_loss, 1e-5, 1e-4);
        assert_close(&format!("{name}: weights"), &w, &want_w, 1e-5, 1e-4);
    }
}

/// The norm comes from the one clip-and-update path: each parameter counted once, whether
/// replicated (data, grid), cut into stages or sharded; a bound below it clips every part alike.
#[test]
fn the_one_clip_path_gives_every_strategy_singles_norm_and_update() {
    let batches = seed_image_batches(8, 3, 6);
    let mut all = every_strategy(Some(0.05));
    let (want_loss, want_norm, want_w) = run(&mut *all[0].1, &batches);
    assert_eq!(want_norm.len(), 3);
    assert!(want_norm.iter().all(|&n| n > 0.05), "the bound clips: {want_norm:?}");
    for (name, s) in &mut all[1..] {
        let (loss, norm, w) = run(&mut **s, &batches);
        assert_close(&format!("{name}: grad norms"), &norm, &want_norm, 1e-5, 1e-4);
        assert_close(&format!("{name}: losses"), &loss, &want_loss, 1e-5, 1e-4);
        assert_close(&format!("{name}: weights"), &w, &want_w, 1e-5, 1e-4);
    }
}

/// `set_lr` once reaches every replica, stage and shard (the learning rate lives in the
/// strategy's core and every optimizer takes it at its update).
#[test]
fn one_learning_rate_reaches_every_optimizer() {
    let batches = seed_image_batches(8, 2, 7);
    let mut all = every_strategy(None);
    all.iter_mut().for_each(|(_, s)| s.set_lr(0.01));
    let (want_loss, _, want_w) = run(&mut *all[0].1, &batches);
    let mut fresh = every_strategy(None);
    let (default_loss, _, _) = run(&mut *fresh[0].1, &batches);
    assert!((default_loss[1] - want_loss[1]).abs() > 1e-6, "the rate changed the second step");
    for (name, s) in &mut all[1..] {
        let (loss, _, w) = run(&mut **s, &batches);
        assert_close(&format!("{name}: losses at lr 0.01"), &loss, &want_loss, 1e-5, 1e-4);
        assert_close(&format!("{name}: weights at lr 0.01"), &w, &want_w, 1e-5, 1e-4);
    }
}

/// `predict` takes the inputs alone: a tensor of features built without any targets, on any
/// device, gives every strategy Single's outputs.
#[test]
fn predict_takes_inputs_without_targets() {
    let mut all = every_strategy(None);
    let x: Vec<f32> = (0..2 * 28 * 28).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
    let x = Tensor::from_vec(x, [2, 1, 28, 28], &Device::cpu()).unwrap();
    all.iter_mut().for_each(|(_, s)| s.set_training(false));
    let want = all[0].1.predict(&x).unwrap();
    assert_eq!(want.dims(), &[2, 10]);
    assert!(want.device().same(&all[0].1.devices()[0]), "outputs on the first device");
    for (name, s) in &all[1..] {
        let got = s.predict(&x).unwrap();
        assert_close(&format!("{name}: predict"), &got.to_vec().unwrap(), &want.to_vec().unwrap(), 1e-5, 1e-4);
    }
}

#[test]
fn the_builder_refuses_a_bad_bound_and_a_communicator_off_the_devices() {
    let d = cycled_devices(2);
    let e = Parallel::single(cnn, &d[0], &opt(), Loss::CrossEntropy).grad_clip(Some(-1.0)).build().err().expect("a negative bound").to_string();
    assert!(e.contains("set_grad_clip") && e.contains("-1"), "{e}");
    let comm = tandem::parallel::comm::for_devices(&d).unwrap();
    let e = Parallel::data(cnn, &d[..1], &opt(), Loss::CrossEntropy).communicator(comm).build().err().expect("devices differ").to_string();
    assert!(e.contains("Parallel::data") && e.contains("communicator"), "{e}");
}
