//! LayerNorm, causal softmax, causal attention and the tanh GELU: one fused kernel each where
//! the device has it (`Backend::fused`), else composed from primitives (the reference the
//! kernels are tested against). `composed` turns the fused kernels off on this thread.
use super::Tensor;
use crate::autograd::{self, GradOp};
use crate::backend::{ln_blocks, FusedOp};
use crate::backend::{GELU_BETA, GELU_KAPPA};
use crate::tensor::gelu_tanh_inner;
use crate::{DType, Device, Error, Result, Shape};
use std::cell::Cell;

thread_local! {
    static FUSED: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` with the fused transformer kernels off on this thread: every op below composes
/// itself from primitives, as on a device without them.
pub fn composed<T>(f: impl FnOnce() -> T) -> T {
    let prev = FUSED.with(|c| c.replace(false));
    let out = f();
    FUSED.with(|c| c.set(prev));
    out
}

/// Whether the fused kernels are on on this thread (they are unless inside [`composed`]).
pub(crate) fn fused_on() -> bool {
    FUSED.with(Cell::get)
}

/// Turns the fused kernels on or off on this thread, returning the previous setting.
pub(crate) fn replace_fused(on: bool) -> bool {
    FUSED.with(|c| c.replace(on))
}

/// `bufs` through the device's fused kernel, if it has one and they are not turned off.
fn try_fused(dev: &Device, op: FusedOp, bufs: &[&crate::backend::Buffer]) -> Result<bool> {
    if !FUSED.with(|c| c.get()) {
        return Ok(false);
    }
    dev.backend().fused(op, bufs)
}

/// Whether `op` may run fused on `dev` at all: asked before its outputs are allocated.
fn may_fuse(dev: &Device, op: &FusedOp) -> bool {
    FUSED.with(|c| c.get()) && dev.backend().fuses(op)
}

/// `[T, T]`, 1 where key `j` comes after query `i` (the positions a token must not see).
pub(crate) fn causal_mask(t: usize, dev: &Device) -> Result<Tensor> {
    let n = t.saturating_mul(t);
    let mask = crate::backend::host::try_collect(n, (0..n).map(|k| f32::from(u8::from(k % t > k / t))), "host", "a causal mask")?;
    Tensor::from_vec(mask, [t, t], dev)
}

impl Tensor {
    /// LayerNorm over the last dimension: `(x - mean) / sqrt(var + eps) · weight + bias` with
    /// the biased variance, as PyTorch's `layer_norm`; `weight` and `bias` are `[C]`.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
        let c = self.dims().last().copied().unwrap_or(0);
        if self.rank() == 0 || weight.dims() != [c] || bias.dims() != [c] {
            return Err(Error::shape(
                "layer_norm",
                format!("input {:?} with weight {:?} and bias {:?}: need [.., C] with [C] and [C]", self.shape(), weight.shape(), bias.shape()),
            ));
        }
        self.same_device("layer_norm", weight)?;
        self.same_device("layer_norm", bias)?;
        if let Some(y) = Tensor::in_f32(&[self, weight, bias], |t| t[0].layer_norm(&t[1], &t[2], eps))? {
            return Ok(y);
        }
        let rows = self.numel() / c.max(1);
        let (y, mean, rstd) = (self.alloc_like(self.numel(), DType::F32)?, self.alloc_like(rows, DType::F32)?, self.alloc_like(rows, DType::F32)?);
        let op = FusedOp::LayerNorm { rows, cols: c, eps };
        if c > 0 && try_fused(self.device(), op, &[self.buffer(), weight.buffer(), bias.buffer(), &y, &mean, &rstd])? {
            return Ok(Tensor::result(y, self.shape().clone(), self.device(), GradOp::LayerNorm { mean, rstd }, &[self, weight, bias]));
        }
        let x = self.reshape([rows, c])?;
        let centred = x.sub(&x.mean(-1, true)?)?;
        let var = centred.square()?.mean(-1, true)?;
        let y = centred.div(&var.add_scalar(eps)?.sqrt()?)?.reshape(self.shape().clone())?;
        y.mul(weight)?.add(bias)
    }

    /// `softmax(x · scale + causal)` over the last axis of `[.., T, T]`, where `causal` is -inf
    /// above the diagonal (key after query): a transformer's attention weights.
    pub fn causal_softmax(&self, scale: f32) -> Result<Tensor> {
        let d = self.dims();
        if d.len() < 2 || d[d.len() - 1] != d[d.len() - 2] {
            return Err(Error::shape("causal_softmax", format!("input {:?}: need [.., T, T]", self.shape())));
        }
        let t = d[d.len() - 1];
        let n = self.numel() / (t * t).max(1);
        if let Some(y) = self.fused_halves(FusedOp::CausalSoftmax { n, t, scale }, GradOp::CausalSoftmax { scale })? {
            return Ok(y);
        }
        if let Some(y) = Tensor::in_f32(&[self], |x| x[0].causal_softmax(scale))? {
            return Ok(y);
        }
        let y = self.alloc_like(self.numel(), DType::F32)?;
        if t > 0 && try_fused(self.device(), FusedOp::CausalSoftmax { n, t, scale }, &[self.buffer(), &y])? {
            return Ok(Tensor::result(y, self.shape().clone(), self.device(), GradOp::CausalSoftmax { scale }, &[self]));
        }
        self.mul_scalar(scale)?.masked_fill(&causal_mask(t, self.device())?, f32::NEG_INFINITY)?.softmax(-1)
    }

    /// Causal self-attention of `q`, `k`, `v` `[N, T, D]` (N = batch × heads):
    /// `softmax(q·kᵀ · scale + causal) · v`. Fused, only the output and each row's logsumexp
    /// are kept for the backward, which recomputes the weights (FlashAttention's idea).
    pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
        if q.rank() != 3 || k.shape() != q.shape() || v.shape() != q.shape() {
            return Err(Error::shape(
                "causal_attention",
                format!("q {:?}, k {:?}, v {:?}: need three equal [N, T, D]", q.shape(), k.shape(), v.shape()),
            ));
        }
        q.same_device("causal_attention", k)?;
        q.same_device("causal_attention", v)?;
        if let Some(y) = Tensor::in_f32(&[q, k, v], |t| Tensor::causal_attention(&t[0], &t[1], &t[2], scale))? {
            return Ok(y);
        }
        let [n, t, d] = [q.dims()[0], q.dims()[1], q.dims()[2]];
        let (o, lse) = (q.alloc_like(q.numel(), DType::F32)?, q.alloc_like(n * t, DType::F32)?);
        let op = FusedOp::Attention { n, t, d, scale };
        if q.numel() > 0 && try_fused(q.device(), op, &[q.buffer(), k.buffer(), v.buffer(), &o, &lse])? {
            return Ok(Tensor::result(o, q.shape().clone(), q.device(), GradOp::Attention { scale, lse }, &[q, k, v]));
        }
        q.matmul_t(k, false, true)?.causal_softmax(scale)?.matmul(v)
    }

    /// `gelu_tanh` in one pass where the device fuses it; `None` where it composes.
    pub(crate) fn gelu_tanh_fused(&self) -> Result<Option<Tensor>> {
        self.expect_dtype("gelu_tanh", DType::F32)?;
        let op = FusedOp::GeluTanh { len: self.numel() };
        if self.numel() == 0 || !may_fuse(self.device(), &op) {
            return Ok(None);
        }
        let y = self.alloc_like(self.numel(), DType::F32)?;
        if !try_fused(self.device(), op, &[self.buffer(), &y])? {
            return Ok(None);
        }
        Ok(Some(Tensor::result(y, self.shape().clone(), self.device(), GradOp::GeluTanh, &[self])))
    }

    /// dL/dx of `gelu_tanh` at `self` for `g` = dL/dy (PyTorch's gradient).
    pub(crate) fn gelu_tanh_backward(&self, g: &Tensor) -> Result<Tensor> {
        let op = FusedOp::GeluTanhBackward { len: self.numel() };
        if self.numel() > 0 && g.shape() == self.shape() && may_fuse(self.device(), &op) {
            let dx = self.alloc_like(self.numel(), DType::F32)?;
            if try_fused(self.device(), op, &[g.buffer(), self.buffer(), &dx])? {
                return Ok(Tensor::from_parts(dx, self.shape().clone(), self.device().clone(), None));
            }
        }
        let x = self;
        let t = gelu_tanh_inner(x)?.tanh()?;
        let left = t.affine(0.5, 0.5)?;
        let slope = x.square()?.affine(3.0 * GELU_KAPPA, 1.0)?.mul_scalar(GELU_BETA)?;
        let right = x.mul_scalar(0.5)?.mul(&t.square()?.affine(-1.0, 1.0)?)?.mul(&slope)?;
        g.mul(&left.add(&right)?)
    }

    /// The gradients of `layer_norm` (see `GradOp::LayerNorm`) for `g` = dL/dy.
    pub(crate) fn layer_norm_backward(&self, w: &Tensor, g: &Tensor, mean: &Tensor, rstd: &Tensor) -> Result<[Tensor; 3]> {
        let c = w.numel();
        let rows = self.numel() / c;
        let dev = self.device();
        let blocks = ln_blocks(rows);
        let (dx, dwp, dbp) =
            (self.alloc_like(self.numel(), DType::F32)?, self.alloc_like(blocks * c, DType::F32)?, self.alloc_like(blocks * c, DType::F32)?);
        let bufs = [g.buffer(), self.buffer(), w.buffer(), mean.buffer(), rstd.buffer(), &dx, &dwp, &dbp];
        if try_fused(dev, FusedOp::LayerNormBackward { rows, cols: c }, &bufs)? {
            let part = |b| Tensor::from_parts(b, Shape(vec![blocks, c]), dev.clone(), None).sum(0, false);
            return Ok([Tensor::from_parts(dx, self.shape().clone(), dev.clone(), None), part(dwp)?, part(dbp)?]);
        }
        let (x, g) = (self.reshape([rows, c])?, g.reshape([rows, c])?);
        let (mean, rstd) = (mean.reshape([rows, 1])?, rstd.reshape([rows, 1])?);
        let xhat = x.sub(&mean)?.mul(&rstd)?;
        let gw = g.mul(w)?;
        let dx = gw.sub(&gw.mean(-1, true)?)?.sub(&xhat.mul(&gw.mul(&xhat)?.mean(-1, true)?)?)?.mul(&rstd)?;
        Ok([dx.reshape(self.shape().clone())?, g.mul(&xhat)?.sum(0, false)?, g.sum(0, false)?])
    }

    /// dL/dx of `causal_softmax` from its output `self` and `g` = dL/dy.
    pub(crate) fn causal_softmax_backward(&self, g: &Tensor, scale: f32) -> Result<Tensor> {
        let t = self.dims()[self.rank() - 1];
        let n = self.numel() / (t * t);
        let dx = self.alloc_like(self.numel(), DType::F32)?;
        if try_fused(self.device(), FusedOp::CausalSoftmaxBackward { n, t, scale }, &[g.buffer(), self.buffer(), &dx])? {
            return Ok(Tensor::from_parts(dx, self.shape().clone(), self.device().clone(), None));
        }
        g.sub(&g.mul(self)?.sum(-1, true)?)?.mul(self)?.mul_scalar(scale)
    }

    /// dL/dq, dL/dk, dL/dv of `causal_attention` from its output `o`, the saved `lse` and
    /// `g` = dL/do.
    pub(crate) fn causal_attention_backward(qkv: [&Tensor; 3], o: &Tensor, lse: &Tensor, g: &Tensor, scale: f32) -> Result<[Tensor; 3]> {
        let [q, k, v] = qkv;
        let [n, t, d] = [q.dims()[0], q.dims()[1], q.dims()[2]];
        let dev = q.device();
        let outs = [q.alloc_like(q.numel(), DType::F32)?, q.alloc_like(q.numel(), DType::F32)?, q.alloc_like(q.numel(), DType::F32)?];
        let delta = q.alloc_like(n * t, DType::F32)?;
        let bufs = [q.buffer(), k.buffer(), v.buffer(), o.buffer(), lse.buffer(), g.buffer(), &outs[0], &outs[1], &outs[2], &delta];
        if try_fused(dev, FusedOp::AttentionBackward { n, t, d, scale }, &bufs)? {
            return Ok(outs.map(|b| Tensor::from_parts(b, q.shape().clone(), dev.clone(), None)));
        }
        let p = autograd::no_grad(|| composed(|| q.matmul_t(k, false, true)?.causal_softmax(scale)))?;
        let dv = p.matmul_t(g, true, false)?;
        let ds = p.causal_softmax_backward(&g.matmul_t(v, false, true)?, scale)?;
        Ok([ds.matmul(k)?, ds.matmul_t(q, true, false)?, dv])
    }
}
