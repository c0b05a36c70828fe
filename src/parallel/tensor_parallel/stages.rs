//! Pipeline stages that are tensor-parallel groups (tensor × pipeline, Megatron-LM's layout
//! across servers): a [`Gpt`]'s stages, each with its blocks split over a group of devices,
//! and a `Sequential`'s, its last two Linears split over the last group.
use super::gpt::ParallelBlock;
use super::placed::{Logical, Placed};
use super::SplitPair;
use crate::nn::models::Gpt;
use crate::nn::Sequential;
use crate::parallel::{plan_stages, Split};
use crate::{Device, Error, Result};

/// One pipeline stage over a tensor-parallel group of devices: its layers (those that are
/// split run their shards on the group's devices) and how its tensors lie on them. Made by
/// [`Gpt::tensor_stages`], given to a pipeline as [`Stages::Sharded`](crate::parallel::Stages::Sharded).
pub struct ShardedStage {
    pub(crate) model: Sequential,
    pub(crate) placed: Placed,
    pub(crate) devices: Vec<Device>,
}

impl ShardedStage {
    /// The group's devices; the stage's input and output are on the first.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
    /// The stage's layers (their parameters are the shards).
    pub fn model(&self) -> &Sequential {
        &self.model
    }
}

impl Gpt {
    /// The model as pipeline stages of tensor-parallel groups (tensor × pipeline): `devices`
    /// in consecutive groups of `tensor`, stage `s` on group `s` (so `devices.len() / tensor`
    /// stages, their blocks cut at `starts` as [`Gpt::stages`] takes them). Each stage is
    /// [`Gpt::stages`]' stage on the group's first device with every block's attention heads
    /// and MLP hidden features split over the group as [`TensorParallelGpt`](crate::parallel::TensorParallelGpt)
    /// splits them; checkpoints keep nanoGPT's names and whole shapes.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use tandem::nn::models::{Gpt, GptConfig};
    /// use tandem::parallel::{Loss, OptimConfig, Parallel, Stages, Strategy};
    /// let devices = tandem::Device::parse("cpu,cpu,cpu,cpu")?;
    /// let cfg = GptConfig { vocab_size: 16, block_size: 8, n_layer: 2, n_head: 2, n_embd: 8, dropout: 0.0, bias: true };
    /// let gpt = Gpt::new(cfg, 0, &devices[0])?;
    /// let stages = Stages::Sharded(gpt.tensor_stages(&devices, 2, None)?);
    /// let mut pipe = Parallel::pipeline(stages, &devices, &OptimConfig::sgd(Default::default()), Loss::CrossEntropy).micro_batches(2).build()?;
    /// let ids: Vec<i32> = (0..4 * 8).map(|i| i % 16).collect();
    /// let batch = tandem::data::Batch::tokens(ids.clone(), ids, 8, 16)?;
    /// assert!(pipe.step(&batch)?.loss.is_finite());
    /// assert_eq!(pipe.state_dict()?.len(), tandem::nn::Module::state_dict(&gpt).len());
    /// # Ok(()) }
    /// ```
    pub fn tensor_stages(&self, devices: &[Device], tensor: usize, starts: Option<&[usize]>) -> Result<Vec<ShardedStage>> {
        let stages = groups("Gpt::tensor_stages", devices, tensor)?.len();
        self.tensor_stages_of(0..stages, stages, devices, tensor, starts)
    }

