//! Data parallelism over replicas that span several devices (`--strategy data,pipeline`,
//! `data,tensor`): R copies of one [`Replica`] (a pipeline of P stages, a tensor-parallel group
//! of T shards), replica r on the row of devices `r·W .. (r+1)·W`. Each replica runs its share
//! of the batch; slot s's gradients are all-reduced over the R devices that hold slot s (one
//! [`Communicator`] per slot); then one global-norm clip over the whole model and one update
//! per replica, so the replicas stay identical. With [`DataGrid::shard`] the data axis runs
//! ZeRO-1/2/3 instead of the all-reduce (`zero.rs`).
mod zero;

use super::comm::{self, Communicator, ReduceKind};
use super::data_parallel::shard::copy_of;
use super::replica::Replica;
use super::split;
use super::step::{NormOver, Part, StepCore};
use super::{DataParallelConfig, OptimConfig, Pipeline, Shard, StepReport, Strategy};
use crate::autograd::no_grad;
use crate::data::Batch;
use crate::nn::Module;
use crate::{Device, Error, Result, Tensor};
use std::ops::Range;
use std::time::Instant;

/// The grid of pipelines (`--strategy data,pipeline`), the form large clusters use.
pub type PipelineGrid = DataGrid<Pipeline>;

/// R replicas of one multi-device model (pipelines, tensor-parallel groups), trained as data
/// parallelism: the global batch is cut by sample
/// (equally, or by [`DataGrid::split_weights`]) and each share's loss weighted by its size,
/// so a step equals the step of one pipeline on the whole batch. Replica 0's weights are
/// copied to the others when the grid is built. Clipping is the grid's
/// ([`Strategy::set_grad_clip`]); the replicas' own is not used. Tied parameters
/// (`PipelineBuilder::tie`) are summed inside each replica before the all-reduce. Slot `s` of
/// every replica (stage `s`, tensor rank `s`) holds the same parameters, and the data axis
/// reduces them slot by slot.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use std::sync::Arc;
/// use tandem::parallel::{Loss, OptimConfig, Pipeline, PipelineGrid, Split, Stages, Strategy};
/// let dev = || tandem::Device::from_backend(Arc::new(tandem::backend::cpu::CpuBackend::new()));
/// let model = tandem::nn::models::SeedModel::Cnn.build(0, &dev())?;
/// let opt = OptimConfig::sgd(Default::default());
/// let pipe = |d: &[tandem::Device]| Pipeline::builder(Stages::Split(&model, Split::At(vec![6])), d, &opt, Loss::CrossEntropy).micro_batches(2).build();
/// let mut grid = PipelineGrid::from_factory(&[dev(), dev(), dev(), dev()], 2, pipe)?;
/// let data = tandem::data::synthetic::seed_images(8, 0)?;
/// assert!(grid.step(&data.batch(&[0, 1, 2, 3, 4, 5, 6, 7])?)?.loss.is_finite());
/// # Ok(()) }
/// ```
pub struct DataGrid<R: Replica> {
    replicas: Vec<R>,
    /// `comms[s]` spans slot s's device in every replica, in replica order.
    comms: Vec<Box<dyn Communicator>>,
    weights: Option<Vec<f64>>,
    /// The data axis's sharded state (ZeRO), when it shards.
    zero: Option<zero::Zero>,
    /// The grid's clipping bound, learning rate, trace and step count; the replicas take the
    /// trace and the step count from it.
    run: StepCore,
}

impl<R: Replica> DataGrid<R> {
    /// What [`Parallel::grid`](super::Parallel::grid) and
    /// [`Parallel::data_tensor`](super::Parallel::data_tensor) call, public for replicas built
    /// with options the builders do not pass on (`tie`, `across`).
    /// `replicas` copies over `devices` (`replicas` × a replica's devices, replica-major: the
    /// first replica's devices first), each built by `build` on its row of devices.
    pub fn from_factory(devices: &[Device], replicas: usize, mut build: impl FnMut(&[Device]) -> Result<R>) -> Result<Self> {
        if replicas == 0 || devices.is_empty() || !devices.len().is_multiple_of(replicas) {
            return Err(Error::invalid("DataGrid", format!("{} devices do not make {replicas} replicas of equal size", devices.len())));
        }
        let replicas = devices.chunks(devices.len() / replicas).map(&mut build).collect::<Result<Vec<_>>>()?;
        Self::new(replicas)
    }

