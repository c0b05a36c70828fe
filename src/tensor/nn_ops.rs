//! Matrix products, convolution and pooling on tensors.
use super::Tensor;
use crate::autograd::GradOp;
use crate::backend::{MatmulSpec, ReduceOp, ReduceSpec, WindowSpec};
use crate::{DType, Error, Result, Shape};

impl Tensor {
    /// Matrix product with `torch.matmul`'s rules: the last two dimensions multiply, the
    /// batch dimensions before them broadcast (`[B,H,T,d]·[B,H,d,T]`, `[B,T,C]·[C,N]`,
    /// `[2,1,3,4]·[5,4,6]` → `[2,5,3,6]`), and a 1-D operand is a row (left) or a column
    /// (right) whose dimension is removed from the result (`[k]·[k]` is a scalar).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        if self.rank() != 1 && other.rank() != 1 {
            return self.matmul_t(other, false, false);
        }
        let (ka, kb) = (self.dims().last().copied(), other.dims().get(other.rank().saturating_sub(2)).copied());
        if self.rank() == 0 || other.rank() == 0 || ka != kb {
            return Err(Error::shape(
                "matmul",
                format!("{:?} · {:?}: inner dimensions differ or an operand is a scalar", self.shape(), other.shape()),
            ));
        }
        let a = if self.rank() == 1 { self.unsqueeze(0)? } else { self.clone() };
        let b = if other.rank() == 1 { other.unsqueeze(1)? } else { other.clone() };
        let mut y = a.matmul_t(&b, false, false)?;
        if other.rank() == 1 {
            y = y.squeeze(-1)?;
        }
        if self.rank() == 1 {
            y = y.squeeze(if other.rank() == 1 { -1 } else { -2 })?;
        }
        Ok(y)
    }

    /// `op(self) · op(other)` where `op` transposes the last two dimensions when its flag is
    /// set, without copying (the backends read transposed operands directly); both operands of
    /// rank 2 or more, batch dimensions broadcast as in `matmul`. An operand whose batch is one
    /// matrix is read for every batch entry (batch stride 0), and a batch times one matrix is
    /// one product over the stacked rows; only an operand broadcast along some batch dimensions
    /// and not others is copied out to the full batch.
    pub fn matmul_t(&self, other: &Tensor, trans_a: bool, trans_b: bool) -> Result<Tensor> {
        self.same_device("matmul", other)?;
        if crate::autocast_dtype().is_some() && (self.dtype() == DType::F32 || other.dtype() == DType::F32) {
            return self.autocast_operand()?.matmul_t(&other.autocast_operand()?, trans_a, trans_b);
        }
        // Halves are read directly where the backend can (`Tensor::half_product_here`), else
        // the product runs on f32 copies.
        let halves = self.dtype().is_half() || other.dtype().is_half();
        if halves && self.half_product_here(other, trans_a).is_none() {
            if let Some(y) = Tensor::in_f32(&[self, other], |t| t[0].matmul_t(&t[1], trans_a, trans_b))? {
                return Ok(y);
            }
        }
        for t in [self, other] {
            if !t.dtype().is_half() {
                t.expect_dtype("matmul", DType::F32)?;
            }
        }
        let err = |why: &str| {
            let t = |f: bool| if f { "ᵀ" } else { "" };
            Error::shape("matmul", format!("{:?}{} · {:?}{}: {why}", self.shape(), t(trans_a), other.shape(), t(trans_b)))
        };
        let (ra, rb) = (self.rank(), other.rank());
        if ra < 2 || rb < 2 {
            return Err(err("both operands need rank 2 or more here (matmul takes 1-D ones)"));
        }
        let (a, b) = (self.dims(), other.dims());
        let (m, k) = if trans_a { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
        let (k2, n) = if trans_b { (b[rb - 1], b[rb - 2]) } else { (b[rb - 2], b[rb - 1]) };
        if k != k2 {
            return Err(err(&format!("inner dimensions {k} and {k2} differ")));
        }
        let (ba, bb) = (Shape(a[..ra - 2].to_vec()), Shape(b[..rb - 2].to_vec()));
        let batch = Shape::broadcast("matmul", &ba, &bb).map_err(|_| err("batch dimensions do not broadcast"))?;
        let with = |mut d: Vec<usize>, x: usize, y: usize| {
            d.extend([x, y]);
            Shape(d)
        };
        let out_shape = with(batch.dims().to_vec(), m, n);
        // A batch times one shared matrix is one bigger product.
        if bb.numel() == 1 && !trans_a && ra > 2 {
            let flat = self.reshape([a[..ra - 1].iter().product(), a[ra - 1]])?;
            let shared = other.reshape(with(vec![], b[rb - 2], b[rb - 1]))?;
            return flat.matmul_t(&shared, false, trans_b)?.reshape(out_shape);
        }
        // Each operand is read with one batch stride: 0 for a single matrix, a whole matrix when
        // its batch dimensions are the result's (leading 1s aside); else it is copied out.
        let whole = |t: &Tensor, own: &Shape| -> Result<(Tensor, usize)> {
            let matrix = t.dims()[t.rank() - 2] * t.dims()[t.rank() - 1];
            if own.numel() == 1 {
                Ok((t.clone(), 0))
            } else if own.numel() == batch.numel() {
                Ok((t.clone(), matrix))
            } else {
                let (r, c) = (t.dims()[t.rank() - 2], t.dims()[t.rank() - 1]);
                Ok((t.broadcast_to(with(batch.dims().to_vec(), r, c))?, matrix))
            }
        };
        let (x, a_stride) = whole(self, &ba)?;
        let (y, b_stride) = whole(other, &bb)?;
        let spec = MatmulSpec {
            batch: batch.numel(),
            m,
            n,
            k,
            trans_a,
            trans_b,
            a_offset: 0,
            b_offset: 0,
            a_batch_stride: a_stride,
            b_batch_stride: b_stride,
        };
        if let Some(cpu) = self.half_product_here(other, trans_a).filter(|_| halves) {
            // One rounding, from the f32 sums; the node's rule runs on the halves as they are.
            let out = self.alloc_like(out_shape.numel(), super::halves::product_dtype(self, other))?;
            cpu.matmul_halves(&x.0.buffer, &y.0.buffer, &out, spec)?;
            let op = GradOp::InF32(Box::new(GradOp::Matmul { trans_a, trans_b }));
            return Ok(Tensor::result(out, out_shape, self.device(), op, &[&x, &y]));
        }
        let out = self.alloc_like(out_shape.numel(), DType::F32)?;
        self.backend().matmul(&x.0.buffer, &y.0.buffer, &out, spec)?;
        Ok(Tensor::result(out, out_shape, self.device(), GradOp::Matmul { trans_a, trans_b }, &[&x, &y]))
    }

    /// 2-D convolution of `[N, C, H, W]` input with `[O, C, KH, KW]` weight (no bias), as
    /// im2col followed by one batched product.
    pub fn conv2d(&self, weight: &Tensor, stride: (usize, usize), pad: (usize, usize)) -> Result<Tensor> {
        self.conv2d_impl(weight, None, stride, pad, false)
    }

    /// `conv2d` plus a per-channel `[O]` bias, added in the product's epilogue where the backend
    /// fuses it (wgpu on software adapters), else by a broadcast add.
    pub fn conv2d_bias(&self, weight: &Tensor, bias: &Tensor, stride: (usize, usize), pad: (usize, usize)) -> Result<Tensor> {
        self.check_conv_bias(weight, bias)?;
        self.conv2d_impl(weight, Some(bias), stride, pad, false)
    }

    /// `conv2d_bias(..)?.relu()`, with the ReLU in the product's epilogue as well where the
    /// backend fuses the bias (saving a pass over the output and its buffer); the gradients are
    /// those of the composition.
    pub fn conv2d_bias_relu(&self, weight: &Tensor, bias: &Tensor, stride: (usize, usize), pad: (usize, usize)) -> Result<Tensor> {
        self.check_conv_bias(weight, bias)?;
        self.conv2d_impl(weight, Some(bias), stride, pad, true)
    }

    fn check_conv_bias(&self, weight: &Tensor, bias: &Tensor) -> Result<()> {
        self.same_device("conv2d", bias)?;
        if bias.dims() != [weight.dims().first().copied().unwrap_or(0)] {
            return Err(Error::shape("conv2d", format!("bias {:?} for weight {:?} (need [O])", bias.shape(), weight.shape())));
        }
        Ok(())
    }

    fn conv2d_impl(&self, weight: &Tensor, bias: Option<&Tensor>, stride: (usize, usize), pad: (usize, usize), relu: bool) -> Result<Tensor> {
        self.same_device("conv2d", weight)?;
        if crate::autocast_dtype().is_some() && [Some(self), Some(weight), bias].into_iter().flatten().any(|t| t.dtype() == DType::F32) {
            let b = bias.map(Tensor::autocast_operand).transpose()?;
            return self.autocast_operand()?.conv2d_impl(&weight.autocast_operand()?, b.as_ref(), stride, pad, relu);
        }
        let halves = match bias {
            Some(b) => Tensor::in_f32(&[self, weight, b], |t| t[0].conv2d_impl(&t[1], Some(&t[2]), stride, pad, relu))?,
            None => Tensor::in_f32(&[self, weight], |t| t[0].conv2d_impl(&t[1], None, stride, pad, relu))?,
        };
        if let Some(y) = halves {
            return Ok(y);
        }
        let (x, w) = (self.dims(), weight.dims());
        if x.len() != 4 || w.len() != 4 || x[1] != w[1] {
            return Err(Error::shape(
                "conv2d",
                format!("input {:?} with weight {:?} (need [N,C,H,W] and [O,C,KH,KW])", self.shape(), weight.shape()),
            ));
        }
        let spec = WindowSpec::new("conv2d", [x[0], x[1], x[2], x[3]], (w[2], w[3]), stride, pad)?;
        let cols = self.alloc_like(spec.n * spec.col_rows() * spec.col_len(), DType::F32)?;
        self.backend().im2col(&self.0.buffer, &cols, spec)?;
        let o = w[0];
        let mm = MatmulSpec {
            batch: spec.n,
            m: o,
            n: spec.col_len(),
            k: spec.col_rows(),
            trans_a: false,
            trans_b: false,
            a_offset: 0,
            b_offset: 0,
            a_batch_stride: 0,
            b_batch_stride: spec.col_rows() * spec.col_len(),
        };
        let out = self.alloc_like(spec.n * o * spec.col_len(), DType::F32)?;
        let shape = Shape(vec![spec.n, o, spec.oh, spec.ow]);
        if let Some(b) = bias {
            if self.backend().matmul_row_bias(&weight.0.buffer, &cols, &b.0.buffer, &out, mm, relu)? {
                let op = GradOp::Conv2d { spec, cols, bias: true, relu: relu.then(|| out.clone()) };
                return Ok(Tensor::result(out, shape, self.device(), op, &[self, weight, b]));
            }
        }
        self.backend().matmul(&weight.0.buffer, &cols, &out, mm)?;
        let y = Tensor::result(out, shape, self.device(), GradOp::Conv2d { spec, cols, bias: false, relu: None }, &[self, weight]);
        let y = match bias {
            Some(b) => y.add(&b.reshape([o, 1, 1])?)?,
            None => y,
        };
        if relu {
            y.relu()
        } else {
            Ok(y)
        }
    }

    /// Max pooling over `[N, C, H, W]` with PyTorch's floor output size.
    pub fn max_pool2d(&self, kernel: (usize, usize), stride: (usize, usize), pad: (usize, usize)) -> Result<Tensor> {
        if let Some(y) = Tensor::in_f32(&[self], |t| t[0].max_pool2d(kernel, stride, pad))? {
            return Ok(y);
        }
        self.expect_dtype("max_pool2d", DType::F32)?;
        let x = self.dims();
        if x.len() != 4 {
            return Err(Error::shape("max_pool2d", format!("input must be [N,C,H,W], got {:?}", self.shape())));
        }
        if pad.0 * 2 > kernel.0 || pad.1 * 2 > kernel.1 {
            return Err(Error::invalid("max_pool2d", format!("padding {pad:?} must be at most half of kernel {kernel:?}")));
        }
        let spec = WindowSpec::new("max_pool2d", [x[0], x[1], x[2], x[3]], kernel, stride, pad)?;
        let n_out = spec.n * spec.c * spec.oh * spec.ow;
        let out = self.alloc_like(n_out, DType::F32)?;
        let argmax = self.alloc_like(n_out, DType::I32)?;
        self.backend().max_pool2d(&self.0.buffer, &out, &argmax, spec)?;
        let shape = Shape(vec![spec.n, spec.c, spec.oh, spec.ow]);
        Ok(Tensor::result(out, shape, self.device(), GradOp::MaxPool2d { spec, argmax }, &[self]))
    }

    /// Sums `[b, rest...]` over dimension 0 into `rest` (used by conv's weight gradient).
    pub(crate) fn sum_batch(&self) -> Result<Tensor> {
        let d = self.dims();
        let spec = ReduceSpec { outer: 1, len: d[0], inner: d[1..].iter().product() };
        let out = self.alloc_like(spec.inner, DType::F32)?;
        self.backend().reduce(ReduceOp::Sum, &self.0.buffer, spec, &out)?;
        Ok(Tensor::from_parts(out, Shape(d[1..].to_vec()), self.device().clone(), None))
    }
}
