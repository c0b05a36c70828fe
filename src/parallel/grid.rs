//! Data parallelism over pipelines on a device grid (`--strategy data,pipeline`): R pipelines
//! of P stages each, replica r's stage s on device `r·P + s`. Each pipeline runs its share of
//! the batch; stage s's gradients are all-reduced over the R devices that hold stage s (one
//! [`Communicator`] per stage); then one global-norm clip over the whole model and one update
//! per replica, so the replicas stay identical.
use super::comm::{self, Communicator, ReduceKind};
use super::pipeline::{PartRun, Pipeline};
use super::split;
use super::step::{NormOver, StepCore};
use crate::nn::Module;
use super::{StepReport, Strategy};
use crate::autograd::no_grad;
use crate::data::Batch;
use crate::{Device, Error, Result, Tensor};
use std::ops::Range;
use std::time::Instant;

/// R replicas of one pipeline, trained as data parallelism: the global batch is cut by sample
/// (equally, or by [`PipelineGrid::split_weights`]) and each share's loss weighted by its size,
/// so a step equals the step of one pipeline on the whole batch. Replica 0's weights are
/// copied to the others when the grid is built. Clipping is the grid's
/// ([`Strategy::set_grad_clip`]); the replicas' own is not used. Tied parameters
/// (`PipelineBuilder::tie`) are summed inside each replica before the all-reduce.
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
pub struct PipelineGrid {
    replicas: Vec<Pipeline>,
    /// `comms[s]` spans stage s's device in every replica, in replica order.
    comms: Vec<Box<dyn Communicator>>,
    weights: Option<Vec<f64>>,
    /// The grid's clipping bound, learning rate, trace and step count; the replicas take the
    /// trace and the step count from it.
    run: StepCore,
}

impl PipelineGrid {
    /// What [`Parallel::grid`](super::Parallel::grid) calls, public for pipelines built with
    /// options the grid builder does not pass on (`tie`, `across`).
    /// `pipelines` replicas over `devices` (`pipelines` × stages of them, replica-major: the
    /// first replica's stages first), each built by `build` on its row of devices.
    pub fn from_factory(devices: &[Device], pipelines: usize, mut build: impl FnMut(&[Device]) -> Result<Pipeline>) -> Result<Self> {
        if pipelines == 0 || devices.is_empty() || !devices.len().is_multiple_of(pipelines) {
            return Err(Error::invalid("PipelineGrid", format!("{} devices do not make {pipelines} pipelines of equal length", devices.len())));
        }
        let replicas = devices.chunks(devices.len() / pipelines).map(&mut build).collect::<Result<Vec<_>>>()?;
        Self::new(replicas)
    }

    /// The grid of `replicas` (all with the same stages), with the best communicator for each
    /// stage's devices (`comm::for_devices`).
    pub fn new(replicas: Vec<Pipeline>) -> Result<Self> {
        let stages = replicas.first().map_or(0, |r| r.devices().len());
        let comms = (0..stages).map(|s| comm::for_devices(&column(&replicas, s))).collect::<Result<Vec<_>>>()?;
        Self::with_communicators(replicas, comms)
    }

    /// As `new`, with `comms[s]` over stage s's devices in replica order.
    pub fn with_communicators(replicas: Vec<Pipeline>, comms: Vec<Box<dyn Communicator>>) -> Result<Self> {
        let Some(first) = replicas.first() else {
            return Err(Error::invalid("PipelineGrid", "no pipelines given"));
        };
        let names = |p: &Pipeline| -> Result<Vec<(String, Vec<usize>)>> { Ok(p.state_dict()?.into_iter().map(|(n, t)| (n, t.dims().to_vec())).collect()) };
        let want = names(first)?;
        for (r, p) in replicas.iter().enumerate() {
            if p.devices().len() != first.devices().len() || names(p)? != want {
                return Err(Error::invalid("PipelineGrid", format!("pipeline {r} has other stages or parameters than pipeline 0; every replica must be the same pipeline")));
            }
        }
        let cut = first.ranges();
        let mut replicas = replicas;
        for (r, p) in replicas.iter_mut().enumerate().skip(1) {
            if p.ranges() == cut {
                continue;
            }
            // A split still to be measured takes replica 0's cut at the first step anyway.
            if !p.split_pending() {
                return Err(Error::invalid("PipelineGrid", format!("pipeline {r} cuts the layers {:?}, pipeline 0 {cut:?}; every replica must be cut alike", p.ranges())));
            }
            p.fix_split(&cut)?;
        }
        if comms.len() != replicas[0].devices().len() {
            return Err(Error::invalid("PipelineGrid", format!("{} communicators for {} stages", comms.len(), replicas[0].devices().len())));
        }
        for (s, c) in comms.iter().enumerate() {
            let col = column(&replicas, s);
            if c.devices().len() != col.len() || c.devices().iter().zip(&col).any(|(a, b)| !a.same(b)) {
                return Err(Error::invalid("PipelineGrid", format!("communicator {s} spans {:?}, stage {s} is on {col:?}", c.devices())));
            }
        }
        let state = replicas[0].state_dict()?;
        for r in replicas.iter_mut().skip(1) {
            r.load_state_dict(&state)?;
        }
        let devices: Vec<Device> = replicas.iter().flat_map(|r| r.devices()).collect();
        let run = StepCore::new(replicas[0].core().loss.clone(), &devices);
        Ok(PipelineGrid { replicas, comms, weights: None, run })
    }

