//! Your own model on any strategy: a residual MLP defined here (skip connections, dropout), a
//! label-smoothed loss written as a closure, global-norm clipping and a linear warmup through
//! `set_lr`, trained on the built-in digits with the strategy and devices you name. Only the
//! line that builds the strategy differs between them.
//!
//! ```text
//! cargo run --release --example custom_model -- --strategy data --devices cpu,cpu
//! cargo run --release --example custom_model -- --strategy pipeline --devices wgpu:0,wgpu:0
//! ```
use std::sync::Arc;
use tandem::data::{digits, DataLoader};
use tandem::nn::{self, Dropout, Flatten, Linear, Module, Sequential};
use tandem::optim::SgdConfig;
use tandem::parallel::pipeline::Pipeline;
use tandem::parallel::{DataParallel, DataParallelConfig, LayerPlacement, Loss, OptimConfig, Single, Split, Stages, Strategy};
use tandem::{CrossEntropy, Device, Error, Result, Tensor};

const WIDTH: usize = 128;

/// `x + fc2(drop(relu(fc1(x))))`.
struct Residual {
    fc1: Linear,
    fc2: Linear,
    drop: Dropout,
    seed: u64,
}

impl Residual {
    fn new(seed: u64, dev: &Device) -> Result<Self> {
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
        Ok(Residual { fc1: Linear::new(WIDTH, WIDTH, &mut rng, dev)?, fc2: Linear::new(WIDTH, WIDTH, &mut rng, dev)?, drop: Dropout::new(0.1)?.seed(seed), seed })
    }
}

impl Module for Residual {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.add(&self.fc2.forward(&self.drop.forward(&self.fc1.forward(x)?.relu()?)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("fc1".into(), &self.fc1), ("fc2".into(), &self.fc2), ("drop".into(), &self.drop)]
    }
    /// Lets layer placement and the pipeline move the block to a stage's device.
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Ok(Box::new(nn::to_device(self, device, |d| Residual::new(self.seed, d))?))
    }
    fn describe(&self) -> String {
        format!("Residual({WIDTH})")
    }
}

fn model(dev: &Device) -> Result<Sequential> {
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0);
    Ok(Sequential::new()
        .push("flat", Flatten)
        .push("inp", Linear::new(28 * 28, WIDTH, &mut rng, dev)?)
        .push("res1", Residual::new(1, dev)?)
        .push("res2", Residual::new(2, dev)?)
        .push("head", Linear::new(WIDTH, 10, &mut rng, dev)?))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into());
    let devices = Device::parse(&flag("--devices", "cpu,cpu"))?;
    let loss = Loss::custom(|out, y| out.cross_entropy_with(y, CrossEntropy { label_smoothing: 0.1, ..Default::default() }));
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let net = model(&devices[0])?;
    let mut strategy: Box<dyn Strategy> = match flag("--strategy", "data").as_str() {
        "single" => Box::new(Single::new(net, &opt, loss, &devices[0])?),
        "data" => Box::new(DataParallel::from_factory(model, &devices, &opt, loss, DataParallelConfig::default())?),
        "model" => Box::new(LayerPlacement::with_stages(Stages::Split(&net, Split::Auto), &devices, &opt, loss)?),
        "pipeline" => Box::new(Pipeline::builder(Stages::Split(&net, Split::Auto), &devices, &opt, loss).micro_batches(4).build()?),
        other => return Err(Error::invalid("--strategy", format!("{other} is not single, data, model or pipeline"))),
    };
    strategy.set_grad_clip(Some(1.0))?;

    let (train, test) = digits::load(8192, 1024, 0)?;
    let mut loader = DataLoader::new(Arc::new(train), 128, true, 0)?.drop_last(true)?;
    let (steps, warmup) = (300, 50);
    for step in 0..steps {
        strategy.set_lr(0.05 * ((step + 1) as f32 / warmup as f32).min(1.0));
        let r = strategy.step(&loader.next_batch())?;
        if step % 50 == 0 || step + 1 == steps {
            println!("step {step:3}  loss {:.4}  grad norm {:.3}", r.loss, r.grad_norm.unwrap_or(f32::NAN));
        }
    }
    strategy.set_training(false);
    let all: Vec<usize> = (0..test.len()).collect();
    let batch = test.batch(&all)?;
    let predicted = strategy.predict(&batch)?.argmax(-1)?.to_vec_i32()?;
    let tandem::data::Targets::Classes { labels, .. } = &batch.y else { return Err(Error::Msg("digits have class labels".into())) };
    let right = predicted.iter().zip(labels).filter(|(p, l)| p == l).count();
    println!("test accuracy {:.2}%", 100.0 * right as f64 / labels.len() as f64);
    Ok(())
}
