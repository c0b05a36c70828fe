//! The seed linear programs as library code: `Linear(10, 1)` and `Linear(10, 5) -> Linear(5, 1)`
//! fitted with MSE and SGD (lr 0.01) on 1000 random rows; then the seed's data-parallel form,
//! where the batch is split into two halves whose two losses are summed before one backward.
//!
//! ```text
//! cargo run --release --example seed_linear -- --devices cpu
//! ```
use rand::SeedableRng;
use tandem::nn::{models::SeedModel, Module, Sequential};
use tandem::optim::{Optimizer, Sgd, SgdConfig};
use tandem::{Device, Tensor};

const STEPS: usize = 10;

fn main() -> tandem::Result<()> {
    let device = device_from_args()?;
    println!("device: {device} ({})", device.info().name);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let x = Tensor::randn([1000, 10], &mut rng, &device)?;
    let y = Tensor::randn([1000, 1], &mut rng, &device)?;

    println!("Linear(10, 1):");
    train(&SeedModel::Linear.build(0, &device)?, &x, &y)?;
    println!("Linear(10, 5) -> Linear(5, 1):");
    train(&SeedModel::TwoLayer.build(0, &device)?, &x, &y)?;
    println!("Linear(10, 5) -> Linear(5, 1), batch split in two halves, losses summed:");
    train_halves(&SeedModel::TwoLayer.build(0, &device)?, &x, &y)?;
    Ok(())
}

fn sgd(model: &Sequential) -> tandem::Result<Sgd> {
    Sgd::new(model.parameters(), SgdConfig { lr: 0.01, ..Default::default() })
}

fn train(model: &Sequential, x: &Tensor, y: &Tensor) -> tandem::Result<()> {
    let mut opt = sgd(model)?;
    for step in 1..=STEPS {
        let loss = model.forward(x)?.mse_loss(y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        println!("  step {step:2}  loss {:.6}", loss.to_scalar()?);
    }
    Ok(())
}

/// Each half's mean loss is computed separately and the two are added, so the gradient is
/// twice the full batch's: the seed's two-replica step written on one device.
fn train_halves(model: &Sequential, x: &Tensor, y: &Tensor) -> tandem::Result<()> {
    let mut opt = sgd(model)?;
    let half = x.dims()[0] / 2;
    for step in 1..=STEPS {
        let first = model.forward(&x.narrow(0, 0, half)?)?.mse_loss(&y.narrow(0, 0, half)?)?;
        let second = model.forward(&x.narrow(0, half, half)?)?.mse_loss(&y.narrow(0, half, half)?)?;
        let loss = first.add(&second)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        println!("  step {step:2}  loss {:.6} (halves {:.6} + {:.6})", loss.to_scalar()?, first.to_scalar()?, second.to_scalar()?);
    }
    Ok(())
}

/// The first device of `--devices SPEC` (default `auto`).
fn device_from_args() -> tandem::Result<Device> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).map_or("auto", String::as_str);
    Ok(Device::parse(spec)?.remove(0))
}
