//! From a plan to a running strategy: which layouts the builders of
//! [`Parallel`](crate::parallel::Parallel) can make of a `Sequential`, and [`Plan::build`],
//! which makes the chosen one through them, so that it keeps that strategy's guarantees.
use super::{Layout, Plan};
use crate::nn::{Module, Sequential};
use crate::parallel::{DataParallelConfig, Loss, OptimConfig, Parallel, Schedule, Shard, Split, Stages, Strategy};
use crate::{Device, Error, Result};

/// Why [`Plan::build`] cannot make layout `l` of `model` with the replicas' batch `shares`, or
/// `None` when it can. Tensor parallelism shards a `Sequential`'s last two Linears over each
/// group and combines with data parallelism over the groups, not with pipelines; recomputation exists in pipeline stages only;
/// a pipeline's micro-batches divide each replica's share; sharding needs a data axis.
pub fn unbuildable(l: &Layout, shares: &[usize], model: &Sequential) -> Option<String> {
    if let Some(why) = shard_unbuildable(l) {
        return Some(why);
    }
    if l.tensor > 1 {
        if l.pipeline > 1 {
            // The split pair must sit in the last stage, a constraint on cuts the search does not
            // carry: `Sequential::tensor_stages` builds this layout by hand.
            return Some(
                "tensor parallelism of a Sequential does not combine with pipeline parallelism in a plan (build it with Sequential::tensor_stages)"
                    .into(),
            );
        }
        if l.micro_batches > 1 || l.recompute {
            return Some("tensor parallelism of a Sequential takes whole batches, without recomputation".into());
        }
        if !ends_in_two_linears(model) {
            return Some("tensor parallelism needs a Sequential ending in two Linears".into());
        }
    }
    if l.pipeline == 1 && l.recompute {
        return Some("recomputation needs pipeline stages".into());
    }
    if l.pipeline > 1 && shares.iter().any(|s| !s.is_multiple_of(l.micro_batches)) {
        return Some(format!("{} micro-batches do not divide the replicas' shares {shares:?}", l.micro_batches));
    }
    None
}

/// Why the sharding of `l` cannot be built: ZeRO shards over a data axis (`DataParallel`'s,
/// or a grid's, [`DataGrid::shard`](crate::parallel::DataGrid::shard)), which a layout of
/// one replica does not have.
pub(super) fn shard_unbuildable(l: &Layout) -> Option<String> {
    (l.shard != Shard::None && l.data == 1).then(|| "sharding (--shard) needs a data axis of at least 2 replicas".to_string())
}

/// What a grid's data axis takes of layout `l` of plan `p`: its sharding, bucket size and
/// gradient-shard type.
pub(super) fn grid_config(p: &Plan, l: &Layout) -> DataParallelConfig {
    DataParallelConfig { shard: l.shard, grad_dtype: p.grad_dtype_of(l), bucket_bytes: l.bucket_bytes() as usize, ..Default::default() }
}

/// What `TensorParallel::new` asks of a model: its last two layers with parameters are
/// Linears, the second the model's last layer.
fn ends_in_two_linears(model: &Sequential) -> bool {
    let layers = model.layers();
    let with_params: Vec<usize> = (0..layers.len()).filter(|&i| !layers[i].1.parameters().is_empty()).collect();
    match with_params[..] {
        [.., a, b] => b + 1 == layers.len() && [a, b].iter().all(|&i| layers[i].1.describe().starts_with("Linear")),
        _ => false,
    }
}

