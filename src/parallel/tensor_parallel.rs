//! Tensor parallelism (Megatron-LM style): one Linear's weight split across devices, by output
//! rows (`ColumnParallelLinear`) or input columns (`RowParallelLinear`), and a strategy that
//! runs a model's last two Linear layers that way.
//!
//! Column then row needs no communication in between: each device keeps its slice of the
//! hidden activation, and only the row layer's partial outputs are summed.
mod attention;
mod gpt;
mod mlp;
pub(crate) mod placed;
mod stages;

use super::split;
use super::step::{NormOver, Part, StepCore};
use super::trace::Phase;
use super::{batch_to_device, Loss, OptimConfig, StepReport, Strategy};
use crate::autograd::no_grad;
use crate::data::Batch;
use crate::nn::{Linear, Module, Sequential};
use crate::optim::Optimizer;
use crate::{Device, Error, Result, Tensor};
pub use gpt::TensorParallelGpt;
pub use mlp::ParallelMlp;
pub use stages::ShardedStage;
use std::time::Instant;

/// `(start, len)` of each device's share of `n`, as equal as integers allow; every share must
/// be non-empty.
fn shard_ranges(op: &'static str, n: usize, devices: &[Device]) -> Result<Vec<(usize, usize)>> {
    if devices.is_empty() || devices.len() > n {
        return Err(Error::invalid(op, format!("cannot split {n} features over {} devices", devices.len())));
    }
    let ranges = split::ranges(n, devices.len(), Some(&vec![1.0; devices.len()]))?;
    Ok(ranges.into_iter().map(|r| (r.start, r.len())).collect())
}

/// A new leaf on `device` holding `t`'s slice `start..start+len` of dimension `dim` (a copy,
/// never sharing storage with `t`: `narrow` always copies).
fn shard(t: &Tensor, dim: usize, (start, len): (usize, usize), device: &Device) -> Result<Tensor> {
    no_grad(|| Ok(t.narrow(dim, start, len)?.to(device)?.detach().requires_grad()))
}

/// The sum of tensors on different devices, on `device` (a plain all-reduce to one place).
fn sum_on(parts: &[Tensor], device: &Device) -> Result<Tensor> {
    let mut acc = parts.first().ok_or_else(|| Error::invalid("sum_on", "no tensors"))?.to(device)?;
    for p in &parts[1..] {
        acc = acc.add(&p.to(device)?)?;
    }
    Ok(acc)
}

/// Values of shards concatenated along `dim` on `device`, without history.
fn gather(parts: &[Tensor], dim: usize, device: &Device) -> Result<Tensor> {
    no_grad(|| Tensor::cat(&parts.iter().map(|p| p.to(device)).collect::<Result<Vec<_>>>()?, dim))
}

/// Gradients of shards concatenated like `gather`; `None` until every shard has one.
fn gather_grads(parts: &[Tensor], dim: usize, device: &Device) -> Result<Option<Tensor>> {
    let grads: Option<Vec<Tensor>> = parts.iter().map(|p| p.grad()).collect();
    grads.map(|g| gather(&g, dim, device)).transpose()
}

/// Writes `full`'s slices into the shards.
fn scatter(full: &Tensor, parts: &[Tensor], dim: usize, ranges: &[(usize, usize)]) -> Result<()> {
    for (p, &(start, len)) in parts.iter().zip(ranges) {
        p.assign(&no_grad(|| full.narrow(dim, start, len))?)?;
    }
    Ok(())
}

/// `y = x·Wᵀ + b` with `W`'s output rows split across devices: every device gets the whole
/// input and computes its slice of the outputs. Autograd sums the input's gradient over the
/// devices, since the input was copied to each with `Tensor::to`.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use std::sync::Arc;
/// use tandem::nn::{Linear, Module};
/// use tandem::parallel::ColumnParallelLinear;
/// let dev = || tandem::Device::from_backend(Arc::new(tandem::backend::cpu::CpuBackend::new()));
/// let mut rng = tandem::rng(0);
/// let lin = Linear::new(3, 5, &mut rng, &dev())?;
/// let col = ColumnParallelLinear::from_linear(&lin, &[dev(), dev()])?;
/// let x = tandem::Tensor::ones([2, 3], lin.weight.device())?;
/// tandem::tolerance::check_close("y", &col.forward(&x)?.to_vec()?, &lin.forward(&x)?.to_vec()?, 1e-6, 1e-5).map_err(tandem::Error::Msg)?;
/// # Ok(()) }
/// ```
pub struct ColumnParallelLinear {
    weights: Vec<Tensor>,
    biases: Option<Vec<Tensor>>,
    devices: Vec<Device>,
    ranges: Vec<(usize, usize)>,
}

