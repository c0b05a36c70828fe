//! Megatron-LM causal self-attention: the heads split across devices. `c_attn` is
//! column-parallel by heads (device `i` computes the q, k and v of its heads), attention runs
//! locally per device, `c_proj` is row-parallel: one reduction forward (the partial outputs
//! summed on the first device) and one backward (the input's gradient summed over its copies).
//!
//! Shape letters: `B` batch, `T` tokens, `C` channels, `H` heads, `D = C / H`, `n` devices,
//! `h = H / n` heads per device.
use super::{ColumnParallelLinear, RowParallelLinear};
use crate::autograd::no_grad;
use crate::nn::models::gpt::Attention;
use crate::nn::{Dropout, Linear, Module};
use crate::{Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};

/// Reorders `c_attn`'s rows (weight `[3C, C]` or bias `[3C]`) between nanoGPT's order
/// `[q | k | v]` (each `C` rows, heads in order) and device-major order `[q₀ k₀ v₀ | q₁ k₁ v₁ |
/// ..]`, where device `i`'s rows are contiguous: the same swap of the two leading axes of a
/// `[3, n, C/n, ..]` view (`to_devices`) or of a `[n, 3, C/n, ..]` one (back).
pub(super) fn qkv_order(t: &Tensor, n: usize, to_devices: bool) -> Result<Tensor> {
    let (rows, rest) = (t.dims()[0], &t.dims()[1..]);
    if !rows.is_multiple_of(3 * n) {
        return Err(Error::shape("ParallelAttention", format!("c_attn rows {:?} do not split into q, k, v over {n} devices", t.shape())));
    }
    let lead = if to_devices { [3, n] } else { [n, 3] };
    let view: Vec<usize> = [&lead[..], &[rows / (3 * n)], rest].concat();
    let mut perm: Vec<usize> = (0..view.len()).collect();
    perm.swap(0, 1);
    no_grad(|| t.reshape(view)?.permute(&perm)?.reshape(t.shape().clone()))
}

/// Causal self-attention with `h` heads on each device. Attention-weight dropout draws the
/// single-device layer's whole mask `[B·H, T, T]` on the first device and hands each device
/// its heads' slice, so masks equal the single-device run's.
pub(crate) struct ParallelAttention {
    pub(super) c_attn: ColumnParallelLinear,
    pub(super) c_proj: RowParallelLinear,
    attn_dropout: Dropout,
    resid_dropout: Dropout,
    n_head: usize,
    devices: Vec<Device>,
    fused: bool,
    training: AtomicBool,
}

impl ParallelAttention {
    /// `attn` split over `devices`, whose number divides `n_head` (the caller checks).
    pub(crate) fn new(attn: Attention, fused: bool, devices: &[Device]) -> Result<Self> {
        let n = devices.len();
        let c_attn = &attn.c_attn;
        let reordered =
            Linear { weight: qkv_order(&c_attn.weight, n, true)?, bias: c_attn.bias.as_ref().map(|b| qkv_order(b, n, true)).transpose()? };
        Ok(ParallelAttention {
            c_attn: ColumnParallelLinear::from_linear(&reordered, devices)?,
            c_proj: RowParallelLinear::from_linear(&attn.c_proj, devices)?,
            attn_dropout: attn.attn_dropout,
            resid_dropout: attn.resid_dropout,
            n_head: attn.n_head,
            devices: devices.to_vec(),
            fused,
            training: AtomicBool::new(true),
        })
    }

    /// The single-device layer's attention-weight mask `[B, H, T·T]` on the first device, or
    /// `None` when no dropout acts.
    fn attention_mask(&self, b: usize, t: usize) -> Result<Option<Tensor>> {
        if self.attn_dropout.p == 0.0 || !self.training.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let ones = Tensor::ones([b * self.n_head, t, t], &self.devices[0])?;
        Ok(Some(no_grad(|| self.attn_dropout.forward(&ones)?.reshape([b, self.n_head, t * t]))?))
    }
}

impl Module for ParallelAttention {
    /// `[B, T, C]` on any device to `[B, T, C]` on the first.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let (n, d) = (self.devices.len(), c / self.n_head);
        let h = self.n_head / n;
        let mask = self.attention_mask(b, t)?;
        let scale = 1.0 / (d as f32).sqrt();
        let qkv = self.c_attn.forward_shards(x)?;
        let ys = qkv
            .iter()
            .enumerate()
            .map(|(i, s)| {
                // [B, T, 3hD] -> [3, B·h, T, D], as the single-device layer with h heads.
                let s = s.reshape([b, t, 3, h, d])?.permute(&[2, 0, 3, 1, 4])?.reshape([3, b * h, t, d])?;
                let part = |j: usize| s.narrow(0, j, 1)?.reshape([b * h, t, d]);
                let (q, k, v) = (part(0)?, part(1)?, part(2)?);
                let y = match &mask {
                    None if self.fused => Tensor::causal_attention(&q, &k, &v, scale)?,
                    None => q.matmul_t(&k, false, true)?.causal_softmax(scale)?.matmul(&v)?,
                    Some(m) => {
                        let mine = no_grad(|| m.narrow(1, i * h, h)?.reshape([b * h, t, t])?.to(&self.devices[i]))?;
                        q.matmul_t(&k, false, true)?.causal_softmax(scale)?.mul(&mine)?.matmul(&v)?
                    }
                };
                y.reshape([b, h, t, d])?.permute(&[0, 2, 1, 3])?.reshape([b, t, h * d])
            })
            .collect::<Result<Vec<_>>>()?;
        self.resid_dropout.forward(&self.c_proj.forward_shards(&ys)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let (a, p) = (&self.c_attn, &self.c_proj);
        vec![("c_attn".into(), a), ("c_proj".into(), p), ("attn_dropout".into(), &self.attn_dropout), ("resid_dropout".into(), &self.resid_dropout)]
    }
    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
        for (_, c) in self.children() {
            c.set_training(training);
        }
    }
    fn describe(&self) -> String {
        format!("ParallelAttention(n_head={}, {} devices)", self.n_head, self.devices.len())
    }
}
