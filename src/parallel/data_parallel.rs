//! `DataParallel`: one model replica per device, each step's batch split across them, gradients
//! all-reduced in buckets that overlap backward, every replica holding the same weights.
//!
//! Each device's shard loss is scaled by its share `n_i / N` of the global batch, so the SUM of
//! the devices' gradients is exactly the gradient of the global mean loss, whatever the split
//! (uneven, user-weighted, calibrated) and however many micro-batches accumulate on a device.
//! See [`DataParallelConfig`] for the options: bucket size, split weights, calibration,
//! deterministic mode and ZeRO-1 optimizer sharding.
//!
//! The replicas stay one model bit for bit. On devices of one kernel family each replica applies
//! the (identical) reduced gradients itself; on a mix of backends or adapters, whose kernels
//! round differently, replica 0 alone updates every parameter and broadcasts the new values
//! (see `update.rs` for why and what it costs).
mod buckets;
mod deterministic;
mod overlapped;
mod timing;
mod update;

pub use buckets::assign_buckets;
pub use timing::{DeviceSpans, Overlap};

use super::comm::{self, Communicator};
use super::split::{PartsOf, ReplicaSplit};
use super::step::{Part, StepCore};
use super::trace::Phase;
use super::{Loss, OptimConfig, StepReport, Strategy};
use crate::data::Batch;
use crate::nn::{Module, Sequential};
use crate::optim::Optimizer;
use crate::{Device, Error, Result, Tensor};
use std::collections::HashMap;
use std::time::Instant;

/// Options of [`DataParallel`]; `Default` matches PyTorch DDP's defaults where there is one.
#[derive(Clone, Debug)]
pub struct DataParallelConfig {
    /// Gradient bytes per all-reduce bucket (DDP's 25 MiB). Smaller buckets start
    /// communicating earlier in backward but pay more per-call overhead.
    pub bucket_bytes: usize,
    /// Relative speed of each device: the batch is split in these proportions.
    pub weights: Option<Vec<f64>>,
    /// Measure each device's speed on the first step and split by it (excludes `weights`).
    pub calibrate: bool,
    /// Bit-identical results across device counts (see `deterministic_shards`); no overlap.
    pub deterministic: bool,
    /// Micro-shards per global batch in deterministic mode (fewer if the batch is smaller);
    /// fixed so results do not depend on the device count. Use at least the device count.
    pub deterministic_shards: usize,
    /// Micro-batches each device accumulates before the all-reduce (gradient accumulation).
    pub micro_batches: usize,
    /// ZeRO-1: each device keeps optimizer state only for the parameters it owns (balanced by
    /// size), updates them and broadcasts them. On devices of different kernel families this
    /// also spreads the updates, which otherwise all run on the first device.
    pub shard_optimizer: bool,
}

impl Default for DataParallelConfig {
    fn default() -> Self {
        DataParallelConfig {
            bucket_bytes: 25 << 20,
            weights: None,
            calibrate: false,
            deterministic: false,
            deterministic_shards: 4,
            micro_batches: 1,
            shard_optimizer: false,
        }
    }
}

/// Something that happened during the last step, for checking and explaining overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEvent {
    /// The all-reduce of a bucket started (every device had reported it).
    BucketLaunched { bucket: usize, at: Instant },
    /// A device finished backward (all micro-batches).
    BackwardDone { device: usize, at: Instant },
}

impl StepEvent {
    pub fn at(&self) -> Instant {
        match *self {
            StepEvent::BucketLaunched { at, .. } | StepEvent::BackwardDone { at, .. } => at,
        }
    }
}

/// One device's model copy. (Its optimizer lives beside it in `DataParallel::opts`, because
/// workers share replicas by reference and an optimizer is `Send` but not `Sync`.)
struct Replica {
    device: Device,
    /// Trace track: the rank and spec, since several devices can share a spec (`cpu`).
    track: String,
    model: Box<dyn Module>,
    params: Vec<(String, Tensor)>,
    /// Parameter index of each parameter's tensor id, for the autograd leaf hook.
    index_of: HashMap<u64, usize>,
}

impl Replica {
    fn comm_track(&self) -> String {
        format!("{} comm", self.track)
    }
}

/// What the compute phase of a step measured.
struct Computed {
    loss: f32,
    /// Forward + backward seconds per device.
    compute_s: Vec<f64>,
    /// Start and end of each communication.
    comm: Vec<(Instant, Instant)>,
    /// When the last device finished backward.
    backward_end: Option<Instant>,
    events: Vec<StepEvent>,
    /// All-reduce against backward on each device's timeline (overlapped mode).
    overlap: Option<Overlap>,
}

