//! `DataParallel`: one model replica per device, each step's batch split across them, gradients
//! all-reduced in buckets that overlap backward, every replica holding the same weights.
//!
//! Each device's shard loss is scaled by its share `n_i / N` of the global batch, so the SUM of
//! the devices' gradients is exactly the gradient of the global mean loss, whatever the split
//! (uneven, user-weighted, calibrated) and however many micro-batches accumulate on a device.
//! A batch may hold fewer samples than there are devices (an epoch's short last batch): the
//! devices left without samples run no forward, and join every collective (all-reduce,
//! reduce-scatter, ZeRO's gathers) with zero gradients, so the step equals one device's.
//! See [`DataParallelConfig`] for the options: bucket size, split weights, calibration,
//! deterministic mode and sharding ([`Shard`]: ZeRO-1, ZeRO-2 and ZeRO-3, see `shard.rs`).
//!
//! The replicas stay one model bit for bit. On devices of one kernel family each replica applies
//! the (identical) reduced gradients itself; on a mix of backends or adapters, whose kernels
//! round differently, replica 0 alone updates every parameter and broadcasts the new values
//! (see `update.rs` for why and what it costs).
pub(crate) mod buckets;
pub(crate) mod construct;
mod deterministic;
pub(crate) mod gather;
mod inspect;
mod overlapped;
pub(crate) mod shard;
mod state;
mod timing;
mod update;

pub use buckets::assign_buckets;
pub use gather::{GatherStats, Gathers};
pub use shard::Shard;
pub use timing::{DeviceSpans, Overlap};

use super::comm::{self, Communicator};
use super::split::{PartsOf, ReplicaSplit};
use super::step::{NormOver, Part, StepCore};
use super::trace::Phase;
use super::{Loss, OptimConfig, StepReport, Strategy};
use crate::data::Batch;
use crate::nn::{Module, Sequential};
use crate::optim::Optimizer;
use crate::{DType, Device, Error, Result, Tensor};
use std::collections::HashMap;
use std::time::Instant;

