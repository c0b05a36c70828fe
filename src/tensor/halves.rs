//! Ops on Bf16 and F16 tensors, and autocast: halves are storage, arithmetic is f32.
//!
//! An op given half inputs runs its f32 kernel on f32 copies and rounds the result once to the
//! half type (`in_f32`), so matmul, reductions, softmax and LayerNorm accumulate in f32 as
//! PyTorch's CPU kernels for bfloat16 do, and every backend needs only its casts. The graph
//! keeps the half inputs, not the copies (the node's rule upcasts them again in backward); the
//! same holds for gradients, so half gradients accumulate in f32 and round once. Mixed inputs (a half and an F32, or both halves)
//! promote to F32, as PyTorch's type promotion does; losses compute in F32 from any input.
//!
//! On a CPU device, products (forward and backward) and elementwise ops whose operands are
//! whole, a bias row or one value skip the copies: the backend reads the halves, widening them
//! tile by tile in its kernels, and rounds each output once (`CpuBackend::matmul_halves`,
//! `unary_halves`, `binary_halves`), with the same result as the composition's; so do the causal
//! softmax and the tanh GELU, forward and backward (`CpuBackend::fused_halves`).
//!
//! [`autocast`] is PyTorch's `torch.autocast`: inside it, products (matmul, Linear, Conv2d)
//! cast their F32 operands to the half type first, so their outputs and everything computed
//! from them until a promotion are halves, while parameters stay F32 master weights whose
//! gradients come back through the casts in F32.
use super::Tensor;
use crate::autograd::{GradOp, Node};
use crate::backend::cpu::{CpuBackend, Spread};
use crate::backend::{BinaryOp, FusedOp, UnaryOp};
use crate::{DType, Error, Result};
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The half type products cast to on this thread, inside [`autocast`]; `None` outside.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(Cell::get)
}

/// Sets this thread's autocast type as it is, returning the previous one.
pub(crate) fn replace_autocast(dtype: Option<DType>) -> Option<DType> {
    AUTOCAST.with(|a| a.replace(dtype))
}

/// Runs `f` with products computing from `dtype` operands (`Bf16` or `F16`; `None` or `F32`
/// turns autocast off inside `f`), as PyTorch's `with torch.autocast(device, dtype)`. The
/// previous state comes back when `f` returns or panics. Recomputed blocks
/// (`autograd::checkpoint`) recompute under the state their forward ran in.
///
/// ```
/// # use tandem::{autocast, Device, DType, Tensor};
/// let dev = Device::cpu();
/// let w = Tensor::from_vec(vec![1.0, 1.0 / 512.0], [2, 1], &dev)?.requires_grad();
/// let x = Tensor::from_vec(vec![1.0, 1.0], [1, 2], &dev)?;
/// let y = autocast(Some(DType::Bf16), || x.matmul(&w))?;
/// // w[1] rounds to bf16's 1/512 exactly; 1 + 1/512 is no bf16, so the product rounds to 1.
/// assert_eq!((y.dtype(), y.to_vec()?), (DType::Bf16, vec![1.0]));
/// y.to_dtype(DType::F32)?.sum_all()?.backward()?;
/// assert_eq!(w.grad().unwrap().dtype(), DType::F32);
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn autocast<T>(dtype: Option<DType>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(dtype.filter(|d| d.is_half()))));
    f()
}

/// The dtype an op of these float inputs computes into: the shared half type, or F32.
fn result_dtype(inputs: &[&Tensor]) -> Option<DType> {
    let mut floats = inputs.iter().map(|t| t.dtype()).filter(|d| *d != DType::I32);
    let first = floats.next()?;
    floats.all(|d| d == first).then_some(first).filter(|d| d.is_half())
}

/// The dtype of a product of `a` and `b`: their shared half type, or F32.
pub(crate) fn product_dtype(a: &Tensor, b: &Tensor) -> DType {
    result_dtype(&[a, b]).unwrap_or(DType::F32)
}