    /// The grid of `replicas` (all of the same model), with the best communicator for each
    /// slot's devices (`comm::for_devices`).
    pub fn new(replicas: Vec<R>) -> Result<Self> {
        let slots = replicas.first().map_or(0, |r| r.devices().len());
        let comms = (0..slots).map(|s| comm::for_devices(&column(&replicas, s))).collect::<Result<Vec<_>>>()?;
        Self::with_communicators(replicas, comms)
    }

    /// The grid of this process's `replicas` and every other rank's of `group` (collective:
    /// every rank calls it with the same number of replicas of the same model): slot `s`'s
    /// gradients are summed over every process through host memory
    /// ([`Hierarchical`](super::comm::Hierarchical), rank order), rank 0's replica 0
    /// initialises every replica, and each rank trains its replicas' shares of every global
    /// batch (every rank must be given the same batches). Megatron-LM's layout across servers:
    /// tensor groups or pipelines inside a process, data parallelism across. With the `nccl`
    /// feature, where every rank's devices are CUDA GPUs, each slot's collectives go through
    /// NCCL across the processes instead.
    pub fn across(replicas: Vec<R>, group: &crate::dist::Group) -> Result<Self> {
        let slots = replicas.first().map_or(0, |r| r.devices().len());
        let counts = group.all_gather_u64(&[replicas.len() as u64, slots as u64])?;
        if counts.iter().any(|c| c.as_slice() != counts[0].as_slice()) {
            let per: Vec<String> = counts.iter().enumerate().map(|(r, c)| format!("rank {r}: {c:?}")).collect();
            return Err(Error::invalid(
                "DataGrid::across",
                format!("every rank must hold as many replicas of as many devices ([replicas, devices]: {})", per.join(", ")),
            ));
        }
        // NCCL only where every rank's devices are CUDA GPUs, decided together so that every
        // rank takes the same branch; one communicator per slot.
        #[cfg(feature = "nccl")]
        {
            let cuda = replicas.iter().flat_map(|r| r.devices()).all(|d| d.info().backend == crate::backend::BackendKind::Cuda);
            if group.all_gather_u64(&[u64::from(cuda)])?.iter().all(|v| v.first() == Some(&1)) {
                let comms = (0..slots)
                    .map(|s| Ok(Box::new(super::comm::Nccl::across(&column(&replicas, s), group)?) as Box<dyn Communicator>))
                    .collect::<Result<Vec<_>>>()?;
                return Self::with_communicators(replicas, comms);
            }
        }
        let comms = (0..slots)
            .map(|s| {
                Ok(Box::new(super::comm::Hierarchical::new(&column(&replicas, s), group.clone(), crate::dist::Order::Mpi)?) as Box<dyn Communicator>)
            })
            .collect::<Result<Vec<_>>>()?;
        Self::with_communicators(replicas, comms)
    }

