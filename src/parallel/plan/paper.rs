//! A GPT planned for a described cluster (`tandem plan --cluster`) without building it: a
//! reduced model (one block, a narrower width of the same head size, a shorter window) is
//! timed here, and its times are scaled to the full shape by counted FLOPs; the full shape's
//! bytes are counted, the parameters from the configuration and the activations and outputs
//! from byte counts of tiny models fitted exactly to the shapes' monomials. GPT-2 XL's shape
//! (48 blocks 1600 wide, windows of 1024) would take minutes and gigabytes to time whole.
use super::reuse::{Calibration, Reuse};
use super::{LayerCost, Workload};
use crate::nn::models::{Gpt, GptConfig};
use crate::{Device, Error, Result, Tensor};

/// How far [`measure_gpt_scaled`] reduces a GPT before timing it: one block, at most `n_embd`
/// wide (whole heads of the model's head size, at least one) and windows of at most
/// `block_size` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    /// The widest reduced model.
    pub n_embd: usize,
    /// The longest reduced window.
    pub block_size: usize,
}

impl Default for Reduction {
    /// 256 wide and 64 tokens: matrix products large enough to run at the CPU's pace, a
    /// calibration of a second or two.
    fn default() -> Reduction {
        Reduction { n_embd: 256, block_size: 64 }
    }
}

impl Reduction {
    /// The reduced configuration of `cfg`: one block, its head size kept with as many heads
    /// as fit in [`Reduction::n_embd`] (at least one, at most `cfg`'s), the window shortened
    /// to [`Reduction::block_size`]; vocabulary, bias and dropout as `cfg`'s.
    pub fn of(&self, cfg: &GptConfig) -> GptConfig {
        let head = (cfg.n_embd / cfg.n_head.max(1)).max(1);
        let n_head = (self.n_embd / head).clamp(1, cfg.n_head.max(1));
        GptConfig { n_layer: 1, n_head, n_embd: n_head * head, block_size: cfg.block_size.min(self.block_size.max(1)), ..*cfg }
    }
}

/// The calibration of a GPT of `cfg` (as [`measure_gpt_reusing`](super::measure_gpt_reusing)
/// gives it on one device) from its [`Reduction::of`] model, drawn from `seed` and timed on
/// `device` at `probe`'s token ids (`[k, T]`, `T` the reduced window), scaled to `cfg` by
/// [`scaled_gpt`]. The reduced calibration is kept and reused as `reuse` says.
#[allow(clippy::too_many_arguments)]
pub fn measure_gpt_scaled(
    cfg: GptConfig,
    seed: u64,
    probe: &Tensor,
    device: &Device,
    batch: usize,
    optimizer_states: usize,
    reuse: Reuse,
    reduction: Reduction,
) -> Result<(Workload, Calibration)> {
    let small = reduction.of(&cfg);
    let gpt = Gpt::new(small, seed, device)?;
    let (measured, _, how) = super::measure_gpt_reusing(&gpt, probe, std::slice::from_ref(device), batch, optimizer_states, reuse)?;
    drop(gpt);
    let windows = probe.dims().first().copied().unwrap_or(1).max(1);
    Ok((scaled_gpt(&measured, &small, &cfg, windows, device)?, how))
}

