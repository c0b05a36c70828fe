//! Times one GPT training step (forward, loss, backward) with each attention kernel and reports
//! the activation bytes the step keeps for its backward: the figures of the README's fused
//! attention paragraph. `cargo run --release --example gpt_attention -- wgpu:0 [steps]`.
use rand::{Rng, SeedableRng};
use std::time::Instant;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::Module;
use tandem::tensor::composed;
use tandem::{autograd, Device, Result, Tensor};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dev = Device::parse(args.get(1).map_or("cpu", |s| s.as_str()))?.remove(0);
    let steps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let cfg = GptConfig { n_layer: 4, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256, dropout: 0.0, bias: true };
    let (b, t) = (16, 64);
    let gpt = Gpt::new(cfg, 0, &dev)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let ids: Vec<i32> = (0..b * (t + 1)).map(|_| rng.random_range(0..cfg.vocab_size as i32)).collect();
    let x = Tensor::from_labels((0..b).flat_map(|r| ids[r * (t + 1)..r * (t + 1) + t].to_vec()).collect(), [b, t], &dev)?;
    let y = Tensor::from_labels((0..b).flat_map(|r| ids[r * (t + 1) + 1..(r + 1) * (t + 1)].to_vec()).collect(), [b, t], &dev)?;
    println!("GPT {cfg:?}, batch {b}, on {dev} ({})", dev.info().name);
    for (name, fused_attention, all_composed) in
        [("composed (no fused kernels)", false, true), ("fused LayerNorm + causal softmax", false, false), ("fused attention", true, false)]
    {
        gpt.set_fused_attention(fused_attention);
        let step = || -> Result<(u64, f32)> {
            let loss = Gpt::loss(&gpt.forward(&x)?, &y)?;
            let bytes = autograd::activation_bytes(&loss);
            loss.backward()?;
            Ok((bytes, loss.to_scalar()?))
        };
        let run = || if all_composed { composed(step) } else { step() };
        let (bytes, loss) = run()?;
        let start = Instant::now();
        for _ in 0..steps {
            run()?;
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!("{name:34} {ms:9.1} ms/step  activations {:7.2} MiB  loss {loss:.5}", bytes as f64 / (1 << 20) as f64);
    }
    Ok(())
}
