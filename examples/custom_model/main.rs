//! Your own model on any strategy: a small ResNet-style network defined in `net.rs` (strided
//! convolutions with BatchNorm, pre-LayerNorm residual MLP blocks with GELU and Dropout), a
//! label-smoothed loss written as a closure, AdamW with no weight decay on biases and norms, a
//! warmup + cosine schedule and global-norm clipping, trained on the built-in digits with the
//! strategy and devices you name. Only the line that builds the strategy differs between them.
//!
//! ```text
//! cargo run --release --example custom_model -- --strategy single --devices wgpu:0
//! cargo run --release --example custom_model -- --strategy data --devices cpu,cpu
//! cargo run --release --example custom_model -- --strategy pipeline --devices wgpu:0,wgpu:0 --steps 400
//! ```
mod net;

use net::NetConfig;
use std::sync::Arc;
use tandem::data::digits;
use tandem::parallel::{Parallel, Split, Stages, Strategy};
use tandem::train::PrintEvery;
use tandem::{Device, Error, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag =
        |name: &str, default: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into());
    let devices = Device::parse(&flag("--devices", "cpu"))?;
    let steps: u64 = flag("--steps", "400").parse().map_err(|e| Error::invalid("--steps", format!("{e}")))?;
    let cfg = NetConfig::EXAMPLE;
    let (opt, loss) = (net::optimizer(), net::loss());
    let model = net::build(cfg, &devices[0])?;
    let strategy: Box<dyn Strategy> = match flag("--strategy", "single").as_str() {
        "single" => Parallel::single(|_| Ok(model), &devices[0], &opt, loss).boxed()?,
        "data" => Parallel::data(|d| net::build(cfg, d), &devices, &opt, loss).boxed()?,
        "model" => Parallel::layers(Stages::Split(&model, Split::Auto), &devices, &opt, loss).boxed()?,
        "pipeline" => Parallel::pipeline(Stages::Split(&model, Split::Auto), &devices, &opt, loss).micro_batches(4).boxed()?,
        other => return Err(Error::invalid("--strategy", format!("{other} is not single, data, model or pipeline"))),
    };

    let (train, test) = digits::load(8192, 1024, 0)?;
    let mut trainer = net::trainer(strategy, steps, Arc::new(test))?.observe(PrintEvery(50));
    let fit = trainer.fit(&mut net::loader(Arc::new(train), 64)?)?;
    println!("test accuracy {:.2}% after {steps} steps ({:.1} s)", 100.0 * fit.metric("accuracy").unwrap_or(0.0), fit.train_s);
    Ok(())
}