/// Data parallelism over any set of devices, any mix of backends.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use std::sync::Arc;
/// use tandem::backend::cpu::CpuBackend;
/// use tandem::nn::models::SeedModel;
/// use tandem::optim::SgdConfig;
/// use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Strategy};
/// use tandem::Device;
/// let devices: Vec<Device> = (0..2).map(|_| Device::from_backend(Arc::new(CpuBackend::new()))).collect();
/// let model = SeedModel::Cnn.build(0, &devices[0])?;
/// let opt = OptimConfig::sgd(SgdConfig::default());
/// let mut dp = DataParallel::new(&model, &devices, &opt, Loss::CrossEntropy, DataParallelConfig::default())?;
/// let data = tandem::data::synthetic::seed_images(6, 1)?;
/// let report = dp.step(&data.batch(&[0, 1, 2, 3, 4, 5])?)?;
/// assert!(report.loss.is_finite());
/// # Ok(()) }
/// ```
pub struct DataParallel {
    replicas: Vec<Replica>,
    /// One optimizer per replica (over the parameters it owns, where parameters have owners).
    opts: Vec<Box<dyn Optimizer>>,
    comm: Box<dyn Communicator>,
    run: StepCore,
    cfg: DataParallelConfig,
    buckets: Vec<Vec<usize>>,
    bucket_of: Vec<usize>,
    /// The device that owns (keeps optimizer state for, and updates) each parameter, as a
    /// global index over every process's devices (`Communicator::device_span`): balanced over
    /// all of them with ZeRO-1, device 0 on devices of different kernel families, `None`
    /// otherwise.
    owners: Option<Vec<usize>>,
    /// Split proportions: the user's, the calibrated ones, or `None` for equal shares.
    split_weights: Option<Vec<f64>>,
    events: Vec<StepEvent>,
    overlap: Option<Overlap>,
}

impl DataParallel {
    /// The data-parallel constructors are what [`Parallel::data`](super::Parallel::data) calls;
    /// they stay public for the programs (the command line) that build a `DataParallel` from a
    /// `Sequential` or a chosen communicator directly.
    ///
    /// Replicates a `Sequential` of built-in layers (or of blocks with `Module::to_device`) on
    /// every device, with one optimizer per replica.
    pub fn new(model: &Sequential, devices: &[Device], opt: &OptimConfig, loss: Loss, cfg: DataParallelConfig) -> Result<Self> {
        Self::from_factory(|d| model.slice(0..model.len(), d), devices, opt, loss, cfg)
    }