/// The planner's four kinds of GPT layer (the embeddings, a block, `ln_f`, the head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Embeddings,
    Block,
    LnF,
    Head,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Embeddings, Kind::Block, Kind::LnF, Kind::Head];

    /// The kind of planner layer `i` of a GPT of `n_layer` blocks.
    fn of(i: usize, n_layer: usize) -> Kind {
        match i {
            0 => Kind::Embeddings,
            i if i <= n_layer => Kind::Block,
            i if i == n_layer + 1 => Kind::LnF,
            _ => Kind::Head,
        }
    }

    /// Forward FLOPs per window of `cfg` (at its full block): the products for a block
    /// (`24·T·C²` in its four Linears, `4·T²·C` in attention's two) and the head (`2·T·C·V`),
    /// element-wise work for the embeddings and `ln_f`. Only ratios of one kind are used.
    fn flops(self, cfg: &GptConfig) -> f64 {
        let (t, c, v) = (cfg.block_size as f64, cfg.n_embd as f64, cfg.vocab_size as f64);
        match self {
            Kind::Embeddings | Kind::LnF => t * c,
            Kind::Block => 24.0 * t * c * c + 4.0 * t * t * c,
            Kind::Head => 2.0 * t * c * v,
        }
    }

    /// The shapes of the parameters this kind of layer holds in `cfg` (a block's as block 0's):
    /// the head's is its own copy of the token embedding.
    fn shapes(self, cfg: &GptConfig) -> Vec<Vec<usize>> {
        let prefix = match self {
            Kind::Embeddings => "transformer.w",
            Kind::Block => "transformer.h.0.",
            Kind::LnF => "transformer.ln_f.",
            Kind::Head => return vec![vec![cfg.vocab_size, cfg.n_embd]],
        };
        cfg.parameter_shapes().filter(|(n, _)| n.starts_with(prefix)).map(|(_, s)| s).collect()
    }

    /// Bytes (f32) of this kind's parameters in `cfg`, and of its largest one.
    fn param_bytes(self, cfg: &GptConfig) -> (u64, u64) {
        let sizes: Vec<u64> = self.shapes(cfg).iter().map(|s| s.iter().map(|&d| d as u64).fold(4u64, u64::saturating_mul)).collect();
        (sizes.iter().copied().fold(0, u64::saturating_add), sizes.iter().copied().max().unwrap_or(0))
    }
}

/// The calibration `measured` of the reduced GPT `small` (its four layers: embeddings, one
/// block, `ln_f`, head) as the full GPT `full`'s, had it been measured on `windows` windows of
/// its own block: each layer's forward and backward times scaled by the ratio of its kind's
/// forward FLOPs (a block's `24·T·C² + 4·T²·C`, the head's `2·T·C·V`), its update by the ratio of its parameters, the fixed
/// cost per pass kept; parameter bytes counted from `full`; activation and output bytes
/// counted by [`ByteModel`], which `device` fits. `measured`'s devices' and batch's figures
/// are kept.
pub fn scaled_gpt(measured: &Workload, small: &GptConfig, full: &GptConfig, windows: usize, device: &Device) -> Result<Workload> {
    if measured.layers.len() != small.n_layer + 3 || small.n_layer != 1 {
        let why = format!("a calibration of {} layers is not a one-block GPT's four", measured.layers.len());
        return Err(Error::invalid("plan::scaled_gpt", why));
    }
    let bytes = ByteModel::fit(full, device)?;
    let (t, c, h) = (full.block_size, full.n_embd, full.n_head);
    let layers = (0..full.n_layer + 3)
        .map(|i| {
            let kind = Kind::of(i, full.n_layer);
            let m = &measured.layers[Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)];
            let ratio = kind.flops(full) / kind.flops(small).max(1.0);
            let (param_bytes, largest_param_bytes) = kind.param_bytes(full);
            let small_params = kind.param_bytes(small).0.max(1) as f64;
            let name = match kind {
                Kind::Block => format!("transformer.h.{}", i - 1),
                _ => m.name.clone(),
            };
            let [graph, input, output] = bytes.at(kind, windows, t, c, h);
            LayerCost {
                name,
                forward_s: m.forward_s * ratio,
                backward_s: m.backward_s * ratio,
                fixed_s: m.fixed_s,
                param_bytes,
                largest_param_bytes,
                activation_bytes: graph.saturating_sub(input) / windows as u64,
                output_bytes: output / windows as u64,
                tensor_parallel: kind == Kind::Block,
                tied: (kind == Kind::Head).then_some((0, param_bytes)),
                update_s: m.update_s * param_bytes as f64 / small_params,
            }
        })
        .collect();
    Ok(Workload { layers, ..measured.clone() })
}

