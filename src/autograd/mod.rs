//! Define-by-run reverse-mode autograd: the graph records, the engine that walks it, `no_grad`,
//! and activation recomputation (`checkpoint`).
mod checkpoint;
mod rules;
mod samples;

pub use checkpoint::{checkpoint, BlockFn, Recompute};
pub(crate) use samples::replace_samples;
pub(crate) use samples::samples_in_progress;
pub use samples::{current_samples, with_samples, SampleContext};

use crate::backend::{BinaryOp, Buffer, UnaryOp, WindowSpec};
use crate::{Error, Result, Tensor};
use std::cell::Cell;
use std::collections::HashMap;

/// How a tensor was computed: its op and the tensors it read.
pub struct Node {
    pub(crate) op: GradOp,
    pub(crate) inputs: Vec<Tensor>,
}

/// Every differentiable op; `rules::backward` holds one gradient rule for each.
pub enum GradOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Sum {
        axis: usize,
    },
    Max {
        axis: usize,
    },
    /// Softmax along `axis`: PyTorch's fused gradient `y (g - sum(g y))`.
    Softmax {
        axis: usize,
    },
    /// Variance (or, if `std`, standard deviation) along `axis`, PyTorch's fused gradient.
    Var {
        axis: usize,
        correction: usize,
        std: bool,
    },
    /// The mean binary cross-entropy of logits (input 0) against targets (input 1).
    BceWithLogits,
    /// `x Φ(x)`, its tanh approximation and `x sigmoid(x)` with PyTorch's fused gradients
    /// (see rules.rs).
    Gelu,
    GeluTanh,
    Silu,
    Reshape,
    Permute(Vec<usize>),
    Expand,
    Narrow {
        dim: usize,
        start: usize,
    },
    /// Concatenation along dimension 0.
    Cat,
    Matmul {
        trans_a: bool,
        trans_b: bool,
    },
    /// `cols` is the forward pass's im2col, kept for the weight gradient; `bias`: the bias was
    /// added in the same pass (a third input); `relu`: a ReLU was applied in the same pass too,
    /// and this is the output it left, whose positive entries pass the gradient through.
    Conv2d {
        spec: WindowSpec,
        cols: Buffer,
        bias: bool,
        relu: Option<Buffer>,
    },
    MaxPool2d {
        spec: WindowSpec,
        argmax: Buffer,
    },
    Gather {
        cols: usize,
    },
    /// LayerNorm over the last dimension of input 0 with weight and bias (inputs 1, 2),
    /// fused: `mean` and `rstd` are each row's, saved by the forward.
    LayerNorm {
        mean: Buffer,
        rstd: Buffer,
    },
    /// `softmax(x · scale + causal)` over `[.., T, T]`, fused.
    CausalSoftmax {
        scale: f32,
    },
    /// Fused causal attention of q, k, v (inputs 0-2); `lse` is each query row's logsumexp.
    Attention {
        scale: f32,
        lse: Buffer,
    },
    /// An embedding lookup of a `[table_rows, D]` table (input 0) by I32 ids (input 1).
    GatherRows {
        table_rows: usize,
    },
    ToDevice,
    /// A cast between F32 and a half type; `from` is the input's dtype, which the gradient
    /// is cast back to.
    Cast {
        from: crate::DType,
    },
    /// An op that ran in F32 on half inputs and rounded its output to their type (see
    /// `tensor::halves`): its own rule, on F32 copies.
    InF32(Box<GradOp>),
    /// The identity whose gradient is multiplied by the factor (loss scaling).
    ScaleGrad(f32),
    /// A function of input 0 run without history (`checkpoint`); the other inputs are the
    /// leaves it reads, whose gradients backward gets by running it again with history.
    Checkpoint(Recompute),
}