impl Tensor {
    /// The CPU device that runs `op(self) · op(other)` reading its halves directly
    /// (`CpuBackend::matmul_halves`), or `None` where the product runs on f32 copies: on other
    /// backends, and where an operand's batch would be broadcast (its gradient would then be a
    /// sum of rounded products). Batch dimensions equal on both sides, two matrices, or a batch
    /// times one matrix (which `matmul_t` flattens into two matrices) qualify.
    pub(crate) fn half_product_here(&self, other: &Tensor, trans_a: bool) -> Option<&CpuBackend> {
        let cpu = self.backend().as_any().downcast_ref::<CpuBackend>()?;
        let (ra, rb) = (self.rank(), other.rank());
        let shapes = ra >= 2 && rb >= 2 && (self.dims()[..ra - 2] == other.dims()[..rb - 2] || (rb == 2 && !trans_a));
        shapes.then_some(cpu)
    }

    /// `op(self)` on a half tensor, computed by the CPU backend from the halves directly and
    /// rounded once (as `in_f32` would, without its F32 copies); `None` on other backends.
    pub(crate) fn unary_halves(&self, op: UnaryOp) -> Result<Option<Tensor>> {
        let cpu = self.backend().as_any().downcast_ref::<CpuBackend>();
        let Some(cpu) = cpu.filter(|_| self.dtype().is_half()) else { return Ok(None) };
        let out = self.alloc_like(self.numel(), self.dtype())?;
        cpu.unary_halves(op, &self.0.buffer, &out)?;
        let node = GradOp::InF32(Box::new(GradOp::Unary(op)));
        Ok(Some(Tensor::result(out, self.shape().clone(), self.device(), node, &[self])))
    }

    /// `op(self, other)` with a half operand, computed by the CPU backend from the halves
    /// directly into the shared half type (or F32 for mixed types), rounded once, where each
    /// operand is the result's shape, one row of its last dimension (a bias) or one value;
    /// `None` elsewhere (the caller runs the op on F32 copies).
    pub(crate) fn binary_halves(&self, op: BinaryOp, other: &Tensor) -> Result<Option<Tensor>> {
        let (da, db) = (self.dtype(), other.dtype());
        if !(da.is_half() || db.is_half()) || da == DType::I32 || db == DType::I32 {
            return Ok(None);
        }
        let Some(cpu) = self.backend().as_any().downcast_ref::<CpuBackend>() else { return Ok(None) };
        let Ok(shape) = crate::Shape::broadcast("binary", self.shape(), other.shape()) else { return Ok(None) };
        let width = shape.dims().last().copied().unwrap_or(1);
        let spread = |t: &Tensor| match () {
            _ if t.shape() == &shape => Some(Spread::Full),
            _ if t.numel() == 1 => Some(Spread::Scalar),
            _ if t.dims().last() == Some(&width) && t.numel() == width => Some(Spread::Row),
            _ => None,
        };
        let (Some(sa), Some(sb)) = (spread(self), spread(other)) else { return Ok(None) };
        if shape.numel() == 0 {
            return Ok(None);
        }
        let out = self.alloc_like(shape.numel(), product_dtype(self, other))?;
        cpu.binary_halves(op, (&self.0.buffer, sa), (&other.0.buffer, sb), width, &out)?;
        Ok(Some(Tensor::result(out, shape, self.device(), GradOp::InF32(Box::new(GradOp::Binary(op))), &[self, other])))
    }

    /// `op`, a causal softmax or tanh GELU whose gradient rule is `inner`, on this half tensor:
    /// computed by the CPU backend from the halves directly and rounded once, as `in_f32`
    /// would, without its F32 copies (`CpuBackend::fused_halves`); `None` elsewhere.
    pub(crate) fn fused_halves(&self, op: FusedOp, inner: GradOp) -> Result<Option<Tensor>> {
        let Some(cpu) = self.fused_halves_here() else { return Ok(None) };
        let out = self.alloc_like(self.numel(), self.dtype())?;
        cpu.fused_halves(op, &[&self.0.buffer, &out])?;
        Ok(Some(Tensor::result(out, self.shape().clone(), self.device(), GradOp::InF32(Box::new(inner)), &[self])))
    }