/// Byte counts of a GPT's layers as exact polynomials of the batch `B`, window `T`, width `C`
/// and heads `H` (the vocabulary, bias, dropout and autocast type fixed): the tensors
/// backward keeps, the layer's input and its output. Each is a sum of tensor sizes, products
/// of those dimensions times a type's bytes, so whole coefficients of the terms below fit them
/// exactly; they are fitted to tiny models' counts and checked on every one of them.
pub struct ByteModel {
    /// Per [`Kind`], the coefficients of the kept bytes, the input's and the output's.
    coefficients: [[[i128; MONOMIALS]; 3]; 4],
}

/// How many terms [`monomials`] has.
const MONOMIALS: usize = 10;

/// The terms a layer's byte counts are made of: per sample `T·C` (hidden states), `H·T²`
/// (attention weights), `T` and `H·T` (per-row statistics, logits over the fixed vocabulary),
/// one per sample, and per batch constants, `C`, `C²` (weights cast under autocast), `T·C` and
/// `T` (the position embeddings' rows).
fn monomials(b: usize, t: usize, c: usize, h: usize) -> [i128; MONOMIALS] {
    let (b, t, c, h) = (b as i128, t as i128, c as i128, h as i128);
    [b * t * c, b * h * t * t, b * t, b * h * t, b, 1, c, c * c, t * c, t]
}

impl ByteModel {
    /// Fits the counts of one-block models of `cfg`'s vocabulary, bias and dropout on
    /// `device`, under the caller's autocast: batches of 2 to 4, windows of 2, 3 and 5, widths
    /// 4 to 12 of 2 to 4 heads (a batch or a head of one can make a copy a view: a model of one
    /// head is counted as if it had the copies). Errors where a count is not such a
    /// polynomial (a layer whose memory the planner's shapes do not describe).
    pub fn fit(cfg: &GptConfig, device: &Device) -> Result<ByteModel> {
        let mut rows: Vec<[i128; MONOMIALS]> = Vec::new();
        let mut counts: Vec<[[i128; 3]; 4]> = Vec::new();
        // No dimension of 1, where a permutation may be a view instead of a copy.
        for (c, h) in [(4, 2), (8, 2), (12, 3), (8, 4)] {
            for t in [2, 3, 5] {
                let tiny = GptConfig { n_layer: 1, n_head: h, n_embd: c, block_size: t, ..*cfg };
                let stage = Gpt::new(tiny, 0, device)?.stages(std::slice::from_ref(device), None)?.remove(0);
                for b in 2..=4 {
                    rows.push(monomials(b, t, c, h));
                    counts.push(layer_counts(&stage, b, t, device)?);
                }
            }
        }
        let mut coefficients = [[[0i128; MONOMIALS]; 3]; 4];
        for (k, kind) in coefficients.iter_mut().enumerate() {
            for (q, coef) in kind.iter_mut().enumerate() {
                let y: Vec<i128> = counts.iter().map(|c| c[k][q]).collect();
                *coef = fit_whole(&rows, &y).ok_or_else(|| {
                    let why = format!("the byte counts of the GPT's {:?} layer are not a sum of the planner's shape terms", Kind::ALL[k]);
                    Error::invalid("plan::ByteModel", why)
                })?;
            }
        }
        Ok(ByteModel { coefficients })
    }

    /// `[kept, input, output]` bytes of a `kind` layer at batch `b`, window `t`, width `c` and
    /// `h` heads (0 where a count would be negative, saturating where it passes a `u64`).
    fn at(&self, kind: Kind, b: usize, t: usize, c: usize, h: usize) -> [u64; 3] {
        let m = monomials(b, t, c, h);
        let k = Kind::ALL.iter().position(|x| *x == kind).unwrap_or(0);
        self.coefficients[k].map(|coef| {
            let v = coef.iter().zip(&m).fold(0i128, |acc, (a, x)| acc.saturating_add(a.saturating_mul(*x)));
            u64::try_from(v.max(0)).unwrap_or(u64::MAX)
        })
    }
}

