//! Stage planning, shared by layer placement and the pipeline: a `Sequential` cut at explicit
//! split points or balanced by measured layer times within each device's memory (or stages the
//! user built), each stage built on its device with its own optimizer, then rebalanced from
//! measured times; and the stages' weights and optimizer state gathered under their names.
use super::step::Part;
use super::tensor_parallel::placed::Placed;
use super::{OptimConfig, ShardedStage};
use crate::data::Batch;
use crate::nn::{Module, Sequential};
use crate::optim::Optimizer;
use crate::{Device, Error, Result, Tensor};
use std::ops::Range;
use std::time::Instant;

/// Where the stages of a layer-split model begin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    /// Layer indices where the next device's stage starts: `At(vec![4])` on two devices puts
    /// layers `0..4` on the first and the rest on the second.
    At(Vec<usize>),
    /// Balanced by each layer's forward+backward time, measured on every device with a few
    /// samples of the first batch, keeping each stage within its device's memory. Until the
    /// first step the stages are balanced by parameter bytes.
    Auto,
}

/// How a model becomes one stage per device (for [`LayerPlacement`](super::LayerPlacement) and the pipeline).
pub enum Stages<'a> {
    /// A `Sequential` cut at `Split`; each stage's layers are copied to its device with
    /// `Module::to_device` (every built-in layer has it; a user's block implements it, for
    /// example with `nn::to_device` and its constructor).
    Split(&'a Sequential, Split),
    /// The user's stages, `stages[s]` already built on `devices[s]`. Their layer names are
    /// the state_dict prefixes, so they should be distinct across stages. No rebalancing.
    Built(Vec<Sequential>),
    /// Stages that are tensor-parallel groups ([`Gpt::tensor_stages`](crate::nn::models::Gpt::tensor_stages)):
    /// stage `s` on its group of devices, the groups in order making up the pipeline's
    /// devices. Pipelines only; no rebalancing.
    Sharded(Vec<ShardedStage>),
}

/// Consecutive layers on one device, or on a tensor-parallel group, with one optimizer per
/// device.
pub(crate) struct Stage {
    pub range: Range<usize>,
    /// Where the stage's input and output are: its only device, or its group's first.
    pub device: Device,
    pub model: Sequential,
    /// `opts[i]` trains what the stage holds on its `i`-th device (`opts[0]` on `device`).
    pub opts: Vec<Box<dyn Optimizer>>,
    /// A tensor-parallel stage's group: its tensors as they lie on its devices.
    pub group: Option<(Placed, Vec<Device>)>,
}

impl Stage {
    /// A stage of one device.
    fn whole(range: Range<usize>, device: &Device, model: Sequential, opt: Box<dyn Optimizer>) -> Stage {
        Stage { range, device: device.clone(), model, opts: vec![opt], group: None }
    }
    /// The stage's devices, `device` first.
    pub fn devices(&self) -> Vec<Device> {
        self.group.as_ref().map_or_else(|| vec![self.device.clone()], |(_, d)| d.clone())
    }
    pub fn zero_grad(&self) {
        self.opts.iter().for_each(|o| o.zero_grad());
    }
    /// What each of the stage's devices trains, in device order.
    pub fn slot_params(&self) -> Vec<Vec<(String, Tensor)>> {
        self.opts.iter().map(|o| o.params().to_vec()).collect()
    }
    /// Each device's optimizer for the update, with its trace track (stage `index`).
    pub fn parts(&mut self, index: usize) -> Vec<Part<'_>> {
        let devices: Vec<&Device> = match &self.group {
            Some((_, group)) => group.iter().collect(),
            None => vec![&self.device],
        };
        let many = devices.len() > 1;
        let track = |i: usize, d: &Device| if many { format!("stage {index}.{i} ({})", d.spec()) } else { track_name(index, d) };
        self.opts.iter_mut().zip(devices).enumerate().map(|(i, (opt, device))| Part { track: Some(track(i, device)), opt, device }).collect()
    }
    /// Weights and buffers under the unsplit model's names and shapes.
    pub fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        match &self.group {
            Some((placed, _)) => placed.state_dict(),
            None => Ok(self.model.state_dict()),
        }
    }
    /// The names `state_dict` gives, without gathering any tensor.
    pub fn names(&self) -> Vec<String> {
        match &self.group {
            Some((placed, _)) => placed.logical.iter().map(|l| l.name.clone()).collect(),
            None => self.model.state_dict().into_iter().map(|p| p.0).collect(),
        }
    }
    /// Loads this stage's tensors of `state` (whole shapes), strictly.
    fn load(&self, state: &[(String, Tensor)]) -> Result<()> {
        match &self.group {
            Some((placed, _)) => placed.load_state_dict("load_state_dict", state, &|_, _| false),
            None => self.model.load_state_dict(state),
        }
    }
    /// The optimizers' state under the parameters' names and whole shapes, and the step count.
    fn opt_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.opt_state_of(self.opts.iter().map(|o| o.state()).collect())
    }
    /// As `opt_state`, from `per[i]`, device `i`'s state (one per device of the stage).
    pub(crate) fn opt_state_of(&self, per: Vec<(Vec<(String, Tensor)>, u64)>) -> Result<(Vec<(String, Tensor)>, u64)> {
        match &self.group {
            Some((placed, _)) => placed.gather_states(per),
            None => per.into_iter().next().ok_or_else(|| Error::Msg("a stage without an optimizer".into())),
        }
    }
    /// Each of the stage's devices' part of a whole model's optimizer state (whole, for a
    /// stage of one device: its optimizer picks its own names).
    pub(crate) fn opt_state_slices(&self, state: &[(String, Tensor)]) -> Result<Vec<Vec<(String, Tensor)>>> {
        match &self.group {
            Some((placed, d)) => {
                let mine: Vec<(String, Tensor)> = state.iter().filter(|(n, _)| placed.owner(n).is_some()).cloned().collect();
                placed.slice_states(d.len(), &mine)
            }
            None => Ok(vec![state.to_vec()]),
        }
    }
    /// Restores this stage's part of a whole model's optimizer state (other stages' names are
    /// left for them).
    fn load_opt_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        let slices = self.opt_state_slices(state)?;
        self.opts.iter_mut().zip(slices).try_for_each(|(o, s)| o.load_state(&s, steps))
    }
}

