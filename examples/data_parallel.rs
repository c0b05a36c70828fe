//! Data parallelism as library code: the seed CNN replicated on every device of `--devices`
//! (default: two CPU devices), each global batch split across them, gradients all-reduced in
//! buckets that overlap backward, trained by the `Trainer`, which prints what each step measured.
//!
//! ```text
//! cargo run --release --example data_parallel -- --devices wgpu:0,wgpu:0
//! ```
use tandem::data::{digits, DataLoader};
use tandem::nn::models::SeedModel;
use tandem::optim::SgdConfig;
use tandem::parallel::{Loss, OptimConfig, Parallel};
use tandem::train::{Observer, StepInfo, Trainer};
use tandem::Device;

/// Prints each step's loss, time, compute, communication and their overlap.
struct Timings;

impl Observer for Timings {
    fn step(&mut self, s: &StepInfo<'_>) {
        let r = s.report;
        println!(
            "step {:2}  loss {:.4}  step {:.1} ms  compute {:.1} ms  comm {:.1} ms  overlap {:.0}%",
            s.step,
            r.loss,
            r.wall_s * 1e3,
            r.compute_s * 1e3,
            r.comm_s * 1e3,
            r.overlap * 100.0
        );
    }
}

fn main() -> tandem::Result<()> {
    let devices = Device::parse(&spec_from_args("cpu,cpu"))?;
    let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let dp = Parallel::data(|d| SeedModel::Cnn.build(0, d), &devices, &opt, Loss::CrossEntropy).build()?;
    let (train, _) = digits::load(4096, 0, 0)?;
    let mut loader = DataLoader::new(std::sync::Arc::new(train), 128, true, 0)?;
    Trainer::new(dp).steps(20).observe(Timings).fit(&mut loader)?;
    Ok(())
}

/// `--devices SPEC`, or `default`.
fn spec_from_args(default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == "--devices").and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.to_string())
}