    /// Any module: `build(device)` (the user's constructor) makes each replica on its device;
    /// replica 0's parameters are then broadcast to the others, so a random initialisation
    /// does not matter. Buffers are not broadcast: a constructor must make them the same
    /// everywhere (BatchNorm's do).
    pub fn from_factory<M: Module>(build: impl Fn(&Device) -> Result<M>, devices: &[Device], opt: &OptimConfig, loss: Loss, cfg: DataParallelConfig) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::invalid("DataParallel::new", "needs at least one device"));
        }
        let comm = comm::for_devices(devices)?;
        let models = comm.devices().iter().map(|d| Ok(Box::new(build(d)?) as Box<dyn Module>)).collect::<Result<Vec<_>>>()?;
        Self::from_models(models, comm, opt, loss, cfg)
    }

    /// `new` with a chosen communicator (for example `PeerRing` on devices without a peer
    /// path, to test the CUDA algorithm); the replicas go on `comm.devices()`.
    pub fn with_communicator(model: &Sequential, comm: Box<dyn Communicator>, opt: &OptimConfig, loss: Loss, cfg: DataParallelConfig) -> Result<Self> {
        let models = comm.devices().iter().map(|d| Ok(Box::new(model.slice(0..model.len(), d)?) as Box<dyn Module>)).collect::<Result<Vec<_>>>()?;
        Self::from_models(models, comm, opt, loss, cfg)
    }

    /// `from_factory` with a chosen communicator (`Hierarchical` across processes): `build`
    /// makes a replica on each of `comm.devices()`.
    pub fn from_factory_with<M: Module>(build: impl Fn(&Device) -> Result<M>, comm: Box<dyn Communicator>, opt: &OptimConfig, loss: Loss, cfg: DataParallelConfig) -> Result<Self> {
        let models = comm.devices().iter().map(|d| Ok(Box::new(build(d)?) as Box<dyn Module>)).collect::<Result<Vec<_>>>()?;
        Self::from_models(models, comm, opt, loss, cfg)
    }

    /// One replica per device of `comm`, `models[i]` on device `i`.
    fn from_models(models: Vec<Box<dyn Module>>, comm: Box<dyn Communicator>, opt: &OptimConfig, loss: Loss, cfg: DataParallelConfig) -> Result<Self> {
        let devices = comm.devices().to_vec();
        let devices = &devices[..];
        let n = devices.len();
        if n == 0 {
            return Err(Error::invalid("DataParallel::new", "needs at least one device"));
        }
        for (i, (m, d)) in models.iter().zip(devices).enumerate() {
            if let Some((name, t)) = m.state_dict().into_iter().find(|(_, t)| !t.device().same(d)) {
                let (on, own) = crate::Device::names_of(t.device(), d);
                return Err(Error::invalid("DataParallel::new", format!("replica {i}'s {name} is on {on}, not on {own}; build each replica on its device")));
            }
        }
        if cfg.micro_batches == 0 || cfg.deterministic_shards == 0 {
            return Err(Error::invalid("DataParallel::new", "micro_batches and deterministic_shards must be at least 1"));
        }
        if let Some(w) = &cfg.weights {
            if w.len() != n {
                return Err(Error::invalid("DataParallel::new", format!("{} split weights for {n} devices", w.len())));
            }
            super::split::proportional_split(n, w)?;
            if cfg.calibrate {
                return Err(Error::invalid("DataParallel::new", "give split weights or calibrate, not both"));
            }
        }
        if cfg.deterministic {
            // A kernel chosen by timing may differ from run to run; pinned, it cannot.
            devices.iter().for_each(|d| d.backend().pin_kernels());
        }
        let params: Vec<Vec<(String, Tensor)>> = models.iter().map(|m| m.parameters()).collect();
        for p in 0..params[0].len() {
            let group: Vec<Tensor> = params.iter().map(|ps| ps[p].1.clone()).collect();
            comm.broadcast(&group, 0)?;
        }
        let sizes: Vec<usize> = params[0].iter().map(|(_, t)| 4 * t.numel()).collect();
        let buckets = assign_buckets(&sizes, cfg.bucket_bytes);
        let bucket_of = buckets::bucket_of(&buckets, sizes.len());
        let (first, world) = comm.device_span();
        let owners = if cfg.shard_optimizer {
            Some(assign_owners(&sizes, world))
        } else if !update::one_kernel_family(devices) {
            // One owner rather than ZeRO-1's balanced ones: one broadcast a step instead of one
            // per device (measured cheaper on the seed CNN; see update.rs).
            Some(vec![0; sizes.len()])
        } else {
            None
        };
        let opts = params
            .iter()
            .enumerate()
            .map(|(i, params)| {
                let mine = params.iter().enumerate().filter(|(p, _)| owners.as_ref().is_none_or(|o| o[*p] == first + i)).map(|(_, p)| p.clone());
                opt.build(mine.collect())
            })
            .collect::<Result<Vec<_>>>()?;
        let replicas = models
            .into_iter()
            .zip(params)
            .enumerate()
            .map(|(i, (model, params))| Replica {
                device: devices[i].clone(),
                track: format!("dp{i}:{}", devices[i].spec()),
                index_of: params.iter().enumerate().map(|(p, (_, t))| (t.id(), p)).collect(),
                model,
                params,
            })
            .collect();
        let run = StepCore::new(loss, devices);
        Ok(DataParallel { replicas, opts, comm, run, split_weights: cfg.weights.clone(), cfg, buckets, bucket_of, owners, events: Vec::new(), overlap: None })
    }

    /// The communicator in use (its name says which algorithm; it counts bytes moved).
    pub fn communicator(&self) -> &dyn Communicator {
        &*self.comm
    }
    /// Parameter names of each gradient bucket, in the order backward fills them.
    pub fn buckets(&self) -> Vec<Vec<String>> {
        let names = &self.replicas[0].params;
        self.buckets.iter().map(|b| b.iter().map(|&p| names[p].0.clone()).collect()).collect()
    }
    /// The split proportions in use: the user's, the calibrated ones after the first step, or
    /// `None` for equal shares.
    pub fn split_weights(&self) -> Option<&[f64]> {
        self.split_weights.as_deref()
    }
    /// Bucket launches and backward completions of the last step, in time order (empty in
    /// deterministic mode, which does not overlap).
    pub fn last_step_events(&self) -> &[StepEvent] {
        &self.events
    }
    /// How much of the last step's all-reduce time each device spent still running backward,
    /// timed on the devices' own clocks where they have them; `None` before the first step and
    /// in deterministic mode, which does not overlap.
    pub fn last_overlap(&self) -> Option<&Overlap> {
        self.overlap.as_ref()
    }
    /// Bytes of optimizer state held on each device (ZeRO-1 divides it among them).
    pub fn optimizer_state_bytes(&self) -> Vec<u64> {
        self.opts.iter().map(|o| o.state().0.iter().map(|(_, t)| 4 * t.numel() as u64).sum()).collect()
    }
    /// The parameters of every replica; tests use it to check the replicas stay identical.
    pub fn replica_parameters(&self) -> Vec<Vec<(String, Tensor)>> {
        self.replicas.iter().map(|r| r.params.clone()).collect()
    }
    /// The optimizer state replica `i` holds (only its owned parameters' where parameters have
    /// owners) and its step count; `None` past the last replica.
    pub fn replica_optimizer_state(&self, i: usize) -> Option<(Vec<(String, Tensor)>, u64)> {
        self.opts.get(i).map(|o| o.state())
    }
    /// The replica that updates each parameter (state_dict order), or `None` when every
    /// replica updates its own copy: with ZeRO-1, and on devices of different kernel families,
    /// each parameter has one owner.
    pub fn parameter_owners(&self) -> Option<&[usize]> {
        self.owners.as_deref()
    }
}

