//! The seed CNN program as library code: ten SGD steps (lr 0.01, momentum 0.9) of
//! cross-entropy on one batch of 1000 random 1x28x28 images with random labels: a source of
//! one batch of 1000, trained for ten epochs.
//!
//! ```text
//! cargo run --release --example seed_cnn -- --devices cpu
//! ```
use std::sync::Arc;
use tandem::data::{synthetic, DataLoader};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::{Loss, OptimConfig, Parallel};
use tandem::train::{PrintEvery, Trainer};
use tandem::Device;

fn main() -> tandem::Result<()> {
    let device = device_from_args()?;
    println!("device: {device} ({})", device.info().name);
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let images = Arc::new(synthetic::seed_images(1000, 0)?);
    let mut one_batch = DataLoader::new(images, 1000, false, 0)?;
    Trainer::new(Parallel::single(|d| SeedModel::Cnn.build(0, d), &device, &opt, Loss::CrossEntropy).build()?)
        .epochs(10)
        .observe(PrintEvery(1))
        .fit(&mut one_batch)?;
    Ok(())
}

/// The first device of `--devices SPEC` (default `auto`).
fn device_from_args() -> tandem::Result<Device> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).map_or("auto", String::as_str);
    Ok(Device::parse(spec)?.remove(0))
}
