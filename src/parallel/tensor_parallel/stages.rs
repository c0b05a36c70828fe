//! Pipeline stages that are tensor-parallel groups (tensor × pipeline, Megatron-LM's layout
//! across servers): a [`Gpt`]'s stages, each with its blocks split over a group of devices.
use super::gpt::ParallelBlock;
use super::placed::{Logical, Placed};
use crate::nn::models::Gpt;
use crate::nn::Sequential;
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
        if tensor == 0 || devices.is_empty() || !devices.len().is_multiple_of(tensor) {
            return Err(Error::invalid("Gpt::tensor_stages", format!("{} devices do not make groups of {tensor} tensor-parallel shards", devices.len())));
        }
        if !self.config.n_head.is_multiple_of(tensor) {
            return Err(Error::invalid("Gpt::tensor_stages", format!("n_head {} does not split evenly over {tensor} devices of a group", self.config.n_head)));
        }
        let groups: Vec<&[Device]> = devices.chunks(tensor).collect();
        let firsts: Vec<Device> = groups.iter().map(|g| g[0].clone()).collect();
        let whole = self.stages(&firsts, starts)?;
        groups
            .into_iter()
            .zip(whole)
            .map(|(group, stage)| {
                let mut model = Sequential::new();
                let mut logical = Vec::new();
                for (name, layer) in stage.into_layers() {
                    let block = name.strip_prefix("transformer.h.").and_then(|i| i.parse::<usize>().ok());
                    match block {
                        Some(i) => {
                            drop(layer);
                            let split = ParallelBlock::split(self.block_copy(i, &group[0])?, group)?;
                            logical.extend(split.logical(&name));
                            model.push_boxed(name, Box::new(split));
                        }
                        None => {
                            let params: Vec<u64> = layer.parameters().iter().map(|(_, t)| t.id()).collect();
                            for (k, t) in layer.state_dict() {
                                let mut l = Logical::whole(format!("{name}.{k}"), t.clone());
                                l.trained = params.contains(&t.id());
                                logical.push(l);
                            }
                            model.push_boxed(name, layer);
                        }
                    }
                }
                Ok(ShardedStage { model, placed: Placed { logical, first: group[0].clone() }, devices: group.to_vec() })
            })
            .collect()
    }
}
