//! [`Parallel`]: one way to build every strategy, from the model (a factory where each device
//! needs its own copy, stages or a model to shard otherwise), the devices, the optimizer and
//! the loss, with each strategy's options as chained settings.
use super::comm::Communicator;
use super::{DataGrid, Replica, TensorParallel, TensorParallelGpt};
use super::{
    DataParallel, DataParallelConfig, LayerPlacement, Loss, OptimConfig, Pipeline, PipelineBuilder, PipelineGrid, Schedule, Single, Stages, Strategy,
};
use crate::nn::models::Gpt;
use crate::nn::{Module, Sequential};
use crate::optim::{GradScaler, Precision};
use crate::{Device, Error, Result};

/// Builds every strategy the same way: `Parallel::<kind>(model, devices, optimizer, loss)`,
/// then the kind's options, then `build()` (the concrete strategy, with its own inspection
/// methods) or `boxed()` (a `Box<dyn Strategy>`, for a strategy chosen at run time). Either
/// goes to [`Trainer::new`](crate::train::Trainer::new) / [`Trainer::boxed`](crate::train::Trainer::boxed).
///
/// The model comes in the form the strategy needs: a factory `|device| -> Result<M>` where
/// every device holds a whole copy (`single`, `data`: each replica is built on its device and
/// replica 0's weights are broadcast), [`Stages`] where devices hold consecutive layers
/// (`layers`, `pipeline`, `grid`: a `Sequential` cut at a [`Split`](super::Split), or stages
/// the model built itself such as [`Gpt::stages`], whose tied head the pipeline ties without
/// being told), and the model itself where its layers are sharded (`tensor`). Every batch-size
/// constraint of the result is checked against the data before the first step by
/// [`Strategy::check_batches`] (the Trainer does it).
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use tandem::nn::models::SeedModel;
/// use tandem::parallel::{Loss, OptimConfig, Parallel, Split, Stages, Strategy};
/// let devices = tandem::Device::parse("cpu,cpu")?;
/// let opt = OptimConfig::sgd(Default::default());
/// let cnn = |d: &tandem::Device| SeedModel::Cnn.build(0, d);
/// let model = cnn(&devices[0])?;
/// let mut strategies: Vec<Box<dyn Strategy>> = vec![
///     Parallel::single(cnn, &devices[0], &opt, Loss::CrossEntropy).boxed()?,
///     Parallel::data(cnn, &devices, &opt, Loss::CrossEntropy).micro_batches(2).boxed()?,
///     Parallel::layers(Stages::Split(&model, Split::At(vec![4])), &devices, &opt, Loss::CrossEntropy).boxed()?,
///     Parallel::pipeline(Stages::Split(&model, Split::At(vec![4])), &devices, &opt, Loss::CrossEntropy).micro_batches(2).boxed()?,
///     Parallel::tensor(&model, &devices, &opt, Loss::CrossEntropy).boxed()?,
/// ];
/// let data = tandem::data::synthetic::seed_images(8, 0)?;
/// let batch = data.batch(&(0..8).collect::<Vec<_>>())?;
/// let losses: Vec<f32> = strategies.iter_mut().map(|s| s.step(&batch).map(|r| r.loss)).collect::<tandem::Result<_>>()?;
/// assert!(losses.iter().all(|l| (l - losses[0]).abs() < 1e-4 * losses[0].abs()), "{losses:?}");
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Parallel;

impl Parallel {
    /// Everything on `device`: `build(device)` makes the model there.
    pub fn single<M: Module, F: FnOnce(&Device) -> Result<M>>(build: F, device: &Device, opt: &OptimConfig, loss: Loss) -> SingleBuilder<F> {
        SingleBuilder { build, device: device.clone(), common: Common::new(opt, loss) }
    }

    /// Data parallelism ([`DataParallel`]): `build(device)` makes one replica on each of
    /// `devices`; options as [`DataParallelConfig`].
    pub fn data<M: Module, F: Fn(&Device) -> Result<M>>(build: F, devices: &[Device], opt: &OptimConfig, loss: Loss) -> DataBuilder<F> {
        DataBuilder { build, devices: devices.to_vec(), cfg: DataParallelConfig::default(), comm: None, common: Common::new(opt, loss) }
    }

