//! The one check of every `Backend` op's operands against its spec, shared by all backends.
//!
//! Each backend calls the function named after the op first thing in its trait method, before
//! any kernel launch or `unsafe`: after it, every element the op addresses (through a layout, a
//! matmul spec, a window or a reduction) lies inside its buffer, every dtype is the op's, and
//! no size computation overflows. `Device::backend()` is public, so these checks, not
//! `Tensor`'s, are what keeps safe code from reading out of bounds. What is left to a backend
//! is its own limits (32-bit kernel arguments, grid sizes) and that a buffer is its own.
use super::{Buffer, CastOp, DeviceInfo, FusedOp, IndexOp, MatmulSpec, OptimStep, ReduceOp, ReduceSpec, WindowSpec};
use crate::{DType, Error, Layout, Result, MAX_RANK};

/// The op being checked and the device it runs on, named by every error below.
struct Op<'a> {
    name: &'static str,
    dev: &'a DeviceInfo,
}

impl Op<'_> {
    fn device(&self) -> String {
        format!("{}:{}", self.dev.backend.name(), self.dev.ordinal)
    }
    fn overflow(&self, what: &str) -> Error {
        Error::invalid(self.name, format!("{what} overflows usize on {}", self.device()))
    }
    /// `a * b * ...` without wrapping.
    fn product(&self, what: &str, dims: &[usize]) -> Result<usize> {
        dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| self.overflow(what))
    }
    fn sum(&self, what: &str, terms: &[usize]) -> Result<usize> {
        terms.iter().try_fold(0usize, |acc, &t| acc.checked_add(t)).ok_or_else(|| self.overflow(what))
    }
    /// `b` holds `dtype` elements and at least `need` of them.
    fn buffer(&self, operand: &str, b: &Buffer, dtype: DType, need: usize) -> Result<()> {
        if b.dtype() != dtype {
            return Err(Error::DType { op: self.name, expected: dtype, got: b.dtype() });
        }
        if b.len() < need {
            return Err(Error::invalid(
                self.name,
                format!("{operand} is a buffer of {} elements but the op addresses {need} on {}", b.len(), self.device()),
            ));
        }
        Ok(())
    }
    /// One past the furthest element `l` reaches (0 when it reaches none), after checking
    /// that its shape and strides agree and that its rank fits the kernels.
    fn extent(&self, operand: &str, l: &Layout) -> Result<usize> {
        if l.shape.len() != l.strides.len() || l.shape.len() > MAX_RANK {
            return Err(Error::shape(
                self.name,
                format!("{operand}: layout of shape {:?} with strides {:?} (rank at most {MAX_RANK}, one stride per dimension)", l.shape, l.strides),
            ));
        }
        if self.product(operand, &l.shape)? == 0 {
            return Ok(0);
        }
        let mut last = l.offset;
        for (&d, &s) in l.shape.iter().zip(&l.strides) {
            last = (d - 1).checked_mul(s).and_then(|x| last.checked_add(x)).ok_or_else(|| self.overflow(operand))?;
        }
        last.checked_add(1).ok_or_else(|| self.overflow(operand))
    }
    /// `b` holds every element `l` reaches.
    fn through(&self, operand: &str, b: &Buffer, l: &Layout) -> Result<()> {
        let need = self.extent(operand, l)?;
        self.buffer(operand, b, DType::F32, need)
    }
    /// An op that writes nothing may alias whatever it likes.
    fn not_aliased(&self, out: &Buffer, inputs: &[(&str, &Buffer)]) -> Result<()> {
        match inputs.iter().find(|(_, b)| !out.is_empty() && b.same_as(out)) {
            Some((name, _)) => Err(Error::invalid(self.name, format!("the output must not alias input {name}"))),
            None => Ok(()),
        }
    }
}

fn op<'a>(name: &'static str, dev: &'a DeviceInfo) -> Op<'a> {
    Op { name, dev }
}

/// `len` elements of `dtype` are a byte count that fits `u64` and `usize`.
pub fn alloc(dev: &DeviceInfo, len: usize, dtype: DType) -> Result<()> {
    op("alloc", dev).product("the byte size", &[len, dtype.size()]).map(drop)
}

