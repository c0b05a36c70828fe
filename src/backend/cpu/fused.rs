//! The CPU reference of the fused transformer kernels (`FusedOp`): loops over rows, sums in f64
//! (a LayerNorm row's in eight partial sums, the same on every CPU). Rows (LayerNorm, softmax)
//! and matrices (attention) are independent, so they are split over threads; each is computed
//! by the same operations whatever the split, so the bits do not depend on the thread count.
use super::kernels::{by_isa, exp_f64};
use crate::backend::{FusedOp, LN_ROW_BLOCK};
use crate::{Error, Result};
use rayon::prelude::*;

/// Elements of work per thread task: below two of them a kernel stays on the calling thread.
/// Smaller than an elementwise chunk, since each element here costs an f64 sum or an `exp`.
const TASK: usize = 1 << 13;

/// Writes the outputs of `op` from its inputs (both in `FusedOp`'s buffer order); every
/// element of each output's leading `operands()` length is written.
pub fn run(op: FusedOp, ins: &[&[f32]], outs: &mut [&mut [f32]]) -> Result<()> {
    match (op, outs) {
        (FusedOp::LayerNorm { rows, cols, eps }, [y, mean, rstd]) => layer_norm(ins, rows, cols, eps, y, mean, rstd),
        (FusedOp::LayerNormBackward { rows, cols }, [dx, dw, db]) => layer_norm_backward(ins, rows, cols, dx, dw, db),
        (FusedOp::CausalSoftmax { n, t, scale }, [y]) => causal_softmax(ins[0], n, t, scale, y),
        (FusedOp::CausalSoftmaxBackward { n, t, scale }, [dx]) => causal_softmax_backward(ins[0], ins[1], n, t, scale, dx),
        (FusedOp::Attention { n, t, d, scale }, [o, lse]) => attention(ins, n, t, d, scale, o, lse),
        (FusedOp::AttentionBackward { n, t, d, scale }, [dq, dk, dv, delta]) => attention_backward(ins, n, t, d, scale, [dq, dk, dv, delta]),
        (FusedOp::GeluTanh { len }, [y]) => super::gelu::forward(&ins[0][..len], &mut y[..len]),
        (FusedOp::GeluTanhBackward { len }, [dx]) => super::gelu::backward(&ins[0][..len], &ins[1][..len], &mut dx[..len]),
        (_, outs) => return Err(Error::invalid(op.name(), format!("{op:?} writes another number of buffers than {}", outs.len()))),
    }
    Ok(())
}

/// Rows per thread task for `rows` rows of `per_row` work each, or `None` when the whole is
/// too small to be worth splitting.
fn group(rows: usize, per_row: usize) -> Option<usize> {
    (rows * per_row >= 2 * TASK).then(|| (TASK / per_row.max(1)).clamp(1, rows))
}

/// `f(first_row, rows)` over groups of whole rows of `width` values of `out`.
fn by_rows(out: &mut [f32], width: usize, per_row: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    match group(out.len() / width.max(1), per_row) {
        Some(g) if width > 0 => out.par_chunks_mut(g * width).enumerate().for_each(|(i, o)| f(i * g, o)),
        _ => f(0, out),
    }
}

fn layer_norm(ins: &[&[f32]], rows: usize, cols: usize, eps: f32, y: &mut [f32], mean: &mut [f32], rstd: &mut [f32]) {
    let (x, w, b) = (ins[0], ins[1], ins[2]);
    let task = |r0: usize, ((y, mean), rstd): ((&mut [f32], &mut [f32]), &mut [f32])| {
        for (i, (y, (mean, rstd))) in y.chunks_mut(cols).zip(mean.iter_mut().zip(rstd)).enumerate() {
            let mut stats = (0.0, 0.0);
            layer_norm_row(&x[(r0 + i) * cols..][..cols], &w[..cols], &b[..cols], eps, y, &mut stats);
            (*mean, *rstd) = stats;
        }
    };
    let (y, mean, rstd) = (&mut y[..rows * cols], &mut mean[..rows], &mut rstd[..rows]);
    match group(rows, cols) {
        Some(g) if cols > 0 => {
            let parts = y.par_chunks_mut(g * cols).zip(mean.par_chunks_mut(g)).zip(rstd.par_chunks_mut(g));
            parts.enumerate().for_each(|(i, p)| task(i * g, p));
        }
        _ => task(0, ((y, mean), rstd)),
    }
}

/// Partial sums of a row's f64 sums: eight on every CPU, so that AVX-512 (one vector), AVX2
/// (two) and plain code add the same numbers in the same order and give the same bits. A
/// single running sum was a chain of dependent adds that no CPU could overlap.
const LANES: usize = 8;