    /// Layer placement ([`LayerPlacement`]): stage `s` on `devices[s]`, one forward through
    /// all of them.
    pub fn layers<'a>(stages: Stages<'a>, devices: &[Device], opt: &OptimConfig, loss: Loss) -> LayersBuilder<'a> {
        LayersBuilder { stages, devices: devices.to_vec(), common: Common::new(opt, loss) }
    }

    /// Pipeline parallelism ([`Pipeline`]): stage `s` on `devices[s]`, micro-batches in a
    /// schedule; the same builder as [`Pipeline::builder`].
    pub fn pipeline<'a>(stages: Stages<'a>, devices: &[Device], opt: &OptimConfig, loss: Loss) -> PipelineBuilder<'a> {
        Pipeline::builder(stages, devices, opt, loss)
    }

    /// Tensor parallelism: `model`'s layers sharded over `devices`, a `&Sequential` ending in
    /// two Linears ([`TensorParallel`]) or a [`Gpt`] ([`TensorParallelGpt`]).
    pub fn tensor<M: TensorModel>(model: M, devices: &[Device], opt: &OptimConfig, loss: Loss) -> TensorBuilder<M> {
        TensorBuilder { model, devices: devices.to_vec(), common: Common::new(opt, loss) }
    }

    /// Data parallelism over tensor-parallel groups ([`DataGrid`] of [`TensorParallel`] or
    /// [`TensorParallelGpt`], Megatron-LM's layout: tensor inside a group of fast-linked
    /// devices, data across the groups): `devices.len() / tensor` replicas, replica `r`'s
    /// shards on `devices[r·tensor .. (r+1)·tensor]`; `model(first)` gives the model to shard
    /// for the replica whose first device is `first` (a `&Sequential` ending in two Linears,
    /// or a [`Gpt`] built there). Replica 0's weights are copied to the others.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use tandem::nn::models::{Gpt, GptConfig};
    /// use tandem::parallel::{Loss, OptimConfig, Parallel, Strategy};
    /// let devices = tandem::Device::parse("cpu,cpu,cpu,cpu")?;
    /// let cfg = GptConfig { vocab_size: 16, block_size: 8, n_layer: 1, n_head: 2, n_embd: 8, dropout: 0.0, bias: true };
    /// let mut mesh = Parallel::data_tensor(|d: &tandem::Device| Gpt::new(cfg, 0, d), &devices, 2, &OptimConfig::sgd(Default::default()), Loss::CrossEntropy).build()?;
    /// assert_eq!(mesh.replicas().len(), 2);
    /// let ids: Vec<i32> = (0..4 * 8).map(|i| i % 16).collect();
    /// let batch = tandem::data::Batch::tokens(ids.clone(), ids, 8, 16)?;
    /// assert!(mesh.step(&batch)?.loss.is_finite());
    /// # Ok(()) }
    /// ```
    pub fn data_tensor<M: TensorModel, F: FnMut(&Device) -> Result<M>>(
        model: F,
        devices: &[Device],
        tensor: usize,
        opt: &OptimConfig,
        loss: Loss,
    ) -> DataTensorBuilder<F> {
        DataTensorBuilder {
            model,
            devices: devices.to_vec(),
            tensor,
            weights: None,
            data: DataParallelConfig::default(),
            common: Common::new(opt, loss),
        }
    }

    /// Data parallelism over pipelines ([`PipelineGrid`]): `pipelines` replicas of one
    /// pipeline, replica `r`'s stage `s` on `devices[r·P + s]`; `stages(row)` gives the stages
    /// of the replica on the devices `row`. Options of the pipelines and the grid's split.
    pub fn grid<'a, F: FnMut(&[Device]) -> Result<Stages<'a>>>(
        stages: F,
        devices: &[Device],
        pipelines: usize,
        opt: &OptimConfig,
        loss: Loss,
    ) -> GridBuilder<F> {
        GridBuilder {
            stages,
            devices: devices.to_vec(),
            pipelines,
            micro_batches: 1,
            schedule: Schedule::OneFOneB,
            recompute: false,
            weights: None,
            data: DataParallelConfig::default(),
            common: Common::new(opt, loss),
        }
    }
}