    /// The CPU device that runs a fused kernel reading this half tensor directly, while fused
    /// kernels are on (see `tensor::composed`).
    fn fused_halves_here(&self) -> Option<&CpuBackend> {
        let cpu = self.backend().as_any().downcast_ref::<CpuBackend>()?;
        (self.dtype().is_half() && self.numel() > 0 && super::fused::fused_on()).then_some(cpu)
    }

    /// This tensor as F32 (a differentiable cast from a half type; itself otherwise).
    pub(crate) fn upcast(&self) -> Result<Tensor> {
        if self.dtype().is_half() {
            self.to_dtype(DType::F32)
        } else {
            Ok(self.clone())
        }
    }

    /// This tensor's values, with a gradient `s` times the incoming one (f16 loss scaling:
    /// see `optim::GradScaler`).
    pub fn scale_grad(&self, s: f32) -> Result<Tensor> {
        Ok(Tensor::result(self.buffer().clone(), self.shape().clone(), self.device(), GradOp::ScaleGrad(s), &[self]))
    }

    /// This tensor's place in the graph without its values: the same id, shape and history, an
    /// empty buffer. A node whose rule never reads an input's values (a cast, a sum, `a + b`:
    /// `GradOp::reads_inputs`) holds this instead of the input, so that an activation nothing
    /// else reads is freed after the forward (PyTorch's cast and add save nothing either).
    /// Leaves are themselves (their gradient is kept on them), and so is a tensor whose own
    /// rule reads its output.
    pub(crate) fn graph_handle(&self) -> Tensor {
        // A leaf keeps its gradient on itself; an op whose rule reads its output needs it whole.
        match &self.0.node {
            Some(node) if !node.op.reads_output() => {}
            _ => return self.clone(),
        }
        Tensor(Arc::new(super::Inner {
            id: self.0.id,
            buffer: crate::backend::Buffer::new((), 0, self.dtype()),
            shape: self.0.shape.clone(),
            device: self.0.device.clone(),
            node: self.0.node.clone(),
            requires_grad: self.0.requires_grad,
            grad: std::sync::Mutex::new(None),
        }))
    }

    /// An operand of a product: cast to the [`autocast`] type when one is set and this is F32.
    pub(crate) fn autocast_operand(&self) -> Result<Tensor> {
        match autocast_dtype() {
            Some(half) if self.dtype() == DType::F32 => self.to_dtype(half),
            _ => Ok(self.clone()),
        }
    }

    /// `Ok(None)` when no input is a half: the caller runs its usual path. Otherwise `op` runs
    /// on F32 copies of the inputs and its result comes back rounded to the inputs' half type
    /// (or F32 when they mix types, and as computed when it is not F32, an argmax's I32), with
    /// the graph node holding the half inputs.
    pub(crate) fn in_f32(inputs: &[&Tensor], op: impl FnOnce(&[Tensor]) -> Result<Tensor>) -> Result<Option<Tensor>> {
        if !inputs.iter().any(|t| t.dtype().is_half()) {
            return Ok(None);
        }
        let ups: Vec<Tensor> = inputs.iter().map(|t| t.upcast()).collect::<Result<_>>()?;
        // The copies are F32 already: products inside `op` must not cast them again.
        let y = autocast(None, || op(&ups))?;
        let Some(half) = result_dtype(inputs).filter(|_| y.dtype() == DType::F32) else { return Ok(Some(y)) };
        let rounded = y.detach().to_dtype(half)?;
        // Take the op's node over, with the half inputs in place of their copies; a node that
        // is still shared (it never is for the ops that call this) keeps the plain cast.
        let y = match Arc::try_unwrap(y.0) {
            Ok(inner) => inner,
            Err(shared) => return Tensor(shared).to_dtype(half).map(Some),
        };
        let Some(node) = y.node else { return Ok(Some(rounded)) };
        let Node { op, inputs: node_inputs } = match Arc::try_unwrap(node) {
            Ok(node) => node,
            Err(shared) => return Tensor(Arc::new(super::Inner { node: Some(shared), ..y })).to_dtype(half).map(Some),
        };
        let originals: Vec<Tensor> = node_inputs
            .into_iter()
            .map(|t| match ups.iter().position(|u| u.id() == t.id()) {
                Some(i) => inputs[i].clone(),
                None => t,
            })
            .collect();
        let refs: Vec<&Tensor> = originals.iter().collect();
        let out = rounded.buffer().clone();
        Ok(Some(Tensor::result(out, rounded.shape().clone(), rounded.device(), GradOp::InF32(Box::new(op)), &refs)))
    }
}