/// `N` sums over `j` in `0..n` of `f(j)` in f64: term `j` into partial sum `j % LANES`, each
/// sum's partial sums then added in order.
#[inline(always)]
fn lane_sums<const N: usize>(n: usize, f: impl Fn(usize) -> [f64; N]) -> [f64; N] {
    let mut acc = [[0.0f64; N]; LANES];
    let mut add = |lane: usize, j: usize| acc[lane].iter_mut().zip(f(j)).for_each(|(a, v)| *a += v);
    // Whole groups of LANES first, a fixed-length loop that vectorises; then the rest.
    let whole = n / LANES * LANES;
    for at in (0..whole).step_by(LANES) {
        (0..LANES).for_each(|lane| add(lane, at + lane));
    }
    (whole..n).for_each(|j| add(j - whole, j));
    std::array::from_fn(|k| acc.iter().map(|lane| lane[k]).sum())
}

by_isa!(
    /// One row of LayerNorm: `y`, and its mean and reciprocal standard deviation in `stats`.
    fn layer_norm_row(row: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [f32], stats: &mut (f32, f32)) => layer_norm_row_plain
);

#[inline(always)]
fn layer_norm_row_plain(row: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [f32], stats: &mut (f32, f32)) {
    let n = row.len() as f64;
    let [sum] = lane_sums(row.len(), |j| [row[j] as f64]);
    let m = (sum / n) as f32;
    let [squares] = lane_sums(row.len(), |j| [((row[j] - m) as f64) * ((row[j] - m) as f64)]);
    let var = squares / n;
    let s = (1.0 / (var + eps as f64).sqrt()) as f32;
    for (((y, &v), &w), &b) in y.iter_mut().zip(row).zip(w).zip(b) {
        *y = (v - m) * s * w + b;
    }
    *stats = (m, s);
}

fn layer_norm_backward(ins: &[&[f32]], rows: usize, cols: usize, dx: &mut [f32], dw: &mut [f32], db: &mut [f32]) {
    let (g, x, w, mean, rstd) = (ins[0], ins[1], ins[2], ins[3], ins[4]);
    by_rows(&mut dx[..rows * cols], cols, 2 * cols, |r0, dx| {
        for (i, dx) in dx.chunks_mut(cols).enumerate() {
            let (r, at) = (r0 + i, (r0 + i) * cols);
            layer_norm_grad_row(&g[at..][..cols], &x[at..][..cols], &w[..cols], (mean[r], rstd[r]), dx);
        }
    });
    // Each block's rows in order, as the kernels' one column of partials per thread; a block
    // per task, its rows added one after another into every column.
    let blocks = crate::backend::ln_blocks(rows);
    let block = |(blk, (dw, db)): (usize, (&mut [f32], &mut [f32]))| {
        dw.fill(0.0);
        db.fill(0.0);
        for r in blk * LN_ROW_BLOCK..((blk + 1) * LN_ROW_BLOCK).min(rows) {
            let (gr, xr) = (&g[r * cols..][..cols], &x[r * cols..][..cols]);
            for j in 0..cols {
                dw[j] += gr[j] * ((xr[j] - mean[r]) * rstd[r]);
                db[j] += gr[j];
            }
        }
    };
    let parts = dw[..blocks * cols].par_chunks_mut(cols.max(1)).zip(db[..blocks * cols].par_chunks_mut(cols.max(1))).enumerate();
    if cols > 0 && blocks > 1 && rows * cols >= 2 * TASK {
        parts.for_each(block);
    } else if cols > 0 {
        dw[..blocks * cols].chunks_mut(cols).zip(db[..blocks * cols].chunks_mut(cols)).enumerate().for_each(block);
    }
}

by_isa!(
    /// One row of LayerNorm's input gradient from the output gradient `g`, the input `x` and
    /// the row's mean and reciprocal standard deviation.
    fn layer_norm_grad_row(g: &[f32], x: &[f32], w: &[f32], stats: (f32, f32), dx: &mut [f32]) => layer_norm_grad_row_plain
);

#[inline(always)]
fn layer_norm_grad_row_plain(g: &[f32], x: &[f32], w: &[f32], (mean, rstd): (f32, f32), dx: &mut [f32]) {
    let (x, w) = (&x[..g.len()], &w[..g.len()]);
    let [a, c] = lane_sums(g.len(), |j| {
        let gw = g[j] * w[j];
        [gw as f64, (gw * ((x[j] - mean) * rstd)) as f64]
    });
    let n = g.len() as f64;
    let (a, c) = ((a / n) as f32, (c / n) as f32);
    for (((dx, &g), &x), &w) in dx.iter_mut().zip(g).zip(x).zip(w) {
        *dx = rstd * (g * w - a - ((x - mean) * rstd) * c);
    }
}