pub fn upload(dev: &DeviceInfo, bytes: &[u8], dtype: DType) -> Result<()> {
    if !bytes.len().is_multiple_of(dtype.size()) {
        let o = op("upload", dev);
        return Err(Error::invalid("upload", format!("{} bytes is not a whole number of {dtype:?} elements on {}", bytes.len(), o.device())));
    }
    Ok(())
}

/// Every op that writes I32 values calls this on its output, so that no stale bound or host
/// copy outlives the values it described.
fn written(out: &Buffer) {
    if out.dtype() == DType::I32 {
        out.set_label_bound(None);
        out.set_host_i32(None);
    }
}

pub fn fill(_dev: &DeviceInfo, buf: &Buffer) -> Result<()> {
    written(buf);
    Ok(())
}

pub fn copy(dev: &DeviceInfo, src: &Buffer, src_off: usize, dst: &Buffer, dst_off: usize, len: usize) -> Result<()> {
    let o = op("copy", dev);
    let (s, d) = (o.sum("the source range", &[src_off, len])?, o.sum("the destination range", &[dst_off, len])?);
    // A copy moves elements whatever they mean: any dtype to any other of the same width.
    if src.dtype().size() != dst.dtype().size() {
        return Err(Error::invalid(
            "copy",
            format!(
                "{:?} elements cannot be copied into a {:?} buffer on {}: their widths differ (cast instead)",
                src.dtype(),
                dst.dtype(),
                o.device()
            ),
        ));
    }
    o.buffer("the source", src, src.dtype(), s)?;
    o.buffer("the destination", dst, dst.dtype(), d)?;
    written(dst);
    Ok(())
}

pub fn unary(dev: &DeviceInfo, x: &Buffer, layout: &Layout, out: &Buffer) -> Result<()> {
    let o = op("unary", dev);
    o.through("x", x, layout)?;
    o.buffer("out", out, DType::F32, layout.numel())
}

pub fn binary(dev: &DeviceInfo, a: &Buffer, la: &Layout, b: &Buffer, lb: &Layout, out: &Buffer) -> Result<()> {
    let o = op("binary", dev);
    if la.shape != lb.shape {
        return Err(Error::shape("binary", format!("operand shapes {:?} and {:?} differ", la.shape, lb.shape)));
    }
    o.through("a", a, la)?;
    o.through("b", b, lb)?;
    o.buffer("out", out, DType::F32, la.numel())
}

pub fn reduce(dev: &DeviceInfo, rop: ReduceOp, x: &Buffer, spec: ReduceSpec, out: &Buffer) -> Result<()> {
    let o = op("reduce", dev);
    o.buffer("x", x, DType::F32, o.product("x", &[spec.outer, spec.len, spec.inner])?)?;
    let dtype = if rop == ReduceOp::ArgMax { DType::I32 } else { DType::F32 };
    o.buffer("out", out, dtype, o.product("out", &[spec.outer, spec.inner])?)?;
    written(out);
    Ok(())
}

/// `bias` is the `m` row biases of `matmul_row_bias`.
pub fn matmul(dev: &DeviceInfo, a: &Buffer, b: &Buffer, bias: Option<&Buffer>, out: &Buffer, s: MatmulSpec) -> Result<()> {
    matmul_of(dev, [DType::F32; 3], a, b, bias, out, s)
}

/// `matmul` whose operands and output may each be F32, Bf16 or F16 (the CPU backend's product
/// that reads and writes halves); the bias, if any, is F32.
pub fn matmul_halves(dev: &DeviceInfo, a: &Buffer, b: &Buffer, out: &Buffer, s: MatmulSpec) -> Result<()> {
    let float = |t: &Buffer| if t.dtype() == DType::I32 { DType::F32 } else { t.dtype() };
    matmul_of(dev, [float(a), float(b), float(out)], a, b, None, out, s)
}

