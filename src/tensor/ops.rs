//! Elementwise arithmetic, reductions and losses on tensors.
use super::Tensor;
use crate::autograd::GradOp;
use crate::backend::{BinaryOp, CastOp, IndexOp, ReduceOp, ReduceSpec, UnaryOp};
use crate::{DType, Error, Layout, Result, Shape};

impl Tensor {
    /// Applies an elementwise op (recorded for autograd).
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if let Some(y) = self.unary_halves(op)? {
            return Ok(y);
        }
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].unary(op))? {
            return Ok(y);
        }
        self.expect_dtype("unary", DType::F32)?;
        let out = self.alloc_like(self.numel(), DType::F32)?;
        self.backend().unary(op, &self.0.buffer, &self.layout(), &out)?;
        Ok(Tensor::result(out, self.shape().clone(), self.device(), GradOp::Unary(op), &[self]))
    }
    crate::backend::op_table::unary_ops!(methods);
    /// `self ^ p`, PyTorch's `pow` with a scalar exponent.
    pub fn powf(&self, p: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Powf(p))
    }
    /// `self * mul + add`.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine { mul, add })
    }
    /// `self * s`; adds -0, not +0, so that -0 · s keeps its sign as in PyTorch.
    pub fn mul_scalar(&self, s: f32) -> Result<Tensor> {
        self.affine(s, -0.0)
    }
    pub fn add_scalar(&self, s: f32) -> Result<Tensor> {
        self.affine(1.0, s)
    }

    /// Broadcasting elementwise op of two tensors (recorded for autograd).
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        let name = op.name();
        self.same_device(name, other)?;
        if let Some(y) = self.binary_halves(op, other)? {
            return Ok(y);
        }
        if let Some(y) = Tensor::in_f32(&[self, other], |t| t[0].binary(op, &t[1]))? {
            return Ok(y);
        }
        self.expect_dtype(name, DType::F32)?;
        other.expect_dtype(name, DType::F32)?;
        let shape = Shape::broadcast(name, self.shape(), other.shape())?;
        let la = Layout::broadcast_to(self.shape(), &shape);
        let lb = Layout::broadcast_to(other.shape(), &shape);
        let out = self.alloc_like(shape.numel(), DType::F32)?;
        self.backend().binary(op, &self.0.buffer, &la, &other.0.buffer, &lb, &out)?;
        Ok(Tensor::result(out, shape, self.device(), GradOp::Binary(op), &[self, other]))
    }
    pub fn add(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, o)
    }
    pub fn sub(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, o)
    }
    pub fn mul(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, o)
    }
    pub fn div(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, o)
    }
    pub fn maximum(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Max, o)
    }
    pub fn minimum(&self, o: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Min, o)
    }
    /// 1 where `self > o`, else 0 (F32, broadcast); no gradient. Takes F32 or I32 operands
    /// (see `compare`).
    pub fn gt(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(BinaryOp::Gt, o)
    }
    /// 1 where `self == o`, else 0; F32 or I32 operands.
    pub fn eq_elem(&self, o: &Tensor) -> Result<Tensor> {
        self.compare(BinaryOp::Eq, o)
    }
    /// 1 where `self < o`, else 0; F32 or I32 operands.
    pub fn lt(&self, o: &Tensor) -> Result<Tensor> {
        o.gt(self)
    }
    /// 1 where `self >= o`, else 0 (`gt + eq`, so 0 where either is NaN, as PyTorch).
    pub fn ge(&self, o: &Tensor) -> Result<Tensor> {
        self.gt(o)?.add(&self.eq_elem(o)?)
    }
    /// 1 where `self <= o`, else 0.
    pub fn le(&self, o: &Tensor) -> Result<Tensor> {
        o.ge(self)
    }
    /// 1 where `self != o`, else 0 (1 where either is NaN, as PyTorch).
    pub fn ne(&self, o: &Tensor) -> Result<Tensor> {
        self.eq_elem(o)?.affine(-1.0, 1.0)
    }

    /// `Gt` or `Eq` of F32 or I32 operands. Two I32 operands compare exactly: as F32 casts where
    /// both are known to lie within ±2^24 (labels from the host), else through their exact
    /// 16-bit halves (`a > b` iff `hi(a) > hi(b)`, or equal high halves and `lo(a) > lo(b)`).
    /// One I32 with one F32 compares in F32, as PyTorch promotes int32 with float32.
    fn compare(&self, op: BinaryOp, o: &Tensor) -> Result<Tensor> {
        let name = op.name();
        self.same_device(name, o)?;
        if self.dtype() == DType::F32 && o.dtype() == DType::F32 {
            return self.binary(op, o);
        }
        let f32s = |t: &Tensor| if t.dtype() == DType::F32 { Ok(t.clone()) } else { t.to_dtype(DType::F32) };
        if self.dtype() != o.dtype() || [self, o].iter().all(|t| t.0.buffer.label_bound().is_some_and(|(lo, hi)| lo >= -(1 << 24) && hi <= 1 << 24)) {
            return f32s(self)?.binary(op, &f32s(o)?);
        }
        let half = |t: &Tensor, c: CastOp| -> Result<Tensor> {
            let out = t.alloc_like(t.numel(), DType::F32)?;
            t.backend().cast(c, &t.0.buffer, &out, t.numel())?;
            Ok(Tensor::from_parts(out, t.shape().clone(), t.device().clone(), None))
        };
        let (ha, hb) = (half(self, CastOp::I32High)?, half(o, CastOp::I32High)?);
        let (la, lb) = (half(self, CastOp::I32Low)?, half(o, CastOp::I32Low)?);
        let high_eq = ha.binary(BinaryOp::Eq, &hb)?;
        let low = la.binary(op, &lb)?.mul(&high_eq)?;
        match op {
            BinaryOp::Eq => Ok(low),
            _ => ha.binary(op, &hb)?.add(&low),
        }
    }

    /// The values as `dtype`: F32 to I32 truncates toward zero (PyTorch's `.to(torch.int32)`),
    /// saturating beyond the I32 range, with NaN giving 0 (PyTorch leaves both undefined);
    /// I32 to F32 rounds to the nearest F32 (exact within ±2^24). F32 to `Bf16` or `F16`
    /// rounds to nearest even (F16 overflows to ±inf past 65504; NaN stays NaN) and back is
    /// exact, with the same bits as PyTorch's `.to(torch.bfloat16)` and `.to(torch.float16)`;
    /// the gradient of those casts is the incoming gradient cast back. No gradient flows
    /// through a cast to or from I32, and a half type converts only to and from F32 (go
    /// through F32 between the others). The same dtype returns this tensor.
    ///
    /// ```
    /// # use tandem::{Device, DType, Tensor};
    /// let x = Tensor::from_vec(vec![1.0, 1.0 + 1.0 / 256.0, 70000.0], [3], &Device::cpu())?;
    /// assert_eq!(x.to_dtype(DType::Bf16)?.to_vec()?, [1.0, 1.0, 70144.0]);
    /// assert_eq!(x.to_dtype(DType::F16)?.to_vec()?, [1.0, 1.00390625, f32::INFINITY]);
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let from = self.dtype();
        if from == dtype {
            return Ok(self.clone());
        }
        let op = CastOp::between(from, dtype)
            .ok_or_else(|| Error::invalid("to_dtype", format!("no cast from {from:?} to {dtype:?} (a half type converts to and from F32 only)")))?;
        let out = self.alloc_like(self.numel(), dtype)?;
        self.backend().cast(op, &self.0.buffer, &out, self.numel())?;
        if from == DType::I32 || dtype == DType::I32 {
            return Ok(Tensor::from_parts(out, self.shape().clone(), self.device().clone(), None));
        }
        Ok(Tensor::result(out, self.shape().clone(), self.device(), GradOp::Cast { from }, &[self]))
    }

    fn reduce_raw(&self, op: ReduceOp, axis: usize, keepdim: bool) -> Result<(crate::backend::Buffer, Shape)> {
        let d = self.dims();
        let spec = ReduceSpec { outer: d[..axis].iter().product(), len: d[axis], inner: d[axis + 1..].iter().product() };
        if spec.len == 0 && op != ReduceOp::Sum {
            return Err(Error::shape("reduce", format!("{op:?} over an empty axis of {:?}", self.shape())));
        }
        let dtype = if op == ReduceOp::ArgMax { DType::I32 } else { DType::F32 };
        let out = self.alloc_like(spec.outer * spec.inner, dtype)?;
        self.backend().reduce(op, &self.0.buffer, spec, &out)?;
        let mut shape = d.to_vec();
        if keepdim {
            shape[axis] = 1;
        } else {
            shape.remove(axis);
        }
        Ok((out, Shape(shape)))
    }
    /// Sum over `axis` (negative counts from the end).
    pub fn sum(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].sum(axis, keepdim))? {
            return Ok(y);
        }
        self.expect_dtype("sum", DType::F32)?;
        let a = self.shape().axis("sum", axis)?;
        let (out, shape) = self.reduce_raw(ReduceOp::Sum, a, keepdim)?;
        Ok(Tensor::result(out, shape, self.device(), GradOp::Sum { axis: a }, &[self]))
    }
    pub fn mean(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = self.shape().axis("mean", axis)?;
        // an empty axis gives 0 · (1/0) = NaN, as in PyTorch
        let n = self.dims()[a] as f32;
        self.sum(axis, keepdim)?.mul_scalar(1.0 / n)
    }
    /// Maximum over `axis`; the gradient is shared evenly between tied maxima.
    pub fn max(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].max(axis, keepdim))? {
            return Ok(y);
        }
        self.expect_dtype("max", DType::F32)?;
        let a = self.shape().axis("max", axis)?;
        let (out, shape) = self.reduce_raw(ReduceOp::Max, a, keepdim)?;
        Ok(Tensor::result(out, shape, self.device(), GradOp::Max { axis: a }, &[self]))
    }
    pub fn min(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.neg()?.max(axis, keepdim)?.neg()
    }
    /// Index of the first maximum along `axis`, as I32.
    pub fn argmax(&self, axis: isize) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].argmax(axis))? {
            return Ok(y);
        }
        self.expect_dtype("argmax", DType::F32)?;
        let a = self.shape().axis("argmax", axis)?;
        let (out, shape) = self.reduce_raw(ReduceOp::ArgMax, a, false)?;
        Ok(Tensor::from_parts(out, shape, self.device().clone(), None))
    }
    pub fn sum_all(&self) -> Result<Tensor> {
        self.flatten_all()?.sum(0, false)
    }
    pub fn mean_all(&self) -> Result<Tensor> {
        let n = self.numel() as f32;
        self.sum_all()?.mul_scalar(1.0 / n)
    }

    /// Numerically stable softmax along `axis`, `exp(log_softmax)`, with PyTorch's gradient.
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].softmax(axis))? {
            return Ok(y);
        }
        let a = self.shape().axis("softmax", axis)?;
        let y = crate::autograd::no_grad(|| self.log_softmax(axis)?.exp())?;
        Ok(Tensor::result(y.0.buffer.clone(), y.shape().clone(), self.device(), GradOp::Softmax { axis: a }, &[self]))
    }
    /// `x - max - log(sum(exp(x - max)))` along `axis`; the max is a constant shift, so it is
    /// detached (the result's gradient does not depend on it).
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].log_softmax(axis))? {
            return Ok(y);
        }
        let m = self.detach().max(axis, true)?;
        let z = self.sub(&m)?;
        let lse = z.exp()?.sum(axis, true)?.log()?;
        z.sub(&lse)
    }

    /// Picks `self[r, labels[r]]` from `[rows, cols]`; labels are I32 `[rows]`.
    pub fn gather_rows(&self, labels: &Tensor) -> Result<Tensor> {
        self.same_device("gather_rows", labels)?;
        if let Some(y) = Tensor::in_f32(&[self, labels], |t| t[0].gather_rows(&t[1]))? {
            return Ok(y);
        }
        labels.expect_dtype("gather_rows", DType::I32)?;
        if self.rank() != 2 || labels.dims() != [self.dims()[0]] {
            return Err(Error::shape(
                "gather_rows",
                format!(
                    "input {:?} needs rank 2 and labels [{}], got labels {:?}",
                    self.shape(),
                    self.dims().first().copied().unwrap_or(0),
                    labels.shape()
                ),
            ));
        }
        let (rows, cols) = (self.dims()[0], self.dims()[1]);
        labels.check_labels("gather_rows", cols)?;
        let out = self.alloc_like(rows, DType::F32)?;
        self.backend().index(IndexOp::Gather, &self.0.buffer, &labels.0.buffer, &out, rows, cols)?;
        Ok(Tensor::result(out, Shape(vec![rows]), self.device(), GradOp::Gather { cols }, &[self, labels]))
    }

    /// Mean cross-entropy of `[N, C]` logits against I32 class indices `[N]`, as PyTorch's
    /// `CrossEntropyLoss()` (reduction mean).
    pub fn cross_entropy(&self, labels: &Tensor) -> Result<Tensor> {
        if self.dtype().is_half() {
            // Losses compute from F32 whatever their input (autocast's rule).
            return self.upcast()?.cross_entropy(labels);
        }
        if self.rank() != 2 {
            return Err(Error::shape("cross_entropy", format!("logits must be [N, C], got {:?}", self.shape())));
        }
        labels.check_labels("cross_entropy", self.dims()[1])?;
        // negated before the mean, as PyTorch's nll_loss: a loss of 0 is +0, not -0
        self.log_softmax(1)?.gather_rows(labels)?.neg()?.mean_all()
    }
    /// Mean squared error, as PyTorch's `MSELoss()`; shapes must match exactly and the targets
    /// must be F32 values. Any other targets (such as I32 class labels, which go with
    /// [`cross_entropy`](Tensor::cross_entropy)) are an [`Error::Invalid`] of `mse_loss` naming
    /// their dtype and shape.
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        if self.dtype().is_half() || target.dtype().is_half() {
            return self.upcast()?.mse_loss(&target.upcast()?);
        }
        if target.dtype() != DType::F32 {
            return Err(Error::invalid(
                "mse_loss",
                format!(
                    "targets are {:?} {:?}; MSE expects F32 targets of the prediction's shape {:?} (class labels go with cross_entropy)",
                    target.dtype(),
                    target.shape(),
                    self.shape()
                ),
            ));
        }
        if self.shape() != target.shape() {
            return Err(Error::shape("mse_loss", format!("prediction {:?} vs target {:?}", self.shape(), target.shape())));
        }
        self.sub(target)?.square()?.mean_all()
    }
}