/// Bytes of each layer's parameters.
fn layer_bytes(model: &Sequential) -> Vec<u64> {
    model.layers().iter().map(|(_, l)| l.parameters().iter().map(|(_, t)| t.numel() as u64 * 4).sum()).collect()
}

/// Parameters, their gradients and up to two optimizer moments: four copies of the weights.
const BYTES_PER_PARAM_BYTE: u64 = 4;

/// Errors when a stage's parameters, gradients and optimizer state cannot fit its device.
fn check_fits(model: &Sequential, ranges: &[Range<usize>], devices: &[Device]) -> Result<()> {
    let bytes = layer_bytes(model);
    for (s, (r, dev)) in ranges.iter().zip(devices).enumerate() {
        let need = BYTES_PER_PARAM_BYTE * bytes[r.clone()].iter().sum::<u64>();
        if let Some(total) = dev.info().memory {
            if need > total {
                let names: Vec<&str> = model.layers()[r.clone()].iter().map(|(n, _)| n.as_str()).collect();
                return Err(Error::OutOfMemory {
                    device: dev.to_string(),
                    requested: need,
                    free: total,
                    detail: format!("stage {s} (layers {r:?}: {names:?}) needs 4 x its parameter bytes for weights, gradients and optimizer state"),
                });
            }
        }
    }
    Ok(())
}

/// The layer range of each stage when `model` is cut at `split` over `devices`, checked
/// against the model and each device's memory; `Split::Auto` gives the split balanced by
/// parameter bytes (what a placement or pipeline starts from before it measures layer times).
/// A program that needs the same split on every run (bit-for-bit reproducibility) fixes this
/// one up front with `Split::At`.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use tandem::parallel::{plan_stages, Split};
/// let dev = tandem::Device::cpu();
/// let model = tandem::nn::models::SeedModel::TwoLayer.build(0, &dev)?;
/// let ranges = plan_stages(&model, &[dev.clone(), dev.clone()], &Split::At(vec![1]))?;
/// assert_eq!(ranges, vec![0..1, 1..model.len()]);
/// # Ok(()) }
/// ```
pub fn plan_stages(model: &Sequential, devices: &[Device], split: &Split) -> Result<Vec<Range<usize>>> {
    let (n, p) = (model.len(), devices.len());
    if p == 0 {
        return Err(Error::invalid("stage split", "no devices given"));
    }
    if p > n {
        return Err(Error::invalid("stage split", format!("{p} stages (one per device) but the model has only {n} layers")));
    }
    let ranges = match split {
        Split::At(points) => {
            if points.len() != p - 1 {
                return Err(Error::invalid("stage split", format!("{} split points {points:?} for {p} devices; give {}", points.len(), p - 1)));
            }
            let mut bounds = vec![0];
            bounds.extend(points);
            bounds.push(n);
            if let Some(w) = bounds.windows(2).find(|w| w[0] >= w[1]) {
                return Err(Error::invalid(
                    "stage split",
                    format!("split points {points:?} must be strictly increasing layer indices in 1..{n}; {} does not start a non-empty stage", w[1]),
                ));
            }
            bounds.windows(2).map(|w| w[0]..w[1]).collect()
        }
        Split::Auto => {
            let bytes = layer_bytes(model);
            // Parameter bytes stand in for cost until a step measures the real times; +1 keeps
            // parameterless layers from being free.
            let cost: Vec<f64> = bytes.iter().map(|&b| b as f64 + 1.0).collect();
            balance(&vec![cost; p], &bytes, devices)?
        }
    };
    check_fits(model, &ranges, devices)?;
    Ok(ranges)
}