/// Options of [`DataParallel`]; `Default` matches PyTorch DDP's defaults where there is one.
#[derive(Clone, Debug)]
pub struct DataParallelConfig {
    /// Gradient bytes per all-reduce bucket (DDP's 25 MiB). Smaller buckets start
    /// communicating earlier in backward but pay more per-call overhead.
    pub bucket_bytes: usize,
    /// Relative speed of each device: the batch is split in these proportions. Across
    /// processes, either one weight per device of this process (each process then takes an
    /// equal share of the batch, which its weights divide) or one per device of the whole job
    /// in rank order, the same list on every rank (each process's share follows its devices'
    /// weights: how a planned job gives a slower process fewer samples).
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
    /// How much training state each device keeps. [`Shard::Optimizer`] (ZeRO-1): optimizer
    /// state only for the parameters a device owns (balanced by size), which it updates and
    /// broadcasts; on devices of different kernel families this also spreads the updates,
    /// which otherwise all run on the first device. [`Shard::Grads`] (ZeRO-2) and
    /// [`Shard::Full`] (ZeRO-3) cut every bucket into one block per device (see `shard.rs`).
    pub shard: Shard,
    /// The type ZeRO-2/3 keep each device's reduced gradient shard in until the update:
    /// `F32` (the default), or `Bf16`/`F16` to halve that part of the training state
    /// (DeepSpeed's `grad_accum_dtype`). The reduce-scatter still sums in f32; the shard is
    /// rounded once, and the update widens it to the parameters' f32 again.
    pub grad_dtype: DType,
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
            shard: Shard::None,
            grad_dtype: DType::F32,
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

/// What each kind of step (overlapped, deterministic) works with.
#[derive(Clone, Copy)]
struct StepWork<'a> {
    buckets: &'a [Vec<usize>],
    bucket_of: &'a [usize],
    run: &'a StepCore,
    /// Samples in the global batch: each part's loss is scaled by its share of it.
    total: usize,
    trace: Option<&'a super::trace::Trace>,
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

impl shard::Holder for Replica {
    fn device(&self) -> &Device {
        &self.device
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
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
    /// ZeRO-2/3: each device's shard of the parameters, which its optimizer updates.
    sharded: Option<shard::Sharded>,
    /// ZeRO-3: the full parameters stay gathered until the next step (`gather_full`).
    full_kept: bool,
    /// ZeRO-3 unit by unit: the order the last step's ops needed the units in on each device
    /// (what the next step prefetches), and what its gathers cost.
    gather_orders: Vec<Vec<usize>>,
    gathers: Option<Gathers>,
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
    /// does not matter. Under ZeRO-3 ([`Shard::Full`]) the constructor runs deferred
    /// ([`build_deferred`](crate::tensor::build_deferred)): the tensors it makes from host
    /// values reach the device only as the device's shard, parameter by parameter. Buffers are not broadcast: a constructor must make them the same
    /// everywhere (BatchNorm's do).
    pub fn from_factory<M: Module>(
        build: impl Fn(&Device) -> Result<M>,
        devices: &[Device],
        opt: &OptimConfig,
        loss: Loss,
        cfg: DataParallelConfig,
    ) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::invalid("DataParallel::new", "needs at least one device"));
        }
        let comm = comm::for_devices(devices)?;
        let models = construct::built(&build, comm.devices(), cfg.shard)?;
        Self::from_models(models, comm, opt, loss, cfg)
    }

    /// `new` with a chosen communicator (for example `PeerRing` on devices without a peer
    /// path, to test the CUDA algorithm); the replicas go on `comm.devices()`.
    pub fn with_communicator(
        model: &Sequential,
        comm: Box<dyn Communicator>,
        opt: &OptimConfig,
        loss: Loss,
        cfg: DataParallelConfig,
    ) -> Result<Self> {
        let models = comm.devices().iter().map(|d| Ok(Box::new(model.slice(0..model.len(), d)?) as Box<dyn Module>)).collect::<Result<Vec<_>>>()?;
        Self::from_models(models, comm, opt, loss, cfg)
    }

    /// `from_factory` with a chosen communicator (`Hierarchical` across processes): `build`
    /// makes a replica on each of `comm.devices()`.
    pub fn from_factory_with<M: Module>(
        build: impl Fn(&Device) -> Result<M>,
        comm: Box<dyn Communicator>,
        opt: &OptimConfig,
        loss: Loss,
        cfg: DataParallelConfig,
    ) -> Result<Self> {
        let models = construct::built(&build, comm.devices(), cfg.shard)?;
        Self::from_models(models, comm, opt, loss, cfg)
    }

    /// A communication span of `what` from `start` to now on every replica's comm track.
    fn trace_comm(&self, trace: Option<&super::trace::Trace>, what: &str, start: Instant) {
        if let Some(tr) = trace {
            for r in &self.replicas {
                tr.span(&r.comm_track(), what, Phase::Comm, start, start.elapsed().as_secs_f64());
            }
        }
    }
}

/// The result of replica `i`'s thread; its error, or its panic, named by replica and device.
fn joined<T>(i: usize, r: &Replica, thread: std::thread::Result<Result<T>>) -> Result<T> {
    thread.unwrap_or_else(|payload| Err(Error::panicked(payload))).map_err(|e| e.in_worker("data-parallel replica", i, &r.device))
}