impl Plan {
    /// The strategy of [`Plan::best`] for `model` on `devices`, built with the usual builders:
    /// `Single`, `DataParallel` (batch shares as [`Plan::shares`], micro-batches accumulated,
    /// state sharded as [`Layout::shard`], gradient shards in [`Plan::grad_dtype`]),
    /// `TensorParallel` (alone or replicated in a [`DataGrid`](crate::parallel::DataGrid)), a
    /// 1F1B `Pipeline` cut at the plan's cuts, or a `PipelineGrid` of them, with `opt`'s state in host memory where the plan keeps it there ([`Plan::optim`]).
    /// `devices` must be the devices planned for (names as [`Device::spec`], any order);
    /// the layout takes them in [`Plan::devices`]' order and leaves out those it does not use.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use tandem::nn::models::SeedModel;
    /// use tandem::parallel::{plan::{measure, plan_within, unbuildable}, Loss, OptimConfig};
    /// let devices = tandem::Device::parse("cpu,cpu")?;
    /// let model = SeedModel::Cnn.build(0, &devices[0])?;
    /// let probe = tandem::parallel::inputs_to_device(&tandem::data::synthetic::seed_images(4, 0)?.batch(&[0, 1, 2, 3])?, &devices[0])?;
    /// let (work, cluster) = measure(&model, &probe, &devices, 16, 1)?;
    /// let p = plan_within(&work, &cluster, &|l, shares| unbuildable(l, shares, &model))?;
    /// let mut strategy = p.build(&model, &devices, &OptimConfig::sgd(Default::default()), Loss::CrossEntropy)?;
    /// let data = tandem::data::synthetic::seed_images(16, 0)?;
    /// strategy.step(&data.batch(&(0..16).collect::<Vec<_>>())?)?;
    /// # Ok(()) }
    /// ```
    pub fn build(&self, model: &Sequential, devices: &[Device], opt: &OptimConfig, loss: Loss) -> Result<Box<dyn Strategy>> {
        let opt = &self.optim(opt);
        let l = &self.best.layout;
        self.check_model(&model.describe())?;
        if let Some(why) = unbuildable(l, &self.shares, model) {
            return Err(Error::invalid("Plan::build", format!("{l}: {why}")));
        }
        let placed = self.placed(devices)?;
        let used = &placed[..l.devices()];
        let copy = |d: &Device| model.slice(0..model.len(), d);
        // Equal shares are the builders' default split; weights only where they differ.
        let weights = (self.shares.windows(2).any(|w| w[0] != w[1])).then(|| self.shares.iter().map(|&s| s as f64).collect::<Vec<f64>>());
        match (l.data, l.tensor, l.pipeline) {
            (1, 1, 1) if l.micro_batches == 1 => Parallel::single(copy, &used[0], opt, loss).boxed(),
            (_, 1, 1) => {
                let cfg = DataParallelConfig {
                    micro_batches: l.micro_batches,
                    weights,
                    shard: l.shard,
                    grad_dtype: self.grad_dtype_of(l),
                    bucket_bytes: l.bucket_bytes() as usize,
                    ..Default::default()
                };
                Parallel::data(copy, used, opt, loss).config(cfg).boxed()
            }
            (1, _, 1) => Parallel::tensor(model, used, opt, loss).boxed(),
            (_, tensor, 1) => {
                let mesh = Parallel::data_tensor(|_| Ok(model), used, tensor, opt, loss).data_config(grid_config(self, l));
                match weights {
                    Some(w) => mesh.split_weights(w).boxed(),
                    None => mesh.boxed(),
                }
            }
            (1, 1, _) => Parallel::pipeline(Stages::Split(model, Split::At(l.cuts.clone())), used, opt, loss)
                .micro_batches(l.micro_batches)
                .recompute(l.recompute)
                .schedule(Schedule::OneFOneB)
                .boxed(),
            (data, 1, _) => {
                let grid = Parallel::grid(|_| Ok(Stages::Split(model, Split::At(l.cuts.clone()))), &l.replica_major(used), data, opt, loss)
                    .micro_batches(l.micro_batches)
                    .recompute(l.recompute)
                    .schedule(Schedule::OneFOneB)
                    .data_config(grid_config(self, l));
                match weights {
                    Some(w) => grid.split_weights(w).boxed(),
                    None => grid.boxed(),
                }
            }
            _ => Err(Error::invalid("Plan::build", format!("{l}: no strategy combines these degrees"))),
        }
    }

    /// Errors unless the plan was made for the model `described` ([`Plan::model`], as
    /// `Module::describe` writes it), or records no model.
    pub fn check_model(&self, described: &str) -> Result<()> {
        if self.model.is_empty() || self.model == described {
            return Ok(());
        }
        Err(Error::invalid("Plan::build", format!("the plan is for {}, not {described}", self.model)))
    }

    /// Errors unless `devices` are the devices planned for (names as [`Device::spec`], in any
    /// order).
    pub fn check_devices(&self, devices: &[Device]) -> Result<()> {
        self.placed(devices).map(|_| ())
    }

    /// `devices` in the plan's order: each of [`Plan::devices`] matched to the first unused
    /// device of that name. Errors unless they are the same devices.
    pub(super) fn placed(&self, devices: &[Device]) -> Result<Vec<Device>> {
        let mut left: Vec<Option<&Device>> = devices.iter().map(Some).collect();
        let mut out = Vec::with_capacity(self.devices.len());
        for name in &self.devices {
            match left.iter_mut().find(|d| d.is_some_and(|d| d.spec() == *name)) {
                Some(slot) => out.push(slot.take().expect("matched a present device").clone()),
                None => return Err(self.not_these(devices)),
            }
        }
        if left.iter().any(Option::is_some) {
            return Err(self.not_these(devices));
        }
        Ok(out)
    }

    fn not_these(&self, devices: &[Device]) -> Error {
        let given: Vec<String> = devices.iter().map(Device::spec).collect();
        Error::invalid("Plan::build", format!("the plan is for devices {}, not {}", self.devices.join(","), given.join(",")))
    }
}