/// Contiguous non-empty stages minimising the slowest stage's time, where `cost[s][i]` is
/// layer `i`'s time on stage `s`'s device and each stage must fit its device's memory.
fn balance(cost: &[Vec<f64>], bytes: &[u64], devices: &[Device]) -> Result<Vec<Range<usize>>> {
    let (p, n) = (devices.len(), bytes.len());
    let fits = |s: usize, r: Range<usize>| match devices[s].info().memory {
        Some(total) => BYTES_PER_PARAM_BYTE * bytes[r].iter().sum::<u64>() <= total,
        None => true,
    };
    // best[s][j]: the smallest possible slowest-stage time with layers 0..j on stages 0..=s.
    let mut best = vec![vec![f64::INFINITY; n + 1]; p];
    let mut from = vec![vec![0usize; n + 1]; p];
    for j in 1..=n {
        if fits(0, 0..j) {
            best[0][j] = cost[0][..j].iter().sum();
        }
    }
    for s in 1..p {
        for j in s + 1..=n {
            for i in s..j {
                if best[s - 1][i].is_finite() && fits(s, i..j) {
                    let t = best[s - 1][i].max(cost[s][i..j].iter().sum());
                    if t < best[s][j] {
                        best[s][j] = t;
                        from[s][j] = i;
                    }
                }
            }
        }
    }
    if !best[p - 1][n].is_finite() {
        let total: u64 = BYTES_PER_PARAM_BYTE * bytes.iter().sum::<u64>();
        return Err(Error::OutOfMemory {
            device: devices.iter().map(Device::spec).collect::<Vec<_>>().join(", "),
            requested: total,
            free: devices.iter().filter_map(|d| d.info().memory).sum(),
            detail: "no split into contiguous stages fits every device's memory".into(),
        });
    }
    let mut ranges = vec![0..0; p];
    let mut end = n;
    for s in (0..p).rev() {
        let start = if s == 0 { 0 } else { from[s][end] };
        ranges[s] = start..end;
        end = start;
    }
    Ok(ranges)
}

/// Copies of `layers` (in order, across stages) cut into `ranges`, each on its device with a
/// fresh optimizer.
fn build(layers: &[&(String, Box<dyn Module>)], ranges: &[Range<usize>], devices: &[Device], opt: &OptimConfig) -> Result<Vec<Stage>> {
    ranges
        .iter()
        .zip(devices)
        .map(|(r, dev)| {
            let mut model = Sequential::new();
            for (name, layer) in layers[r.clone()].iter().map(|l| (&l.0, &l.1)) {
                model.push_boxed(name.clone(), layer.to_device(dev)?);
            }
            let opt = opt.build(model.parameters())?;
            Ok(Stage::whole(r.clone(), dev, model, opt))
        })
        .collect()
}