    /// As `new`, with `comms[s]` over slot s's devices in replica order.
    pub fn with_communicators(mut replicas: Vec<R>, comms: Vec<Box<dyn Communicator>>) -> Result<Self> {
        let Some(first) = replicas.first() else {
            return Err(Error::invalid("DataGrid", "no replicas given"));
        };
        let kind = first.kind();
        let names = |p: &R| -> Result<Vec<(String, Vec<usize>)>> { Ok(p.state_dict()?.into_iter().map(|(n, t)| (n, t.dims().to_vec())).collect()) };
        let want = names(first)?;
        for (r, p) in replicas.iter().enumerate() {
            if p.devices().len() != first.devices().len() || names(p)? != want {
                return Err(Error::invalid(
                    "DataGrid",
                    format!("{kind} {r} has other devices or parameters than {kind} 0; every replica must be the same model"),
                ));
            }
        }
        align_cuts(&mut replicas, None)?;
        let slots = |p: &R| -> Vec<Vec<(String, Vec<usize>)>> {
            p.slot_params().iter().map(|s| s.iter().map(|(n, t)| (n.clone(), t.dims().to_vec())).collect()).collect()
        };
        let want = slots(&replicas[0]);
        if let Some(r) = replicas.iter().position(|p| slots(p) != want) {
            return Err(Error::invalid(
                "DataGrid",
                format!("{kind} {r} lays its parameters over its devices unlike {kind} 0; every replica must be split alike"),
            ));
        }
        if comms.len() != replicas[0].devices().len() {
            return Err(Error::invalid("DataGrid", format!("{} communicators for {} devices per {kind}", comms.len(), replicas[0].devices().len())));
        }
        for (s, c) in comms.iter().enumerate() {
            let col = column(&replicas, s);
            if c.devices().len() != col.len() || c.devices().iter().zip(&col).any(|(a, b)| !a.same(b)) {
                return Err(Error::invalid("DataGrid", format!("communicator {s} spans {:?}, slot {s} of the replicas is on {col:?}", c.devices())));
            }
        }
        let state = replicas[0].state_dict()?;
        for r in replicas.iter_mut().skip(1) {
            r.load_state_dict(&state)?;
        }
        if comms[0].device_span().1 > replicas.len() {
            // Across processes: rank 0's replica 0 is every replica's start.
            no_grad(|| {
                let params: Vec<Vec<Vec<(String, Tensor)>>> = replicas.iter().map(|r| r.slot_params()).collect();
                for (s, comm) in comms.iter().enumerate() {
                    for p in 0..params[0][s].len() {
                        let group: Vec<Tensor> = params.iter().map(|r| r[s][p].1.clone()).collect();
                        comm.broadcast(&group, 0)?;
                    }
                }
                Ok(())
            })?;
            replicas.iter_mut().try_for_each(|r| r.updated(0))?;
        }
        let devices: Vec<Device> = replicas.iter().flat_map(|r| r.devices()).collect();
        let run = StepCore::new(replicas[0].core().loss.clone(), &devices);
        Ok(DataGrid { replicas, comms, weights: None, zero: None, run })
    }

    /// Shares of the batch in proportion to `weights`, one per replica (of every process,
    /// across processes); equal without.
    pub fn split_weights(mut self, weights: Vec<f64>) -> Result<Self> {
        let world = self.world().1;
        if weights.len() != world {
            return Err(Error::invalid("DataGrid::split_weights", format!("{} weights for {world} replicas", weights.len())));
        }
        self.weights = Some(weights);
        Ok(self)
    }

    /// Shards the data axis's training state as `cfg.shard` says (ZeRO-1, 2 or 3 over the
    /// devices that hold each slot; [`Shard::None`] leaves the all-reduce), in buckets of
    /// `cfg.bucket_bytes`, gradient shards kept in `cfg.grad_dtype`, each device's pieces
    /// updated by an optimizer of `opt` (the replicas' own optimizers then hold no state). The
    /// options of one-device replicas (deterministic mode, calibration, micro-batches, split
    /// weights: use [`DataGrid::split_weights`]) are refused. A collective across processes.
    ///
    /// On a grid the reduction runs after backward, so ZeRO-1 and ZeRO-2 do the same work
    /// (each device keeps its block of the reduced gradients), and ZeRO-3 gathers a slot's
    /// parameters for a whole step, releasing them between steps.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use std::sync::Arc;
    /// use tandem::parallel::{DataParallelConfig, Loss, OptimConfig, Pipeline, PipelineGrid, Shard, Split, Stages, Strategy};
    /// let dev = || tandem::Device::from_backend(Arc::new(tandem::backend::cpu::CpuBackend::new()));
    /// let model = tandem::nn::models::SeedModel::Cnn.build(0, &dev())?;
    /// let opt = OptimConfig::adam(Default::default());
    /// let pipe = |d: &[tandem::Device]| Pipeline::builder(Stages::Split(&model, Split::At(vec![6])), d, &opt, Loss::CrossEntropy).build();
    /// let cfg = DataParallelConfig { shard: Shard::Grads, ..Default::default() };
    /// let mut grid = PipelineGrid::from_factory(&[dev(), dev(), dev(), dev()], 2, pipe)?.shard(&cfg, &opt)?;
    /// let data = tandem::data::synthetic::seed_images(8, 0)?;
    /// assert!(grid.step(&data.batch(&[0, 1, 2, 3, 4, 5, 6, 7])?)?.loss.is_finite());
    /// # Ok(()) }
    /// ```
    pub fn shard(mut self, cfg: &DataParallelConfig, opt: &OptimConfig) -> Result<Self> {
        zero::check_config(cfg)?;
        if self.zero.is_some() {
            return Err(Error::invalid("DataGrid::shard", "the grid is sharded already"));
        }
        if cfg.shard != Shard::None {
            self.zero = Some(zero::Zero::new(cfg, &self.replicas, &self.comms, opt)?);
        }
        Ok(self)
    }

