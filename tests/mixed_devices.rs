//! Every parallel strategy on devices of different backends at once — the CPU reference,
//! lavapipe (Vulkan) and llvmpipe (GL) here — gives the single-device losses and weights over
//! ten steps of the seed CNN.
mod common;

use tandem::data::{synthetic, Batch};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::pipeline::{Pipeline, Schedule};
use tandem::parallel::{DataParallel, DataParallelConfig, LayerPlacement, Loss, OptimConfig, Single, Split, Stages, Strategy, TensorParallel};
use tandem::tolerance::assert_close;
use tandem::Device;

fn opt() -> OptimConfig {
    OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })
}

fn batches() -> Vec<Batch> {
    let ds = synthetic::seed_images(24 * 10, 21).unwrap();
    (0..10).map(|s| ds.batch(&(s * 24..(s + 1) * 24).collect::<Vec<_>>()).unwrap()).collect()
}

fn run(strategy: &mut dyn Strategy, data: &[Batch]) -> (Vec<f32>, Vec<f32>) {
    let losses = data.iter().map(|b| strategy.step(b).unwrap().loss).collect();
    let weights = strategy.state_dict().unwrap().iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect();
    (losses, weights)
}

fn check(what: &str, strategy: &mut dyn Strategy, want: &(Vec<f32>, Vec<f32>), data: &[Batch]) {
    let specs: Vec<String> = strategy.devices().iter().map(Device::spec).collect();
    let got = run(strategy, data);
    assert_close(&format!("{what} on {specs:?}: losses"), &got.0, &want.0, 1e-5, 1e-4);
    assert_close(&format!("{what} on {specs:?}: weights"), &got.1, &want.1, 1e-4, 1e-3);
}

#[test]
fn every_strategy_on_cpu_vulkan_and_gl_matches_one_device() {
    let Some(devs) = common::mixed_devices() else { return };
    let data = batches();
    let model = SeedModel::Cnn.build(5, &Device::cpu()).unwrap();
    let want = run(&mut Single::new(SeedModel::Cnn.build(5, &Device::cpu()).unwrap(), &opt(), Loss::CrossEntropy, &Device::cpu()).unwrap(), &data);
    let loss = Loss::CrossEntropy;
    for n in [2, 3] {
        let d = &devs[..n];
        let mut dp = DataParallel::new(&model, d, &opt(), loss.clone(), DataParallelConfig::default()).unwrap();
        check("data parallel", &mut dp, &want, &data);
        for kind in [Schedule::GPipe, Schedule::OneFOneB] {
            let split = if n == 2 { Split::At(vec![4]) } else { Split::At(vec![3, 7]) };
            let mut p = Pipeline::builder(Stages::Split(&model, split), d, &opt(), loss.clone()).micro_batches(4).schedule(kind).build().unwrap();
            check(&format!("{kind:?}"), &mut p, &want, &data);
        }
        let mut lp = LayerPlacement::new(&model, d, Split::Auto, &opt(), loss.clone()).unwrap();
        check("layer placement", &mut lp, &want, &data);
        let mut tp = TensorParallel::new(&model, d, &opt(), loss.clone()).unwrap();
        check("tensor parallel", &mut tp, &want, &data);
    }
}