/// Per layer of `stage` (a one-block GPT's four) at a batch of `b` windows of `t` tokens:
/// the bytes its backward keeps, its input's and its output's, counted as the calibration
/// counts them (the kept bytes with the input's, which the calibration subtracts).
fn layer_counts(stage: &crate::nn::Sequential, b: usize, t: usize, device: &Device) -> Result<[[i128; 3]; 4]> {
    let mut x = Tensor::from_labels(vec![0; b * t], [b, t], device)?;
    let mut out = [[0i128; 3]; 4];
    for (k, (_, layer)) in stage.layers().iter().enumerate().take(4) {
        let input = if x.dtype() != crate::DType::I32 { x.detach().requires_grad() } else { x.clone() };
        let y = layer.forward(&input)?;
        let root = y.sum_all()?;
        let kept = crate::autograd::activation_bytes(&root);
        let size = |t: &Tensor| (t.numel() * t.dtype().size()) as i128;
        out[k] = [kept as i128, size(&x), size(&y)];
        x = y.detach();
    }
    Ok(out)
}

/// Whole coefficients `a` with `rows · a = y` exactly, by least squares rounded to whole
/// numbers; `None` where no such coefficients reproduce every row.
fn fit_whole(rows: &[[i128; MONOMIALS]], y: &[i128]) -> Option<[i128; MONOMIALS]> {
    // Normal equations, solved by Gaussian elimination with partial pivoting; a column no row
    // varies (a term the samples cannot tell apart) is left at 0.
    let mut a = [[0f64; MONOMIALS + 1]; MONOMIALS];
    for (r, &v) in rows.iter().zip(y) {
        for (ri, line) in r.iter().zip(a.iter_mut()) {
            for (rj, cell) in r.iter().zip(line.iter_mut()) {
                *cell += (ri * rj) as f64;
            }
            line[MONOMIALS] += (ri * v) as f64;
        }
    }
    let mut solved = [0f64; MONOMIALS];
    let mut pivots = Vec::new();
    let mut row = 0;
    for col in 0..MONOMIALS {
        let p = (row..MONOMIALS).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[p][col].abs() < 1e-9 {
            continue;
        }
        a.swap(row, p);
        let pivot = a[row];
        for (_, line) in a.iter_mut().enumerate().filter(|(i, _)| *i != row) {
            let f = line[col] / pivot[col];
            for (x, p) in line.iter_mut().zip(&pivot).skip(col) {
                *x -= f * p;
            }
        }
        pivots.push((row, col));
        row += 1;
    }
    for (r, c) in pivots {
        solved[c] = a[r][MONOMIALS] / a[r][c];
    }
    let whole = solved.map(|v| v.round() as i128);
    let exact = rows.iter().zip(y).all(|(r, &v)| r.iter().zip(&whole).map(|(x, a)| x * a).sum::<i128>() == v);
    exact.then_some(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_coefficients_are_recovered_and_anything_else_refused() {
        let shapes = [(4, 1, 2), (4, 2, 3), (8, 2, 5), (12, 3, 2), (12, 3, 5)];
        let rows: Vec<[i128; MONOMIALS]> = (1..=3).flat_map(|b| shapes.map(|(c, h, t)| monomials(b, t, c, h))).collect();
        let truth = [4, 8, 8, 4, 0, 4, 2, 8, 4, 0];
        let y: Vec<i128> = rows.iter().map(|r| r.iter().zip(&truth).map(|(x, a)| x * a).sum()).collect();
        assert_eq!(fit_whole(&rows, &y), Some(truth));
        let mut off = y.clone();
        off[3] += 1;
        assert_eq!(fit_whole(&rows, &off), None);
    }
}
