//! The gradient table: one rule per differentiable op, all in one place.
//!
//! `backward(op, inputs, out, g)` returns, for each input, the gradient of the loss with
//! respect to it given `g` = dL/d(out); `None` where an input has no gradient.
use super::GradOp;
use crate::backend::{BinaryOp, IndexOp, MatmulSpec, UnaryOp};
use crate::{DType, Result, Shape, Tensor};

pub(super) fn backward(op: &GradOp, inputs: &[Tensor], out: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = &inputs[0];
    Ok(match op {
        GradOp::Unary(u) => vec![Some(unary(*u, x, out, g)?)],
        GradOp::Binary(b) => {
            let (a, bb) = (&inputs[0], &inputs[1]);
            let (ga, gb) = binary(*b, a, bb, out, g)?;
            vec![ga.map(|t| t.sum_to(a.shape())).transpose()?, gb.map(|t| t.sum_to(bb.shape())).transpose()?]
        }
        GradOp::Cast { from } => vec![Some(g.to_dtype(*from)?)],
        GradOp::ScaleGrad(s) => vec![Some(g.mul_scalar(*s)?)],
        GradOp::InF32(inner) => crate::tensor::backward_in_f32(inner, inputs, out, g, backward)?,
        GradOp::Sum { axis } => vec![Some(g.reshape(keepdim(x.shape(), *axis))?.broadcast_to(x.shape().clone())?)],
        // d max / dx_i = [x_i == max] / (number of maxima)
        GradOp::Max { axis } => {
            let kd = keepdim(x.shape(), *axis);
            let mask = x.eq_elem(&out.reshape(kd.clone())?)?;
            let count = mask.sum(*axis as isize, true)?;
            vec![Some(mask.mul(&g.reshape(kd)?.div(&count)?)?)]
        }
        // in PyTorch's order, so that a zero gradient has its sign (that of g - sum(g y))
        GradOp::Softmax { axis } => {
            let a = *axis as isize;
            vec![Some(out.mul(&g.sub(&g.mul(out)?.sum(a, true)?)?)?)]
        }
        // g (Φ(x) + x φ(x)) and g s (1 + x (1 - s)), s = sigmoid(x), as PyTorch computes them:
        // the composition's g Φ + (g x) φ would overflow at g x where the result does not
        GradOp::Gelu => {
            let cdf = x.mul_scalar(std::f32::consts::FRAC_1_SQRT_2)?.erf()?.affine(0.5, 0.5)?;
            let pdf = x.square()?.mul_scalar(-0.5)?.exp()?.mul_scalar(0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2)?;
            vec![Some(g.mul(&cdf.add(&x.mul(&pdf)?)?)?)]
        }
        // PyTorch's GeluBackward for approximate='tanh', term by term and in its order, so that a
        // zero gradient has its sign: g (0.5 (1 + t) + (0.5 x) (1 - t²) β (1 + 3κ x²)), t the
        // forward's tanh (the composition's sum of paths gives +0 where PyTorch has -0)
        GradOp::GeluTanh => vec![Some(x.gelu_tanh_backward(g)?)],
        // PyTorch's var_backward, (2 / (n - c)) g (x - mean), after std's g / (2 std), 0 where
        // std is 0
        GradOp::Var { axis, correction, std } => {
            let g = g.reshape(keepdim(x.shape(), *axis))?;
            let g = if *std {
                let zero = Tensor::zeros(Shape(vec![]), g.device())?;
                let out = out.reshape(g.shape().clone())?;
                g.div(&out.mul_scalar(2.0)?)?.where_(&out.eq_elem(&zero)?.affine(-1.0, 1.0)?, &zero)?
            } else {
                g
            };
            let n = x.dims()[*axis] as f32;
            // the mean as PyTorch's, sum / n, so that x - mean is 0 with its sign where it is
            let mean = x.sum(*axis as isize, true)?.div(&Tensor::full(n, Shape(vec![]), g.device())?)?;
            vec![Some(g.mul_scalar(2.0 / (n - *correction as f32))?.mul(&x.sub(&mean)?)?)]
        }
        // PyTorch's: (sigmoid(x) - y) g / N and -x g / N
        GradOp::BceWithLogits => {
            let n = Tensor::full(x.numel() as f32, Shape(vec![]), g.device())?;
            vec![Some(x.sigmoid()?.sub(&inputs[1])?.mul(g)?.div(&n)?), Some(x.neg()?.mul(g)?.div(&n)?)]
        }
        GradOp::Silu => {
            let s = x.sigmoid()?;
            vec![Some(g.mul(&s)?.mul(&x.mul(&s.affine(-1.0, 1.0)?)?.add_scalar(1.0)?)?)]
        }
        GradOp::Reshape => vec![Some(g.reshape(x.shape().clone())?)],
        GradOp::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.permute(&inv)?)]
        }
        GradOp::Expand => vec![Some(g.sum_to(x.shape())?)],
        // zeros around the slice
        GradOp::Narrow { dim, start } => {
            let (d, s) = (*dim, *start);
            let full = x.dims()[d];
            let len = g.dims()[d];
            let mut parts = Vec::new();
            for (at, n) in [(0, s), (s + len, full - s - len)] {
                if n > 0 {
                    let mut shape = x.dims().to_vec();
                    shape[d] = n;
                    parts.push((at, Tensor::zeros(shape, g.device())?.to_dtype(g.dtype())?));
                }
            }
            parts.push((s, g.clone()));
            parts.sort_by_key(|p| p.0);
            let parts: Vec<Tensor> = parts.into_iter().map(|p| p.1).collect();
            vec![Some(Tensor::cat(&parts, d)?)]
        }
        GradOp::Cat => {
            let mut at = 0;
            inputs
                .iter()
                .map(|t| {
                    let n = t.dims()[0];
                    at += n;
                    g.narrow(0, at - n, n).map(Some)
                })
                .collect::<Result<_>>()?
        }
        // C = op(A)·op(B): dop(A) = G·op(B)ᵀ, dop(B) = op(A)ᵀ·G, transposed back when stored
        // transposed, then summed over the batch dimensions the operand was broadcast along.
        GradOp::Matmul { trans_a, trans_b } => {
            let (a, b, ta, tb) = (&inputs[0], &inputs[1], *trans_a, *trans_b);
            let ga =
                if a.needs_grad() { Some(if ta { b.matmul_t(g, tb, true)? } else { g.matmul_t(b, false, !tb)? }.sum_to(a.shape())?) } else { None };
            let gb =
                if b.needs_grad() { Some(if tb { g.matmul_t(a, true, ta)? } else { a.matmul_t(g, !ta, false)? }.sum_to(b.shape())?) } else { None };
            vec![ga, gb]
        }
        GradOp::Conv2d { spec, cols, bias, relu } => {
            // A fused ReLU first: its gradient from the output, as `UnaryOp::Relu`'s from its input.
            let masked;
            let g = match relu {
                Some(y) => {
                    let y = Tensor::from_parts(y.clone(), g.shape().clone(), g.device().clone(), None);
                    masked = g.binary(BinaryOp::ReluBackward, &y)?;
                    &masked
                }
                None => g,
            };
            let w = &inputs[1];
            let (o, p, r) = (w.dims()[0], spec.col_len(), spec.col_rows());
            let dev = g.device();
            // dW = Σ_n G[n]·cols[n]ᵀ
            let gw = if w.needs_grad() {
                let mm = MatmulSpec {
                    batch: spec.n,
                    m: o,
                    n: r,
                    k: p,
                    trans_a: false,
                    trans_b: true,
                    a_offset: 0,
                    b_offset: 0,
                    a_batch_stride: o * p,
                    b_batch_stride: r * p,
                };
                let per = dev.backend().alloc(spec.n * o * r, DType::F32)?;
                dev.backend().matmul(g.buffer(), cols, &per, mm)?;
                let per = Tensor::from_parts(per, Shape(vec![spec.n, o * r]), dev.clone(), None);
                Some(per.sum_batch()?.reshape(w.shape().clone())?)
            } else {
                None
            };
            // dcols[n] = Wᵀ·G[n], folded back by col2im
            let gx = if x.needs_grad() {
                let mm = MatmulSpec {
                    batch: spec.n,
                    m: r,
                    n: p,
                    k: o,
                    trans_a: true,
                    trans_b: false,
                    a_offset: 0,
                    b_offset: 0,
                    a_batch_stride: 0,
                    b_batch_stride: o * p,
                };
                let dcols = dev.backend().alloc(spec.n * r * p, DType::F32)?;
                dev.backend().matmul(w.buffer(), g.buffer(), &dcols, mm)?;
                let gx = dev.backend().alloc(x.numel(), DType::F32)?;
                dev.backend().col2im(&dcols, &gx, *spec)?;
                Some(Tensor::from_parts(gx, x.shape().clone(), dev.clone(), None))
            } else {
                None
            };
            if *bias {
                // d bias = G summed over images and positions, per channel
                let gb = if inputs[2].needs_grad() { Some(g.sum_to(&Shape(vec![o, 1, 1]))?.reshape([o])?) } else { None };
                vec![gx, gw, gb]
            } else {
                vec![gx, gw]
            }
        }
        GradOp::MaxPool2d { spec, argmax } => {
            let gx = x.backend().alloc(x.numel(), DType::F32)?;
            x.backend().max_pool2d_backward(g.buffer(), argmax, &gx, *spec)?;
            vec![Some(Tensor::from_parts(gx, x.shape().clone(), x.device().clone(), None))]
        }
        GradOp::Gather { cols } => {
            let rows = x.dims()[0];
            let gx = x.backend().alloc(rows * cols, DType::F32)?;
            x.backend().index(IndexOp::Scatter, g.buffer(), inputs[1].buffer(), &gx, rows, *cols)?;
            vec![Some(Tensor::from_parts(gx, x.shape().clone(), x.device().clone(), None)), None]
        }
        // The deterministic scatter-add: the plan of the ids (built on the host from the values
        // uploaded, or from one read of ids made on the device) makes every backend sum each
        // row's gradients in ascending order.
        GradOp::GatherRows { table_rows } => {
            let (ids, v) = (&inputs[1], *table_rows);
            let d = x.dims()[1];
            let plan = match ids.buffer().host_i32() {
                Some(host) => crate::backend::row_plan(&host[..ids.numel()], v),
                None => crate::backend::row_plan(&ids.to_vec_i32()?, v),
            };
            let plan = x.backend().upload(bytemuck::cast_slice(&plan), DType::I32)?;
            let gx = x.backend().alloc(v * d, DType::F32)?;
            x.backend().index(IndexOp::ScatterAddRows { table_rows: v }, g.buffer(), &plan, &gx, ids.numel(), d)?;
            vec![Some(Tensor::from_parts(gx, x.shape().clone(), x.device().clone(), None)), None]
        }
        // x̂ = (x - mean) rstd: dx = rstd (g w - mean(g w) - x̂ mean(g w x̂)), dw = Σ g x̂,
        // db = Σ g over rows (per block of rows, then the blocks in order: deterministic)
        GradOp::LayerNorm { mean, rstd } => {
            let rows = Shape(vec![mean.len()]);
            let saved = |b: &crate::backend::Buffer| Tensor::from_parts(b.clone(), rows.clone(), x.device().clone(), None);
            let [dx, dw, db] = x.layer_norm_backward(&inputs[1], g, &saved(mean), &saved(rstd))?;
            vec![Some(dx), inputs[1].needs_grad().then_some(dw), inputs[2].needs_grad().then_some(db)]
        }
        // scale · y (g - Σ g y), 0 above the diagonal
        GradOp::CausalSoftmax { scale } => vec![Some(out.causal_softmax_backward(g, *scale)?)],
        // p = exp(s - lse) recomputed; ds = p (g·vᵀ - Σ g o): dq = scale ds·k, dk = scale dsᵀ·q,
        // dv = pᵀ·g
        GradOp::Attention { scale, lse } => {
            let lse = Tensor::from_parts(lse.clone(), Shape(vec![lse.len()]), x.device().clone(), None);
            let grads = Tensor::causal_attention_backward([&inputs[0], &inputs[1], &inputs[2]], out, &lse, g, *scale)?;
            grads.into_iter().map(Some).collect()
        }
        GradOp::ToDevice => vec![Some(g.to(x.device())?)],
        GradOp::Checkpoint(r) => super::checkpoint::backward(r, inputs, g)?,
    })
}

