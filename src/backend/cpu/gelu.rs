//! The tanh GELU and its gradient in one pass each, with the f32 operations of their
//! compositions (`Tensor::gelu_tanh` and its gradient rule) in order, so the same bits. Where the
//! CPU has AVX2 or AVX-512F the same loops are also compiled for it (chosen at run time,
//! whatever the cargo features, as the products), which vectorises the tanh's f32
//! arithmetic eight or sixteen lanes wide; Rust never fuses a multiply and an add, so every
//! build gives the same bits. The GELU is a large share of a small GPT's CPU step, so its
//! vector form matters (figures in benches/README.md, "Figures behind choices in the code").
use super::kernels::{by_isa, unary, CHUNK};
use crate::backend::{UnaryOp, GELU_BETA, GELU_KAPPA};
use rayon::prelude::*;

/// `y = x · (tanh(β (x + κ x³)) · 0.5 + 0.5)`.
pub fn forward(x: &[f32], y: &mut [f32]) {
    by_chunks(y, |at, y| forward_chunk(&x[at..at + y.len()], y));
}

/// `dx = g · dGELU/dx`.
pub fn backward(g: &[f32], x: &[f32], dx: &mut [f32]) {
    by_chunks(dx, |at, dx| backward_chunk(&g[at..at + dx.len()], &x[at..at + dx.len()], dx));
}

/// `f(first index, chunk)` over chunks of `CHUNK` outputs, on several threads when long enough.
fn by_chunks(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() >= 2 * CHUNK {
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, o)| f(c * CHUNK, o));
    } else {
        out.chunks_mut(CHUNK).enumerate().for_each(|(c, o)| f(c * CHUNK, o));
    }
}

by_isa!(fn forward_chunk(x: &[f32], y: &mut [f32]) => forward_plain);
by_isa!(fn backward_chunk(g: &[f32], x: &[f32], dx: &mut [f32]) => backward_plain);

#[inline(always)]
fn forward_plain(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x * unary(HALF_ONE, gelu_t(x));
    }
}

#[inline(always)]
fn backward_plain(g: &[f32], x: &[f32], dx: &mut [f32]) {
    for (dx, (&g, &x)) in dx.iter_mut().zip(g.iter().zip(x)) {
        *dx = g * slope(x);
    }
}

/// `t · 0.5 + 0.5`, the `affine(0.5, 0.5)` of the composition.
const HALF_ONE: UnaryOp = UnaryOp::Affine { mul: 0.5, add: 0.5 };

/// `x · s`, as the composition's `mul_scalar` (an affine that adds -0).
#[inline(always)]
fn scaled(x: f32, s: f32) -> f32 {
    unary(UnaryOp::Affine { mul: s, add: -0.0 }, x)
}

/// `tanh(β (x + κ x³))`: `gelu_tanh_inner` and its `tanh`, op by op.
#[inline(always)]
fn gelu_t(x: f32) -> f32 {
    let inner = scaled(x + scaled(unary(UnaryOp::Powf(3.0), x), GELU_KAPPA), GELU_BETA);
    unary(UnaryOp::Tanh, inner)
}

/// dGELU/dx: `left + right` of the gradient rule's composition, op by op.
#[inline(always)]
fn slope(x: f32) -> f32 {
    let t = gelu_t(x);
    let left = unary(HALF_ONE, t);
    let slope = scaled(unary(UnaryOp::Affine { mul: 3.0 * GELU_KAPPA, add: 1.0 }, unary(UnaryOp::Square, x)), GELU_BETA);
    let right = scaled(x, 0.5) * unary(UnaryOp::Affine { mul: -1.0, add: 1.0 }, unary(UnaryOp::Square, t)) * slope;
    left + right
}