/// What every builder takes alike.
struct Common {
    opt: OptimConfig,
    loss: Loss,
    clip: Option<f32>,
    /// The precision and F16's loss scaler (`None`: PyTorch's defaults).
    precision: (Precision, Option<GradScaler>),
}

impl Common {
    fn new(opt: &OptimConfig, loss: Loss) -> Self {
        Common { opt: opt.clone(), loss, clip: None, precision: (Precision::F32, None) }
    }
    /// `s` with the clipping bound and the precision set.
    fn finish<S: Strategy>(&self, mut s: S) -> Result<S> {
        s.set_grad_clip(self.clip)?;
        s.set_precision(self.precision.0, self.precision.1)?;
        Ok(s)
    }
}

/// The settings every builder has, and `boxed`; `$precision` is the path of the builder's
/// `(Precision, Option<GradScaler>)`.
macro_rules! common_settings {
    () => {
        common_settings!(common.precision);
        /// Global-norm gradient clipping (as [`Strategy::set_grad_clip`]); off by default.
        pub fn grad_clip(mut self, max_norm: Option<f32>) -> Self {
            self.common.clip = max_norm;
            self
        }
    };
    ($($precision:ident).+) => {
        /// Trains in `precision` (as [`Strategy::set_precision`]: forwards under autocast in
        /// the half types, F16 with PyTorch's default loss scaler); F32 by default. The
        /// [`Trainer`](crate::train::Trainer) records it in every checkpoint, and a resume
        /// must repeat it.
        pub fn precision(mut self, precision: Precision) -> Self {
            self.$($precision).+ = (precision, None);
            self
        }
        /// Trains in F16 with this loss scaler instead of PyTorch's defaults (the last of
        /// `precision` and `grad_scaler` called decides).
        pub fn grad_scaler(mut self, scaler: GradScaler) -> Self {
            self.$($precision).+ = (Precision::F16, Some(scaler));
            self
        }
        /// [`build`](Self::build) as a `Box<dyn Strategy>`.
        pub fn boxed(self) -> Result<Box<dyn Strategy>> {
            Ok(Box::new(self.build()?))
        }
    };
}

/// [`Parallel::single`]'s options.
pub struct SingleBuilder<F> {
    build: F,
    device: Device,
    common: Common,
}

impl<M: Module, F: FnOnce(&Device) -> Result<M>> SingleBuilder<F> {
    common_settings!();
    pub fn build(self) -> Result<Single> {
        let model = (self.build)(&self.device)?;
        self.common.finish(Single::new(model, &self.common.opt, self.common.loss.clone(), &self.device)?)
    }
}

/// [`Parallel::data`]'s options; defaults as [`DataParallelConfig::default`] (PyTorch DDP's).
pub struct DataBuilder<F> {
    build: F,
    devices: Vec<Device>,
    cfg: DataParallelConfig,
    comm: Option<Box<dyn Communicator>>,
    common: Common,
}