/// The gradient rule of unary op `op` from the table in `backend/op_table.rs`.
fn unary(op: UnaryOp, x: &Tensor, out: &Tensor, g: &Tensor) -> Result<Tensor> {
    crate::backend::op_table::unary_ops!(grad op, x, out, g)
}

/// The gradients of binary op `op`'s two inputs (before broadcasting is undone; `None` where
/// there is none), by the rule in `backend/op_table.rs`.
fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, out: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
    Ok(crate::backend::op_table::binary_ops!(grad op, a, b, out, g))
}

/// The gradients of `torch.maximum` (`is_max`) or `torch.minimum`: ties share evenly, the loser
/// gets +0 (selected, not multiplied by 0), and where either is NaN (no comparison holds) both
/// get all of `g`.
fn max_min(is_max: bool, a: &Tensor, b: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let (lose_a, lose_b) = if is_max { (b.gt(a)?, a.gt(b)?) } else { (a.gt(b)?, b.gt(a)?) };
    let shared = g.mul(&a.eq_elem(b)?.affine(-0.5, 1.0)?)?;
    let unless = |lose: Tensor| shared.binary(BinaryOp::ReluBackward, &lose.affine(-1.0, 1.0)?);
    Ok((Some(unless(lose_a)?), Some(unless(lose_b)?)))
}

fn keepdim(shape: &Shape, axis: usize) -> Shape {
    let mut d = shape.dims().to_vec();
    if d.len() > axis {
        d[axis] = 1;
    }
    Shape(d)
}