    /// Shares of the batch in proportion to `weights`, one per pipeline (equal without).
    pub fn split_weights(mut self, weights: Vec<f64>) -> Result<Self> {
        if weights.len() != self.replicas.len() {
            return Err(Error::invalid("PipelineGrid::split_weights", format!("{} weights for {} pipelines", weights.len(), self.replicas.len())));
        }
        self.weights = Some(weights);
        Ok(self)
    }

    /// The pipelines, in replica order.
    pub fn replicas(&self) -> &[Pipeline] {
        &self.replicas
    }

    /// Each replica's samples of a batch of `n`.
    fn shares(&self, n: usize) -> Result<Vec<Range<usize>>> {
        let r = self.replicas.len();
        let shares = split::ranges(n, r, self.weights.as_deref())?;
        if n < r || shares.iter().any(Range::is_empty) {
            let sizes: Vec<usize> = shares.iter().map(Range::len).collect();
            return Err(Error::invalid("PipelineGrid::step", format!("a batch of {n} samples split {sizes:?} leaves a pipeline of the {r} without samples")));
        }
        Ok(shares)
    }

    /// Sums each stage's gradients over the replicas: one flat tensor per replica and stage.
    fn all_reduce_grads(&self) -> Result<()> {
        no_grad(|| {
            for (s, comm) in self.comms.iter().enumerate() {
                let params: Vec<Vec<(String, Tensor)>> = self.replicas.iter().map(|r| r.trained_params().swap_remove(s)).collect();
                let flats = params
                    .iter()
                    .map(|ps| {
                        let parts = ps
                            .iter()
                            .map(|(_, p)| match p.grad() {
                                Some(g) => g.reshape([p.numel()]),
                                None => Tensor::zeros([p.numel()], p.device()),
                            })
                            .collect::<Result<Vec<_>>>()?;
                        Tensor::cat(&parts, 0)
                    })
                    .collect::<Result<Vec<_>>>()?;
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

/// Stage `s`'s device in every replica.
fn column(replicas: &[Pipeline], s: usize) -> Vec<Device> {
    replicas.iter().map(|r| r.devices()[s].clone()).collect()
}

impl Strategy for PipelineGrid {
    fn autocasts(&self) -> bool {
        true
    }
    fn computes_on_caller(&self) -> bool {
        false
    }
    fn check_batch_size(&self, n: usize) -> Result<()> {
        for (share, pipe) in self.shares(n)?.into_iter().zip(&self.replicas) {
            pipe.check_batch_size(share.len())?;
        }
        Ok(())
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        let (n, shares) = (batch.len(), self.shares(batch.len())?);
        let parts = shares.iter().map(|r| batch.slice(r.clone())).collect::<Result<Vec<_>>>()?;
        // Every replica must cut the model where replica 0 does, or stage s's gradients differ
        // in length across the replicas; timed apart (and on a loaded machine) they can disagree.
        if self.replicas[0].split_pending() {
            self.replicas[0].measure_split(&parts[0])?;
            let cut = self.replicas[0].ranges();
            self.replicas.iter_mut().skip(1).try_for_each(|r| r.fix_split(&cut))?;
        }
        for r in &mut self.replicas {
            let core = r.core_mut();
            core.trace = self.run.trace.clone();
            core.step = self.run.step;
            // The replicas' forwards autocast and scale their losses as the grid's update,
            // which unscales and moves the scale, expects.
            core.precision = self.run.precision;
            core.scaler = self.run.scaler;
        }
        let results: Vec<Result<PartRun>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self.replicas.iter_mut().zip(&parts).zip(&shares).map(|((rep, part), r)| scope.spawn(move || rep.backward_part(part, r.start, n))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(Error::panicked(p)))).collect()
        });
        let mut runs = Vec::with_capacity(results.len());
        for (i, r) in results.into_iter().enumerate() {
            runs.push(r.map_err(|e| e.in_worker("pipeline replica", i, &self.replicas[i].devices()[0]))?);
        }
        let tc = Instant::now();
        self.all_reduce_grads()?;
        let comm_s = tc.elapsed().as_secs_f64();
        // After the all-reduce every replica holds the same gradients: replica 0's norm is the
        // whole model's, each parameter counted once, and every replica takes the same scale.
        let counted = self.replicas[0].trained_params().concat();
        let parts = self.replicas.iter_mut().flat_map(|r| r.parts()).collect();
        let (grad_norm, _) = self.run.update(NormOver::Params(&counted), None, parts, None)?;
        for r in &mut self.replicas {
            r.updated(self.run.step)?;
        }
        let mut reports: Vec<StepReport> = self.replicas.iter_mut().zip(&runs).map(|(r, run)| r.report(run, grad_norm)).collect();
        let mut report = reports.swap_remove(0);
        for r in &reports {
            report.compute_s = report.compute_s.max(r.compute_s);
            report.comm_s += r.comm_s;
            report.peak_memory.extend(&r.peak_memory);
        }
        report.loss = runs.iter().map(PartRun::loss).sum();
        report.comm_s += comm_s;
        report.wall_s = t0.elapsed().as_secs_f64();
        Ok(report)
    }
    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        self.replicas[0].predict(x)
    }
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        self.replicas[0].state_dict()
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        self.replicas.iter_mut().try_for_each(|r| r.load_state_dict(state))
    }
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.replicas[0].optimizer_state()
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        self.replicas.iter_mut().try_for_each(|r| r.load_optimizer_state(state, steps))
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
