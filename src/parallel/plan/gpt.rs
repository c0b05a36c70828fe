//! The planner for the GPT ([`Gpt`]): its embeddings, blocks and head calibrated one by one
//! ([`measure_gpt`]), the layouts tandem's GPT strategies can make ([`gpt_unbuildable`], with
//! stage cuts only between blocks, [`gpt_cuttable`]) and [`Plan::build_gpt`], which makes the
//! chosen one: `Single`, `DataParallel` (sharded or not), `TensorParallelGpt` (alone or in a
//! `DataGrid` of replicas), a 1F1B `Pipeline` of [`Gpt::stages`] or of
//! [`Gpt::tensor_stages`] (tensor × pipeline), or a `PipelineGrid` of either.
//!
//! The planner's layers of a GPT of `n` blocks are `transformer` (the embeddings, layer 0),
//! `transformer.h.{i}` (layer `i + 1`), `transformer.ln_f` and `lm_head` (layers `n + 1` and
//! `n + 2`); a cut at layer `c` starts a stage at block `c - 1`. The head holds its own copy of
//! the embedding's weight (as a pipeline's last stage does), so the planner counts that
//! matrix twice also where one device holds both (an overestimate of `vocab x n_embd` floats).
//! Tensor parallelism splits the blocks; the embeddings and the head, which
//! `TensorParallelGpt` keeps on its first device, are costed as if every rank held them.
use super::build::{grid_config, shard_unbuildable};
use super::measure::measure_built;
use super::reuse::{Calibration, Reuse};
use super::{Cluster, Layout, Plan, Workload};
use crate::nn::models::{Gpt, GptConfig};
use crate::nn::Module;
use crate::parallel::{
    DataGrid, DataParallel, DataParallelConfig, Loss, OptimConfig, Pipeline, PipelineGrid, Schedule, Single, Stages, Strategy, TensorParallelGpt,
};
use crate::{Device, Error, Result, Tensor};

/// [`measure`](super::measure) of `gpt` on `devices`: each of its layers (embeddings, every
/// block, `ln_f`, the head) timed on the first device at `probe`'s token ids (`[B, T]`) and
/// twice as many, the whole model on each device for its speed, all devices at once for
/// their contention. The blocks are marked as split by tensor parallelism. `batch` and
/// `optimizer_states` as for `measure` (AdamW: 2); budgets as there.
pub fn measure_gpt(gpt: &Gpt, probe: &Tensor, devices: &[Device], batch: usize, optimizer_states: usize) -> Result<(Workload, Cluster)> {
    measure_gpt_reusing(gpt, probe, devices, batch, optimizer_states, Reuse::Off).map(|(w, c, _)| (w, c))
}

/// [`measure_gpt`], or the same calibration kept on disk where `reuse` allows (as
/// [`measure_reusing`](super::measure_reusing)), and where it came from.
pub fn measure_gpt_reusing(
    gpt: &Gpt,
    probe: &Tensor,
    devices: &[Device],
    batch: usize,
    optimizer_states: usize,
    reuse: Reuse,
) -> Result<(Workload, Cluster, Calibration)> {
    let make = |d: &Device| -> Result<crate::nn::Sequential> {
        let mut stages = gpt.stages(std::slice::from_ref(d), None)?;
        Ok(stages.remove(0))
    };
    let blocks = |_: usize, name: &str, _: &dyn Module| name.starts_with("transformer.h.");
    let key = super::reuse::key(&format!("{:?}", gpt.config), probe, devices, batch, optimizer_states);
    measure_built(&make, probe, devices, batch, optimizer_states, &blocks, (&key, reuse))
}

/// Whether a pipeline stage of a GPT of `n_layer` blocks may start at planner layer `c`: at a
/// block other than the first (`c` in `2..=n_layer`), since the embeddings open the first
/// stage and `ln_f` with the head close the last. For
/// [`plan_cut_within`](super::plan_cut_within).
pub fn gpt_cuttable(n_layer: usize) -> impl Fn(usize) -> bool {
    move |c| (2..=n_layer).contains(&c)
}

/// Why [`Plan::build_gpt`] cannot make layout `l` of a GPT of `cfg` with the replicas' batch
/// `shares`, or `None` when it can: tensor parallelism splits whole heads evenly; alone
/// (`TensorParallelGpt`, in a `DataGrid` or not) it takes whole batches without
/// recomputation, inside a pipeline ([`Gpt::tensor_stages`]) the pipeline's micro-batches; a pipeline needs a block per stage and micro-batches dividing each replica's share;
/// recomputation is per stage in a pipeline and per block ([`Gpt::set_recompute`]) without
/// one; sharding needs a data axis.
pub fn gpt_unbuildable(l: &Layout, shares: &[usize], cfg: &GptConfig) -> Option<String> {
    if let Some(why) = shard_unbuildable(l) {
        return Some(why);
    }
    if l.tensor > 1 {
        if l.pipeline == 1 && (l.micro_batches > 1 || l.recompute) {
            return Some("the GPT's tensor parallelism takes whole batches, without recomputation".into());
        }
        if !cfg.n_head.is_multiple_of(l.tensor) {
            return Some(format!("n_head {} does not split into {} equal groups of heads", cfg.n_head, l.tensor));
        }
    }
    if l.pipeline > cfg.n_layer {
        return Some(format!("{} stages for {} blocks: every stage needs a block", l.pipeline, cfg.n_layer));
    }
    if l.pipeline > 1 && shares.iter().any(|s| !s.is_multiple_of(l.micro_batches)) {
        return Some(format!("{} micro-batches do not divide the replicas' shares {shares:?}", l.micro_batches));
    }
    None
}