/// The gradient rule of an op that ran in F32 on half inputs (`GradOp::InF32`): the inner
/// op's rule on F32 copies of its inputs, output and incoming gradient, each input's gradient
/// rounded back to that input's dtype.
pub(crate) fn backward_in_f32(
    inner: &GradOp,
    inputs: &[Tensor],
    out: &Tensor,
    g: &Tensor,
    rule: impl FnOnce(&GradOp, &[Tensor], &Tensor, &Tensor) -> Result<Vec<Option<Tensor>>>,
) -> Result<Vec<Option<Tensor>>> {
    // A product the CPU backend computes from halves directly takes its halves and gradient
    // as they are: its products sum in f32 and round once, to the gradient's dtype or, mixed
    // with an F32, into F32 that the last line rounds once to the input's. Autocast is off in
    // there, or an F32 gradient would be rounded to a half before its product.
    if let (GradOp::Matmul { trans_a, .. }, [a, b]) = (inner, inputs) {
        if a.half_product_here(b, *trans_a).is_some() && a.dims()[..a.rank() - 2] == b.dims()[..b.rank() - 2] {
            let grads = autocast(None, || rule(inner, inputs, out, g))?;
            return grads.into_iter().zip(inputs).map(|(gr, x)| gr.map(|gr| gr.to_dtype(x.dtype())).transpose()).collect();
        }
    }
    if let Some(dx) = fused_grad_halves(inner, inputs, out, g)? {
        return Ok(vec![Some(dx)]);
    }
    // The rules ask their inputs whether they need a gradient: the copies answer as the halves.
    let reads = inner.reads_inputs();
    let wide = |t: &Tensor| -> Result<Tensor> {
        match t.dtype().is_half() && reads {
            true if t.needs_grad() => Ok(t.upcast()?.detach().requires_grad()),
            true => Ok(t.upcast()?.detach()),
            false => Ok(t.clone()),
        }
    };
    let ups: Vec<Tensor> = inputs.iter().map(wide).collect::<Result<_>>()?;
    // The output is widened only for a rule that reads it (it may be a `graph_handle`).
    let out = if inner.reads_output() { out.upcast()? } else { out.clone() };
    let grads = rule(inner, &ups, &out, &g.upcast()?)?;
    if grads.len() != inputs.len() {
        return Err(Error::invalid("backward", format!("{} gradients for {} inputs of an op run in f32", grads.len(), inputs.len())));
    }
    grads.into_iter().zip(inputs).map(|(gr, x)| gr.map(|gr| gr.to_dtype(x.dtype())).transpose()).collect()
}

/// The gradient of a causal softmax or tanh GELU that ran on a half input (`Tensor::fused_halves`),
/// computed by the CPU backend from the half output or input and the gradient as they are and
/// rounded once to the input's type; `None` for other ops and devices.
fn fused_grad_halves(inner: &GradOp, inputs: &[Tensor], out: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
    let [x] = inputs else { return Ok(None) };
    let (op, read) = match inner {
        GradOp::CausalSoftmax { scale } => {
            let t = x.dims().last().copied().unwrap_or(0);
            (FusedOp::CausalSoftmaxBackward { n: x.numel() / (t * t).max(1), t, scale: *scale }, out)
        }
        GradOp::GeluTanh => (FusedOp::GeluTanhBackward { len: x.numel() }, x),
        _ => return Ok(None),
    };
    let Some(cpu) = read.fused_halves_here() else { return Ok(None) };
    if g.numel() != x.numel() || read.numel() != x.numel() || read.dtype() != x.dtype() {
        return Ok(None);
    }
    let dx = x.alloc_like(x.numel(), x.dtype())?;
    cpu.fused_halves(op, &[g.buffer(), read.buffer(), &dx])?;
    Ok(Some(Tensor::from_parts(dx, x.shape().clone(), x.device().clone(), None)))
}