impl<M: Module, F: Fn(&Device) -> Result<M>> DataBuilder<F> {
    common_settings!();
    /// Micro-batches each device accumulates before the all-reduce.
    pub fn micro_batches(mut self, m: usize) -> Self {
        self.cfg.micro_batches = m;
        self
    }
    /// Bit-identical results across device counts: the batch cut into `shards` fixed
    /// micro-shards (use at least the device count); no overlap.
    pub fn deterministic(mut self, shards: usize) -> Self {
        self.cfg.deterministic = true;
        self.cfg.deterministic_shards = shards;
        self
    }
    /// Gradient bytes per all-reduce bucket.
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.cfg.bucket_bytes = bytes;
        self
    }
    /// The batch split in these proportions, one per device.
    pub fn split_weights(mut self, weights: Vec<f64>) -> Self {
        self.cfg.weights = Some(weights);
        self
    }
    /// The split measured from each device's speed on the first step.
    pub fn calibrate(mut self) -> Self {
        self.cfg.calibrate = true;
        self
    }
    /// ZeRO-1: each device keeps optimizer state only for the parameters it owns
    /// (`.shard(Shard::Optimizer)`).
    pub fn shard_optimizer(self) -> Self {
        self.shard(super::Shard::Optimizer)
    }
    /// How much training state each device keeps: ZeRO-1, 2 or 3 (see [`super::Shard`]).
    pub fn shard(mut self, shard: super::Shard) -> Self {
        self.cfg.shard = shard;
        self
    }
    /// Every option at once.
    pub fn config(mut self, cfg: DataParallelConfig) -> Self {
        self.cfg = cfg;
        self
    }
    /// A chosen communicator (for example `Hierarchical` across processes) instead of the
    /// best one for the devices; the replicas go on its devices, and the devices given to
    /// [`Parallel::data`] must be those.
    pub fn communicator(mut self, comm: Box<dyn Communicator>) -> Self {
        self.comm = Some(comm);
        self
    }
    pub fn build(self) -> Result<DataParallel> {
        let DataBuilder { build, devices, cfg, comm, common } = self;
        let dp = match comm {
            None => DataParallel::from_factory(build, &devices, &common.opt, common.loss.clone(), cfg)?,
            Some(comm) => {
                if comm.devices().len() != devices.len() || comm.devices().iter().zip(&devices).any(|(a, b)| !a.same(b)) {
                    return Err(Error::invalid(
                        "Parallel::data",
                        format!("the communicator spans {:?}, the devices given are {devices:?}", comm.devices()),
                    ));
                }
                DataParallel::from_factory_with(build, comm, &common.opt, common.loss.clone(), cfg)?
            }
        };
        common.finish(dp)
    }
}

/// [`Parallel::layers`]' options.
pub struct LayersBuilder<'a> {
    stages: Stages<'a>,
    devices: Vec<Device>,
    common: Common,
}

impl LayersBuilder<'_> {
    common_settings!();
    pub fn build(self) -> Result<LayerPlacement> {
        let lp = LayerPlacement::with_stages(self.stages, &self.devices, &self.common.opt, self.common.loss.clone())?;
        self.common.finish(lp)
    }
}

impl PipelineBuilder<'_> {
    common_settings!(precision);
}

/// A model that [`Parallel::tensor`] shards: a `&Sequential` ending in two Linears, or a
/// [`Gpt`].
pub trait TensorModel {
    /// The strategy it becomes.
    type Strategy: Strategy + 'static;
    /// `self` sharded over `devices`.
    fn shard(self, devices: &[Device], opt: &OptimConfig, loss: Loss) -> Result<Self::Strategy>;
}

impl TensorModel for &Sequential {
    type Strategy = TensorParallel;
    fn shard(self, devices: &[Device], opt: &OptimConfig, loss: Loss) -> Result<TensorParallel> {
        TensorParallel::new(self, devices, opt, loss)
    }
}

impl TensorModel for Gpt {
    type Strategy = TensorParallelGpt;
    fn shard(self, devices: &[Device], opt: &OptimConfig, loss: Loss) -> Result<TensorParallelGpt> {
        TensorParallelGpt::new(self, devices, opt, loss)
    }
}

/// [`Parallel::data_tensor`]'s options: the common ones and the split of the batch over the
/// replicas.
pub struct DataTensorBuilder<F> {
    model: F,
    devices: Vec<Device>,
    tensor: usize,
    weights: Option<Vec<f64>>,
    data: DataParallelConfig,
    common: Common,
}

