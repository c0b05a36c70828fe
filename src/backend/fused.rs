//! `FusedOp`: the transformer kernels (LayerNorm, causal softmax, causal attention, the tanh
//! GELU) that a backend may run in one pass each, an optional fast path over their compositions.
//!
//! Shape letters: `R` rows and `C` their length (LayerNorm), `N` independent matrices (batch ×
//! heads), `T` tokens, `D` the head size, `L` values of an elementwise op. Every buffer is F32
//! and contiguous.

/// β = √(2/π) and κ of the tanh approximation of GELU, shared by the composition
/// (`Tensor::gelu_tanh`), its gradient rule and the fused kernels.
pub(crate) const GELU_BETA: f32 = 0.797_884_6;
pub(crate) const GELU_KAPPA: f32 = 0.044715;

/// Rows one LayerNorm-backward partial sums: `dweight` and `dbias` are summed over blocks of
/// this many rows into `[blocks(R), C]` partials, which a fixed-order reduction then adds, so the
/// result is the same bits on every run (no float atomics).
pub const LN_ROW_BLOCK: usize = 256;

/// The number of partial rows `LayerNormBackward` writes for `rows` rows.
pub fn ln_blocks(rows: usize) -> usize {
    rows.div_ceil(LN_ROW_BLOCK).max(1)
}

/// One fused transformer kernel; the buffers it takes, in order, are listed with each variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FusedOp {
    /// `y = (x - mean) · rstd · w + b` over each of `rows` rows of `cols` values, with
    /// `rstd = 1 / sqrt(var + eps)` (biased variance). Buffers `[x, w, b, y, mean, rstd]`:
    /// x, y `[R, C]`; w, b `[C]`; mean, rstd `[R]` (saved for the backward).
    LayerNorm { rows: usize, cols: usize, eps: f32 },
    /// Buffers `[g, x, w, mean, rstd, dx, dw_part, db_part]`: g, x, dx `[R, C]`; w `[C]`;
    /// mean, rstd `[R]`; the partials `[ln_blocks(R), C]` of `Σ g·x̂` and `Σ g` per row block.
    /// `dx = rstd · (g·w - mean(g·w) - x̂ · mean(g·w·x̂))`, x̂ = (x - mean) · rstd.
    LayerNormBackward { rows: usize, cols: usize },
    /// `y = softmax(x · scale + causal)` over the last axis of `[N, T, T]`, where `causal` is
    /// -inf at column `j > i` of row `i`. Buffers `[x, y]`.
    CausalSoftmax { n: usize, t: usize, scale: f32 },
    /// `dx = scale · y · (g - Σ g·y)`. Buffers `[g, y, dx]`, all `[N, T, T]`.
    CausalSoftmaxBackward { n: usize, t: usize, scale: f32 },
    /// `o = softmax(q·kᵀ · scale + causal) · v` with an online softmax over keys, saving
    /// `lse` = the logsumexp of each row of scores. Buffers `[q, k, v, o, lse]`: q, k, v, o
    /// `[N, T, D]`, lse `[N, T]`.
    Attention { n: usize, t: usize, d: usize, scale: f32 },
    /// Recomputes the probabilities `p = exp(s - lse)` from q, k and lse. Buffers
    /// `[q, k, v, o, lse, g, dq, dk, dv, delta]`: delta `[N, T]` is scratch (`Σ g·o` per row).
    AttentionBackward { n: usize, t: usize, d: usize, scale: f32 },
    /// `y = x · (tanh(β (x + κ x³)) · 0.5 + 0.5)`, GELU's tanh form, with the f32 operations of
    /// its composition (`Tensor::gelu_tanh`) in their order, so the same bits. Buffers `[x, y]`,
    /// both `[L]`.
    GeluTanh { len: usize },
    /// `dx = g · (½ (1 + t) + ½ x (1 - t²) · β (1 + 3κ x²))` with `t = tanh(β (x + κ x³))`,
    /// the composition's operations in order. Buffers `[g, x, dx]`, all `[L]`.
    GeluTanhBackward { len: usize },
}

impl FusedOp {
    pub fn name(self) -> &'static str {
        match self {
            FusedOp::LayerNorm { .. } => "layer_norm",
            FusedOp::LayerNormBackward { .. } => "layer_norm backward",
            FusedOp::CausalSoftmax { .. } => "causal_softmax",
            FusedOp::CausalSoftmaxBackward { .. } => "causal_softmax backward",
            FusedOp::Attention { .. } => "causal_attention",
            FusedOp::AttentionBackward { .. } => "causal_attention backward",
            FusedOp::GeluTanh { .. } => "gelu_tanh",
            FusedOp::GeluTanhBackward { .. } => "gelu_tanh backward",
        }
    }

    /// How many elements each buffer holds, in the variant's order, and how many of the
    /// leading buffers are inputs (the rest are written); `None` when a size overflows.
    pub fn operands(self) -> Option<(Vec<usize>, usize)> {
        let m = |a: usize, b: usize| a.checked_mul(b);
        Some(match self {
            FusedOp::LayerNorm { rows, cols, .. } => {
                let rc = m(rows, cols)?;
                (vec![rc, cols, cols, rc, rows, rows], 3)
            }
            FusedOp::LayerNormBackward { rows, cols } => {
                let (rc, part) = (m(rows, cols)?, m(ln_blocks(rows), cols)?);
                (vec![rc, rc, cols, rows, rows, rc, part, part], 5)
            }
            FusedOp::CausalSoftmax { n, t, .. } => {
                let ntt = m(m(n, t)?, t)?;
                (vec![ntt, ntt], 1)
            }
            FusedOp::CausalSoftmaxBackward { n, t, .. } => {
                let ntt = m(m(n, t)?, t)?;
                (vec![ntt, ntt, ntt], 2)
            }
            FusedOp::Attention { n, t, d, .. } => {
                let (ntd, nt) = (m(m(n, t)?, d)?, m(n, t)?);
                (vec![ntd, ntd, ntd, ntd, nt], 3)
            }
            FusedOp::AttentionBackward { n, t, d, .. } => {
                let (ntd, nt) = (m(m(n, t)?, d)?, m(n, t)?);
                (vec![ntd, ntd, ntd, ntd, nt, ntd, ntd, ntd, ntd, nt], 6)
            }
            FusedOp::GeluTanh { len } => (vec![len, len], 1),
            FusedOp::GeluTanhBackward { len } => (vec![len, len, len], 2),
        })
    }
}
