//! Shapes, dtypes and strided layouts: the vocabulary shared by tensors and backends.
use crate::{Error, Result};
use std::fmt;

/// Element types. `I32` holds class labels and argmax results (WGSL has no 64-bit integers;
/// I64 labels from files are narrowed on load). `Bf16` and `F16` are storage types: a buffer
/// of them holds two values per 32-bit word (element `2k` in the low half, as little-endian
/// bytes lay them out), every backend stores, copies, fills and casts them, and arithmetic
/// reads them through a cast to `F32` (sm_52 and most WGSL adapters have no fast half math,
/// and f32 accumulation is what PyTorch's autocast does too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DType {
    F32,
    I32,
    /// bfloat16: f32's 8 exponent bits and 7 of its mantissa bits.
    Bf16,
    /// IEEE 754 binary16: 5 exponent bits, 10 mantissa bits, largest finite 65504.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }
    /// Whether this is one of the 16-bit float storage types.
    pub fn is_half(self) -> bool {
        matches!(self, DType::Bf16 | DType::F16)
    }
    /// 32-bit words that hold `len` elements (halves round up to a whole word).
    pub fn words(self, len: usize) -> usize {
        if self.is_half() {
            len.div_ceil(2)
        } else {
            len
        }
    }
}

/// A tensor's dimensions, outermost first.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }
    /// Row-major strides of a contiguous tensor of this shape.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut s = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.0[i + 1];
        }
        s
    }
    /// Resolves a possibly negative axis (`-1` is the last) for `op`.
    pub fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        let r = self.rank() as isize;
        let a = if axis < 0 { axis + r } else { axis };
        if a < 0 || a >= r {
            return Err(Error::shape(op, format!("axis {axis} out of range for shape {self:?}")));
        }
        Ok(a as usize)
    }
    /// The shape two operands broadcast to, NumPy/PyTorch rules.
    pub fn broadcast(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
        let r = a.rank().max(b.rank());
        let mut out = vec![0; r];
        for (i, o) in out.iter_mut().enumerate() {
            let da = if i + a.rank() >= r { a.0[i + a.rank() - r] } else { 1 };
            let db = if i + b.rank() >= r { b.0[i + b.rank() - r] } else { 1 };
            *o = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return Err(Error::shape(op, format!("cannot broadcast {a:?} with {b:?}"))),
            };
        }
        Ok(Shape(out))
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}

/// Most dimensions a strided layout may have; kernels pass layouts in fixed-size arrays.
pub const MAX_RANK: usize = 6;

/// How an operand is read: element `idx` (a multi-index over `shape`) lives at
/// `offset + sum(idx[i] * strides[i])` in its buffer. Stride 0 broadcasts a dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Layout {
    pub fn contiguous(shape: &Shape) -> Self {
        Layout { shape: shape.0.clone(), strides: shape.contiguous_strides(), offset: 0 }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_contiguous(&self) -> bool {
        self.strides == Shape(self.shape.clone()).contiguous_strides()
    }
    /// This contiguous layout read as `target` (broadcast: size-1 or missing leading dims get
    /// stride 0).
    pub fn broadcast_to(shape: &Shape, target: &Shape) -> Self {
        let s = shape.contiguous_strides();
        let r = target.rank();
        let mut strides = vec![0; r];
        for (i, (&d, &st)) in shape.0.iter().zip(&s).enumerate() {
            strides[i + r - shape.rank()] = if d == 1 { 0 } else { st };
        }
        Layout { shape: target.0.clone(), strides, offset: 0 }
    }
    /// Padded to `MAX_RANK` with leading unit dimensions, as kernels expect, in 32 bits. A
    /// size-1 dimension gets stride 0: its index is always 0, whatever its stride. A rank past
    /// `MAX_RANK`, or a size or stride past `u32::MAX` (a view of more than 2^32 - 1 elements),
    /// is a shape error naming `op`, never a truncation.
    pub fn padded(&self, op: &'static str) -> Result<([u32; MAX_RANK], [u32; MAX_RANK])> {
        if self.shape.len() > MAX_RANK {
            return Err(Error::shape(op, format!("rank {} exceeds {MAX_RANK}", self.shape.len())));
        }
        let wide = || {
            Error::shape(
                op,
                format!("layout of shape {:?} with strides {:?} exceeds the kernels' 32-bit sizes and strides", self.shape, self.strides),
            )
        };
        let mut shape = [1u32; MAX_RANK];
        let mut strides = [0u32; MAX_RANK];
        let pad = MAX_RANK - self.shape.len();
        for (i, (&d, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            shape[pad + i] = u32::try_from(d).map_err(|_| wide())?;
            strides[pad + i] = if d == 1 { 0 } else { u32::try_from(s).map_err(|_| wide())? };
        }
        Ok((shape, strides))
    }
    /// Buffer position of the `i`-th element in row-major order of `shape`.
    pub fn index(&self, mut i: usize) -> usize {
        let mut pos = self.offset;
        for d in (0..self.shape.len()).rev() {
            let n = self.shape[d];
            pos += (i % n) * self.strides[d];
            i /= n;
        }
        pos
    }
}

/// `len` items cut into `n` contiguous near-equal ranges; the first `len % n` get one extra.
pub(crate) fn even_ranges(len: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    let (base, extra) = (len / n, len % n);
    let mut start = 0;
    (0..n)
        .map(|i| {
            let size = base + usize::from(i < extra);
            start += size;
            start - size..start
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Layout;

    fn layout(shape: &[usize], strides: &[usize]) -> Layout {
        Layout { shape: shape.to_vec(), strides: strides.to_vec(), offset: 0 }
    }

    #[test]
    fn padded_refuses_what_32_bits_cannot_hold() {
        let big = u32::MAX as usize + 1;
        for (l, what) in
            [(layout(&[big, 1], &[1, 1]), "dimension"), (layout(&[2, 3], &[big, 1]), "stride"), (layout(&[big + 7], &[0]), "broadcast dimension")]
        {
            let err = l.padded("unary").expect_err(what).to_string();
            assert!(err.contains("unary") && err.contains("32-bit") && err.contains(&format!("{:?}", l.shape)), "{what}: {err}");
        }
        // A dimension cut to 0 would divide by zero in the kernels' index arithmetic.
        assert!(layout(&[big, 2], &[2, 1]).padded("binary").is_err());
        let (shape, strides) = layout(&[u32::MAX as usize, 1], &[1, 1]).padded("unary").unwrap();
        assert_eq!((shape[4], strides[4]), (u32::MAX, 1), "u32::MAX itself fits");
        // The stride of a size-1 dimension never moves the index, so it need not fit.
        let (shape, strides) = layout(&[1, 3], &[big * 4, 1]).padded("unary").unwrap();
        assert_eq!((&shape[4..], &strides[4..]), (&[1, 3][..], &[0, 1][..]));
    }
}
