//! Sampling from a [`Gpt`] as nanoGPT's `generate` does: crop the context to the block, divide
//! the last position's logits by the temperature, keep the top k, sample from their softmax.
use super::Gpt;
use crate::autograd::no_grad;
use crate::nn::Module;
use crate::{DType, Error, Result, Tensor};
use rand::{Rng, SeedableRng};

impl Gpt {
    /// Token ids `[B, T0]` (I32) continued by `tokens` sampled tokens: `[B, T0 + tokens]`.
    ///
    /// Each step reads the last `block_size` tokens. `top_k` keeps the k largest logits (and
    /// any tied with the k-th), `None` keeps all. The draws are made on the host from `seed`,
    /// so a seed gives the same tokens on every run. The model runs in its current mode: call
    /// `eval()` first, as in PyTorch, or dropout stays on.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use tandem::nn::models::{Gpt, GptConfig};
    /// use tandem::nn::Module;
    /// use tandem::{Device, Tensor};
    /// let cfg = GptConfig { n_layer: 1, n_head: 1, n_embd: 4, block_size: 3, vocab_size: 6, ..Default::default() };
    /// let dev = Device::cpu();
    /// let gpt = Gpt::new(cfg, 0, &dev)?;
    /// gpt.eval();
    /// let out = gpt.generate(&Tensor::from_labels(vec![1], [1, 1], &dev)?, 5, 0.8, Some(3), 7)?;
    /// assert_eq!(out.dims(), [1, 6]);
    /// # Ok(()) }
    /// ```
    ///
    /// On the CPU it runs on the CPU backend's pool ([`on_cpu_pool`](crate::on_cpu_pool)), as
    /// the `Trainer`'s steps do: its many small forwards then hand no work over op by op.
    pub fn generate(&self, ids: &Tensor, tokens: usize, temperature: f32, top_k: Option<usize>, seed: u64) -> Result<Tensor> {
        if ids.device().info().backend == crate::BackendKind::Cpu {
            crate::on_cpu_pool(|| self.generate_here(ids, tokens, temperature, top_k, seed))
        } else {
            self.generate_here(ids, tokens, temperature, top_k, seed)
        }
    }

    /// [`generate`](Gpt::generate) on this thread.
    fn generate_here(&self, ids: &Tensor, tokens: usize, temperature: f32, top_k: Option<usize>, seed: u64) -> Result<Tensor> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(Error::invalid("Gpt::generate", format!("temperature {temperature} must be a finite number > 0")));
        }
        if top_k == Some(0) {
            return Err(Error::invalid("Gpt::generate", "top_k must be at least 1"));
        }
        if ids.dtype() != DType::I32 {
            return Err(Error::DType { op: "Gpt::generate", expected: DType::I32, got: ids.dtype() });
        }
        if ids.rank() != 2 || ids.numel() == 0 {
            return Err(Error::shape("Gpt::generate", format!("prompt ids {:?}: need [B, T] with B, T >= 1", ids.shape())));
        }
        let (b, t0) = (ids.dims()[0], ids.dims()[1]);
        let dev = ids.device();
        let mut seqs: Vec<Vec<i32>> = ids.to_vec_i32()?.chunks(t0).map(<[i32]>::to_vec).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let vocab = self.config.vocab_size;
        no_grad(|| -> Result<()> {
            for step in 0..tokens {
                let w = (t0 + step).min(self.config.block_size);
                let window: Vec<i32> = seqs.iter().flat_map(|s| s[s.len() - w..].iter().copied()).collect();
                let logits = self.forward(&Tensor::from_labels(window, [b, w], dev)?)?;
                let last = logits.narrow(1, w - 1, 1)?.to_vec()?;
                for (row, (logits, seq)) in last.chunks(vocab).zip(seqs.iter_mut()).enumerate() {
                    let token = sample(logits, temperature, top_k, &mut rng).ok_or_else(|| {
                        Error::invalid("Gpt::generate", format!("row {row} at step {step}: the logits / temperature hold NaN or +inf, or are all -inf"))
                    })?;
                    seq.push(token);
                }
            }
            Ok(())
        })?;
        Tensor::from_labels(seqs.concat(), [b, t0 + tokens], dev)
    }
}

/// One index drawn from `softmax(logits / temperature)` over the `top_k` largest values;
/// `None` where PyTorch's `multinomial` would fail (a NaN or +inf, or nothing left to draw).
fn sample(logits: &[f32], temperature: f32, top_k: Option<usize>, rng: &mut impl Rng) -> Option<i32> {
    let scaled: Vec<f32> = logits.iter().map(|&l| l / temperature).collect();
    if scaled.iter().any(|l| l.is_nan() || *l == f32::INFINITY) {
        return None;
    }
    let cut = match top_k {
        Some(k) if k < scaled.len() => {
            let mut sorted = scaled.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            sorted[k - 1]
        }
        _ => f32::NEG_INFINITY,
    };
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = scaled.iter().map(|&l| if l >= cut && l > f32::NEG_INFINITY { f64::from(l - max).exp() } else { 0.0 }).collect();
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let mut u = rng.random::<f64>() * total;
    let last = weights.iter().rposition(|&w| w > 0.0)?;
    for (i, &w) in weights.iter().enumerate().take(last) {
        if u < w {
            return i32::try_from(i).ok();
        }
        u -= w;
    }
    i32::try_from(last).ok()
}