/// `exp(z - m) / s` for every column; a masked column's z is -inf, so that a row whose max is
/// NaN, +inf or -inf is NaN throughout, as the composition (and PyTorch) gives.
fn causal_softmax(x: &[f32], n: usize, t: usize, scale: f32, y: &mut [f32]) {
    by_rows(&mut y[..n * t * t], t, t, |r0, y| {
        let mut e = vec![0.0f64; t];
        for (k, y) in y.chunks_mut(t).enumerate() {
            let (row, i) = (r0 + k, (r0 + k) % t);
            let xr = &x[row * t..][..=i];
            let m = xr.iter().map(|&v| v * scale).fold(f32::NEG_INFINITY, nan_max);
            exps(xr, scale, m, &mut e[..=i]);
            let s = e[..=i].iter().fold(0.0f64, |s, &e| s + e);
            for (y, &e) in y.iter_mut().zip(&e[..=i]) {
                *y = (e / s) as f32;
            }
            let masked = (((f32::NEG_INFINITY - m) as f64).exp() / s) as f32;
            y[i + 1..].fill(masked);
        }
    });
}

by_isa!(
    /// `e[j] = exp(x[j]·scale - m)` in f64 ([`exp_f64`], no libm call per element), vectorised
    /// as the GELU's loops are.
    fn exps(x: &[f32], scale: f32, m: f32, e: &mut [f64]) => exps_plain
);

#[inline(always)]
fn exps_plain(x: &[f32], scale: f32, m: f32, e: &mut [f64]) {
    for (e, &v) in e.iter_mut().zip(x) {
        *e = exp_f64((v * scale - m) as f64);
    }
}

