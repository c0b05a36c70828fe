//! The CPU reference of the fused transformer kernels (`FusedOp`): plain loops over rows, sums
//! in f64, in the order the kernels use.
use crate::backend::{FusedOp, LN_ROW_BLOCK};

/// The outputs of `op` from its inputs (both in `FusedOp`'s buffer order).
pub fn run(op: FusedOp, ins: &[&[f32]]) -> Vec<Vec<f32>> {
    match op {
        FusedOp::LayerNorm { rows, cols, eps } => layer_norm(ins, rows, cols, eps),
        FusedOp::LayerNormBackward { rows, cols } => layer_norm_backward(ins, rows, cols),
        FusedOp::CausalSoftmax { n, t, scale } => vec![causal_softmax(ins[0], n, t, scale)],
        FusedOp::CausalSoftmaxBackward { n, t, scale } => vec![causal_softmax_backward(ins[0], ins[1], n, t, scale)],
        FusedOp::Attention { n, t, d, scale } => attention(ins, n, t, d, scale),
        FusedOp::AttentionBackward { n, t, d, scale } => attention_backward(ins, n, t, d, scale),
    }
}

fn layer_norm(ins: &[&[f32]], rows: usize, cols: usize, eps: f32) -> Vec<Vec<f32>> {
    let (x, w, b) = (ins[0], ins[1], ins[2]);
    let (mut y, mut mean, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let m = (row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64) as f32;
        let var = row.iter().map(|&v| ((v - m) as f64).powi(2)).sum::<f64>() / cols as f64;
        let s = (1.0 / (var + eps as f64).sqrt()) as f32;
        for (j, &v) in row.iter().enumerate() {
            y[r * cols + j] = (v - m) * s * w[j] + b[j];
        }
        (mean[r], rstd[r]) = (m, s);
    }
    vec![y, mean, rstd]
}

fn layer_norm_backward(ins: &[&[f32]], rows: usize, cols: usize) -> Vec<Vec<f32>> {
    let (g, x, w, mean, rstd) = (ins[0], ins[1], ins[2], ins[3], ins[4]);
    let blocks = crate::backend::ln_blocks(rows);
    let (mut dx, mut dw, mut db) = (vec![0.0; rows * cols], vec![0.0; blocks * cols], vec![0.0; blocks * cols]);
    for r in 0..rows {
        let at = r * cols;
        let xhat = |j: usize| (x[at + j] - mean[r]) * rstd[r];
        let (mut a, mut c) = (0.0f64, 0.0f64);
        for j in 0..cols {
            let gw = g[at + j] * w[j];
            a += gw as f64;
            c += (gw * xhat(j)) as f64;
        }
        let (a, c) = ((a / cols as f64) as f32, (c / cols as f64) as f32);
        for j in 0..cols {
            dx[at + j] = rstd[r] * (g[at + j] * w[j] - a - xhat(j) * c);
        }
    }
    // Each block's rows in order, as the kernels: one column of partials per thread.
    for blk in 0..blocks {
        for j in 0..cols {
            let (mut sw, mut sb) = (0.0f32, 0.0f32);
            for r in blk * LN_ROW_BLOCK..((blk + 1) * LN_ROW_BLOCK).min(rows) {
                let gv = g[r * cols + j];
                sw += gv * ((x[r * cols + j] - mean[r]) * rstd[r]);
                sb += gv;
            }
            (dw[blk * cols + j], db[blk * cols + j]) = (sw, sb);
        }
    }
    vec![dx, dw, db]
}

/// `exp(z - m) / s` for every column; a masked column's z is -inf, so that a row whose max is
/// NaN, +inf or -inf is NaN throughout, as the composition (and PyTorch) gives.
fn causal_softmax(x: &[f32], n: usize, t: usize, scale: f32) -> Vec<f32> {
    let mut y = vec![0.0; n * t * t];
    for row in 0..n * t {
        let i = row % t;
        let z = |j: usize| if j <= i { x[row * t + j] * scale } else { f32::NEG_INFINITY };
        let m = (0..=i).map(z).fold(f32::NEG_INFINITY, nan_max);
        let s: f64 = (0..=i).map(|j| ((z(j) - m) as f64).exp()).sum();
        for j in 0..t {
            y[row * t + j] = (((z(j) - m) as f64).exp() / s) as f32;
        }
    }
    y
}

