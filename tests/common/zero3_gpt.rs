//! The small GPTs the ZeRO-3 tests train: configuration, batches, AdamW, data parallelism with
//! recomputed blocks and clipping, and a run's losses and final weights.
// Each test file that includes this uses part of it.
#![allow(dead_code)]
use tandem::data::text::{Split, TextCorpus};
use tandem::data::Batch;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::optim::AdamConfig;
use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Shard, Strategy};
use tandem::Device;

pub fn devices(n: usize) -> Vec<Device> {
    (0..n).map(|_| Device::cpu_independent()).collect()
}

pub fn gpt_batches(cfg: &GptConfig, corpus: &TextCorpus, size: usize, steps: usize) -> Vec<Batch> {
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(5);
    (0..steps)
        .map(|_| {
            let b = corpus.batch(Split::Train, size, cfg.block_size, &mut rng).unwrap();
            Batch::tokens(b.x, b.y, b.block, corpus.vocab.len()).unwrap()
        })
        .collect()
}

pub fn gpt(layers: usize, corpus: &TextCorpus) -> GptConfig {
    GptConfig { n_layer: layers, n_head: 4, n_embd: 64, block_size: 16, vocab_size: corpus.vocab.len(), dropout: 0.0, bias: true }
}

pub fn adamw() -> OptimConfig {
    OptimConfig::adam(AdamConfig { lr: 1e-3, ..AdamConfig::adamw() })
}

/// Data parallelism on `devs` for a GPT of `cfg` (blocks recomputed in backward), clipped.
pub fn data_parallel(cfg: GptConfig, devs: &[Device], shard: Shard, bucket_bytes: usize, micro_batches: usize) -> tandem::Result<DataParallel> {
    configured(cfg, devs, DataParallelConfig { shard, bucket_bytes, micro_batches, ..Default::default() })
}

/// `data_parallel` with any configuration.
pub fn configured(cfg: GptConfig, devs: &[Device], dp: DataParallelConfig) -> tandem::Result<DataParallel> {
    configured_with(cfg, devs, dp, &adamw())
}

/// `configured` with optimizer `opt`.
pub fn configured_with(cfg: GptConfig, devs: &[Device], dp: DataParallelConfig, opt: &OptimConfig) -> tandem::Result<DataParallel> {
    let build = |d: &Device| {
        let g = Gpt::new(cfg, 1, d)?;
        g.set_recompute(true);
        Ok(g)
    };
    let mut s = DataParallel::from_factory(build, devs, opt, Loss::CrossEntropy, dp)?;
    s.set_grad_clip(Some(0.5))?;
    Ok(s)
}

/// Losses of every step, and the weights after the last.
pub fn train(s: &mut DataParallel, batches: &[Batch]) -> tandem::Result<(Vec<f32>, Vec<f32>)> {
    let losses = batches.iter().map(|b| s.step(b).map(|r| r.loss)).collect::<tandem::Result<Vec<_>>>()?;
    let weights = s.state_dict()?.iter().map(|(_, t)| t.to_vec()).collect::<tandem::Result<Vec<_>>>()?.concat();
    Ok((losses, weights))
}

/// The error of a run that must not fit its budget: out of memory on a CPU device, saying what
/// it asked, what was free and the budget, and every one of `also`; `what` names the case.
pub fn out_of_memory<T>(run: tandem::Result<T>, what: &str, also: &[&str]) -> String {
    let err = match run {
        Ok(_) => panic!("{what} trained under a budget it cannot fit"),
        Err(e) => e,
    };
    assert!(matches!(err.root_cause(), tandem::Error::OutOfMemory { .. }), "{what}: {err}");
    let text = err.to_string();
    assert!(["out of memory on cpu", "bytes free", "memory budget is"].iter().chain(also).all(|w| text.contains(w)), "{what}: {text}");
    text
}
