//! Model parallelism as library code: the seed CNN's layers placed on the devices of
//! `--devices` (split automatically by measured layer time), then its fc1/fc2 as Megatron-style
//! column- and row-parallel Linear layers.
//!
//! ```text
//! cargo run --release --example model_parallel -- --devices cpu,wgpu:0
//! ```
use tandem::data::{digits, DataLoader};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::{LayerPlacement, Loss, OptimConfig, Split, Strategy, TensorParallel};
use tandem::Device;

fn main() -> tandem::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).map_or("cpu,cpu", String::as_str);
    let devices = Device::parse(spec)?;
    let model = SeedModel::Cnn.build(0, &devices[0])?;
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let (train, _) = digits::load(2048, 0, 0)?;
    let mut loader = DataLoader::new(std::sync::Arc::new(train), 64, true, 0)?;

    let mut placed = LayerPlacement::new(&model, &devices, Split::Auto, &opt, Loss::CrossEntropy)?;
    let mut tensor = TensorParallel::new(&model, &devices, &opt, Loss::CrossEntropy)?;
    for step in 1..=10 {
        let batch = loader.next_batch();
        let a = placed.step(&batch)?;
        let b = tensor.step(&batch)?;
        println!("step {step:2}  layer placement loss {:.5}  tensor parallel loss {:.5}", a.loss, b.loss);
    }
    println!("layer placement stages: {:?}", placed.ranges());
    Ok(())
}