    /// How the data axis shards the training state ([`Shard::None`]: all-reduced, every
    /// replica holding it all).
    pub fn shard_mode(&self) -> Shard {
        self.zero.as_ref().map_or(Shard::None, |z| z.mode)
    }

    /// Each local device's optimizer-state bytes, replica-major (a replica's devices in slot
    /// order): under ZeRO only its pieces' state.
    pub fn optimizer_state_bytes(&mut self) -> Vec<u64> {
        match &self.zero {
            Some(z) => {
                let per_slot = z.state_bytes();
                let slots = self.replicas[0].devices().len();
                (0..self.replicas.len())
                    .flat_map(|r| (0..slots).map(move |s| (r, s)))
                    .map(|(r, s)| per_slot[s].get(r).copied().unwrap_or(0))
                    .collect()
            }
            None => self
                .replicas
                .iter_mut()
                .flat_map(|r| r.optimizers().into_iter().map(|(o, _, _)| zero::state_bytes(&**o)).collect::<Vec<_>>())
                .collect(),
        }
    }

    /// The replicas, in order.
    pub fn replicas(&self) -> &[R] {
        &self.replicas
    }

    /// The global index of this process's first replica, and the replicas of every process.
    fn world(&self) -> (usize, usize) {
        self.comms.first().map_or((0, self.replicas.len()), |c| c.device_span())
    }

    /// This process's replicas' samples of a global batch of `n`.
    fn shares(&self, n: usize) -> Result<Vec<Range<usize>>> {
        let (first, world) = self.world();
        let shares = split::ranges(n, world, self.weights.as_deref())?;
        if n < world || shares.iter().any(Range::is_empty) {
            let sizes: Vec<usize> = shares.iter().map(Range::len).collect();
            return Err(Error::invalid(
                "DataGrid::step",
                format!("a batch of {n} samples split {sizes:?} leaves a {} of the {world} without samples", self.replicas[0].kind()),
            ));
        }
        Ok(shares[first..first + self.replicas.len()].to_vec())
    }

    /// Sums each slot's gradients over the replicas: one flat tensor per replica and slot.
    fn all_reduce_grads(&self) -> Result<()> {
        no_grad(|| {
            for (s, comm) in self.comms.iter().enumerate() {
                let params: Vec<Vec<(String, Tensor)>> = self.replicas.iter().map(|r| r.slot_params().swap_remove(s)).collect();
                if params[0].is_empty() {
                    continue;
                }
                let every: Vec<usize> = (0..params[0].len()).collect();
                let flats = params.iter().map(|ps| zero::flat_grads(ps, &every)).collect::<Result<Vec<_>>>()?;
                comm.all_reduce(&flats, ReduceKind::Sum)?;
                for (ps, flat) in params.iter().zip(&flats) {
                    let mut at = 0;
                    for (_, p) in ps.iter() {
                        p.set_grad(Some(flat.narrow(0, at, p.numel())?.reshape(p.shape().clone())?));
                        at += p.numel();
                    }
                }
            }
            Ok(())
        })
    }
}