impl ColumnParallelLinear {
    /// `linear`'s weight (and bias) split by output rows over `devices`.
    pub fn from_linear(linear: &Linear, devices: &[Device]) -> Result<Self> {
        let ranges = shard_ranges("ColumnParallelLinear", linear.weight.dims()[0], devices)?;
        let weights = ranges.iter().zip(devices).map(|(&r, d)| shard(&linear.weight, 0, r, d)).collect::<Result<_>>()?;
        let biases = match &linear.bias {
            Some(b) => Some(ranges.iter().zip(devices).map(|(&r, d)| shard(b, 0, r, d)).collect::<Result<_>>()?),
            None => None,
        };
        Ok(ColumnParallelLinear { weights, biases, devices: devices.to_vec(), ranges })
    }
    /// Each device's slice of the output, on that device (no gather).
    pub fn forward_shards(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        (0..self.devices.len())
            .map(|i| {
                let y = x.to(&self.devices[i])?.matmul_t(&self.weights[i], false, true)?;
                match &self.biases {
                    Some(b) => y.add(&b[i]),
                    None => Ok(y),
                }
            })
            .collect()
    }
    /// The whole weight `[out, in]` on the first device.
    pub fn weight(&self) -> Result<Tensor> {
        gather(&self.weights, 0, &self.devices[0])
    }
    pub fn bias(&self) -> Result<Option<Tensor>> {
        self.biases.as_ref().map(|b| gather(b, 0, &self.devices[0])).transpose()
    }
    /// The weight's gradient reassembled like `weight()`.
    pub fn weight_grad(&self) -> Result<Option<Tensor>> {
        gather_grads(&self.weights, 0, &self.devices[0])
    }
    pub fn bias_grad(&self) -> Result<Option<Tensor>> {
        Ok(match &self.biases {
            Some(b) => gather_grads(b, 0, &self.devices[0])?,
            None => None,
        })
    }
    /// Overwrites the shards from a whole weight and bias.
    pub fn load(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<()> {
        scatter(weight, &self.weights, 0, &self.ranges)?;
        match (&self.biases, bias) {
            (Some(parts), Some(b)) => scatter(b, parts, 0, &self.ranges),
            (None, None) => Ok(()),
            _ => Err(Error::invalid("ColumnParallelLinear::load", "bias given for a layer without one, or missing")),
        }
    }
    /// Device `i`'s parameters under the unsplit layer's names (`weight`, `bias`).
    fn device_params(&self, i: usize) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weights[i].clone())];
        if let Some(b) = &self.biases {
            p.push(("bias".to_string(), b[i].clone()));
        }
        p
    }
}

impl Module for ColumnParallelLinear {
    /// The output gathered (concatenated along the last dimension) on the first device.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let first = &self.devices[0];
        let parts = self.forward_shards(x)?.iter().map(|y| y.to(first)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, parts[0].rank() - 1)
    }
    /// Shards named `weight.shard{i}` and `bias.shard{i}`.
    fn parameters(&self) -> Vec<(String, Tensor)> {
        (0..self.devices.len()).flat_map(|i| self.device_params(i).into_iter().map(move |(n, t)| (format!("{n}.shard{i}"), t))).collect()
    }
    /// The unsplit `Linear` on `device`.
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Linear { weight: self.weight()?, bias: self.bias()? }.to_device(device)
    }
    fn describe(&self) -> String {
        let out: usize = self.ranges.iter().map(|r| r.1).sum();
        format!("ColumnParallelLinear({}, {out}, {} shards)", self.weights[0].dims()[1], self.devices.len())
    }
}

/// `y = x·Wᵀ + b` with `W`'s input columns split across devices: device `i` multiplies its
/// slice of the input's last dimension, the partial outputs are summed on the first device
/// and the bias is added once there.
pub struct RowParallelLinear {
    weights: Vec<Tensor>,
    bias: Option<Tensor>,
    devices: Vec<Device>,
    ranges: Vec<(usize, usize)>,
}

