//! Model parallelism as library code: the seed CNN's layers placed on the devices of
//! `--devices` (split automatically by measured layer time), then its fc1/fc2 as Megatron-style
//! column- and row-parallel Linear layers, each trained by the `Trainer` on the same batches.
//!
//! ```text
//! cargo run --release --example model_parallel -- --devices cpu,wgpu:0
//! ```
use std::sync::Arc;
use tandem::data::{digits, DataLoader};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::{Loss, OptimConfig, Parallel, Split, Stages};
use tandem::train::Trainer;
use tandem::Device;

fn main() -> tandem::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).map_or("cpu,cpu", String::as_str);
    let devices = Device::parse(spec)?;
    let model = SeedModel::Cnn.build(0, &devices[0])?;
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let (train, _) = digits::load(2048, 0, 0)?;
    let train = Arc::new(train);

    let mut placed = Trainer::new(Parallel::layers(Stages::Split(&model, Split::Auto), &devices, &opt, Loss::CrossEntropy).build()?).steps(10);
    let mut tensor = Trainer::new(Parallel::tensor(&model, &devices, &opt, Loss::CrossEntropy).build()?).steps(10);
    // The same seed gives both the same batches.
    let a = placed.fit(&mut DataLoader::new(train.clone(), 64, true, 0)?)?;
    let b = tensor.fit(&mut DataLoader::new(train, 64, true, 0)?)?;
    for ((step, la), (_, lb)) in a.losses.iter().zip(&b.losses) {
        println!("step {step:2}  layer placement loss {la:.5}  tensor parallel loss {lb:.5}");
    }
    println!("layer placement stages: {:?}", placed.strategy().ranges());
    Ok(())
}