/// Gives every pipeline replica the first one's layer cuts. A replica whose split is still to
/// be measured takes them (the first is measured on `first_part` when given); one cut
/// otherwise is refused.
fn align_cuts<R: Replica>(replicas: &mut [R], first_part: Option<&Batch>) -> Result<()> {
    let Some((head, rest)) = replicas.split_first_mut() else { return Ok(()) };
    let Some(p0) = head.as_pipeline_mut() else { return Ok(()) };
    if let Some(part) = first_part {
        if p0.split_pending() {
            p0.measure_split(part)?;
        }
    }
    let cut = p0.ranges();
    for (r, rep) in rest.iter_mut().enumerate() {
        let p = rep.as_pipeline_mut().expect("every replica of a grid is of one type");
        if p.ranges() == cut {
            continue;
        }
        // A split still to be measured takes replica 0's cut at the first step anyway.
        if !p.split_pending() && first_part.is_none() {
            return Err(Error::invalid(
                "DataGrid",
                format!("pipeline {} cuts the layers {:?}, pipeline 0 {cut:?}; every replica must be cut alike", r + 1, p.ranges()),
            ));
        }
        p.fix_split(&cut)?;
    }
    Ok(())
}

/// Slot `s`'s device in every replica.
fn column<R: Replica>(replicas: &[R], s: usize) -> Vec<Device> {
    replicas.iter().map(|r| r.devices()[s].clone()).collect()
}

