//! `Tensor`: an n-dimensional array on one device, with define-by-run autograd.
//!
//! Storage is always contiguous in the tensor's own buffer, so reshape and flatten are free;
//! transposes, broadcasts and slices are strided reads inside the op that consumes them.
#![doc = include_str!("numerics.md")]
mod compose;
mod deferred;
mod fused;
mod halves;
mod losses;
mod nn_ops;
mod ops;
pub mod random;
mod shape_ops;
mod thread_settings;

pub(crate) use compose::gelu_tanh_inner;
pub use deferred::build_deferred;
pub(crate) use deferred::{defers, forget_host_values};
pub use fused::composed;
pub(crate) use halves::backward_in_f32;
pub use halves::{autocast, autocast_dtype};
pub use losses::CrossEntropy;
pub use thread_settings::on_cpu_pool;

use crate::autograd::{self, GradOp, Node};
use crate::backend::{host, Backend, Buffer, IndexOp, ReduceOp, ReduceSpec};
use crate::{DType, Device, Error, Layout, Result, Shape};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_TENSOR_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Work this thread defers to the moment between two ops (see [`between_ops`]).
    static BETWEEN_OPS: std::cell::RefCell<Option<std::rc::Rc<dyn Fn()>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on this thread after every op that makes a tensor, until the returned guard
/// drops: a point where no op holds any buffer, so `f` may release memory (ZeRO-3 frees the
/// parameters a gather made unneeded there, never inside the op that asked for the gather).
pub(crate) fn between_ops(f: std::rc::Rc<dyn Fn()>) -> BetweenOps {
    BetweenOps(BETWEEN_OPS.with(|h| h.replace(Some(f))))
}

/// Whether this thread runs work between ops ([`between_ops`]): work that cannot move to
/// another thread.
pub(crate) fn runs_between_ops() -> bool {
    BETWEEN_OPS.with(|h| h.borrow().is_some())
}

/// Puts back what ran between ops before [`between_ops`].
pub(crate) struct BetweenOps(Option<std::rc::Rc<dyn Fn()>>);

impl Drop for BetweenOps {
    fn drop(&mut self) {
        let prev = self.0.take();
        BETWEEN_OPS.with(|h| *h.borrow_mut() = prev);
    }
}

/// An n-dimensional f32 (or I32 label) array on one device.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use tandem::{Device, Tensor};
/// let dev = Device::cpu();
/// let w = Tensor::from_vec(vec![1.0, -2.0, 3.0], [3], &dev)?.requires_grad();
/// let loss = w.square()?.sum_all()?;
/// loss.backward()?;
/// assert_eq!(w.grad().unwrap().to_vec()?, vec![2.0, -4.0, 6.0]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) buffer: Buffer,
    pub(crate) shape: Shape,
    pub(crate) device: Device,
    /// Shared, so that a node can point at this tensor's history without holding its values
    /// (`Tensor::graph_handle`).
    pub(crate) node: Option<Arc<Node>>,
    pub(crate) requires_grad: bool,
    pub(crate) grad: Mutex<Option<Tensor>>,
}