/// The result of replica `i`'s thread; its error, or its panic, named by replica and device.
fn joined<T>(i: usize, r: &Replica, thread: std::thread::Result<Result<T>>) -> Result<T> {
    thread.unwrap_or_else(|payload| Err(Error::panicked(payload))).map_err(|e| e.in_worker("data-parallel replica", i, &r.device))
}

/// ZeRO-1 ownership: parameters from largest to smallest, each to the device holding the
/// fewest bytes so far (lowest rank on ties), which balances state without splitting tensors.
fn assign_owners(sizes: &[usize], devices: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut load = vec![0usize; devices];
    let mut owner = vec![0; sizes.len()];
    for p in order {
        let d = (0..devices).min_by_key(|&d| (load[d], d)).unwrap_or(0);
        owner[p] = d;
        load[d] += sizes[p];
    }
    owner
}

impl Strategy for DataParallel {
    fn check_batch_size(&self, n: usize) -> Result<()> {
        super::split::check_samples(n, self.comm.device_span().1)
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        let n = self.replicas.len();
        let (first, world) = self.comm.device_span();
        let mode = if self.cfg.deterministic { PartsOf::FixedShards(self.cfg.deterministic_shards) } else { PartsOf::MicroBatches(self.cfg.micro_batches) };
        if self.cfg.calibrate && self.split_weights.is_none() {
            let models: Vec<(&dyn Module, &Device)> = self.replicas.iter().map(|r| (&*r.model, &r.device)).collect();
            self.split_weights = Some(timing::calibrate(&models, batch, &self.run)?);
        }
        let trace = self.run.trace.clone();
        let trace = trace.as_ref();
        let updates: Vec<bool> = (0..n).map(|i| self.owners.as_ref().is_none_or(|o| o.contains(&(first + i)))).collect();
        let parts = ReplicaSplit { first, world, local: n, weights: self.split_weights.as_deref(), mode }.parts(batch)?;
        let (computed, reduced) = if self.cfg.deterministic {
            (deterministic::run(&self.replicas, &parts, batch.len(), &updates, &self.run, &*self.comm, trace)?, None)
        } else {
            let plan = overlapped::Plan {
                buckets: &self.buckets,
                bucket_of: &self.bucket_of,
                run: &self.run,
                total: batch.len(),
                trace,
            };
            let (mut c, r) = overlapped::run(&self.replicas, &parts, &*self.comm, &plan)?;
            c.loss = self.comm.sum_by_index(vec![(first, vec![c.loss])])?[0];
            (c, Some(r))
        };

        if let Some(reduced) = &reduced {
            update::unpack(&self.replicas, &self.buckets, reduced)?;
        }
        // Every updating replica now holds the reduced gradient: the norm is one replica's.
        let counted = updates.iter().position(|&u| u).map(|r| &self.replicas[r].params[..]);
        let parts = self.replicas.iter().zip(self.opts.iter_mut()).map(|(r, opt)| Part { opt, device: &r.device, track: Some(r.track.clone()) }).collect();
        let (grad_norm, opt_s) = self.run.update(Some(counted.unwrap_or(&[])), None, parts, Some("data-parallel replica"))?;
        // Parameters with an owner were updated there only; copy them to the other replicas.
        let mut comm_spans = computed.comm.clone();
        if let Some(owners) = &self.owners {
            let tb = Instant::now();
            if world > n {
                update::gather_owned(&self.replicas, owners, &*self.comm)?;
            } else {
                update::share_owned(&self.replicas, owners, &*self.comm)?;
            }
            comm_spans.push((tb, Instant::now()));
            if let Some(tr) = trace {
                for r in &self.replicas {
                    tr.span(&r.comm_track(), "broadcast owned parameters", Phase::Comm, tb, tb.elapsed().as_secs_f64());
                }
            }
        }

        let host_s = |spans: &[(Instant, Instant)]| spans.iter().map(|(s, e)| (*e - *s).as_secs_f64()).sum::<f64>();
        let (comm_s, overlapped) = match &computed.overlap {
            // The owners' broadcast follows the update, so none of it is hidden.
            Some(o) => (o.mean_allreduce_s() + host_s(&comm_spans[computed.comm.len()..]), o.hidden_s.iter().sum::<f64>() / n as f64),
            None => {
                let hidden = match computed.backward_end {
                    Some(end) => comm_spans.iter().map(|&(s, e)| e.min(end).saturating_duration_since(s).as_secs_f64()).sum(),
                    None => 0.0,
                };
                (host_s(&comm_spans), hidden)
            }
        };
        let compute_s = computed.compute_s.iter().zip(&opt_s).map(|(c, o)| c + o).fold(0.0, f64::max);
        self.events = computed.events;
        self.overlap = computed.overlap;
        Ok(StepReport {
            loss: computed.loss,
            wall_s: t0.elapsed().as_secs_f64(),
            compute_s,
            comm_s,
            overlap: if comm_s > 0.0 { overlapped / comm_s } else { 0.0 },
            peak_memory: self.replicas.iter().map(|r| r.device.memory().peak).collect(),
            grad_norm,
        })
    }

    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        let r = &self.replicas[0];
        let x = x.to(&r.device)?;
        crate::autograd::no_grad(|| self.run.forward(&*r.model, &x, 0))
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        // The module's own state_dict: a model may name more than its parameters (Gpt's tied
        // `lm_head.weight`); replica 0's tensors are current after every step.
        Ok(self.replicas[0].model.state_dict())
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.replicas.iter().try_for_each(|r| r.model.load_state_dict(state))
    }
    /// Replica 0's state; where parameters have owners, each parameter's state gathered from
    /// its owner onto device 0, in state_dict order (across processes a collective: owners on
    /// other ranks send theirs).
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        let (first, steps) = self.opts[0].state();
        let Some(owners) = &self.owners else { return Ok((first, steps)) };
        if let Some(group) = self.comm.process_group().filter(|g| g.size() > 1) {
            let mine: Vec<(String, Tensor)> = self.opts.iter().flat_map(|o| o.state().0).collect();
            return Ok((update::gathered_state(&group.all_gather_named(&mine)?, &self.replicas[0])?, steps));
        }
        let states: Vec<Vec<(String, Tensor)>> = self.opts.iter().map(|o| o.state().0).collect();
        let dev0 = &self.replicas[0].device;
        let mut out = Vec::new();
        for (p, (name, _)) in self.replicas[0].params.iter().enumerate() {
            let prefix = format!("{name}.");
            for (key, t) in states[owners[p]].iter().filter(|(k, _)| k.starts_with(&prefix)) {
                let t = if owners[p] == 0 { t.clone() } else { self.comm.send_recv(t, dev0)? };
                out.push((key.clone(), t));
            }
        }
        Ok((out, steps))
    }
    /// Every replica loads `state`; where parameters have owners each keeps only its own
    /// parameters' entries.
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        self.opts.iter_mut().try_for_each(|o| o.load_state(state, steps))
    }
    fn modules(&self) -> Vec<&dyn Module> {
        self.replicas.iter().map(|r| &*r.model).collect()
    }
    fn core(&self) -> &StepCore {
        &self.run
    }
    fn core_mut(&mut self) -> &mut StepCore {
        &mut self.run
    }
}