/// The stages on `devices` as `stages` describes, and whether the split still has to be
/// measured (`Split::Auto`).
pub(crate) fn build_stages(stages: Stages, devices: &[Device], opt: &OptimConfig) -> Result<(Vec<Stage>, bool)> {
    match stages {
        Stages::Split(model, split) => {
            let ranges = plan_stages(model, devices, &split)?;
            let layers: Vec<_> = model.layers().iter().collect();
            Ok((build(&layers, &ranges, devices, opt)?, split == Split::Auto))
        }
        Stages::Built(models) => {
            if models.len() != devices.len() || models.iter().any(Sequential::is_empty) {
                let sizes: Vec<usize> = models.iter().map(Sequential::len).collect();
                return Err(Error::invalid(
                    "stages",
                    format!("{} stages of {sizes:?} layers for {} devices; give one non-empty stage per device", models.len(), devices.len()),
                ));
            }
            let mut start = 0;
            let mut out = Vec::with_capacity(models.len());
            for (s, (model, dev)) in models.into_iter().zip(devices).enumerate() {
                if let Some((name, t)) = model.state_dict().into_iter().find(|(_, t)| !t.device().same(dev)) {
                    let (on, own) = Device::names_of(t.device(), dev);
                    return Err(Error::invalid(
                        "stages",
                        format!("stage {s}'s {name} is on {on}, not on its device {own}; build each stage on its device"),
                    ));
                }
                let opt = opt.build(model.parameters())?;
                let range = start..start + model.len();
                start = range.end;
                out.push(Stage::whole(range, dev, model, opt));
            }
            Ok((out, false))
        }
        Stages::Sharded(stages) => {
            let given: Vec<Device> = stages.iter().flat_map(|s| s.devices.clone()).collect();
            if given.len() != devices.len() || given.iter().zip(devices).any(|(a, b)| !a.same(b)) {
                let per: Vec<usize> = stages.iter().map(|s| s.devices.len()).collect();
                return Err(Error::invalid(
                    "stages",
                    format!(
                        "stages over groups of {per:?} devices for {} devices; give the devices the stages were made on, in order",
                        devices.len()
                    ),
                ));
            }
            let mut start = 0;
            let mut out = Vec::with_capacity(stages.len());
            for ShardedStage { model, placed, devices } in stages {
                let opts = (0..devices.len()).map(|i| opt.build(placed.device_params(i))).collect::<Result<Vec<_>>>()?;
                let range = start..start + model.len();
                start = range.end;
                out.push(Stage { range, device: devices[0].clone(), model, opts, group: Some((placed, devices)) });
            }
            Ok((out, false))
        }
    }
}

/// Each layer's forward+backward seconds on each stage's device (`[device][layer]`), the best
/// of three runs, on `probe` (a few samples).
fn profile(stages: &[Stage], probe: &Tensor) -> Result<Vec<Vec<f64>>> {
    let layers: Vec<_> = stages.iter().flat_map(|s| s.model.layers()).collect();
    stages
        .iter()
        .map(|stage| {
            let dev = &stage.device;
            let mut h = probe.to(dev)?;
            let mut times = Vec::with_capacity(layers.len());
            for (i, (_, layer)) in layers.iter().enumerate() {
                let copy = layer.to_device(dev)?;
                let mut best = f64::INFINITY;
                let mut out = h.clone();
                for _ in 0..3 {
                    // The model's input needs no gradient: timing one would overcharge the
                    // first layer (a convolution's col2im) and the first stage with it.
                    let x = if i == 0 { h.detach() } else { h.detach().requires_grad() };
                    let t0 = Instant::now();
                    out = copy.forward(&x)?;
                    let root = out.sum_all()?;
                    if root.needs_grad() {
                        root.backward()?;
                    }
                    dev.sync()?;
                    best = best.min(t0.elapsed().as_secs_f64());
                }
                times.push(best);
                h = out.detach();
            }
            Ok(times)
        })
        .collect()
}

/// Re-splits `stages` by measured layer times on `probe`, moving layers with their current
/// weights and optimizer state; returns the measured times (`[device][layer]`, as `balance`
/// takes them) for [`refine`] to correct later.
pub(crate) fn rebalance(stages: &mut Vec<Stage>, probe: &Tensor, opt: &OptimConfig) -> Result<Vec<Vec<f64>>> {
    let cost = profile(stages, probe)?;
    resplit(stages, &cost, opt)?;
    Ok(cost)
}

/// Corrects the layer times `cost` by what each stage's compute really took in a step (`busy`,
/// seconds per stage) and re-splits by them; returns whether any layer moved.
///
/// Timed one layer at a time, layers run alone on the device; in the pipeline, stages run at the
/// same time and, on CPU devices, share the cores, and small layers lose more to that than large
/// ones. Scaling each stage's layers so that they add up to its measured time puts that into the
/// estimate.
pub(crate) fn refine(stages: &mut Vec<Stage>, cost: &mut [Vec<f64>], busy: &[f64], opt: &OptimConfig) -> Result<bool> {
    for (s, stage) in stages.iter().enumerate() {
        let estimated: f64 = cost[s][stage.range.clone()].iter().sum();
        if estimated <= 0.0 || busy[s] <= 0.0 {
            continue;
        }
        let scale = busy[s] / estimated;
        for row in cost.iter_mut() {
            row[stage.range.clone()].iter_mut().for_each(|c| *c *= scale);
        }
    }
    resplit(stages, cost, opt)
}