impl Strategy for DataParallel {
    fn autocasts(&self) -> bool {
        true
    }
    fn computes_on_caller(&self) -> bool {
        false
    }
    fn check_batch_size(&self, n: usize) -> Result<()> {
        super::split::check_samples(n, self.comm.device_span().1)
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        let n = self.replicas.len();
        let (first, world) = self.comm.device_span();
        let mode =
            if self.cfg.deterministic { PartsOf::FixedShards(self.cfg.deterministic_shards) } else { PartsOf::MicroBatches(self.cfg.micro_batches) };
        let full = self.sharded.as_ref().is_some_and(|s| s.mode == Shard::Full);
        if self.cfg.calibrate && self.split_weights.is_none() {
            if full {
                self.gather_full()?;
            }
            let models: Vec<(&dyn Module, &Device)> = self.replicas.iter().map(|r| (&*r.model, &r.device)).collect();
            self.split_weights = Some(timing::calibrate(&models, batch, &self.run)?);
        }
        let trace = self.run.trace.clone();
        let trace = trace.as_ref();
        let updates: Vec<bool> = (0..n).map(|i| self.owners.as_ref().is_none_or(|o| o.contains(&(first + i)))).collect();
        let mut comm_spans = Vec::new();
        let parts = ReplicaSplit { first, world, local: n, weights: self.split_weights.as_deref(), mode }.parts(batch)?;
        // Deterministic mode gathers unit by unit in one process, each device on its own, and
        // across processes where every device computes as many micro-shards.
        let shards = self.cfg.deterministic_shards.min(batch.len());
        let by_unit = full
            && if self.cfg.deterministic {
                world == n || shards.is_multiple_of(world)
            } else {
                gather::every_device_alike(&parts, self.cfg.micro_batches, &*self.comm)?
            };
        self.gathers = None;
        if let Some(s) = self.sharded.as_ref().filter(|_| full) {
            if by_unit {
                // Every parameter starts released; ops gather the units as they need them.
                s.release(&self.replicas)?;
            } else if !self.full_kept {
                let tg = Instant::now();
                s.gather(&self.replicas, &*self.comm)?;
                comm_spans.push((tg, Instant::now()));
                self.trace_comm(trace, "all-gather parameters", tg);
            }
            self.full_kept = false;
        }
        let mut host_sum = None;
        let work = StepWork { buckets: &self.buckets, bucket_of: &self.bucket_of, run: &self.run, total: batch.len(), trace };
        let (computed, mut reduced) = if self.cfg.deterministic {
            let plan =
                deterministic::Plan { work, updates: &updates, sharded: self.sharded.as_ref(), units: by_unit.then(|| self.gather_orders.clone()) };
            let out = deterministic::run(&self.replicas, &parts, &*self.comm, &plan)?;
            if let Some((orders, g, spans)) = out.gathered {
                (self.gather_orders, self.gathers) = (orders, Some(g));
                // Before `hidden_from`: deterministic mode hides no communication.
                comm_spans.extend(spans);
            }
            host_sum = out.sum;
            (out.computed, None)
        } else {
            let plan = overlapped::Plan { work, scatter: self.sharded.as_ref().map(|s| (s.world(), self.cfg.grad_dtype)), release: full };
            let units = match (&self.sharded, by_unit) {
                (Some(s), true) => Some(overlapped::UnitGathers {
                    units: self.replicas.iter().enumerate().map(|(i, r)| s.units_on(i, r)).collect(),
                    previous: self.gather_orders.first().cloned().unwrap_or_default(),
                }),
                _ => None,
            };
            let (mut c, x) = overlapped::run(&self.replicas, &parts, &*self.comm, &plan, units)?;
            c.loss = self.comm.sum_by_index(vec![(first, vec![c.loss])])?[0];
            if let Some((order, g)) = x.gathered {
                self.gather_orders = vec![order; n];
                self.gathers = Some(g);
            }
            (c, Some(x.reduced))
        };

        let (grad_norm, opt_s) = match &self.sharded {
            Some(s) => {
                match (reduced.take(), &host_sum) {
                    (Some(blocks), _) => s.grads_from_blocks(blocks)?,
                    (None, Some(sum)) => s.grads_from_host(sum, &self.replicas, self.cfg.grad_dtype)?,
                    (None, None) => return Err(Error::Msg("data parallel: no reduced gradient for the shards".into())),
                }
                self.replicas.iter().for_each(|r| r.model.zero_grad());
                // Deterministic mode: the norm of the host sum as replica 0 takes it without
                // sharding, bit for bit. Otherwise every element of the gradient is in one
                // piece: the norm sums the pieces, over every process.
                let r0 = &self.replicas[0];
                let given = |unscale: Option<f32>| deterministic::norm_sq(host_sum.as_deref().unwrap_or_default(), r0, unscale);
                let norm_over = if host_sum.is_some() { NormOver::Given(&given) } else { NormOver::Parts };
                let comm = &*self.comm;
                let across = |sq: f64| Ok(f64::from(comm.sum_by_index(vec![(first, vec![sq as f32])])?[0]));
                let reduce = (host_sum.is_none() && world > n).then_some(&across as &dyn Fn(f64) -> Result<f64>);
                let parts = self
                    .replicas
                    .iter()
                    .zip(self.opts.iter_mut())
                    .map(|(r, opt)| Part { opt, device: &r.device, track: Some(r.track.clone()) })
                    .collect();
                let out = self.run.update(norm_over, reduce, parts, Some("data-parallel replica"))?;
                self.replicas.iter().for_each(|r| r.model.zero_grad());
                s.drop_grads();
                out
            }
            None => {
                // Dropped once unpacked (the gradients are copies), before the update.
                if let Some(reduced) = reduced.take() {
                    update::unpack(&self.replicas, &self.buckets, &reduced)?;
                }
                // Every updating replica now holds the reduced gradient: the norm is one replica's.
                let counted = updates.iter().position(|&u| u).map(|r| &self.replicas[r].params[..]);
                let parts = self
                    .replicas
                    .iter()
                    .zip(self.opts.iter_mut())
                    .map(|(r, opt)| Part { opt, device: &r.device, track: Some(r.track.clone()) })
                    .collect();
                self.run.update(NormOver::Params(counted.unwrap_or(&[])), None, parts, Some("data-parallel replica"))?
            }
        };
        let hidden_from = comm_spans.len() + computed.comm.len();
        comm_spans.extend(computed.comm.iter().copied());
        if let Some(s) = &self.sharded {
            // ZeRO-2 all-gathers the updated pieces now; ZeRO-3 before the next forward.
            let tg = Instant::now();
            if s.mode == Shard::Grads {
                s.gather(&self.replicas, &*self.comm)?;
                comm_spans.push((tg, Instant::now()));
                self.trace_comm(trace, "all-gather parameters", tg);
            } else {
                s.release(&self.replicas)?;
                self.full_kept = false;
            }
        }
        // Parameters with an owner were updated there only; copy them to the other replicas.
        if let Some(owners) = &self.owners {
            let tb = Instant::now();
            if world > n {
                update::gather_owned(&self.replicas, owners, &*self.comm)?;
            } else {
                update::share_owned(&self.replicas, owners, &*self.comm)?;
            }
            comm_spans.push((tb, Instant::now()));
            self.trace_comm(trace, "broadcast owned parameters", tb);
        }

        let host_s = |spans: &[(Instant, Instant)]| spans.iter().map(|(s, e)| (*e - *s).as_secs_f64()).sum::<f64>();
        let (comm_s, overlapped) = match &computed.overlap {
            // The owners' broadcast and the all-gathers come before forward or after the
            // update, so none of them is hidden.
            Some(o) => {
                let (gather_s, gather_hidden) = self.gathers.as_ref().map_or((0.0, 0.0), |g| (g.gather_s, g.hidden_s()));
                let before_and_after = host_s(&comm_spans[..hidden_from - computed.comm.len()]) + host_s(&comm_spans[hidden_from..]);
                (o.mean_allreduce_s() + gather_s + before_and_after, o.hidden_s.iter().sum::<f64>() / n as f64 + gather_hidden)
            }
            None => {
                let hidden = match computed.backward_end {
                    // Only the step's own reduction can overlap backward; ZeRO-3's gather
                    // before forward cannot.
                    Some(end) => comm_spans[hidden_from - computed.comm.len()..]
                        .iter()
                        .map(|&(s, e)| e.min(end).saturating_duration_since(s).as_secs_f64())
                        .sum(),
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
        self.on_replica_0(|| crate::autograd::no_grad(|| self.run.forward(&*r.model, &x, 0)))
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        self.weights()
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.load_weights(state)
    }
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.whole_optimizer_state()
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.load_whole_optimizer_state(state, steps)
    }
    fn state_is_collective(&self) -> bool {
        let (_, world) = self.comm.device_span();
        world > self.replicas.len() && (self.owners.is_some() || self.sharded.is_some())
    }
    fn gather_full(&mut self) -> Result<()> {
        if let Some(s) = self.sharded.as_ref().filter(|s| s.mode == Shard::Full && !self.full_kept) {
            s.gather(&self.replicas, &*self.comm)?;
            self.full_kept = true;
        }
        Ok(())
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