fn causal_softmax_backward(g: &[f32], y: &[f32], n: usize, t: usize, scale: f32, dx: &mut [f32]) {
    by_rows(&mut dx[..n * t * t], t, t, |r0, dx| {
        for (k, dx) in dx.chunks_mut(t).enumerate() {
            let (i, at) = ((r0 + k) % t, (r0 + k) * t);
            let dot: f64 = (0..=i).map(|j| (g[at + j] * y[at + j]) as f64).sum();
            for (j, dx) in dx[..=i].iter_mut().enumerate() {
                *dx = scale * y[at + j] * (g[at + j] - dot as f32);
            }
            dx[i + 1..].fill(0.0);
        }
    });
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
/// output accumulator rescaled by `exp(m_old - m_new)` when the max grows. One task per
/// matrix of the batch.
fn attention(ins: &[&[f32]], n: usize, t: usize, d: usize, scale: f32, o: &mut [f32], lse: &mut [f32]) {
    let (q, k, v) = (ins[0], ins[1], ins[2]);
    let one = |(b, (o, lse)): (usize, (&mut [f32], &mut [f32]))| {
        let (q, k, v) = (&q[b * t * d..][..t * d], &k[b * t * d..][..t * d], &v[b * t * d..][..t * d]);
        let mut acc = vec![0.0f32; d];
        for i in 0..t {
            let qi = row(q, i, d);
            let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
            acc.fill(0.0);
            for j in 0..=i {
                let s = dot(qi, row(k, j, d)) * scale;
                let m_new = nan_max(m, s);
                let (alpha, p) = ((m - m_new).exp(), (s - m_new).exp());
                // exp(-inf - -inf) is NaN; nothing has accumulated before the first key.
                let alpha = if j == 0 { 0.0 } else { alpha };
                l = l * alpha + p;
                for (a, &vv) in acc.iter_mut().zip(row(v, j, d)) {
                    *a = *a * alpha + p * vv;
                }
                m = m_new;
            }
            for (e, a) in o[i * d..][..d].iter_mut().zip(&acc) {
                *e = a / l;
            }
            lse[i] = m + l.ln();
        }
    };
    let tasks: Vec<_> = split(o, n, t * d).into_iter().zip(split(lse, n, t)).enumerate().collect();
    if n * t * t * d >= 2 * TASK {
        tasks.into_par_iter().for_each(one);
    } else {
        tasks.into_iter().for_each(one);
    }
}

/// The first `n` runs of `w` values of `x` (`n` empty ones when `w` is 0).
fn split(x: &mut [f32], n: usize, w: usize) -> Vec<&mut [f32]> {
    if w == 0 {
        return (0..n).map(|_| &mut [][..]).collect();
    }
    x[..n * w].chunks_mut(w).collect()
}

/// One matrix's dq and dk, then dv and delta.
type Grads<'a> = ((&'a mut [f32], &'a mut [f32]), (&'a mut [f32], &'a mut [f32]));

/// FlashAttention's backward: `p = exp(s - lse)`, `dp = g·vᵀ`, `ds = p (dp - delta)` with
/// `delta = Σ g·o`; dq sums over keys per query row, dk and dv over queries per key row, so
/// that no two rows add into one value. One task per matrix of the batch.
fn attention_backward(ins: &[&[f32]], n: usize, t: usize, d: usize, scale: f32, outs: [&mut &mut [f32]; 4]) {
    let (q, k, v, o, lse, g) = (ins[0], ins[1], ins[2], ins[3], ins[4], ins[5]);
    let [dq, dk, dv, delta] = outs;
    let one = |(b, ((dq, dk), (dv, delta))): (usize, Grads<'_>)| {
        let at = b * t * d;
        let (q, k, v, o, g, lse) =
            (&q[at..][..t * d], &k[at..][..t * d], &v[at..][..t * d], &o[at..][..t * d], &g[at..][..t * d], &lse[b * t..][..t]);
        for (r, dl) in delta.iter_mut().enumerate() {
            *dl = dot(row(g, r, d), row(o, r, d));
        }
        let delta = &*delta;
        let p = |i: usize, j: usize| (dot(row(q, i, d), row(k, j, d)) * scale - lse[i]).exp();
        dq.fill(0.0);
        dk.fill(0.0);
        dv.fill(0.0);
        for i in 0..t {
            for j in 0..=i {
                let ds = p(i, j) * (dot(row(g, i, d), row(v, j, d)) - delta[i]);
                for e in 0..d {
                    dq[i * d + e] += ds * scale * k[j * d + e];
                }
            }
        }
        for j in 0..t {
            for i in j..t {
                let pij = p(i, j);
                let ds = pij * (dot(row(g, i, d), row(v, j, d)) - delta[i]);
                for e in 0..d {
                    dk[j * d + e] += ds * scale * q[i * d + e];
                    dv[j * d + e] += pij * g[i * d + e];
                }
            }
        }
    };
    let td = t * d;
    let dqk = split(dq, n, td).into_iter().zip(split(dk, n, td));
    let tasks: Vec<_> = dqk.zip(split(dv, n, td).into_iter().zip(split(delta, n, t))).enumerate().collect();
    if n * t * t * d >= 2 * TASK {
        tasks.into_par_iter().for_each(one);
    } else {
        tasks.into_iter().for_each(one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-3, 3), and a few large ones so that the sums carry rounding a different
    /// order would change.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.into());
        (0..n).map(|i| rng.random_range(-3.0f32..3.0) * if i % 17 == 3 { 1e4 } else { 1.0 }).collect()
    }

    /// The row functions this CPU runs (AVX2 or AVX-512 where it has them) give the plain
    /// code's bits, and both agree with an f64 computation.
    #[test]
    fn layer_norm_rows_give_the_plain_bits_on_this_cpu() {
        for (k, n) in [1usize, 7, 8, 9, 16, 127, 128, 1000].into_iter().enumerate() {
            let (x, w, b, g) = (values(n, 4 * k as u32 + 1), values(n, 4 * k as u32 + 2), values(n, 4 * k as u32 + 3), values(n, 4 * k as u32 + 4));
            let (mut y, mut y_plain, mut stats, mut stats_plain) = (vec![0.0; n], vec![0.0; n], (0.0, 0.0), (0.0, 0.0));
            layer_norm_row(&x, &w, &b, 1e-5, &mut y, &mut stats);
            layer_norm_row_plain(&x, &w, &b, 1e-5, &mut y_plain, &mut stats_plain);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                (bits(&y), stats.0.to_bits(), stats.1.to_bits()),
                (bits(&y_plain), stats_plain.0.to_bits(), stats_plain.1.to_bits()),
                "forward, {n} columns"
            );
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            assert!((stats.0 as f64 - mean).abs() <= 1e-6 * (1.0 + mean.abs()), "mean {} of {n}: want {mean}", stats.0);
            let rstd = 1.0 / (var + 1e-5).sqrt();
            assert!((stats.1 as f64 - rstd).abs() <= 1e-5 * rstd, "rstd {} of {n}: want {rstd}", stats.1);

            let (mut dx, mut dx_plain) = (vec![0.0; n], vec![0.0; n]);
            layer_norm_grad_row(&g, &x, &w, stats, &mut dx);
            layer_norm_grad_row_plain(&g, &x, &w, stats, &mut dx_plain);
            assert_eq!(bits(&dx), bits(&dx_plain), "gradient, {n} columns");
        }
    }
}
