//! Ops composed from the primitives (so the backend trait stays small): activations, `where`,
//! `clamp`, variance, shape helpers, `arange`, `one_hot`, `triu`/`tril`, `index_select` (a
//! primitive gather), and average pooling.
use super::Tensor;
use crate::autograd::{self, GradOp};
use crate::backend::{BinaryOp, IndexOp, GELU_BETA, GELU_KAPPA};
use crate::{DType, Device, Error, Result, Shape};

/// `β (x + κ x³)`, the argument of the tanh in `gelu_tanh`, shared with its gradient.
pub(crate) fn gelu_tanh_inner(x: &Tensor) -> Result<Tensor> {
    autograd::no_grad(|| x.add(&x.powf(3.0)?.mul_scalar(GELU_KAPPA)?)?.mul_scalar(GELU_BETA))
}

impl Tensor {
    /// `x · Φ(x) = 0.5 x (1 + erf(x / √2))`, PyTorch's exact GELU (and its gradient).
    pub fn gelu(&self) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].gelu())? {
            return Ok(y);
        }
        let y = autograd::no_grad(|| self.mul(&self.mul_scalar(std::f32::consts::FRAC_1_SQRT_2)?.erf()?.affine(0.5, 0.5)?))?;
        Ok(Tensor::result(y.buffer().clone(), y.shape().clone(), self.device(), autograd::GradOp::Gelu, &[self]))
    }
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, GELU with `approximate='tanh'` (and
    /// PyTorch's gradient).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        if let Some(y) = self.fused_halves(crate::backend::FusedOp::GeluTanh { len: self.numel() }, GradOp::GeluTanh)? {
            return Ok(y);
        }
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].gelu_tanh())? {
            return Ok(y);
        }
        if let Some(y) = self.gelu_tanh_fused()? {
            return Ok(y);
        }
        let y = autograd::no_grad(|| self.mul(&gelu_tanh_inner(self)?.tanh()?.affine(0.5, 0.5)?))?;
        Ok(Tensor::result(y.buffer().clone(), y.shape().clone(), self.device(), GradOp::GeluTanh, &[self]))
    }
    /// `x · sigmoid(x)` (and PyTorch's gradient).
    pub fn silu(&self) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].silu())? {
            return Ok(y);
        }
        let y = autograd::no_grad(|| self.mul(&self.sigmoid()?))?;
        Ok(Tensor::result(y.buffer().clone(), y.shape().clone(), self.device(), autograd::GradOp::Silu, &[self]))
    }

    /// `self` where `cond` is nonzero (F32, broadcast), else `other`. The other side is
    /// selected away, not multiplied by 0, so a NaN or infinity there does not leak (PyTorch's
    /// `torch.where(cond, self, other)`); each side's gradient is the incoming one where chosen.
    pub fn where_(&self, cond: &Tensor, other: &Tensor) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self, cond, other], |t| t[0].where_(&t[1], &t[2]))? {
            return Ok(y);
        }
        cond.expect_dtype("where", DType::F32)?;
        let shape = Shape::broadcast("where", &Shape::broadcast("where", self.shape(), other.shape())?, cond.shape())?;
        let pick = cond.ne_zero()?;
        // each side kept where chosen (+0 elsewhere) and times 1 where chosen, -1 elsewhere: -0
        // where not chosen, the zero that leaves the other side exact when added (+0 would turn
        // a chosen -0 into +0), while the gradient where not chosen is still +0, as PyTorch's
        let side = |t: &Tensor, keep: &Tensor| t.broadcast_to(shape.clone())?.binary(BinaryOp::ReluBackward, keep)?.mul(&keep.affine(2.0, -1.0)?);
        side(self, &pick)?.add(&side(other, &pick.affine(-1.0, 1.0)?)?)
    }
    /// 1 where this is nonzero (NaN counts as nonzero, as `bool(nan)`), else 0; no gradient.
    fn ne_zero(&self) -> Result<Tensor> {
        autograd::no_grad(|| self.eq_elem(&Tensor::zeros(Shape(vec![]), self.device())?)?.affine(-1.0, 1.0))
    }
    /// `value` where `mask` is nonzero, else `self`.
    pub fn masked_fill(&self, mask: &Tensor, value: f32) -> Result<Tensor> {
        Tensor::full(value, Shape(vec![]), self.device())?.where_(mask, self)
    }
    /// Each value limited to `[min, max]` (either bound optional). NaN stays NaN, a value at
    /// a bound stays itself (-0 against a bound of 0 too); the gradient passes only strictly
    /// inside the bounds, so not at a bound nor for NaN (PyTorch's).
    pub fn clamp(&self, min: Option<f32>, max: Option<f32>) -> Result<Tensor> {
        let dev = self.device();
        let x = self.detach();
        let mut bounded = x.clone();
        let mut inside = Tensor::ones(Shape(vec![]), dev)?;
        if let Some(lo) = min {
            let lo = Tensor::full(lo, Shape(vec![]), dev)?;
            bounded = lo.where_(&lo.gt(&x)?, &bounded)?;
            inside = inside.mul(&x.gt(&lo)?)?;
        }
        if let Some(hi) = max {
            let hi = Tensor::full(hi, Shape(vec![]), dev)?;
            bounded = hi.where_(&x.gt(&hi)?, &bounded)?;
            inside = inside.mul(&hi.gt(&x)?)?;
        }
        self.where_(&inside, &bounded)
    }

    /// Mean over several axes (kept, size 1): a sum per axis, then one division by the count
    /// (a mean per axis would round once per axis); NaN over nothing.
    pub fn mean_axes(&self, axes: &[isize]) -> Result<Tensor> {
        let mut n = 1usize;
        let mut t = self.clone();
        for &a in axes {
            n *= self.dims()[self.shape().axis("mean_axes", a)?];
            t = t.sum(a, true)?;
        }
        t.div(&Tensor::full(n as f32, Shape(vec![]), self.device())?)
    }
    /// Variance over `axis` with Bessel's `correction` (1: unbiased, PyTorch's default; 0: biased)
    /// and PyTorch's gradient `2 g (x - mean) / (n - correction)`.
    pub fn var(&self, axis: isize, correction: usize, keepdim: bool) -> Result<Tensor> {
        let a = self.shape().axis("var", axis)?;
        let v = autograd::no_grad(|| self.shifted_var(a, correction, keepdim, false).map(|(_, v)| v))?;
        Ok(Tensor::result(v.buffer().clone(), v.shape().clone(), self.device(), autograd::GradOp::Var { axis: a, correction, std: false }, &[self]))
    }
    /// Standard deviation, finite where the variance overflows, with PyTorch's gradient (that of
    /// the variance times `1 / (2 std)`, and 0 where std is 0).
    pub fn std(&self, axis: isize, correction: usize, keepdim: bool) -> Result<Tensor> {
        let a = self.shape().axis("std", axis)?;
        let s = autograd::no_grad(|| self.shifted_var(a, correction, keepdim, true).and_then(|(scale, v)| v.sqrt()?.mul(&scale)))?;
        Ok(Tensor::result(s.buffer().clone(), s.shape().clone(), self.device(), autograd::GradOp::Var { axis: a, correction, std: true }, &[self]))
    }
    /// `(s, v)` with variance `v s²`: the values shifted by their first one along axis `a` (a
    /// constant row's variance is exactly 0 however its mean rounds) and, if `scale`, divided
    /// by their largest magnitude `s` (1 where that is 0), so that the squares overflow only
    /// where the standard deviation itself does; without `scale`, `s` is 1.
    fn shifted_var(&self, a: usize, correction: usize, keepdim: bool, scale: bool) -> Result<(Tensor, Tensor)> {
        let n = self.dims()[a];
        let axis = a as isize;
        let dev = self.device();
        let one = Tensor::ones(Shape(vec![]), dev)?;
        // PyTorch divides by max(n - correction, 0): 0/0 = NaN where n = correction, x/0 beyond
        let div = Tensor::full((n as f32 - correction as f32).max(0.0), Shape(vec![]), dev)?;
        if n == 0 {
            return Ok((one, self.sum(axis, keepdim)?.div(&div)?));
        }
        let d = self.sub(&self.narrow(a, 0, 1)?)?;
        let (s, u) = if scale {
            let m = d.abs()?.max(axis, true)?;
            let s = m.add(&m.eq_elem(&Tensor::zeros(Shape(vec![]), dev)?)?)?;
            let u = d.div(&s)?;
            (s, u)
        } else {
            (one, d)
        };
        let v = u.sub(&u.mean(axis, true)?)?.square()?.sum(axis, keepdim)?.div(&div)?;
        Ok((s.reshape(if scale { v.dims().to_vec() } else { vec![] })?, v))
    }

    /// A new dimension of size 1 at `dim` (0 ..= rank; negative counts from the end).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let r = self.rank() as isize;
        let d = if dim < 0 { dim + r + 1 } else { dim };
        if !(0..=r).contains(&d) {
            return Err(Error::shape("unsqueeze", format!("dim {dim} for {:?}", self.shape())));
        }
        let mut dims = self.dims().to_vec();
        dims.insert(d as usize, 1);
        self.reshape(dims)
    }
    /// Removes dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = self.shape().axis("squeeze", dim)?;
        if self.dims()[d] != 1 {
            return Err(Error::shape("squeeze", format!("dim {dim} of {:?} is not 1", self.shape())));
        }
        let mut dims = self.dims().to_vec();
        dims.remove(d);
        self.reshape(dims)
    }
    /// Joins equal-shaped tensors along a new dimension `dim`.
    pub fn stack(tensors: &[Tensor], dim: usize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::invalid("stack", "no tensors"))?;
        if tensors.iter().any(|t| t.shape() != first.shape()) || dim > first.rank() {
            let shapes: Vec<_> = tensors.iter().map(|t| t.shape().clone()).collect();
            return Err(Error::shape("stack", format!("cannot stack {shapes:?} at dim {dim}")));
        }
        let parts = tensors.iter().map(|t| t.unsqueeze(dim as isize)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, dim)
    }
    /// `start, start + step, ..` below `end` (F32), as `torch.arange`.
    pub fn arange(start: f32, end: f32, step: f32, device: &Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() || (end - start) / step < 0.0 {
            return Err(Error::invalid("arange", format!("start {start}, end {end}, step {step}")));
        }
        // in f64 as PyTorch: the length and each value rounded once
        let (s, e, st) = (start as f64, end as f64, step as f64);
        let n = ((e - s) / st).ceil() as usize;
        let values = crate::backend::host::try_collect(n, (0..n).map(|i| (s + i as f64 * st) as f32), "host", &format!("arange of {n} values"))?;
        Tensor::from_vec(values, [n], device)
    }
    /// F32 one-hot rows `[.., classes]` of I32 class indices of any shape, all in `0..classes`.
    pub fn one_hot(&self, classes: usize) -> Result<Tensor> {
        self.check_labels("one_hot", classes)?;
        self.one_hot_unchecked(classes)
    }
    /// `one_hot` where an index outside `0..classes` gives a row of zeros (the `IndexOp` contract).
    pub(crate) fn one_hot_unchecked(&self, classes: usize) -> Result<Tensor> {
        self.expect_dtype("one_hot", DType::I32)?;
        let rows = self.numel();
        let ones = self.alloc_like(rows, DType::F32)?;
        self.backend().fill(&ones, 1.0)?;
        let out = self.alloc_like(rows * classes, DType::F32)?;
        self.backend().index(IndexOp::Scatter, &ones, &self.0.buffer, &out, rows, classes)?;
        let mut dims = self.dims().to_vec();
        dims.push(classes);
        Ok(Tensor::from_parts(out, Shape(dims), self.device().clone(), None))
    }
    /// Keeps the upper triangle of the last two dimensions (`j - i >= diagonal`), zeroes the rest.
    pub fn triu(&self, diagonal: isize) -> Result<Tensor> {
        self.triangle("triu", diagonal, |i, j, d| j - i >= d)
    }
    /// Keeps the lower triangle of the last two dimensions (`j - i <= diagonal`), zeroes the rest.
    pub fn tril(&self, diagonal: isize) -> Result<Tensor> {
        self.triangle("tril", diagonal, |i, j, d| j - i <= d)
    }
    fn triangle(&self, op: &'static str, diagonal: isize, keep: fn(isize, isize, isize) -> bool) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::shape(op, format!("needs rank >= 2, got {:?}", self.shape())));
        }
        let (r, c) = (self.dims()[self.rank() - 2], self.dims()[self.rank() - 1]);
        let n = r.saturating_mul(c);
        let mask =
            crate::backend::host::try_collect(n, (0..n).map(|k| keep((k / c) as isize, (k % c) as isize, diagonal) as i32 as f32), "host", op)?;
        let mask = Tensor::from_vec(mask, [r, c], self.device())?;
        self.where_(&mask, &Tensor::zeros(Shape(vec![]), self.device())?)
    }
    /// Rows of this `[V, D]` table picked by I32 `ids` of any shape: `[.., D]` (an embedding
    /// lookup, `F.embedding(ids, table)`); an id outside `0..V` is an error naming it and V.
    /// One gather pass; the table's gradient is a scatter-add that sums each row's gradients in
    /// ascending position (no atomics: the same bits every run, on every device count).
    pub fn index_select(&self, ids: &Tensor) -> Result<Tensor> {
        self.same_device("index_select", ids)?;
        self.expect_dtype("index_select", DType::F32)?;
        ids.expect_dtype("index_select", DType::I32)?;
        if self.rank() != 2 {
            return Err(Error::shape("index_select", format!("table must be [V, D], got {:?}", self.shape())));
        }
        let (v, d) = (self.dims()[0], self.dims()[1]);
        ids.check_labels("index_select", v)?;
        let out = self.alloc_like(ids.numel() * d, DType::F32)?;
        self.backend().index(IndexOp::GatherRows { table_rows: v }, &self.0.buffer, &ids.0.buffer, &out, ids.numel(), d)?;
        let mut dims = ids.dims().to_vec();
        dims.push(d);
        Ok(Tensor::result(out, Shape(dims), self.device(), GradOp::GatherRows { table_rows: v }, &[self, ids]))
    }

    /// Average over `kernel`×`kernel` windows of `[N, C, H, W]`, zero padding counted (PyTorch's
    /// default): a convolution of each channel with a constant `1/k²` kernel.
    pub fn avg_pool2d(&self, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
        let x = self.dims();
        if self.rank() != 4 || kernel == 0 || padding * 2 > kernel {
            return Err(Error::shape(
                "avg_pool2d",
                format!("input {:?} kernel {kernel} padding {padding} (need [N,C,H,W], padding <= kernel/2)", self.shape()),
            ));
        }
        let (n, c) = (x[0], x[1]);
        let w = Tensor::full(1.0 / (kernel * kernel) as f32, [1, 1, kernel, kernel], self.device())?;
        let y = self.reshape([n * c, 1, x[2], x[3]])?.conv2d(&w, (stride, stride), (padding, padding))?;
        let (oh, ow) = (y.dims()[2], y.dims()[3]);
        // + 0: a window of zeros averages to +0, as PyTorch's sum from +0 (a product may be -0)
        y.reshape([n, c, oh, ow])?.add_scalar(0.0)
    }
    /// PyTorch's adaptive average pooling to `(oh, ow)`: cell `(i, j)` averages rows
    /// `floor(i·H/oh) .. ceil((i+1)·H/oh)` and likewise columns, summed and then divided once
    /// by the cell's size.
    pub fn adaptive_avg_pool2d(&self, (oh, ow): (usize, usize)) -> Result<Tensor> {
        if self.rank() != 4 || oh == 0 || ow == 0 {
            return Err(Error::shape("adaptive_avg_pool2d", format!("input {:?} to ({oh}, {ow}) (need [N,C,H,W] and a nonzero size)", self.shape())));
        }
        let cells = |len: usize, out: usize| -> Vec<(usize, usize)> { (0..out).map(|i| (i * len / out, ((i + 1) * len).div_ceil(out))).collect() };
        let (rows, cols) = (cells(self.dims()[2], oh), cells(self.dims()[3], ow));
        let pool = |t: &Tensor, dim: usize, cells: &[(usize, usize)]| -> Result<Tensor> {
            let sums = cells.iter().map(|&(s, e)| t.narrow(dim, s, e - s)?.sum(dim as isize, true)).collect::<Result<Vec<_>>>()?;
            Tensor::cat(&sums, dim)
        };
        let sizes: Vec<f32> = rows.iter().flat_map(|&(r0, r1)| cols.iter().map(move |&(c0, c1)| ((r1 - r0) * (c1 - c0)) as f32)).collect();
        pool(&pool(self, 2, &rows)?, 3, &cols)?.div(&Tensor::from_vec(sizes, [oh, ow], self.device())?)
    }
}