/// Moves layers (with weights and optimizer state) into the split that `balance` gives for
/// `cost`; returns whether any moved.
fn resplit(stages: &mut Vec<Stage>, cost: &[Vec<f64>], opt: &OptimConfig) -> Result<bool> {
    let devices: Vec<Device> = stages.iter().map(|s| s.device.clone()).collect();
    let bytes: Vec<u64> = stages.iter().flat_map(|s| layer_bytes(&s.model)).collect();
    let ranges = balance(cost, &bytes, &devices)?;
    resplit_to(stages, &ranges, opt)
}

/// Moves layers (with weights and optimizer state) so that stage `s` holds `ranges[s]`; returns
/// whether any moved.
pub(crate) fn resplit_to(stages: &mut Vec<Stage>, ranges: &[Range<usize>], opt: &OptimConfig) -> Result<bool> {
    if ranges.iter().eq(stages.iter().map(|s| &s.range)) {
        return Ok(false);
    }
    let devices: Vec<Device> = stages.iter().map(|s| s.device.clone()).collect();
    let layers: Vec<_> = stages.iter().flat_map(|s| s.model.layers()).collect();
    let mut fresh = build(&layers, ranges, &devices, opt)?;
    let mut state = Vec::new();
    let mut steps = 0;
    for s in stages.iter() {
        let (st, n) = s.opts[0].state();
        state.extend(st);
        steps = n;
    }
    // The fresh optimizers start from the config's learning rate; keep the one set since.
    let lr = stages.first().map(|s| s.opts[0].lr());
    for s in &mut fresh {
        s.opts[0].load_state(&state, steps)?;
        if let Some(lr) = lr {
            s.opts[0].set_lr(lr);
        }
    }
    *stages = fresh;
    Ok(true)
}

/// The first `k` samples of a batch as one input tensor on `device`.
pub(crate) fn probe_input(batch: &Batch, k: usize, device: &Device) -> Result<Tensor> {
    let per: usize = batch.x_shape.iter().skip(1).product();
    let k = k.min(batch.len()).max(1);
    if batch.x_shape.is_empty() || batch.x.len() < k * per {
        return Err(Error::shape("probe batch", format!("a batch of shape {:?} has no sample to probe with", batch.x_shape)));
    }
    super::batch_to_device(&batch.slice(0..k)?, device).map(|(x, _)| x)
}

/// Gathers every stage's parameters and buffers, named as in the unsplit model.
pub(crate) fn stage_params(stages: &[Stage]) -> Result<Vec<(String, Tensor)>> {
    let mut all = Vec::new();
    for s in stages {
        all.extend(s.state_dict()?);
    }
    Ok(all)
}

/// The names [`stage_params`] gives, in its order.
pub(crate) fn stage_names(stages: &[Stage]) -> Vec<String> {
    stages.iter().flat_map(Stage::names).collect()
}

/// Loads weights into whichever stage owns each name (strict over the whole model).
pub(crate) fn load_stage_params(stages: &[Stage], state: &[(String, Tensor)]) -> Result<()> {
    let all = stage_names(stages);
    let unexpected: Vec<&str> = state.iter().map(|s| s.0.as_str()).filter(|n| !all.iter().any(|p| p == n)).collect();
    if !unexpected.is_empty() {
        return Err(Error::invalid("load_state_dict", format!("unexpected [{}]", crate::error::capped_list(unexpected))));
    }
    for s in stages {
        let names = s.names();
        let mine: Vec<(String, Tensor)> = state.iter().filter(|(n, _)| names.contains(n)).cloned().collect();
        s.load(&mine)?;
    }
    Ok(())
}

/// Every stage optimizer's state in stage order, and the step count.
pub(crate) fn stage_opt_state(stages: &[Stage]) -> Result<(Vec<(String, Tensor)>, u64)> {
    let mut all = Vec::new();
    let mut steps = 0;
    for s in stages {
        let (st, n) = s.opt_state()?;
        all.extend(st);
        steps = n;
    }
    Ok((all, steps))
}

/// Restores what `stage_opt_state` gathered: each stage's optimizers pick their own names.
pub(crate) fn load_stage_opt_state(stages: &mut [Stage], state: &[(String, Tensor)], steps: u64) -> Result<()> {
    for s in stages {
        s.load_opt_state(state, steps)?;
    }
    Ok(())
}

/// The trace track of stage `i`: distinct per stage even when devices share a spec.
pub(crate) fn track_name(i: usize, device: &Device) -> String {
    format!("stage {i} ({})", device.spec())
}

#[cfg(test)]
mod tests;