    /// Stages `mine` of [`Gpt::tensor_stages`]' `total` (stage `mine.start + i` on the `i`-th
    /// group of `tensor` of `devices`): one process's part of a pipeline across processes, each
    /// stage a tensor-parallel group inside the process, as [`Gpt::stages_of`] gives whole
    /// stages.
    pub fn tensor_stages_of(
        &self,
        mine: std::ops::Range<usize>,
        total: usize,
        devices: &[Device],
        tensor: usize,
        starts: Option<&[usize]>,
    ) -> Result<Vec<ShardedStage>> {
        let groups = groups("Gpt::tensor_stages", devices, tensor)?;
        if !self.config.n_head.is_multiple_of(tensor) {
            return Err(Error::invalid(
                "Gpt::tensor_stages",
                format!("n_head {} does not split evenly over {tensor} devices of a group", self.config.n_head),
            ));
        }
        let firsts: Vec<Device> = groups.iter().map(|g| g[0].clone()).collect();
        // Each split block's tensors by its name, for the stage's placement below.
        let mut split = std::collections::HashMap::new();
        let first_stage = mine.start;
        let whole = self.stages_with(mine, total, &firsts, starts, &mut |s, i, first| {
            let b = ParallelBlock::split(self.block_copy(i, first)?, groups[s - first_stage])?;
            let name = format!("transformer.h.{i}");
            split.insert(name.clone(), b.logical(&name));
            Ok(Box::new(b))
        })?;
        groups
            .into_iter()
            .zip(whole)
            .map(|(group, model)| {
                let mut logical = Vec::new();
                for (name, layer) in model.layers() {
                    match split.remove(name) {
                        Some(block) => logical.extend(block),
                        None => logical.extend(Logical::all_of(&**layer).into_iter().map(|l| Logical { name: format!("{name}.{}", l.name), ..l })),
                    }
                }
                Ok(ShardedStage { model, placed: Placed { logical, first: group[0].clone() }, devices: group.to_vec() })
            })
            .collect()
    }
}

/// Consecutive groups of `tensor` of `devices`, checked for `op`.
fn groups<'a>(op: &'static str, devices: &'a [Device], tensor: usize) -> Result<Vec<&'a [Device]>> {
    if tensor == 0 || devices.is_empty() || !devices.len().is_multiple_of(tensor) {
        return Err(Error::invalid(op, format!("{} devices do not make groups of {tensor} tensor-parallel shards", devices.len())));
    }
    Ok(devices.chunks(tensor).collect())
}

impl Sequential {
    /// The model as pipeline stages of tensor-parallel groups: `devices` in consecutive groups
    /// of `tensor`, the layers cut at `split` ([`plan_stages`] over the groups' first devices:
    /// `Split::Auto` balances parameter bytes, with no later rebalancing), each stage on its
    /// group's first device but the last stage's final `Linear → parameterless layers → Linear`,
    /// column- then row-parallel over the last group as [`TensorParallel`](crate::parallel::TensorParallel)
    /// splits them. The last stage must hold both of those Linears. Checkpoints keep the model's
    /// names and whole shapes.
    pub fn tensor_stages(&self, devices: &[Device], tensor: usize, split: Split) -> Result<Vec<ShardedStage>> {
        let groups = groups("Sequential::tensor_stages", devices, tensor)?;
        let firsts: Vec<Device> = groups.iter().map(|g| g[0].clone()).collect();
        let ranges = plan_stages(self, &firsts, &split)?;
        let last = groups.len() - 1;
        let pair = SplitPair::of(self, groups[last])?;
        if pair.at < ranges[last].start {
            let what = format!(
                "the last stage starts at layer {}, after the first of the two Linears tensor parallelism splits (layer {}): cut later",
                ranges[last].start, pair.at
            );
            return Err(Error::invalid("Sequential::tensor_stages", what));
        }
        let mut out = Vec::with_capacity(groups.len());
        let mut pair = Some(pair);
        for (s, (group, range)) in groups.into_iter().zip(ranges).enumerate() {
            let whole = if s == last { range.start..pair.as_ref().map_or(range.end, |p| p.at) } else { range };
            let mut model = if whole.is_empty() { Sequential::new() } else { self.slice(whole, &group[0])? };
            let mut logical = Logical::all_of(&model);
            if s == last {
                let p = pair.take().expect("one pair, for the last stage");
                logical.extend(p.logical());
                model.push_boxed(p.layer_name(), Box::new(p));
            }
            out.push(ShardedStage { model, placed: Placed { logical, first: group[0].clone() }, devices: group.to_vec() });
        }
        Ok(out)
    }
}
