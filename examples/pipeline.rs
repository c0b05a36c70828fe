//! Pipeline parallelism as library code: the seed CNN cut into stages on the devices of
//! `--devices`, each step run as 8 micro-batches under the 1F1B schedule, trained by the
//! `Trainer`, with the measured bubble beside the theoretical one and a Chrome trace of every
//! stage's timeline.
//!
//! ```text
//! cargo run --release --example pipeline -- --devices wgpu:0,wgpu:0
//! ```
use tandem::data::{digits, DataLoader};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::pipeline::Schedule;
use tandem::parallel::{trace::Trace, Loss, OptimConfig, Parallel, Split, Stages};
use tandem::train::{PrintEvery, Trainer};
use tandem::Device;

fn main() -> tandem::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).map_or("cpu,cpu", String::as_str);
    let devices = Device::parse(spec)?;
    let model = SeedModel::Cnn.build(0, &devices[0])?;
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let pipe = Parallel::pipeline(Stages::Split(&model, Split::Auto), &devices, &opt, Loss::CrossEntropy)
        .micro_batches(8)
        .schedule(Schedule::OneFOneB)
        .build()?;
    let (train, _) = digits::load(4096, 0, 0)?;
    let mut loader = DataLoader::new(std::sync::Arc::new(train), 128, true, 0)?;
    let trace = Trace::new();
    let mut trainer = Trainer::new(pipe).steps(10).trace(trace.clone()).observe(PrintEvery(1));
    trainer.fit(&mut loader)?;
    if let Some(s) = trainer.strategy().last_stats() {
        println!("bubble: measured {:.3}, theoretical {:.3}", s.bubble_measured, s.bubble_theoretical);
    }
    trace.write("pipeline-trace.json")?;
    println!("wrote pipeline-trace.json (open in Perfetto)");
    Ok(())
}