impl RowParallelLinear {
    /// `linear`'s weight split by input columns over `devices`; the bias stays whole on the first.
    pub fn from_linear(linear: &Linear, devices: &[Device]) -> Result<Self> {
        let ranges = shard_ranges("RowParallelLinear", linear.weight.dims()[1], devices)?;
        let weights = ranges.iter().zip(devices).map(|(&r, d)| shard(&linear.weight, 1, r, d)).collect::<Result<_>>()?;
        let bias = linear.bias.as_ref().map(|b| shard(b, 0, (0, b.numel()), &devices[0])).transpose()?;
        Ok(RowParallelLinear { weights, bias, devices: devices.to_vec(), ranges })
    }
    /// The output on the first device from inputs already split by `forward_shards` of a
    /// `ColumnParallelLinear` (one slice per device, in device order).
    pub fn forward_shards(&self, xs: &[Tensor]) -> Result<Tensor> {
        if xs.len() != self.devices.len() {
            return Err(Error::invalid("RowParallelLinear", format!("{} input slices for {} devices", xs.len(), self.devices.len())));
        }
        let partial =
            xs.iter().enumerate().map(|(i, x)| x.to(&self.devices[i])?.matmul_t(&self.weights[i], false, true)).collect::<Result<Vec<_>>>()?;
        let y = sum_on(&partial, &self.devices[0])?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
    pub fn weight(&self) -> Result<Tensor> {
        gather(&self.weights, 1, &self.devices[0])
    }
    pub fn bias(&self) -> Option<Tensor> {
        self.bias.clone()
    }
    pub fn weight_grad(&self) -> Result<Option<Tensor>> {
        gather_grads(&self.weights, 1, &self.devices[0])
    }
    pub fn load(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<()> {
        scatter(weight, &self.weights, 1, &self.ranges)?;
        match (&self.bias, bias) {
            (Some(own), Some(b)) => own.assign(b),
            (None, None) => Ok(()),
            _ => Err(Error::invalid("RowParallelLinear::load", "bias given for a layer without one, or missing")),
        }
    }
}

impl Module for RowParallelLinear {
    /// Splits `x`'s last dimension over the devices, then `forward_shards`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let last = x.rank().checked_sub(1).ok_or_else(|| Error::shape("RowParallelLinear", "a scalar input"))?;
        let xs = self.ranges.iter().map(|&(s, n)| x.narrow(last, s, n)).collect::<Result<Vec<_>>>()?;
        self.forward_shards(&xs)
    }
    /// Shards named `weight.shard{i}`; the bias is `bias`.
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p: Vec<_> = self.weights.iter().enumerate().map(|(i, w)| (format!("weight.shard{i}"), w.clone())).collect();
        if let Some(b) = &self.bias {
            p.push(("bias".into(), b.clone()));
        }
        p
    }
    fn to_device(&self, device: &Device) -> Result<Box<dyn Module>> {
        Linear { weight: self.weight()?, bias: self.bias.clone() }.to_device(device)
    }
    fn describe(&self) -> String {
        format!("RowParallelLinear({}, {}, {} shards)", self.ranges.iter().map(|r| r.1).sum::<usize>(), self.weights[0].dims()[0], self.devices.len())
    }
}

/// The `Linear` a layer's `weight [out, in]` and `bias [out]` parameters describe.
fn as_linear(name: &str, layer: &dyn Module) -> Result<Linear> {
    let params = layer.parameters();
    let get = |n: &str| params.iter().find(|p| p.0 == n).map(|p| p.1.clone());
    match get("weight") {
        Some(w) if w.rank() == 2 && params.len() <= 2 => Ok(Linear { weight: w, bias: get("bias") }),
        _ => Err(Error::invalid("TensorParallel", format!("layer {name} ({}) is not a Linear", layer.describe()))),
    }
}

/// The rest of a tensor-parallel step after the whole batch's forward, begun at `t0`, gave
/// `loss`: its backward (both cross every device from the first device's thread), then each
/// device's optimizer, `opts[i]` on `devices[i]`, with clipping over all of them.
fn backward_and_update(loss: Tensor, t0: Instant, run: &mut StepCore, opts: &mut [Box<dyn Optimizer>]) -> Result<StepReport> {
    let devices = run.devices.clone();
    let trace = run.trace.clone();
    let trace = trace.as_ref();
    let tf = t0.elapsed().as_secs_f64();
    opts.iter().for_each(|o| o.zero_grad());
    let tb = Instant::now();
    loss.backward()?;
    let dur_b = tb.elapsed().as_secs_f64();
    if let Some(tr) = trace {
        let track = devices[0].spec() + " #0";
        tr.span(&track, "forward", Phase::Forward, t0, tf);
        tr.span(&track, "backward", Phase::Backward, tb, dur_b);
    }
    let parts =
        opts.iter_mut().zip(&devices).enumerate().map(|(i, (opt, d))| Part { opt, device: d, track: Some(format!("{} #{i}", d.spec())) }).collect();
    let (grad_norm, _) = run.update(NormOver::Parts, None, parts, None)?;
    let wall = t0.elapsed().as_secs_f64();
    let peak_memory = devices.iter().map(|d| d.memory().peak).collect();
    Ok(StepReport { loss: loss.to_scalar()?, wall_s: wall, compute_s: wall, peak_memory, grad_norm, ..Default::default() })
}