/// The matmul check with the dtypes `[a, b, out]` must hold.
fn matmul_of(dev: &DeviceInfo, dtypes: [DType; 3], a: &Buffer, b: &Buffer, bias: Option<&Buffer>, out: &Buffer, s: MatmulSpec) -> Result<()> {
    let o = op("matmul", dev);
    // The last batch entry's matrix ends furthest into the buffer (strides are non-negative).
    let extent = |name: &str, off: usize, stride: usize, size: usize| -> Result<usize> {
        if s.batch == 0 || size == 0 {
            return Ok(0);
        }
        let last = o.product(name, &[s.batch - 1, stride])?;
        o.sum(name, &[off, last, size])
    };
    let a_need = extent("a", s.a_offset, s.a_batch_stride, o.product("a", &[s.m, s.k])?)?;
    let b_need = extent("b", s.b_offset, s.b_batch_stride, o.product("b", &[s.k, s.n])?)?;
    o.buffer("a", a, dtypes[0], a_need)?;
    o.buffer("b", b, dtypes[1], b_need)?;
    o.buffer("out", out, dtypes[2], o.product("out", &[s.batch, s.m, s.n])?)?;
    if let Some(bias) = bias {
        o.buffer("bias", bias, DType::F32, s.m)?;
        o.not_aliased(out, &[("bias", bias)])?;
    }
    o.not_aliased(out, &[("a", a), ("b", b)])
}

/// A window whose output size is not the one `WindowSpec::new` computes would make kernels
/// read outside the input, so the geometry itself is checked, not only the buffers.
fn window(o: &Op, s: &WindowSpec) -> Result<(usize, usize, usize)> {
    let again = WindowSpec::new(o.name, [s.n, s.c, s.h, s.w], (s.kh, s.kw), s.stride, s.pad)?;
    if (again.oh, again.ow) != (s.oh, s.ow) {
        return Err(Error::shape(o.name, format!("window {s:?} gives a {}x{} output, not {}x{}", again.oh, again.ow, s.oh, s.ow)));
    }
    let input = o.product("the input", &[s.n, s.c, s.h, s.w])?;
    let output = o.product("the output", &[s.n, s.c, s.oh, s.ow])?;
    let cols = o.product("the columns", &[s.n, s.c, s.kh, s.kw, s.oh, s.ow])?;
    Ok((input, output, cols))
}

pub fn im2col(dev: &DeviceInfo, x: &Buffer, cols: &Buffer, spec: WindowSpec) -> Result<()> {
    let o = op("im2col", dev);
    let (input, _, n_cols) = window(&o, &spec)?;
    o.buffer("x", x, DType::F32, input)?;
    o.buffer("cols", cols, DType::F32, n_cols)?;
    o.not_aliased(cols, &[("x", x)])
}

pub fn col2im(dev: &DeviceInfo, cols: &Buffer, x: &Buffer, spec: WindowSpec) -> Result<()> {
    let o = op("col2im", dev);
    let (input, _, n_cols) = window(&o, &spec)?;
    o.buffer("cols", cols, DType::F32, n_cols)?;
    o.buffer("x", x, DType::F32, input)?;
    o.not_aliased(x, &[("cols", cols)])
}

pub fn max_pool2d(dev: &DeviceInfo, x: &Buffer, out: &Buffer, argmax: &Buffer, spec: WindowSpec) -> Result<()> {
    let o = op("max_pool2d", dev);
    let (input, output, _) = window(&o, &spec)?;
    o.buffer("x", x, DType::F32, input)?;
    o.buffer("out", out, DType::F32, output)?;
    o.buffer("argmax", argmax, DType::I32, output)?;
    o.not_aliased(out, &[("x", x)])?;
    written(argmax);
    Ok(())
}

/// The argmax values themselves are checked by the backends that index with them (the GPU
/// kernels compare positions instead).
pub fn max_pool2d_backward(dev: &DeviceInfo, grad_out: &Buffer, argmax: &Buffer, grad_x: &Buffer, spec: WindowSpec) -> Result<()> {
    let o = op("max_pool2d_backward", dev);
    let (input, output, _) = window(&o, &spec)?;
    o.buffer("grad_out", grad_out, DType::F32, output)?;
    o.buffer("argmax", argmax, DType::I32, output)?;
    o.buffer("grad_x", grad_x, DType::F32, input)?;
    o.not_aliased(grad_x, &[("grad_out", grad_out)])
}

