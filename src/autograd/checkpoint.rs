//! Activation recomputation: a function whose forward keeps only its input for the backward,
//! which runs the function again with history to get the gradients (PyTorch's
//! `torch.utils.checkpoint`, non-reentrant in spirit: the recomputed graph is private).
use super::samples::{current_samples, with_samples, SampleContext};
use super::{no_grad, propagate, with_grad, GradOp};
use crate::{Error, Result, Tensor};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A function of one tensor that `checkpoint` runs twice (forward, then in backward).
pub type BlockFn = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// What a `checkpoint` node keeps: the function and the sample context its forward ran under,
/// so that the recomputation draws the same Dropout masks.
#[derive(Clone)]
pub struct Recompute {
    f: BlockFn,
    ctx: SampleContext,
    /// The `autocast` type the forward ran under, which the recomputation runs under too.
    autocast: Option<crate::DType>,
}

/// Contexts for forwards run outside any strategy (no sample context): one per call, so each
/// call draws fresh masks and its recomputation the same ones. Counted down from `u32::MAX`
/// so as not to meet the step numbers strategies use.
static OWN_STEP: AtomicU64 = AtomicU64::new(u32::MAX as u64);

/// `f(x)` without keeping its intermediate tensors: `f` runs with history off, and backward
/// runs it again on `x` with history to get the gradients of `x` and of `params`. `params`
/// must list every tensor needing grad that `f` reads besides `x` (a block's parameters);
/// gradients of anything else `f` reads are not computed.
///
/// Dropout inside `f` draws the same masks both times: both runs are under the caller's sample
/// context (a strategy's step sets one) started afresh, so each Dropout's call count starts
/// at 0 as in a plain forward that calls each layer once. Without a caller context each call
/// gets its own context (masks then differ from a plain forward's, which uses offsets).
/// With history off (`no_grad`, evaluation) this is just `f(x)`.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use std::sync::Arc;
/// use tandem::{Device, Tensor};
/// let dev = Device::cpu();
/// let w = Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.25], [2, 2], &dev)?.requires_grad();
/// let x = Tensor::from_vec(vec![1.0, 2.0], [1, 2], &dev)?.requires_grad();
/// let wf = w.clone();
/// let y = tandem::autograd::checkpoint(Arc::new(move |x: &Tensor| x.matmul(&wf)?.tanh()), &x, &[w.clone()])?;
/// y.sum(-1, false)?.sum(0, false)?.backward()?;
/// assert!(w.grad().is_some() && x.grad().is_some());
/// # Ok(()) }
/// ```
pub fn checkpoint(f: BlockFn, x: &Tensor, params: &[Tensor]) -> Result<Tensor> {
    if !super::is_enabled() || !(x.needs_grad() || params.iter().any(Tensor::needs_grad)) {
        return f(x);
    }
    let ctx = current_samples().unwrap_or_else(|| SampleContext {
        step: OWN_STEP.fetch_sub(1, Ordering::Relaxed),
        first_sample: 0,
        samples: x.dims().first().copied().unwrap_or(1),
    });
    let y = no_grad(|| with_samples(ctx, || f(x)))?;
    let inputs: Vec<&Tensor> = std::iter::once(x).chain(params).collect();
    Ok(Tensor::result(
        y.buffer().clone(),
        y.shape().clone(),
        y.device(),
        GradOp::Checkpoint(Recompute { f, ctx, autocast: crate::autocast_dtype() }),
        &inputs,
    ))
}

/// The gradients of a `checkpoint` node's inputs (`x`, then the parameters) given `g` =
/// dL/d(output): the forward again with history, from a detached copy of `x`, then `g`
/// back-propagated through that private graph only.
pub(super) fn backward(r: &Recompute, inputs: &[Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = if inputs[0].needs_grad() { inputs[0].detach().requires_grad() } else { inputs[0].detach() };
    let y = with_grad(|| with_samples(r.ctx, || crate::autocast(r.autocast, || (r.f)(&x))))?;
    if y.shape() != g.shape() {
        return Err(Error::shape(
            "checkpoint",
            format!("the recomputed output {:?} differs from the forward's {:?} on {}", y.shape(), g.shape(), g.device()),
        ));
    }
    let mut got: HashMap<u64, Tensor> = HashMap::new();
    if y.needs_grad() {
        propagate(&y, g.clone(), &mut |leaf, gl| {
            if let Some(gl) = gl {
                got.insert(leaf.id(), gl);
            }
            Ok(())
        })?;
    }
    let ids = std::iter::once(x.id()).chain(inputs[1..].iter().map(Tensor::id));
    Ok(ids.map(|id| got.remove(&id)).collect())
}
