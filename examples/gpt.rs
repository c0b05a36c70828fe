//! A small GPT trained on the built-in text through the `Trainer` with the strategy you name
//! (`--strategy single|tensor|pipeline|grid`): character windows in shuffled epochs, a held-out
//! tenth of the windows validated every 20 steps by loss and perplexity, AdamW with warmup and
//! cosine decay, clipping, and checkpoints that `--resume` continues bit for bit.
//!
//! ```text
//! cargo run --release --example gpt -- --strategy tensor --devices cpu,cpu
//! cargo run --release --example gpt -- --strategy grid --devices wgpu:0,wgpu:0,wgpu:0,wgpu:0 --steps 100
//! ```
use std::sync::Arc;
use tandem::data::text::{builtin_text, CharVocab, Split, TokenWindows};
use tandem::data::WindowLoader;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::optim::{AdamConfig, LrSchedule};
use tandem::parallel::{Loss, OptimConfig, Parallel, Stages, Strategy};
use tandem::train::{Checkpoints, MeanLoss, Perplexity, PrintEvery, Trainer};
use tandem::{Device, Error, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag =
        |name: &str, default: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into());
    let devices = Device::parse(&flag("--devices", "cpu,cpu"))?;
    let steps: u64 = flag("--steps", "200").parse().map_err(|e| Error::invalid("--steps", format!("{e}")))?;

    let text = builtin_text(0, 60_000);
    let vocab = CharVocab::from_text(&text);
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: vocab.len(), dropout: 0.1, bias: true };
    let windows = Arc::new(TokenWindows::from_tokens(&vocab.encode(&text)?, cfg.block_size, vocab.len(), "builtin text")?);
    // The first 90% of the windows train, in a new shuffled order each epoch; the rest validate.
    let (train_rows, val_rows) = (windows.rows_of(Split::Train), windows.rows_of(Split::Val));
    let mut train = WindowLoader::new(windows.clone(), train_rows, 16, true, 0)?.drop_last(true)?;
    let val = WindowLoader::new(windows, val_rows, 64, false, 0)?;

    let opt = OptimConfig::adam(AdamConfig { lr: 1e-3, weight_decay: 0.1, ..AdamConfig::adamw() });
    let gpt = || Gpt::new(cfg, 0, &devices[0]);
    // A GPT's stages tie the head to the embedding themselves; one stage per block at most.
    let stages = &devices[..devices.len().min(cfg.n_layer)];
    let strategy: Box<dyn Strategy> = match flag("--strategy", "single").as_str() {
        "single" => Parallel::single(|d| Gpt::new(cfg, 0, d), &devices[0], &opt, Loss::CrossEntropy).boxed()?,
        "tensor" => Parallel::tensor(gpt()?, &devices, &opt, Loss::CrossEntropy).boxed()?,
        "pipeline" => Parallel::pipeline(Stages::Built(gpt()?.stages(stages, None)?), stages, &opt, Loss::CrossEntropy).micro_batches(4).boxed()?,
        "grid" => Parallel::grid(|row| Ok(Stages::Built(Gpt::new(cfg, 0, &row[0])?.stages(row, None)?)), &devices, 2, &opt, Loss::CrossEntropy)
            .micro_batches(2)
            .boxed()?,
        other => return Err(Error::invalid("--strategy", format!("{other} is not single, tensor, pipeline or grid"))),
    };
    let dir = std::env::temp_dir().join("tandem-example-gpt");
    let plan = if args.iter().any(|a| a == "--resume") { Checkpoints::new(&dir).resume() } else { Checkpoints::new(&dir).overwrite() };
    let mut trainer = Trainer::boxed(strategy)
        .steps(steps)
        .schedule(LrSchedule::WarmupCosine { lr: 1e-3, warmup_steps: steps / 10, decay_steps: steps, min_lr: 1e-4 })
        .grad_clip(Some(1.0))
        .validate(20, val, vec![Box::new(MeanLoss::new(Loss::CrossEntropy)), Box::new(Perplexity::new())])
        .checkpoints(plan.every(50))
        .settings(serde_json::json!({ "gpt": format!("{cfg:?}"), "strategy": flag("--strategy", "single") }), 0)
        .observe(PrintEvery(20));
    let fit = trainer.fit(&mut train)?;
    println!(
        "validation perplexity {:.2} after {} steps ({:.1} s); checkpoints in {}",
        fit.metric("perplexity").unwrap_or(f64::NAN),
        fit.step,
        fit.train_s,
        dir.display()
    );
    Ok(())
}