impl<M: TensorModel, F: FnMut(&Device) -> Result<M>> DataTensorBuilder<F>
where
    M::Strategy: Replica,
{
    common_settings!();
    /// Shares of the batch in proportion to `weights`, one per replica (equal without).
    pub fn split_weights(mut self, weights: Vec<f64>) -> Self {
        self.weights = Some(weights);
        self
    }
    /// Shards the data axis's training state (ZeRO-1/2/3, as [`DataGrid::shard`]); none by
    /// default.
    pub fn shard(mut self, shard: super::Shard) -> Self {
        self.data.shard = shard;
        self
    }
    /// The data axis's sharding, bucket size and gradient-shard type at once (as
    /// [`DataGrid::shard`], which refuses the options of one-device replicas).
    pub fn data_config(mut self, cfg: DataParallelConfig) -> Self {
        self.data = cfg;
        self
    }
    pub fn build(self) -> Result<DataGrid<M::Strategy>> {
        let DataTensorBuilder { mut model, devices, tensor, weights, data, common } = self;
        if tensor == 0 || devices.is_empty() || !devices.len().is_multiple_of(tensor) {
            return Err(Error::invalid(
                "Parallel::data_tensor",
                format!("{} devices do not make groups of {tensor} tensor-parallel shards", devices.len()),
            ));
        }
        let grid = DataGrid::from_factory(&devices, devices.len() / tensor, |row| model(&row[0])?.shard(row, &common.opt, common.loss.clone()))?;
        let grid = match weights {
            Some(w) => grid.split_weights(w)?,
            None => grid,
        };
        common.finish(grid.shard(&data, &common.opt)?)
    }
}

/// [`Parallel::tensor`]'s options.
pub struct TensorBuilder<M> {
    model: M,
    devices: Vec<Device>,
    common: Common,
}

impl<M: TensorModel> TensorBuilder<M> {
    common_settings!();
    pub fn build(self) -> Result<M::Strategy> {
        let s = self.model.shard(&self.devices, &self.common.opt, self.common.loss.clone())?;
        self.common.finish(s)
    }
}

/// [`Parallel::grid`]'s options: the pipelines' (as [`PipelineBuilder`]'s) and the split of
/// the batch over them.
pub struct GridBuilder<F> {
    stages: F,
    devices: Vec<Device>,
    pipelines: usize,
    micro_batches: usize,
    schedule: Schedule,
    recompute: bool,
    weights: Option<Vec<f64>>,
    data: DataParallelConfig,
    common: Common,
}

impl<'a, F: FnMut(&[Device]) -> Result<Stages<'a>>> GridBuilder<F> {
    common_settings!();
    /// Micro-batches per pipeline's share of the batch (they must divide it evenly).
    pub fn micro_batches(mut self, m: usize) -> Self {
        self.micro_batches = m;
        self
    }
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }
    /// Activation recomputation in every stage.
    pub fn recompute(mut self, recompute: bool) -> Self {
        self.recompute = recompute;
        self
    }
    /// Shares of the batch in proportion to `weights`, one per pipeline (equal without).
    pub fn split_weights(mut self, weights: Vec<f64>) -> Self {
        self.weights = Some(weights);
        self
    }
    /// Shards the data axis's training state (ZeRO-1/2/3, as [`DataGrid::shard`]); none by
    /// default.
    pub fn shard(mut self, shard: super::Shard) -> Self {
        self.data.shard = shard;
        self
    }
    /// The data axis's sharding, bucket size and gradient-shard type at once (as
    /// [`DataGrid::shard`], which refuses the options of one-device replicas).
    pub fn data_config(mut self, cfg: DataParallelConfig) -> Self {
        self.data = cfg;
        self
    }
    pub fn build(self) -> Result<PipelineGrid> {
        let GridBuilder { mut stages, devices, pipelines, micro_batches, schedule, recompute, weights, data, common } = self;
        let grid = PipelineGrid::from_factory(&devices, pipelines, |row| {
            Pipeline::builder(stages(row)?, row, &common.opt, common.loss.clone())
                .micro_batches(micro_batches)
                .schedule(schedule)
                .recompute(recompute)
                .build()
        })?;
        let grid = match weights {
            Some(w) => grid.split_weights(w)?,
            None => grid,
        };
        common.finish(grid.shard(&data, &common.opt)?)
    }
}