/// A model's last `Linear → parameterless elementwise layers → Linear`, the first Linear
/// column-parallel and the second row-parallel over a group of devices: one module whose input
/// and output are on the group's first device.
pub(crate) struct SplitPair {
    /// The index of the first Linear in the model.
    pub at: usize,
    names: (String, String),
    between: Sequential,
    col: ColumnParallelLinear,
    row: RowParallelLinear,
}

impl SplitPair {
    /// `model`'s last two Linears (with the parameterless layers between) split over `devices`.
    pub fn of(model: &Sequential, devices: &[Device]) -> Result<Self> {
        let first = devices.first().ok_or_else(|| Error::invalid("TensorParallel", "no devices given"))?;
        let layers = model.layers();
        let with_params: Vec<usize> = (0..layers.len()).filter(|&i| !layers[i].1.parameters().is_empty()).collect();
        let (i1, i2) = match with_params[..] {
            [.., a, b] if b + 1 == layers.len() => (a, b),
            _ => return Err(Error::invalid("TensorParallel", "the model must end in two Linear layers with only parameterless layers between")),
        };
        let between = if i1 + 1 < i2 { model.slice(i1 + 1..i2, first)? } else { Sequential::new() };
        let fc1 = as_linear(&layers[i1].0, &*layers[i1].1)?;
        let fc2 = as_linear(&layers[i2].0, &*layers[i2].1)?;
        if fc1.weight.dims()[0] != fc2.weight.dims()[1] {
            return Err(Error::shape(
                "TensorParallel",
                format!("{} outputs {:?} but {} takes {:?}", layers[i1].0, fc1.weight.shape(), layers[i2].0, fc2.weight.shape()),
            ));
        }
        let col = ColumnParallelLinear::from_linear(&fc1, devices)?;
        let row = RowParallelLinear::from_linear(&fc2, devices)?;
        Ok(SplitPair { at: i1, names: (layers[i1].0.clone(), layers[i2].0.clone()), between, col, row })
    }

    /// Its name as one layer of a stage: the two Linears' names.
    pub fn layer_name(&self) -> String {
        format!("{}..{}", self.names.0, self.names.1)
    }

    /// The two Linears' tensors under the model's names, as they lie on the group.
    pub fn logical(&self) -> Vec<placed::Logical> {
        use placed::{Logical, Placement};
        let (a, b) = &self.names;
        let mut out = vec![Logical::param(format!("{a}.weight"), Placement::Split(0), self.col.weights.clone())];
        out.extend(self.col.biases.clone().map(|parts| Logical::param(format!("{a}.bias"), Placement::Split(0), parts)));
        out.push(Logical::param(format!("{b}.weight"), Placement::Split(1), self.row.weights.clone()));
        out.extend(self.row.bias.clone().map(|t| Logical::whole(format!("{b}.bias"), t)));
        out
    }
}

impl Module for SplitPair {
    /// The column-parallel Linear's shards, the layers between on each, summed by the row.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let shards = self.col.forward_shards(x)?.iter().map(|s| self.between.forward(s)).collect::<Result<Vec<_>>>()?;
        self.row.forward_shards(&shards)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![(self.names.0.clone(), &self.col), ("between".into(), &self.between), (self.names.1.clone(), &self.row)]
    }
    fn describe(&self) -> String {
        format!("SplitPair({}, {})", self.names.0, self.names.1)
    }
}

/// Tensor parallelism for a model ending in `Linear → parameterless elementwise layers →
/// Linear` (the seed CNN's fc1, relu3, fc2): everything before runs on the first device, the
/// first Linear is column-parallel, the second row-parallel, each device with its own
/// optimizer. `state_dict()` gives the unsplit names and shapes.
pub struct TensorParallel {
    trunk: Option<Sequential>,
    between: Sequential,
    col: ColumnParallelLinear,
    row: RowParallelLinear,
    /// The trunk's state whole on the first device, the two Linears split.
    placed: placed::Placed,
    opts: Vec<Box<dyn Optimizer>>,
    run: StepCore,
}