impl GradOp {
    /// Whether this op's gradient rule reads the op's own output (`exp`'s `g · y`, softmax,
    /// attention), so that the output's values must outlive the forward; rules that do not may
    /// be given a tensor's place in the graph without its values (`Tensor::graph_handle`).
    pub(crate) fn reads_output(&self) -> bool {
        match self {
            GradOp::Unary(u) => u.grad_reads_output(),
            GradOp::Binary(b) => b.grad_reads_output(),
            GradOp::Max { .. } | GradOp::Softmax { .. } | GradOp::CausalSoftmax { .. } | GradOp::Attention { .. } => true,
            GradOp::Var { std, .. } => *std,
            GradOp::InF32(inner) => inner.reads_output(),
            _ => false,
        }
    }
    /// Whether this op's gradient rule reads its inputs' values; `false` for the ops whose
    /// rules need only the inputs' shapes, devices and whether they need a gradient (sums,
    /// views, copies, casts, `a ± b`), whose nodes then keep `graph_handle`s, not the values.
    pub(crate) fn reads_inputs(&self) -> bool {
        match self {
            GradOp::Binary(b) => b.grad_reads_inputs(),
            GradOp::Unary(u) => u.grad_reads_input(),
            GradOp::Reshape | GradOp::Permute(_) | GradOp::Expand | GradOp::Narrow { .. } | GradOp::Cat | GradOp::Sum { .. } => false,
            GradOp::ToDevice | GradOp::Cast { .. } | GradOp::ScaleGrad(_) => false,
            GradOp::InF32(inner) => inner.reads_inputs(),
            _ => true,
        }
    }
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record history.
pub fn is_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Sets whether ops on this thread record history, returning the previous mode (for
/// [`on_cpu_pool`](crate::on_cpu_pool), which carries it to another thread).
pub(crate) fn replace_enabled(enabled: bool) -> bool {
    GRAD_ENABLED.with(|g| g.replace(enabled))
}

/// Runs `f` without recording history on this thread (evaluation, optimizer updates).
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    let _guard = NoGradGuard::new();
    f()
}

/// Runs `f` recording history even inside `no_grad` or backward (a recomputed forward).
fn with_grad<T>(f: impl FnOnce() -> T) -> T {
    // The guard puts the previous mode back, whichever it was.
    let _guard = NoGradGuard { prev: GRAD_ENABLED.with(|g| g.replace(true)) };
    f()
}

/// Disables history on this thread until dropped.
pub struct NoGradGuard {
    prev: bool,
}

impl NoGradGuard {
    pub fn new() -> Self {
        NoGradGuard { prev: GRAD_ENABLED.with(|g| g.replace(false)) }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

/// Backward from scalar `root`. `on_leaf_ready` is called for each leaf the moment its
/// gradient for this pass is complete (its `grad()` is updated), in the order backward
/// finishes them: data parallelism starts communicating a bucket from there.
pub fn backward(root: &Tensor, on_leaf_ready: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
    if root.numel() != 1 {
        return Err(Error::shape("backward", format!("needs a scalar (one element), got {:?}", root.shape())));
    }
    if !root.needs_grad() {
        return Err(Error::invalid("backward", "the tensor does not depend on anything that requires grad"));
    }
    let _guard = NoGradGuard::new();
    let seed = Tensor::ones(root.shape().clone(), root.device())?;
    propagate(root, seed, &mut |leaf, g| finish_leaf(leaf, g, on_leaf_ready))
}

/// Back-propagates `seed` = dL/d(`root`) through `root`'s graph; `on_leaf(leaf, gradient)` is
/// called once per leaf that needs grad, when every contribution to it is summed. Runs with
/// history off (the caller holds a `NoGradGuard`).
fn propagate(root: &Tensor, seed: Tensor, on_leaf: &mut dyn FnMut(&Tensor, Option<Tensor>) -> Result<()>) -> Result<()> {
    let order = topo_order(root);
    // How many gradient contributions each tensor still waits for.
    let mut pending: HashMap<u64, usize> = HashMap::new();
    for t in &order {
        if let Some(node) = &t.0.node {
            for i in node.inputs.iter().filter(|i| i.needs_grad()) {
                *pending.entry(i.id()).or_default() += 1;
            }
        }
    }
    let mut grads: HashMap<u64, Tensor> = HashMap::new();
    grads.insert(root.id(), seed);
    if root.is_leaf() {
        return on_leaf(root, grads.remove(&root.id()));
    }
    for t in order.iter().rev() {
        let Some(node) = &t.0.node else { continue };
        // A node no gradient reached still releases its inputs' pending counts.
        let input_grads = match grads.remove(&t.id()) {
            Some(g) => rules::backward(&node.op, &node.inputs, t, &g)?,
            None => vec![None; node.inputs.len()],
        };
        for (input, gi) in node.inputs.iter().zip(input_grads) {
            if !input.needs_grad() {
                continue;
            }
            if let Some(gi) = gi {
                let acc = match grads.remove(&input.id()) {
                    Some(prev) => prev.add(&gi)?,
                    None => gi,
                };
                grads.insert(input.id(), acc);
            }
            let left = pending.get_mut(&input.id()).expect("counted above");
            *left -= 1;
            if *left == 0 && input.is_leaf() {
                on_leaf(input, grads.remove(&input.id()))?;
            }
        }
    }
    Ok(())
}

fn finish_leaf(leaf: &Tensor, g: Option<Tensor>, on_ready: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
    if let Some(g) = g {
        let total = match leaf.grad() {
            Some(prev) => prev.add(&g)?,
            None => g,
        };
        leaf.set_grad(Some(total));
    }
    on_ready(leaf)
}

/// Bytes of the activations `root`'s graph keeps alive for its backward: every buffer of a
/// tensor the graph holds other than its leaves (parameters and inputs), once however many
/// tensors share it, and the buffers ops saved beside their inputs (im2col columns, pooling
/// argmax, LayerNorm statistics, attention logsumexp). Measured at the end of a forward pass,
/// it is the memory backward still needs.
pub fn activation_bytes(root: &Tensor) -> u64 {
    let mut buffers = std::collections::HashSet::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root.clone()];
    let mut bytes = 0;
    let mut count = |b: &Buffer, bytes: &mut u64| {
        if buffers.insert(b.key()) {
            *bytes += (b.len() * b.dtype().size()) as u64;
        }
    };
    while let Some(t) = stack.pop() {
        let Some(node) = &t.0.node else { continue };
        if !seen.insert(t.id()) {
            continue;
        }
        count(t.buffer(), &mut bytes);
        match &node.op {
            GradOp::Conv2d { cols, relu, .. } => {
                count(cols, &mut bytes);
                if let Some(r) = relu {
                    count(r, &mut bytes);
                }
            }
            GradOp::MaxPool2d { argmax, .. } => count(argmax, &mut bytes),
            GradOp::LayerNorm { mean, rstd } => {
                count(mean, &mut bytes);
                count(rstd, &mut bytes);
            }
            GradOp::Attention { lse, .. } => count(lse, &mut bytes),
            _ => {}
        }
        stack.extend(node.inputs.iter().cloned());
    }
    bytes
}

/// Tensors reachable from `root` that need grad, each after all of its inputs.
fn topo_order(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut visited = std::collections::HashSet::new();
    // Iterative DFS: (tensor, inputs already pushed)
    let mut stack = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !visited.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if let Some(node) = &t.0.node {
            for i in node.inputs.iter().filter(|i| i.needs_grad() && !visited.contains(&i.id())) {
                stack.push((i.clone(), false));
            }
        }
    }
    order
}
