//! The seed linear programs as library code: `Linear(10, 1)` and `Linear(10, 5) -> Linear(5, 1)`
//! fitted with MSE and SGD (lr 0.01) on one batch of 1000 random rows for ten steps; then the
//! seed's data-parallel form, where the batch is split into two halves whose two losses are
//! summed before one backward (written here as the loss of one device).
//!
//! ```text
//! cargo run --release --example seed_linear -- --devices cpu
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
    let rows = Arc::new(synthetic::regression(1000, 10, 0)?);
    // Each half's mean loss computed separately and the two added: the gradient is twice the
    // full batch's, the seed's two-replica step written on one device.
    let halves = Loss::custom(|out, y| {
        let half = out.dims()[0] / 2;
        out.narrow(0, 0, half)?.mse_loss(&y.narrow(0, 0, half)?)?.add(&out.narrow(0, half, half)?.mse_loss(&y.narrow(0, half, half)?)?)
    });
    for (name, model, loss) in [
        ("Linear(10, 1)", SeedModel::Linear, Loss::Mse),
        ("Linear(10, 5) -> Linear(5, 1)", SeedModel::TwoLayer, Loss::Mse),
        ("Linear(10, 5) -> Linear(5, 1), batch split in two halves, losses summed", SeedModel::TwoLayer, halves),
    ] {
        println!("{name}:");
        let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, ..Default::default() });
        let single = Parallel::single(|d| model.build(0, d), &device, &opt, loss).build()?;
        Trainer::new(single).epochs(10).observe(PrintEvery(1)).fit(&mut DataLoader::new(rows.clone(), 1000, false, 0)?)?;
    }
    Ok(())
}

/// The first device of `--devices SPEC` (default `auto`).
fn device_from_args() -> tandem::Result<Device> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).map_or("auto", String::as_str);
    Ok(Device::parse(spec)?.remove(0))
}