pub fn index(dev: &DeviceInfo, iop: IndexOp, x: &Buffer, idx: &Buffer, out: &Buffer, rows: usize, cols: usize) -> Result<()> {
    let o = op("index", dev);
    let matrix = o.product("the matrix", &[rows, cols])?;
    let (x_len, idx_len, out_len) = match iop {
        IndexOp::Gather => (matrix, rows, rows),
        IndexOp::Scatter => (rows, rows, matrix),
        IndexOp::GatherRows { table_rows } => (o.product("the table", &[table_rows, cols])?, rows, matrix),
        IndexOp::ScatterAddRows { table_rows } => {
            // The plan holds positions and counts of the `rows` ids as I32.
            if i32::try_from(rows).is_err() || i32::try_from(table_rows).is_err() {
                return Err(Error::invalid("index", format!("{rows} ids into {table_rows} rows: both must fit I32 on {}", o.device())));
            }
            (matrix, o.sum("the plan", &[table_rows, 1, rows])?, o.product("the table", &[table_rows, cols])?)
        }
    };
    o.buffer("x", x, DType::F32, x_len)?;
    o.buffer("idx", idx, DType::I32, idx_len)?;
    o.buffer("out", out, DType::F32, out_len)?;
    o.not_aliased(out, &[("x", x)])
}

pub fn cast(dev: &DeviceInfo, cop: CastOp, x: &Buffer, out: &Buffer, len: usize) -> Result<()> {
    let o = op("cast", dev);
    let (from, to) = cop.dtypes();
    o.buffer("x", x, from, len)?;
    o.buffer("out", out, to, len)?;
    o.not_aliased(out, &[("x", x)])?;
    written(out);
    Ok(())
}

/// `param`, `grad` and the state buffers the update reads all hold `param.len()` values.
pub fn optim_step(dev: &DeviceInfo, step: OptimStep, param: &Buffer, grad: &Buffer, state: &[&Buffer]) -> Result<()> {
    let o = op("optim_step", dev);
    let n = param.len();
    o.buffer("param", param, DType::F32, n)?;
    o.buffer("grad", grad, DType::F32, n)?;
    let states = match step {
        OptimStep::Sgd { momentum, .. } => usize::from(momentum != 0.0),
        OptimStep::Adam { step, .. } => {
            if step == 0 {
                return Err(Error::invalid("optim_step", "Adam's step counts from 1"));
            }
            2
        }
    };
    if state.len() < states {
        return Err(Error::invalid("optim_step", format!("{step:?} needs {states} state buffers, got {}", state.len())));
    }
    for (i, s) in state.iter().take(states).enumerate() {
        o.buffer(&format!("state {i}"), s, DType::F32, n)?;
    }
    Ok(())
}

/// `bufs` are the op's buffers in its order (see `FusedOp`), each F32 and long enough, and no
/// output is the same buffer as another operand.
pub fn fused(dev: &DeviceInfo, fop: FusedOp, bufs: &[&Buffer]) -> Result<()> {
    fused_of(dev, fop, bufs, |_| DType::F32)
}

/// As [`fused`], with each buffer holding F32, Bf16 or F16 values (the CPU's kernels that read
/// halves: `CpuBackend::fused_halves`).
pub fn fused_halves(dev: &DeviceInfo, fop: FusedOp, bufs: &[&Buffer]) -> Result<()> {
    fused_of(dev, fop, bufs, |b| if b.dtype() == DType::I32 { DType::F32 } else { b.dtype() })
}

/// The fused check with each buffer's dtype as `dtype` gives it.
fn fused_of(dev: &DeviceInfo, fop: FusedOp, bufs: &[&Buffer], dtype: impl Fn(&Buffer) -> DType) -> Result<()> {
    let o = op(fop.name(), dev);
    let (sizes, inputs) = fop.operands().ok_or_else(|| o.overflow("a buffer size"))?;
    if bufs.len() != sizes.len() {
        return Err(Error::invalid(fop.name(), format!("{fop:?} takes {} buffers, got {} on {}", sizes.len(), bufs.len(), o.device())));
    }
    if let FusedOp::LayerNorm { eps, .. } = fop {
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::invalid(fop.name(), format!("eps {eps} must be a non-negative number")));
        }
    }
    for (i, (b, &need)) in bufs.iter().zip(&sizes).enumerate() {
        o.buffer(&format!("buffer {i}"), b, dtype(b), need)?;
    }
    for (i, out) in bufs.iter().enumerate().skip(inputs) {
        let others: Vec<(&str, &Buffer)> = bufs.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, b)| ("another operand", *b)).collect();
        o.not_aliased(out, &others)?;
    }
    Ok(())
}