impl<R: Replica + 'static> Strategy for DataGrid<R> {
    fn autocasts(&self) -> bool {
        true
    }
    fn computes_on_caller(&self) -> bool {
        false
    }
    /// `DataGrid<Pipeline>` (which `PipelineGrid` names), `DataGrid<TensorParallelGpt>`, ...
    fn describe(&self) -> String {
        match self.shard_mode() {
            Shard::None => format!("DataGrid<{}>", self.replicas[0].describe()),
            mode => format!("DataGrid<{}>, shard {}", self.replicas[0].describe(), mode.name()),
        }
    }
    fn check_batch_size(&self, n: usize) -> Result<()> {
        for (share, rep) in self.shares(n)?.into_iter().zip(&self.replicas) {
            rep.check_batch_size(share.len())?;
        }
        Ok(())
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        let (n, shares) = (batch.len(), self.shares(batch.len())?);
        let parts = shares.iter().map(|r| batch.slice(r.clone())).collect::<Result<Vec<_>>>()?;
        // Every replica must cut the model where replica 0 does, or stage s's gradients differ
        // in length across the replicas; timed apart (and on a loaded machine) they can disagree.
        align_cuts(&mut self.replicas, Some(&parts[0]))?;
        let tg = Instant::now();
        if let Some(z) = self.zero.as_ref().filter(|z| z.mode == Shard::Full) {
            z.gather(&self.comms)?;
        }
        let mut comm_s = tg.elapsed().as_secs_f64();
        for r in &mut self.replicas {
            let core = r.core_mut();
            core.trace = self.run.trace.clone();
            core.step = self.run.step;
            // The replicas' forwards autocast and scale their losses as the grid's update,
            // which unscales and moves the scale, expects.
            core.precision = self.run.precision;
            core.scaler = self.run.scaler;
        }
        let results: Vec<Result<f32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .zip(&parts)
                .zip(&shares)
                .map(|((rep, part), r)| scope.spawn(move || rep.backward_share(part, r.start, n)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(Error::panicked(p)))).collect()
        });
        let mut losses = Vec::with_capacity(results.len());
        for (i, r) in results.into_iter().enumerate() {
            let kind = self.replicas[i].kind();
            losses.push(r.map_err(|e| e.in_worker(kind, i, &self.replicas[i].devices()[0]))?);
        }
        let tc = Instant::now();
        let (first, world) = self.world();
        let grad_norm = match &mut self.zero {
            Some(z) => {
                z.reduce(&self.comms)?;
                comm_s += tc.elapsed().as_secs_f64();
                // Every element of the model's gradient is in exactly one piece: the norm sums
                // the pieces, over every process.
                let comm = &*self.comms[0];
                let across = |sq: f64| Ok(f64::from(comm.sum_by_index(vec![(first, vec![sq as f32])])?[0]));
                let reduce = (world > self.replicas.len()).then_some(&across as &dyn Fn(f64) -> Result<f64>);
                let (norm, _) = self.run.update(NormOver::Parts, reduce, z.parts(), None)?;
                let tu = Instant::now();
                z.updated(&self.comms)?;
                comm_s += tu.elapsed().as_secs_f64();
                norm
            }
            None => {
                self.all_reduce_grads()?;
                comm_s += tc.elapsed().as_secs_f64();
                // After the all-reduce every replica holds the same gradients: replica 0's norm
                // is the whole model's, each parameter counted once, and every replica takes
                // the same scale.
                let counted = self.replicas[0].slot_params().concat();
                let parts = self.replicas.iter_mut().flat_map(|r| r.optimizers()).map(|(opt, device, track)| Part { opt, device, track }).collect();
                self.run.update(NormOver::Params(&counted), None, parts, None)?.0
            }
        };
        for r in &mut self.replicas {
            r.updated(self.run.step)?;
        }
        if let Some(z) = &self.zero {
            // After the tied copies took their primaries' values.
            z.release()?;
        }
        let mut reports: Vec<StepReport> = self.replicas.iter_mut().zip(&losses).map(|(r, &loss)| r.share_report(loss, grad_norm, t0)).collect();
        let mut report = reports.swap_remove(0);
        for r in &reports {
            report.compute_s = report.compute_s.max(r.compute_s);
            report.comm_s += r.comm_s;
            report.peak_memory.extend(&r.peak_memory);
        }
        report.loss =
            if world > self.replicas.len() { self.comms[0].sum_by_index(vec![(first, vec![losses.iter().sum()])])?[0] } else { losses.iter().sum() };
        report.comm_s += comm_s;
        report.wall_s = t0.elapsed().as_secs_f64();
        Ok(report)
    }
    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        match &self.zero {
            Some(z) => z.with_full(&self.comms, || self.replicas[0].predict(x)),
            None => self.replicas[0].predict(x),
        }
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        match &self.zero {
            // Copies: the live parameters are released again after.
            Some(z) if z.mode == Shard::Full => {
                z.with_full(&self.comms, || self.replicas[0].state_dict()?.into_iter().map(|(n, t)| Ok((n, copy_of(&t)?))).collect())
            }
            Some(_) | None => self.replicas[0].state_dict(),
        }
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        if let Some(z) = &self.zero {
            z.restore()?;
        }
        self.replicas.iter_mut().try_for_each(|r| r.load_state_dict(state))?;
        match &self.zero {
            Some(z) => {
                z.refresh()?;
                z.release()
            }
            None => Ok(()),
        }
    }
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        match &self.zero {
            Some(z) => z.optimizer_state(&self.replicas[0], &self.comms),
            None => self.replicas[0].optimizer_state(),
        }
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        match &mut self.zero {
            Some(z) => {
                z.load_optimizer_state(&self.replicas[0], state, steps)?;
                self.replicas.iter_mut().for_each(|r| r.core_mut().step = steps);
                Ok(())
            }
            None => self.replicas.iter_mut().try_for_each(|r| r.load_optimizer_state(state, steps)),
        }
    }
    fn state_is_collective(&self) -> bool {
        self.zero.is_some() && self.world().1 > self.replicas.len()
    }
    fn modules(&self) -> Vec<&dyn Module> {
        self.replicas.iter().flat_map(|r| r.modules()).collect()
    }
    fn core(&self) -> &StepCore {
        &self.run
    }
    fn core_mut(&mut self) -> &mut StepCore {
        &mut self.run
    }
}