impl TensorParallel {
    /// `model`'s last two Linears sharded over `devices`: what
    /// [`Parallel::tensor`](super::Parallel::tensor) calls for a `&Sequential`.
    pub fn new(model: &Sequential, devices: &[Device], opt: &OptimConfig, loss: Loss) -> Result<Self> {
        let first = devices.first().ok_or_else(|| Error::invalid("TensorParallel", "no devices given"))?;
        let pair = SplitPair::of(model, devices)?;
        let trunk = if pair.at > 0 { Some(model.slice(0..pair.at, first)?) } else { None };
        let mut logical = Vec::new();
        if let Some(t) = &trunk {
            logical.extend(placed::Logical::all_of(t));
        }
        logical.extend(pair.logical());
        let SplitPair { between, col, row, .. } = pair;
        let placed = placed::Placed { logical, first: first.clone() };
        let opts = (0..devices.len()).map(|i| opt.build(placed.device_params(i))).collect::<Result<_>>()?;
        Ok(TensorParallel { trunk, between, col, row, placed, opts, run: StepCore::new(loss, devices) })
    }

    /// The whole model's forward, under the batch's sample context.
    fn forward(&self, x: &Tensor, first: usize) -> Result<Tensor> {
        let h = match &self.trunk {
            Some(t) => self.run.forward(t, x, first)?,
            None => x.clone(),
        };
        self.run.autocast(|| {
            let shards = self.col.forward_shards(&h)?.iter().map(|s| self.run.forward(&self.between, s, first)).collect::<Result<Vec<_>>>()?;
            self.row.forward_shards(&shards)
        })
    }
}

impl TensorParallel {
    /// The loss of `part`, samples `first..` of a global batch of `total`, weighted by its share.
    fn share_loss(&self, part: &Batch, first: usize, total: usize) -> Result<Tensor> {
        let (x, y) = batch_to_device(part, &self.run.devices[0])?;
        self.run.loss_share(&self.forward(&x, first)?, &y, part.len(), total)
    }
}

impl super::Replica for TensorParallel {
    fn kind(&self) -> &'static str {
        "tensor group"
    }
    fn backward_share(&mut self, part: &Batch, first: usize, total: usize) -> Result<f32> {
        let loss = self.share_loss(part, first, total)?;
        backward_share(&loss, &self.opts)
    }
    fn slot_params(&self) -> Vec<Vec<(String, Tensor)>> {
        self.placed.slot_params(self.run.devices.len())
    }
    fn optimizers(&mut self) -> Vec<(&mut Box<dyn Optimizer>, &Device, Option<String>)> {
        optimizers(&mut self.opts, &self.run.devices)
    }
    fn state_of_slots(&self, per_slot: Vec<(Vec<(String, Tensor)>, u64)>) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.placed.gather_states(per_slot)
    }
    fn slots_of_state(&self, state: &[(String, Tensor)]) -> Result<Vec<Vec<(String, Tensor)>>> {
        self.placed.slice_states(self.run.devices.len(), state)
    }
}

/// A tensor-parallel replica's backward of its share's `loss`, its optimizers' (`opts`)
/// gradients from zero; the loss's value.
fn backward_share(loss: &Tensor, opts: &[Box<dyn Optimizer>]) -> Result<f32> {
    opts.iter().for_each(|o| o.zero_grad());
    loss.backward()?;
    loss.to_scalar()
}

/// Each device's optimizer (`opts[i]` on `devices[i]`) with its trace track.
fn optimizers<'a>(opts: &'a mut [Box<dyn Optimizer>], devices: &'a [Device]) -> Vec<(&'a mut Box<dyn Optimizer>, &'a Device, Option<String>)> {
    opts.iter_mut().zip(devices).enumerate().map(|(i, (o, d))| (o, d, Some(format!("{} #{i}", d.spec())))).collect()
}

impl Strategy for TensorParallel {
    fn autocasts(&self) -> bool {
        true
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        let loss = self.share_loss(batch, 0, batch.len())?;
        // Every parameter sits in exactly one device's optimizer (each shard once, the trunk
        // and the row bias on the first device), so the norm over all of them is the model's.
        backward_and_update(loss, t0, &mut self.run, &mut self.opts)
    }
    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to(&self.run.devices[0])?;
        no_grad(|| self.forward(&x, 0))
    }
    /// The unsplit model's names and shapes.
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        self.placed.state_dict()
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.placed.load_state_dict("load_state_dict", state, &|_, _| false)
    }
    /// The sharded parameters' state reassembled from every device.
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.placed.optimizer_state(&self.opts)
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        self.placed.load_optimizer_state(&mut self.opts, state, steps)
    }
    fn modules(&self) -> Vec<&dyn Module> {
        self.trunk.iter().map(|t| t as &dyn Module).chain([&self.between as &dyn Module]).collect()
    }
    fn core(&self) -> &StepCore {
        &self.run
    }
    fn core_mut(&mut self) -> &mut StepCore {
        &mut self.run
    }
}
