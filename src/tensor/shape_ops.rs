//! Shape changes: reshape (free), permute and broadcast (one strided copy), narrow and cat.
use super::Tensor;
use crate::autograd::GradOp;
use crate::backend::{CastOp, UnaryOp};
use crate::{DType, Error, Layout, Result, Shape};

impl Tensor {
    /// The same values with a new shape of equal size; one dimension may be `usize::MAX`
    /// to be inferred. Free: shares the buffer.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let mut dims = shape.into().0;
        if let Some(pos) = dims.iter().position(|&d| d == usize::MAX) {
            let known: usize = dims.iter().filter(|&&d| d != usize::MAX).product();
            if known == 0 || !self.numel().is_multiple_of(known) {
                return Err(Error::shape("reshape", format!("cannot infer a dimension of {dims:?} from {:?}", self.shape())));
            }
            dims[pos] = self.numel() / known;
        }
        let shape = Shape(dims);
        if shape.numel() != self.numel() {
            return Err(Error::shape("reshape", format!("{:?} ({} elements) into {shape:?}", self.shape(), self.numel())));
        }
        Ok(Tensor::result(self.0.buffer.clone(), shape, self.device(), GradOp::Reshape, &[self]))
    }
    /// Keeps dimension 0 and flattens the rest (`view(N, -1)`).
    pub fn flatten(&self) -> Result<Tensor> {
        let n = self.dims().first().copied().unwrap_or(1);
        self.reshape([n, self.numel() / n.max(1)])
    }
    pub fn flatten_all(&self) -> Result<Tensor> {
        self.reshape([self.numel()])
    }

    /// Reorders dimensions (`perm[i]` is the source of output dimension `i`).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let r = self.rank();
        let mut seen = vec![false; r];
        if perm.len() != r || perm.iter().any(|&p| p >= r || std::mem::replace(&mut seen[p], true)) {
            return Err(Error::shape("permute", format!("{perm:?} is not a permutation of the dims of {:?}", self.shape())));
        }
        let src = self.layout();
        let layout =
            Layout { shape: perm.iter().map(|&p| src.shape[p]).collect(), strides: perm.iter().map(|&p| src.strides[p]).collect(), offset: 0 };
        let out = self.strided_copy(&layout)?;
        Ok(Tensor::result(out, Shape(layout.shape), self.device(), GradOp::Permute(perm.to_vec()), &[self]))
    }
    /// Swaps the last two dimensions.
    pub fn t(&self) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 {
            return Err(Error::shape("t", format!("needs rank >= 2, got {:?}", self.shape())));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.permute(&perm)
    }

    /// Materializes this tensor broadcast to `shape`.
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if Shape::broadcast("broadcast_to", self.shape(), &shape)? != shape {
            return Err(Error::shape("broadcast_to", format!("{:?} to {shape:?}", self.shape())));
        }
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        let out = self.strided_copy(&Layout::broadcast_to(self.shape(), &shape))?;
        Ok(Tensor::result(out, shape, self.device(), GradOp::Expand, &[self]))
    }

    /// Sums broadcast dimensions away so the result has `shape` (the adjoint of broadcast_to).
    pub fn sum_to(&self, shape: &Shape) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let extra = self.rank().checked_sub(shape.rank()).ok_or_else(|| Error::shape("sum_to", format!("{:?} to {shape:?}", self.shape())))?;
        let mut t = self.clone();
        for _ in 0..extra {
            t = t.sum(0, false)?;
        }
        for (i, &d) in shape.dims().iter().enumerate() {
            if d == 1 && t.dims()[i] != 1 {
                t = t.sum(i as isize, true)?;
            }
        }
        if t.shape() != shape {
            return Err(Error::shape("sum_to", format!("{:?} to {shape:?}", self.shape())));
        }
        Ok(t)
    }

    /// `len` entries of dimension `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        if dim >= self.rank() || start + len > self.dims()[dim] {
            return Err(Error::shape("narrow", format!("dim {dim} range {start}..{} of {:?}", start + len, self.shape())));
        }
        let mut layout = self.layout();
        layout.offset = start * layout.strides[dim];
        layout.shape[dim] = len;
        let out = if dim == 0 {
            let n = layout.numel();
            let out = self.alloc_like(n, self.dtype())?;
            self.backend().copy(&self.0.buffer, layout.offset, &out, 0, n)?;
            // A part's values lie within the whole's bounds (loose, which check_labels allows).
            out.set_label_bound(self.0.buffer.label_bound());
            out
        } else {
            self.strided_copy(&layout)?
        };
        Ok(Tensor::result(out, Shape(layout.shape), self.device(), GradOp::Narrow { dim, start }, &[self]))
    }

    /// Splits dimension 0 into pieces of the given sizes.
    pub fn split(&self, sizes: &[usize]) -> Result<Vec<Tensor>> {
        if sizes.iter().sum::<usize>() != self.dims().first().copied().unwrap_or(0) {
            return Err(Error::shape("split", format!("sizes {sizes:?} do not add up to dim 0 of {:?}", self.shape())));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&n| {
                let t = self.narrow(0, start, n);
                start += n;
                t
            })
            .collect()
    }

    /// Concatenates along `dim`; all tensors on one device with equal other dimensions.
    pub fn cat(tensors: &[Tensor], dim: usize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::invalid("cat", "no tensors"))?;
        for t in tensors {
            first.same_device("cat", t)?;
            if t.dtype() != first.dtype() {
                return Err(Error::DType { op: "cat", expected: first.dtype(), got: t.dtype() });
            }
            let ok = t.rank() == first.rank() && dim < t.rank() && (0..t.rank()).all(|d| d == dim || t.dims()[d] == first.dims()[d]);
            if !ok {
                let shapes: Vec<_> = tensors.iter().map(|t| t.shape().clone()).collect();
                return Err(Error::shape("cat", format!("cannot concatenate {shapes:?} along dim {dim}")));
            }
        }
        if dim != 0 {
            // Move `dim` to the front, concatenate contiguous blocks, move it back.
            let mut perm: Vec<usize> = (0..first.rank()).collect();
            perm.remove(dim);
            perm.insert(0, dim);
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            let moved = tensors.iter().map(|t| t.permute(&perm)).collect::<Result<Vec<_>>>()?;
            return Tensor::cat(&moved, 0)?.permute(&inv);
        }
        let mut shape = first.dims().to_vec();
        shape[0] = tensors.iter().map(|t| t.dims()[0]).sum();
        let shape = Shape(shape);
        let out = first.alloc_like(shape.numel(), first.dtype())?;
        let mut at = 0;
        for t in tensors {
            first.backend().copy(&t.0.buffer, 0, &out, at, t.numel())?;
            at += t.numel();
        }
        let bounds: Option<Vec<(i32, i32)>> = tensors.iter().map(|t| t.0.buffer.label_bound()).collect();
        out.set_label_bound(bounds.and_then(|b| b.into_iter().reduce(|x, y| (x.0.min(y.0), x.1.max(y.1)))));
        let refs: Vec<&Tensor> = tensors.iter().collect();
        Ok(Tensor::result(out, shape, first.device(), GradOp::Cat, &refs))
    }

    fn strided_copy(&self, layout: &Layout) -> Result<crate::backend::Buffer> {
        if self.dtype().is_half() {
            // Strided reads go through F32 (exact both ways): the kernels read 32-bit words.
            let b = self.backend();
            let cast = |a, z| CastOp::between(a, z).ok_or_else(|| Error::invalid("copy", format!("no cast from {a:?} to {z:?}")));
            let (to, from) = (cast(self.dtype(), DType::F32)?, cast(DType::F32, self.dtype())?);
            let wide = self.alloc_like(self.0.buffer.len(), DType::F32)?;
            b.cast(to, &self.0.buffer, &wide, self.0.buffer.len())?;
            let picked = self.alloc_like(layout.numel(), DType::F32)?;
            b.unary(UnaryOp::Identity, &wide, layout, &picked)?;
            let out = self.alloc_like(layout.numel(), self.dtype())?;
            b.cast(from, &picked, &out, layout.numel())?;
            return Ok(out);
        }
        let out = self.alloc_like(layout.numel(), self.dtype())?;
        self.backend().unary(UnaryOp::Identity, &self.0.buffer, layout, &out)?;
        Ok(out)
    }
}