impl Plan {
    /// The strategy of [`Plan::best`] for the GPT `gpt` builds on a device (called once per
    /// device that holds the whole model, and once on the host for a pipeline's stages), on
    /// `devices` (those planned for, any order), with the cross-entropy loss: `Single`,
    /// `DataParallel` (shares as [`Plan::shares`], micro-batches accumulated, sharded as
    /// [`Layout::shard`], gradient shards in [`Plan::grad_dtype`]), `TensorParallelGpt`, a 1F1B `Pipeline` of [`Gpt::stages`] (of [`Gpt::tensor_stages`] where the layout has tensor parallelism too) cut at
    /// the plan's cuts (its embedding and head tied), or a `PipelineGrid` of them; `opt`'s
    /// state in host memory where the plan keeps it there ([`Plan::optim`]). Errors,
    /// naming the reason, for a plan made for another model or a layout it cannot make.
    pub fn build_gpt(&self, gpt: &dyn Fn(&Device) -> Result<Gpt>, devices: &[Device], opt: &OptimConfig) -> Result<Box<dyn Strategy>> {
        let opt = &self.optim(opt);
        let l = &self.best.layout;
        // Without stages the layout's recomputation is the GPT's own, per block.
        let per_block = |d: &Device| {
            let g = gpt(d)?;
            if l.recompute && l.pipeline == 1 {
                g.set_recompute(true);
            }
            Ok(g)
        };
        let gpt: &dyn Fn(&Device) -> Result<Gpt> = &per_block;
        let host = gpt(&Device::cpu())?;
        self.check_model(&host.describe())?;
        if let Some(why) = gpt_unbuildable(l, &self.shares, &host.config) {
            return Err(Error::invalid("Plan::build_gpt", format!("{l}: {why}")));
        }
        let placed = self.placed(devices)?;
        let used = &placed[..l.devices()];
        let weights = (self.shares.windows(2).any(|w| w[0] != w[1])).then(|| self.shares.iter().map(|&s| s as f64).collect::<Vec<f64>>());
        let loss = Loss::CrossEntropy;
        match (l.data, l.tensor, l.pipeline) {
            (1, 1, 1) if l.micro_batches == 1 => {
                drop(host);
                Ok(Box::new(Single::new(gpt(&used[0])?, opt, loss, &used[0])?))
            }
            (_, 1, 1) => {
                drop(host);
                let cfg = DataParallelConfig {
                    micro_batches: l.micro_batches,
                    weights,
                    shard: l.shard,
                    grad_dtype: self.grad_dtype_of(l),
                    bucket_bytes: l.bucket_bytes() as usize,
                    ..Default::default()
                };
                Ok(Box::new(DataParallel::from_factory(gpt, used, opt, loss, cfg)?))
            }
            (1, _, 1) => {
                drop(host);
                Ok(Box::new(TensorParallelGpt::new(gpt(&used[0])?, used, opt, loss)?))
            }
            (_, tensor, 1) => {
                drop(host);
                let mesh = DataGrid::from_factory(used, used.len() / tensor, |row| TensorParallelGpt::new(gpt(&row[0])?, row, opt, loss.clone()))?
                    .shard(&grid_config(self, l), opt)?;
                Ok(Box::new(match weights {
                    Some(w) => mesh.split_weights(w)?,
                    None => mesh,
                }))
            }
            (1, _, _) => Ok(Box::new(gpt_pipeline(&host, used, opt, l)?)),
            (data, _, _) => {
                let grid = PipelineGrid::from_factory(&l.replica_major(used), data, |row| gpt_pipeline(&host, row, opt, l))?
                    .shard(&grid_config(self, l), opt)?;
                Ok(Box::new(match weights {
                    Some(w) => grid.split_weights(w)?,
                    None => grid,
                }))
            }
        }
    }
}

/// The GPT `host` as a 1F1B pipeline over `devices`, cut at `l`'s cuts: one stage per device,
/// or per group of `l.tensor` consecutive devices with the blocks split over the group.
fn gpt_pipeline(host: &Gpt, devices: &[Device], opt: &OptimConfig, l: &Layout) -> Result<Pipeline> {
    let starts: Vec<usize> = l.cuts.iter().map(|c| c.saturating_sub(1)).collect();
    let stages = match l.tensor {
        1 => Stages::Built(host.stages(devices, Some(&starts))?),
        t => Stages::Sharded(host.tensor_stages(devices, t, Some(&starts))?),
    };
    Pipeline::builder(stages, devices, opt, Loss::CrossEntropy)
        .micro_batches(l.micro_batches)
        .schedule(Schedule::OneFOneB)
        .recompute(l.recompute)
        .tie((0, Gpt::WTE), (devices.len() / l.tensor - 1, Gpt::LM_HEAD))
        .build()
}
