//! What the mesh suites (tests/mesh.rs, tests/mesh_pipeline.rs) share: seeded GPT token
//! batches, a clipped run's losses and final state, and the comparison with `Single`'s.
#![allow(dead_code)]
use super::common::{assert_close, rng, uniform};
use tandem::data::Batch;
use tandem::nn::models::GptConfig;
use tandem::parallel::Strategy;

/// A run's losses and its final state (names and values).
pub type Run = (Vec<f32>, Vec<(String, Vec<f32>)>);

/// `steps` batches of `b` windows of the config's block, drawn from `seed`.
pub fn token_batches(cfg: GptConfig, b: usize, steps: usize, seed: u64) -> Vec<Batch> {
    let mut rng = rng(seed);
    (0..steps)
        .map(|_| {
            let ids: Vec<i32> = uniform(&mut rng, b * (cfg.block_size + 1), 0.0, cfg.vocab_size as f32)
                .iter()
                .map(|&v| (v as i32).min(cfg.vocab_size as i32 - 1))
                .collect();
            let (x, y): (Vec<i32>, Vec<i32>) =
                ids.chunks(cfg.block_size + 1).flat_map(|w| w[..cfg.block_size].iter().copied().zip(w[1..].iter().copied())).unzip();
            Batch::tokens(x, y, cfg.block_size, cfg.vocab_size).unwrap()
        })
        .collect()
}

/// Losses of `s` over `batches`, clipped at 1.0, and its final state.
pub fn train(s: &mut dyn Strategy, batches: &[Batch]) -> Run {
    s.set_grad_clip(Some(1.0)).unwrap();
    let losses = batches.iter().map(|b| s.step(b).unwrap().loss).collect();
    let state = s.state_dict().unwrap().into_iter().map(|(n, t)| (n, t.to_vec().unwrap())).collect();
    (losses, state)
}

/// `got` has `want`'s losses (1e-5 relative), names and weights.
pub fn same_as_single(what: &str, got: &Run, want: &Run) {
    assert_close(&format!("{what}: losses"), &got.0, &want.0, 0.0, 1e-5);
    assert_eq!(got.1.iter().map(|p| &p.0).collect::<Vec<_>>(), want.1.iter().map(|p| &p.0).collect::<Vec<_>>(), "{what}: the single-device names");
    for ((name, a), (_, b)) in got.1.iter().zip(&want.1) {
        // AdamW divides by each gradient's running magnitude, so a near-zero gradient summed in
        // another order moves its weight by a visible fraction of one step (lr 3e-3).
        assert_close(&format!("{what}: {name}"), a, b, 1e-4, 1e-3);
    }
}

/// A tiny GPT's `tandem train` flags (2 blocks, 2 heads, 16 wide, block 8, batch 4, 3 steps,
/// dropout 0.1), which the mesh suites' command-line tests run under each layout.
pub const TINY_GPT_TRAIN: [&str; 19] = [
    "train",
    "--model",
    "gpt",
    "--data",
    "text",
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "8",
    "--batch",
    "4",
    "--steps",
    "3",
    "--dropout",
    "0.1",
];

/// The logged losses of [`TINY_GPT_TRAIN`] with `extra` flags.
pub fn tiny_gpt_losses(extra: &[&str]) -> Vec<f32> {
    super::common::logged_losses(&[&TINY_GPT_TRAIN[..], extra].concat())
}

/// Copies of `state`'s tensors on the CPU, apart from the live ones (which the next step
/// updates).
pub fn snapshot(state: Vec<(String, tandem::Tensor)>) -> Vec<(String, tandem::Tensor)> {
    let cpu = tandem::Device::cpu();
    state.into_iter().map(|(n, t)| (n, tandem::Tensor::from_vec(t.to_vec().unwrap(), t.dims().to_vec(), &cpu).unwrap())).collect()
}

/// `data` pipelines over `devs`, each stage a tensor-parallel group of `tensor` of `host`'s
/// blocks ([`Gpt::tensor_stages`](tandem::nn::models::Gpt::tensor_stages)), the data axis
/// sharded as `shard` (1F1B, `micro` micro-batches).
pub fn gpt_mesh(
    host: &tandem::nn::models::Gpt,
    devs: &[tandem::Device],
    (data, tensor, micro): (usize, usize, usize),
    shard: tandem::parallel::Shard,
    opt: &tandem::parallel::OptimConfig,
) -> tandem::Result<tandem::parallel::PipelineGrid> {
    use tandem::parallel::{Loss, Parallel, Stages};
    Parallel::grid(|row| Ok(Stages::Sharded(host.tensor_stages(row, tensor, None)?)), devs, data, opt, Loss::CrossEntropy)
        .micro_batches(micro)
        .shard(shard)
        .build()
}
