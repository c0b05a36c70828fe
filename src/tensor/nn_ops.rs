//! Matrix products, convolution and pooling on tensors.
use super::Tensor;
use crate::autograd::GradOp;
use crate::backend::{MatmulSpec, ReduceOp, ReduceSpec, WindowSpec};
use crate::{DType, Error, Result, Shape};

impl Tensor {
    /// Matrix product: `[m,k]·[k,n]`, `[b,m,k]·[b,k,n]`, or `[b,m,k]·[k,n]` (weight shared).
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_t(other, false, false)
    }

    /// `op(self) · op(other)` where `op` transposes the last two dimensions when its flag is
    /// set, without copying (the backends read transposed operands directly).
    pub fn matmul_t(&self, other: &Tensor, trans_a: bool, trans_b: bool) -> Result<Tensor> {
        self.same_device("matmul", other)?;
        self.expect_dtype("matmul", DType::F32)?;
        other.expect_dtype("matmul", DType::F32)?;
        let err = || {
            Error::shape(
                "matmul",
                format!("{:?}{} · {:?}{}", self.shape(), if trans_a { "ᵀ" } else { "" }, other.shape(), if trans_b { "ᵀ" } else { "" }),
            )
        };
        // A batch of matrices times one shared matrix is one bigger product.
        if self.rank() == 3 && other.rank() == 2 && !trans_a {
            let d = self.dims();
            let flat = self.reshape([d[0] * d[1], d[2]])?;
            let out = flat.matmul_t(other, false, trans_b)?;
            let n = out.dims()[1];
            return out.reshape([d[0], d[1], n]);
        }
        let (a, b) = (self.dims(), other.dims());
        let batch = match (a.len(), b.len()) {
            (2, 2) => 1,
            (3, 3) if a[0] == b[0] => a[0],
            _ => return Err(err()),
        };
        let (ar, ac) = (a[a.len() - 2], a[a.len() - 1]);
        let (br, bc) = (b[b.len() - 2], b[b.len() - 1]);
        let (m, k) = if trans_a { (ac, ar) } else { (ar, ac) };
        let (k2, n) = if trans_b { (bc, br) } else { (br, bc) };
        if k != k2 {
            return Err(err());
        }
        let spec = MatmulSpec {
            batch,
            m,
            n,
            k,
            trans_a,
            trans_b,
            a_offset: 0,
            b_offset: 0,
            a_batch_stride: m * k,
            b_batch_stride: k * n,
        };
        let out = self.alloc_like(batch * m * n, DType::F32)?;
        self.backend().matmul(&self.0.buffer, &other.0.buffer, &out, spec)?;
        let shape = if a.len() == 3 { Shape(vec![batch, m, n]) } else { Shape(vec![m, n]) };
        Ok(Tensor::result(out, shape, self.device(), GradOp::Matmul { trans_a, trans_b }, &[self, other]))
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
        let (x, w) = (self.dims(), weight.dims());
        if x.len() != 4 || w.len() != 4 || x[1] != w[1] {
            return Err(Error::shape("conv2d", format!("input {:?} with weight {:?} (need [N,C,H,W] and [O,C,KH,KW])", self.shape(), weight.shape())));
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
