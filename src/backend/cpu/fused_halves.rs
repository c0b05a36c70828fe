//! The causal softmax and the tanh GELU (forward and backward) on buffers that may hold Bf16 or
//! F16: each task widens its group of rows (whole `T × T` matrices, or a run of elements) into
//! scratch, runs the f32 kernel of `fused` on it and rounds each output once on its way out.
//! The result is the f32 kernel's on the exactly widened inputs, rounded once, as the
//! composition (cast, f32 kernel, cast) gives, without its F32 tensors and passes.
use super::halves::{narrow, widen};
use super::{contract, fused, raw, read, write, CpuBackend};
use crate::backend::{Buffer, FusedOp};
use crate::{DType, Error, Result};
use rayon::prelude::*;
use std::cell::RefCell;

/// Elements per task: a few `T × T` matrices or GELU values, whose widened inputs and output
/// (64 KiB each) stay in a core's L2.
const TASK: usize = 1 << 14;

thread_local! {
    /// Each thread's widened inputs and output, kept between ops.
    static SCRATCH: RefCell<[Vec<f32>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// A buffer's words as the f32 or half values they hold.
#[derive(Clone, Copy)]
enum Input<'a> {
    F32(&'a [f32]),
    Half(&'a [u16], DType),
}

impl CpuBackend {
    /// `Backend::fused` for `CausalSoftmax`, `CausalSoftmaxBackward`, `GeluTanh` and
    /// `GeluTanhBackward` whose buffers may each be F32, Bf16 or F16; other ops are refused.
    pub(crate) fn fused_halves(&self, op: FusedOp, bufs: &[&Buffer]) -> Result<()> {
        contract::fused_halves(&self.info, op, bufs)?;
        // Every buffer of these ops is `len` long, made of independent units of `unit` values.
        let (len, unit) = match op {
            FusedOp::CausalSoftmax { n, t, .. } | FusedOp::CausalSoftmaxBackward { n, t, .. } => (n * t * t, t * t),
            FusedOp::GeluTanh { len } | FusedOp::GeluTanhBackward { len } => (len, 1),
            _ => return Err(Error::invalid(op.name(), format!("{op:?} has no kernel that reads halves"))),
        };
        if len == 0 {
            return Ok(());
        }
        let (ins, outs) = bufs.split_at(bufs.len() - 1);
        // One read lock per distinct input (a gradient may be the very buffer it multiplies).
        let raws: Vec<_> = ins.iter().map(|b| raw(b)).collect::<Result<_>>()?;
        let first = |i: usize| raws.iter().position(|r| std::ptr::eq(*r, raws[i])).unwrap_or(i);
        let guards: Vec<_> = (0..raws.len()).map(|i| (first(i) == i).then(|| read(raws[i]))).collect();
        let inputs: Vec<Input> = (0..raws.len())
            .map(|i| {
                let words = &guards[first(i)].as_ref().expect("the first of equal inputs is read")[..];
                match ins[i].dtype() {
                    DType::F32 => Input::F32(bytemuck::cast_slice(words)),
                    half => Input::Half(bytemuck::cast_slice(words), half),
                }
            })
            .collect();
        let out = outs[0];
        let mut go = write(raw(out)?);
        let per_task = (TASK / unit).max(1) * unit;
        let task = |at: usize, y: Chunk| -> Result<()> {
            let n = y.len();
            SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                let [a, b, c] = &mut *s;
                let mut wide: Vec<&[f32]> = Vec::with_capacity(inputs.len());
                for (input, scratch) in inputs.iter().zip([&mut *a, &mut *b]) {
                    wide.push(match *input {
                        Input::F32(x) => &x[at..at + n],
                        Input::Half(h, dtype) => {
                            scratch.resize(n, 0.0);
                            widen(&h[at..at + n], dtype, scratch);
                            &scratch[..]
                        }
                    });
                }
                let op = with_n(op, n / unit);
                match y {
                    Chunk::F32(y) => fused::run(op, &wide, &mut [y]),
                    Chunk::Half(y, dtype) => {
                        c.resize(n, 0.0);
                        fused::run(op, &wide, &mut [&mut c[..]])?;
                        narrow(c, dtype, y);
                        Ok(())
                    }
                }
            })
        };
        match out.dtype() {
            DType::F32 => {
                let y: &mut [f32] = &mut bytemuck::cast_slice_mut(&mut go)[..len];
                y.par_chunks_mut(per_task).enumerate().try_for_each(|(i, y)| task(i * per_task, Chunk::F32(y)))
            }
            half => {
                let y: &mut [u16] = &mut bytemuck::cast_slice_mut(&mut go)[..len];
                y.par_chunks_mut(per_task).enumerate().try_for_each(|(i, y)| task(i * per_task, Chunk::Half(y, half)))
            }
        }
    }
}

/// One task's share of the output.
enum Chunk<'a> {
    F32(&'a mut [f32]),
    Half(&'a mut [u16], DType),
}

impl Chunk<'_> {
    fn len(&self) -> usize {
        match self {
            Chunk::F32(y) => y.len(),
            Chunk::Half(y, _) => y.len(),
        }
    }
}

/// `op` over `units` of its units (matrices, or elements) instead of all of them.
fn with_n(op: FusedOp, units: usize) -> FusedOp {
    match op {
        FusedOp::CausalSoftmax { t, scale, .. } => FusedOp::CausalSoftmax { n: units, t, scale },
        FusedOp::CausalSoftmaxBackward { t, scale, .. } => FusedOp::CausalSoftmaxBackward { n: units, t, scale },
        FusedOp::GeluTanh { .. } => FusedOp::GeluTanh { len: units },
        FusedOp::GeluTanhBackward { .. } => FusedOp::GeluTanhBackward { len: units },
        other => other,
    }
}
