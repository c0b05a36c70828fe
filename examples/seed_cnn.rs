//! The seed CNN program as library code: ten SGD steps (lr 0.01, momentum 0.9) of
//! cross-entropy on one batch of 1000 random 1x28x28 images with random labels.
//!
//! ```text
//! cargo run --release --example seed_cnn -- --devices cpu
//! ```
use rand::{Rng, SeedableRng};
use tandem::nn::{models::SeedModel, Module};
use tandem::optim::{Optimizer, Sgd, SgdConfig};
use tandem::{Device, Tensor};

fn main() -> tandem::Result<()> {
    let device = device_from_args()?;
    println!("device: {device} ({})", device.info().name);
    let model = SeedModel::Cnn.build(0, &device)?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() })?;

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let x = Tensor::randn([1000, 1, 28, 28], &mut rng, &device)?;
    let labels: Vec<i32> = (0..1000).map(|_| rng.random_range(0..10)).collect();
    let y = Tensor::from_labels(labels, [1000], &device)?;

    for step in 1..=10 {
        let loss = model.forward(&x)?.cross_entropy(&y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        println!("step {step:2}  loss {:.6}", loss.to_scalar()?);
    }
    Ok(())
}

/// The first device of `--devices SPEC` (default `auto`).
fn device_from_args() -> tandem::Result<Device> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).map_or("auto", String::as_str);
    Ok(Device::parse(spec)?.remove(0))
}