fn causal_softmax_backward(g: &[f32], y: &[f32], n: usize, t: usize, scale: f32) -> Vec<f32> {
    let mut dx = vec![0.0; n * t * t];
    for row in 0..n * t {
        let (i, at) = (row % t, row * t);
        let dot: f64 = (0..=i).map(|j| (g[at + j] * y[at + j]) as f64).sum();
        for j in 0..=i {
            dx[at + j] = scale * y[at + j] * (g[at + j] - dot as f32);
        }
    }
    dx
}

/// The maximum where NaN wins, as `max` reductions in every backend.
fn nan_max(m: f32, v: f32) -> f32 {
    if v.is_nan() || v > m {
        v
    } else {
        m
    }
}

/// Row `r` of a matrix of rows of `d` values.
fn row(x: &[f32], r: usize, d: usize) -> &[f32] {
    &x[r * d..(r + 1) * d]
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

/// Keys in order with the online softmax the kernels use: a running max `m`, sum `l` and
/// output accumulator rescaled by `exp(m_old - m_new)` when the max grows.
fn attention(ins: &[&[f32]], n: usize, t: usize, d: usize, scale: f32) -> Vec<Vec<f32>> {
    let (q, k, v) = (ins[0], ins[1], ins[2]);
    let (mut o, mut lse) = (vec![0.0; n * t * d], vec![0.0; n * t]);
    for b in 0..n {
        for i in 0..t {
            let qi = &q[(b * t + i) * d..][..d];
            let (mut m, mut l, mut acc) = (f32::NEG_INFINITY, 0.0f32, vec![0.0f32; d]);
            for j in 0..=i {
                let s = dot(qi, &k[(b * t + j) * d..][..d]) * scale;
                let m_new = nan_max(m, s);
                let (alpha, p) = ((m - m_new).exp(), (s - m_new).exp());
                // exp(-inf - -inf) is NaN; nothing has accumulated before the first key.
                let alpha = if j == 0 { 0.0 } else { alpha };
                l = l * alpha + p;
                for (a, &vv) in acc.iter_mut().zip(&v[(b * t + j) * d..][..d]) {
                    *a = *a * alpha + p * vv;
                }
                m = m_new;
            }
            for (e, a) in o[(b * t + i) * d..][..d].iter_mut().zip(&acc) {
                *e = a / l;
            }
            lse[b * t + i] = m + l.ln();
        }
    }
    vec![o, lse]
}

/// FlashAttention's backward: `p = exp(s - lse)`, `dp = g·vᵀ`, `ds = p (dp - delta)` with
/// `delta = Σ g·o`; dq sums over keys per query row, dk and dv over queries per key row, so
/// that no two rows add into one value.
fn attention_backward(ins: &[&[f32]], n: usize, t: usize, d: usize, scale: f32) -> Vec<Vec<f32>> {
    let (q, k, v, o, lse, g) = (ins[0], ins[1], ins[2], ins[3], ins[4], ins[5]);
    let (mut dq, mut dk, mut dv, mut delta) = (vec![0.0; n * t * d], vec![0.0; n * t * d], vec![0.0; n * t * d], vec![0.0; n * t]);
    for (r, dl) in delta.iter_mut().enumerate() {
        *dl = dot(row(g, r, d), row(o, r, d));
    }
    let p = |b: usize, i: usize, j: usize| (dot(row(q, b * t + i, d), row(k, b * t + j, d)) * scale - lse[b * t + i]).exp();
    for b in 0..n {
        for i in 0..t {
            let ri = b * t + i;
            for j in 0..=i {
                let rj = b * t + j;
                let ds = p(b, i, j) * (dot(row(g, ri, d), row(v, rj, d)) - delta[ri]);
                for e in 0..d {
                    dq[ri * d + e] += ds * scale * k[rj * d + e];
                }
            }
        }
        for j in 0..t {
            let rj = b * t + j;
            for i in j..t {
                let ri = b * t + i;
                let pij = p(b, i, j);
                let ds = pij * (dot(row(g, ri, d), row(v, rj, d)) - delta[ri]);
                for e in 0..d {
                    dk[rj * d + e] += ds * scale * q[ri * d + e];
                    dv[rj * d + e] += pij * g[ri * d + e];
                }
            }
        }
    }
    vec![dq, dk, dv, delta]
}
