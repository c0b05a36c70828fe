//! Sampling from a [`Gpt`] as nanoGPT's `generate` does: crop the context to the block, divide
//! the last position's logits by the temperature, keep the top k, sample from their softmax;
//! all at once ([`Gpt::generate`]) or token by token ([`Gpt::generate_with`]).
use super::Gpt;
use crate::autograd::no_grad;
use crate::nn::Module;
use crate::{DType, Error, Result, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::ops::ControlFlow;

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
    ///
    /// The result holds every token; to stream tokens as they are drawn, or to draw more than
    /// memory would hold, use [`generate_with`](Gpt::generate_with), which this calls.
    pub fn generate(&self, ids: &Tensor, tokens: usize, temperature: f32, top_k: Option<usize>, seed: u64) -> Result<Tensor> {
        let (b, t0) = prompt_shape(ids)?;
        let mut seqs: Vec<Vec<i32>> = ids.to_vec_i32()?.chunks(t0).map(<[i32]>::to_vec).collect();
        self.generate_with(ids, tokens, temperature, top_k, seed, |step| {
            for (seq, &token) in seqs.iter_mut().zip(step) {
                seq.push(token);
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Tensor::from_labels(seqs.concat(), [b, t0 + tokens], ids.device())
    }

    /// [`generate`](Gpt::generate) one token at a time: after each step, `each` gets the token
    /// drawn for every row of `ids` (`B` of them, in row order) and says whether to go on
    /// ([`ControlFlow::Continue`]) or stop early ([`ControlFlow::Break`]); an error it returns
    /// ends generation with that error. Only the last `block_size` tokens of each row are
    /// kept, so memory stays the same however many `tokens` are drawn. The tokens are those
    /// of [`generate`](Gpt::generate) with the same arguments.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use std::ops::ControlFlow;
    /// use tandem::nn::models::{Gpt, GptConfig};
    /// use tandem::nn::Module;
    /// use tandem::{Device, Tensor};
    /// let cfg = GptConfig { n_layer: 1, n_head: 1, n_embd: 4, block_size: 3, vocab_size: 6, ..Default::default() };
    /// let dev = Device::cpu();
    /// let gpt = Gpt::new(cfg, 0, &dev)?;
    /// gpt.eval();
    /// let mut drawn = Vec::new();
    /// gpt.generate_with(&Tensor::from_labels(vec![1], [1, 1], &dev)?, 1_000_000, 0.8, Some(3), 7, |tokens| {
    ///     drawn.push(tokens[0]);
    ///     Ok(if drawn.len() == 4 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    /// })?;
    /// assert_eq!(drawn.len(), 4);
    /// # Ok(()) }
    /// ```
    pub fn generate_with<F>(&self, ids: &Tensor, tokens: usize, temperature: f32, top_k: Option<usize>, seed: u64, each: F) -> Result<()>
    where
        F: FnMut(&[i32]) -> Result<ControlFlow<()>> + Send,
    {
        if ids.device().info().backend == crate::BackendKind::Cpu {
            crate::on_cpu_pool(|| self.generate_here(ids, tokens, temperature, top_k, seed, each))
        } else {
            self.generate_here(ids, tokens, temperature, top_k, seed, each)
        }
    }

    /// [`generate_with`](Gpt::generate_with) on this thread.
    fn generate_here(
        &self,
        ids: &Tensor,
        tokens: usize,
        temperature: f32,
        top_k: Option<usize>,
        seed: u64,
        mut each: impl FnMut(&[i32]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(Error::invalid("Gpt::generate", format!("temperature {temperature} must be a finite number > 0")));
        }
        if top_k == Some(0) {
            return Err(Error::invalid("Gpt::generate", "top_k 0 leaves no token to draw: it must be at least 1 (or None for every token)"));
        }
        let (b, t0) = prompt_shape(ids)?;
        let dev = ids.device();
        let block = self.config.block_size;
        // Each row's last `block` tokens: all the next forward reads.
        let keep = |row: &[i32]| row[row.len().saturating_sub(block)..].iter().copied().collect();
        let mut context: Vec<VecDeque<i32>> = ids.to_vec_i32()?.chunks(t0).map(keep).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let vocab = self.config.vocab_size;
        let mut drawn = vec![0i32; b];
        no_grad(|| -> Result<()> {
            for step in 0..tokens {
                let w = context[0].len();
                let window: Vec<i32> = context.iter().flat_map(|row| row.iter().copied()).collect();
                let logits = self.forward(&Tensor::from_labels(window, [b, w], dev)?)?;
                let last = logits.narrow(1, w - 1, 1)?.to_vec()?;
                for (row, (logits, token)) in last.chunks(vocab).zip(drawn.iter_mut()).enumerate() {
                    *token = sample(logits, temperature, top_k, &mut rng).ok_or_else(|| {
                        Error::invalid(
                            "Gpt::generate",
                            format!("row {row} at step {step}: the logits / temperature hold NaN or +inf, or are all -inf"),
                        )
                    })?;
                }
                for (row, &token) in context.iter_mut().zip(&drawn) {
                    if row.len() == block {
                        row.pop_front();
                    }
                    row.push_back(token);
                }
                if each(&drawn)?.is_break() {
                    break;
                }
            }
            Ok(())
        })
    }
}

/// `[B, T]` of prompt ids, or why they are not a prompt.
fn prompt_shape(ids: &Tensor) -> Result<(usize, usize)> {
    if ids.dtype() != DType::I32 {
        return Err(Error::DType { op: "Gpt::generate", expected: DType::I32, got: ids.dtype() });
    }
    if ids.rank() != 2 || ids.numel() == 0 {
        return Err(Error::shape("Gpt::generate", format!("prompt ids {:?}: need [B, T] with B, T >= 1", ids.shape())));
    }
    Ok((ids.dims()[0], ids.dims()[1]))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::models::GptConfig;
    use crate::Device;

    fn tiny() -> Gpt {
        let cfg = GptConfig { n_layer: 1, n_head: 1, n_embd: 4, block_size: 3, vocab_size: 6, ..Default::default() };
        let gpt = Gpt::new(cfg, 0, &Device::cpu()).unwrap();
        gpt.eval();
        gpt
    }

    #[test]
    fn token_by_token_draws_what_generate_returns_and_stops_when_asked() {
        let gpt = tiny();
        let dev = Device::cpu();
        // Two rows, a prompt longer than the block, more tokens than the block holds.
        let ids = Tensor::from_labels(vec![1, 2, 3, 4, 5, 0, 1, 2], [2, 4], &dev).unwrap();
        let all = gpt.generate(&ids, 9, 0.9, Some(4), 3).unwrap().to_vec_i32().unwrap();
        let mut rows = [Vec::new(), Vec::new()];
        gpt.generate_with(&ids, 9, 0.9, Some(4), 3, |step| {
            assert_eq!(step.len(), 2);
            rows[0].push(step[0]);
            rows[1].push(step[1]);
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
        assert_eq!(rows[0], all[4..13], "row 0");
        assert_eq!(rows[1], all[17..26], "row 1");
        let mut calls = 0;
        gpt.generate_with(&ids, 1_000_000_000, 0.9, None, 3, |_| {
            calls += 1;
            Ok(if calls == 5 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        })
        .unwrap();
        assert_eq!(calls, 5);
        let err = gpt.generate_with(&ids, 10, 0.9, None, 3, |_| Err(Error::Msg("reader gone".into()))).unwrap_err();
        assert!(err.to_string().contains("reader gone"), "{err}");
    }

    #[test]
    fn a_temperature_or_top_k_that_cannot_sample_is_named_with_its_value() {
        let gpt = tiny();
        let ids = Tensor::from_labels(vec![1], [1, 1], &Device::cpu()).unwrap();
        for (t, shown) in [(0.0, "temperature 0 "), (-1.0, "temperature -1 "), (f32::NAN, "temperature NaN "), (f32::INFINITY, "temperature inf ")] {
            let err = gpt.generate(&ids, 1, t, None, 0).unwrap_err();
            assert!(matches!(err, Error::Invalid { .. }) && err.to_string().contains(shown), "{err}");
        }
        let err = gpt.generate(&ids, 1, 1.0, Some(0), 0).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }) && err.to_string().contains("top_k 0 "), "{err}");
    }
}