impl Tensor {
    /// Wraps a buffer as a tensor; `node` records how it was computed (when grad is on).
    pub(crate) fn from_parts(buffer: Buffer, shape: Shape, device: Device, node: Option<Node>) -> Tensor {
        let requires_grad = node.is_some();
        Tensor(Arc::new(Inner {
            id: NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed),
            buffer,
            shape,
            device,
            node: node.map(Arc::new),
            requires_grad,
            grad: Mutex::new(None),
        }))
    }

    /// The result of an op on `inputs`: records `op` for backward when any input needs grad.
    pub(crate) fn result(buffer: Buffer, shape: Shape, device: &Device, op: GradOp, inputs: &[&Tensor]) -> Tensor {
        // Cloned out of the cell, so that the hook may itself run ops.
        if let Some(f) = BETWEEN_OPS.with(|h| h.borrow().clone()) {
            f();
        }
        // A rule that reads no input values gets the inputs' places in the graph only, so that
        // an activation nothing else reads is freed after the forward (as PyTorch saves only
        // what each backward formula uses).
        let node = (autograd::is_enabled() && inputs.iter().any(|t| t.0.requires_grad)).then(|| {
            let keep = op.reads_inputs();
            Node { op, inputs: inputs.iter().map(|t| if keep { (*t).clone() } else { t.graph_handle() }).collect() }
        });
        Tensor::from_parts(buffer, shape, device.clone(), node)
    }

    /// A tensor holding `data` with `shape` on `device`.
    pub fn from_vec(data: Vec<f32>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.numel() {
            return Err(Error::shape("from_vec", format!("{} values for shape {shape:?}", data.len())));
        }
        if deferred::defers(device) {
            return deferred::deferred(device, shape, deferred::HostValues::F32(data));
        }
        let buf = device.backend().upload(bytemuck::cast_slice(&data), DType::F32)?;
        Ok(Tensor::from_parts(buf, shape, device.clone(), None))
    }
    /// An I32 tensor of class labels (or other integers) on `device`. Their range is noted
    /// while they are on the host, so that `cross_entropy` checks them without a device pass.
    pub fn from_labels(data: Vec<i32>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.numel() {
            return Err(Error::shape("from_labels", format!("{} values for shape {shape:?}", data.len())));
        }
        let buf = device.backend().upload(bytemuck::cast_slice(&data), DType::I32)?;
        let bound = data.iter().fold(None, |b: Option<(i32, i32)>, &v| Some(b.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v)))));
        buf.set_label_bound(bound);
        buf.set_host_i32(Some(data.into()));
        Ok(Tensor::from_parts(buf, shape, device.clone(), None))
    }
    pub fn full(value: f32, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        if deferred::defers(device) {
            return deferred::deferred(device, shape, deferred::HostValues::Fill(value));
        }
        let buf = device.backend().alloc(shape.numel(), DType::F32)?;
        device.backend().fill(&buf, value)?;
        Ok(Tensor::from_parts(buf, shape, device.clone(), None))
    }
    pub fn zeros(shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::full(0.0, shape, device)
    }
    pub fn ones(shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, device)
    }
    /// Uniform in `[lo, hi)` from `rng` (drawn on the host, so results do not depend on the device).
    pub fn rand_uniform(lo: f32, hi: f32, shape: impl Into<Shape>, rng: &mut impl rand::Rng, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let n = shape.numel();
        let data = host::try_collect(n, (0..n).map(|_| lo + (hi - lo) * rng.random::<f32>()), "host", &format!("rand_uniform {shape:?}"))?;
        Tensor::from_vec(data, shape, device)
    }
    /// Standard normal values from `rng` (Box–Muller, on the host); any RNG of the
    /// re-exported [`rand`], such as `tandem::rand::rngs::StdRng`.
    pub fn randn(shape: impl Into<Shape>, rng: &mut impl rand::Rng, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let data = normal_vec(shape.numel(), rng)?;
        Tensor::from_vec(data, shape, device)
    }

    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }
    pub fn dims(&self) -> &[usize] {
        self.0.shape.dims()
    }
    pub fn rank(&self) -> usize {
        self.0.shape.rank()
    }
    pub fn numel(&self) -> usize {
        self.0.shape.numel()
    }
    pub fn dtype(&self) -> DType {
        self.0.buffer.dtype()
    }
    pub fn device(&self) -> &Device {
        &self.0.device
    }
    pub fn buffer(&self) -> &Buffer {
        &self.0.buffer
    }
    pub(crate) fn backend(&self) -> &dyn Backend {
        self.0.device.backend()
    }
    pub(crate) fn layout(&self) -> Layout {
        Layout::contiguous(&self.0.shape)
    }
    /// Unique per tensor value; autograd keys gradients by it.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The values, copied to the host (waits for pending work on the device).
    /// The values as f32; a Bf16 or F16 tensor's widen exactly (as PyTorch's `.tolist()`).
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        if let Some(op) = crate::backend::CastOp::between(self.dtype(), DType::F32).filter(|_| self.dtype().is_half()) {
            let bytes = self.backend().download(&self.0.buffer)?;
            return host::try_words(&op.host(&bytes, self.numel()), "host", "to_vec");
        }
        self.expect_dtype("to_vec", DType::F32)?;
        let bytes = self.backend().download(&self.0.buffer)?;
        host::try_words(&bytes[..self.numel() * 4], "host", "to_vec")
    }
    /// The raw bits of a Bf16 or F16 tensor's values.
    pub fn to_half_bits(&self) -> Result<Vec<u16>> {
        if !self.dtype().is_half() {
            return Err(Error::DType { op: "to_half_bits", expected: DType::Bf16, got: self.dtype() });
        }
        let bytes = self.backend().download(&self.0.buffer)?;
        host::try_words(&bytes[..self.numel() * 2], "host", "to_half_bits")
    }
    pub fn to_vec_i32(&self) -> Result<Vec<i32>> {
        self.expect_dtype("to_vec_i32", DType::I32)?;
        let bytes = self.backend().download(&self.0.buffer)?;
        host::try_words(&bytes[..self.numel() * 4], "host", "to_vec_i32")
    }
    /// The single value of a one-element tensor.
    pub fn to_scalar(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(Error::shape("to_scalar", format!("expected one element, shape is {:?}", self.shape())));
        }
        Ok(self.to_vec()?[0])
    }

    /// This tensor on `device` (differentiable: gradients flow back to the source device).
    /// CUDA devices with peer access copy directly; other pairs stage through host memory.
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if self.device().same(device) {
            return Ok(self.clone());
        }
        let buf = match device.backend().copy_from_peer(self.backend(), &self.0.buffer)? {
            Some(b) => b,
            None => {
                let bytes = self.backend().download(&self.0.buffer)?;
                device.backend().upload(&bytes[..self.numel() * self.dtype().size()], self.dtype())?
            }
        };
        buf.set_label_bound(self.0.buffer.label_bound());
        buf.set_host_i32(self.0.buffer.host_i32());
        Ok(Tensor::result(buf, self.shape().clone(), device, GradOp::ToDevice, &[self]))
    }

    /// Marks this tensor as a leaf that accumulates gradients.
    pub fn requires_grad(self) -> Tensor {
        Tensor(Arc::new(Inner {
            id: NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed),
            buffer: self.0.buffer.clone(),
            shape: self.0.shape.clone(),
            device: self.0.device.clone(),
            node: None,
            requires_grad: true,
            grad: Mutex::new(None),
        }))
    }
    pub fn needs_grad(&self) -> bool {
        self.0.requires_grad
    }
    pub fn is_leaf(&self) -> bool {
        self.0.node.is_none()
    }
    /// The same values without history.
    pub fn detach(&self) -> Tensor {
        Tensor::from_parts(self.0.buffer.clone(), self.0.shape.clone(), self.0.device.clone(), None)
    }
    /// The accumulated gradient of a leaf, if any backward has reached it.
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad.lock().unwrap().clone()
    }
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *self.0.grad.lock().unwrap() = grad;
    }
    /// Computes gradients of this scalar with respect to every leaf that needs them,
    /// accumulating into their `grad()` as PyTorch does.
    pub fn backward(&self) -> Result<()> {
        autograd::backward(self, &mut |_| Ok(()))
    }

    /// Overwrites this tensor's values in place with `src`'s (same shape, dtype); not recorded
    /// by autograd. Optimizers and checkpoint loading use it.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() || src.dtype() != self.dtype() {
            return Err(Error::shape("assign", format!("{:?} into {:?}", src.shape(), self.shape())));
        }
        let src = src.to(self.device())?;
        self.backend().copy(&src.0.buffer, 0, &self.0.buffer, 0, self.numel())
    }

    /// Frees this tensor's memory while the tensor (and every view sharing its buffer) lives
    /// on: ZeRO-3 keeps a model's parameters this way between steps. `Ok(false)` where the
    /// backend keeps the memory (see [`Backend::release`]).
    pub(crate) fn release_storage(&self) -> Result<bool> {
        self.backend().release(&self.0.buffer)
    }
    /// Memory again for a released tensor, contents unspecified: assign its values next.
    pub(crate) fn restore_storage(&self) -> Result<bool> {
        self.backend().restore(&self.0.buffer)
    }

    pub(crate) fn expect_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if self.dtype() != dtype {
            return Err(Error::DType { op, expected: dtype, got: self.dtype() });
        }
        Ok(())
    }
    pub(crate) fn same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if !self.device().same(other.device()) {
            let (a, b) = Device::names_of(self.device(), other.device());
            return Err(Error::DeviceMismatch { op, a, b });
        }
        Ok(())
    }
    /// Errors unless every value of this I32 tensor is a class index in `0..classes`, naming
    /// the first that is not. Free for labels whose range is known (made by `from_labels`, and
    /// moved or reshaped since); others take one device pass whose only transfer is a flag, and
    /// a passing result is remembered with the buffer. Only a failure downloads the labels,
    /// to name the first bad one.
    pub(crate) fn check_labels(&self, op: &'static str, classes: usize) -> Result<()> {
        self.expect_dtype(op, DType::I32)?;
        if self.numel() == 0 {
            return Ok(());
        }
        let fits = |(lo, hi): (i32, i32)| lo >= 0 && (hi as i64) < classes as i64;
        let known = self.0.buffer.label_bound();
        if known.is_some_and(fits) {
            return Ok(());
        }
        if known.is_none() && classes > 0 && self.labels_fit_on_device(classes)? {
            self.0.buffer.set_label_bound(Some((0, i32::try_from(classes - 1).unwrap_or(i32::MAX))));
            return Ok(());
        }
        let values = self.to_vec_i32()?;
        match values.iter().position(|&l| l < 0 || l as i64 >= classes as i64) {
            Some(index) => Err(Error::Label { op, label: values[index], index, classes }),
            // A bound wider than the values (after a narrow): they fit after all.
            None => Ok(()),
        }
    }

    /// Whether every label is in `0..classes`, on the device: gathering each row's label from
    /// a matrix of ones reads 1 in range and 0 outside (the `IndexOp` contract), and the
    /// minimum over the rows is the flag. Rows go in chunks so the ones stay small and each
    /// reduction short (software adapters end shader loops after 65,535 iterations).
    fn labels_fit_on_device(&self, classes: usize) -> Result<bool> {
        const ONES: usize = 1 << 20;
        const ROWS: usize = 1 << 15;
        let (b, rows) = (self.backend(), self.numel());
        let chunk = (ONES / classes).clamp(1, ROWS).min(rows);
        let chunks = rows.div_ceil(chunk);
        let ones = self.alloc_like(chunk * classes, DType::F32)?;
        b.fill(&ones, 1.0)?;
        let (idx, hit) = (self.alloc_like(chunk, DType::I32)?, self.alloc_like(chunk, DType::F32)?);
        let (mins, flag) = (self.alloc_like(chunks, DType::F32)?, self.alloc_like(1, DType::F32)?);
        for (i, start) in (0..rows).step_by(chunk).enumerate() {
            let n = chunk.min(rows - start);
            b.copy(&self.0.buffer, start, &idx, 0, n)?;
            b.index(IndexOp::Gather, &ones, &idx, &hit, n, classes)?;
            b.reduce(ReduceOp::Min, &hit, ReduceSpec { outer: 1, len: n, inner: 1 }, &flag)?;
            b.copy(&flag, 0, &mins, i, 1)?;
        }
        b.reduce(ReduceOp::Min, &mins, ReduceSpec { outer: 1, len: chunks, inner: 1 }, &flag)?;
        Ok(b.download(&flag)? == 1f32.to_le_bytes())
    }

    /// A fresh output buffer on this tensor's device.
    pub(crate) fn alloc_like(&self, numel: usize, dtype: DType) -> Result<Buffer> {
        self.backend().alloc(numel, dtype)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {:?}, {:?})", self.shape(), self.dtype(), self.device())
    }
}

/// `n` standard normal samples by Box–Muller (kept here so tensors need no distribution crate);
/// `OutOfMemory` when the host cannot hold them.
pub(crate) fn normal_vec(n: usize, rng: &mut impl rand::Rng) -> Result<Vec<f32>> {
    let mut out = host::try_vec(n.saturating_add(1), "host", &format!("{n} normal samples"))?;
    while out.len() < n {
        let u1 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(n);
    Ok(out)
}
