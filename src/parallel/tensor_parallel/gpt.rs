//! A tensor-parallel GPT (Megatron-LM): every block's attention heads and MLP hidden features
//! split over the devices; the embeddings, LayerNorms, `ln_f` and the tied `lm_head` on the
//! first device. Checkpoints are the single-device model's: `state_dict` gathers each sharded
//! parameter (and its optimizer state) to nanoGPT's name and shape, `load_state_dict` scatters.
use super::attention::ParallelAttention;
use super::placed::{Logical, Placed, Placement};
use super::{backward_and_update, ColumnParallelLinear, ParallelMlp};
use crate::autograd::no_grad;
use crate::data::Batch;
use crate::nn::models::gpt::{block_forward, BlockLayers, Norm};
use crate::nn::models::{Gpt, Transformer};
use crate::nn::{Dropout, Module};
use crate::optim::Optimizer;
use crate::parallel::step::StepCore;
use crate::parallel::{batch_to_device, Loss, OptimConfig, Replica, StepReport, Strategy};
use crate::{Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One block with its attention and MLP split over the devices.
struct ParallelLayers {
    ln_1: Norm,
    attn: ParallelAttention,
    ln_2: Norm,
    mlp: ParallelMlp,
    dropout: Dropout,
}

impl ParallelLayers {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        x.add(&self.dropout.forward(&self.mlp.forward(&self.ln_2.forward(&x)?)?)?)
    }
}

pub(super) struct ParallelBlock {
    layers: Arc<ParallelLayers>,
    recompute: AtomicBool,
}

impl ParallelBlock {
    /// `block` (on the group's first device, used by no graph) split over `devices`: its
    /// Linears copied to their devices, the LayerNorms and dropout kept on the first.
    pub(super) fn split(block: crate::nn::models::Block, devices: &[Device]) -> Result<Self> {
        let (recompute, fused) = (block.recompute(), block.layers.attn.fused());
        let BlockLayers { ln_1, attn, ln_2, mlp } =
            Arc::try_unwrap(block.layers).map_err(|_| Error::invalid("TensorParallelGpt", "a block of the model is still in use by a graph"))?;
        let layers = ParallelLayers {
            ln_1,
            attn: ParallelAttention::new(attn, fused, devices)?,
            ln_2,
            mlp: ParallelMlp::from_linears(&mlp.c_fc, &mlp.c_proj, mlp.gelu, devices)?,
            dropout: mlp.dropout,
        };
        Ok(ParallelBlock { layers: Arc::new(layers), recompute: AtomicBool::new(recompute) })
    }

    /// The block's nanoGPT tensors under `prefix` (`transformer.h.{i}`), as they lie on the group.
    pub(super) fn logical(&self, prefix: &str) -> Vec<Logical> {
        let col = |name: &str, c: &ColumnParallelLinear, placement: Placement| {
            let mut v = vec![Logical::param(format!("{name}.weight"), placement, c.weights.clone())];
            if let Some(b) = &c.biases {
                // Qkv and Split(0) split a bias along its only dimension as the weight's rows.
                v.push(Logical::param(format!("{name}.bias"), placement, b.clone()));
            }
            v
        };
        let row = |name: &str, r: &super::RowParallelLinear| {
            let mut v = vec![Logical::param(format!("{name}.weight"), Placement::Split(1), r.weights.clone())];
            v.extend(r.bias.clone().map(|b| Logical::whole(format!("{name}.bias"), b)));
            v
        };
        let (l, p) = (&*self.layers, prefix);
        let mut out = norm_logical(&format!("{p}.ln_1"), &l.ln_1);
        out.extend(col(&format!("{p}.attn.c_attn"), &l.attn.c_attn, Placement::Qkv));
        out.extend(row(&format!("{p}.attn.c_proj"), &l.attn.c_proj));
        out.extend(norm_logical(&format!("{p}.ln_2"), &l.ln_2));
        out.extend(col(&format!("{p}.mlp.c_fc"), l.mlp.c_fc(), Placement::Split(0)));
        out.extend(row(&format!("{p}.mlp.c_proj"), l.mlp.c_proj()));
        out
    }
}

/// A whole LayerNorm's tensors under `name`.
fn norm_logical(name: &str, n: &Norm) -> Vec<Logical> {
    n.parameters().into_iter().map(|(k, t)| Logical::whole(format!("{name}.{k}"), t)).collect()
}

impl Module for ParallelBlock {
    /// `[B, T, C]` on the first device to the same there, the heads and hidden features
    /// computed on their devices; under `autograd::checkpoint` with recomputation.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        block_forward(self, &self.layers, &self.recompute, ParallelLayers::forward, x)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let l = &*self.layers;
        vec![("ln_1".into(), &l.ln_1), ("attn".into(), &l.attn), ("ln_2".into(), &l.ln_2), ("mlp".into(), &l.mlp), ("dropout".into(), &l.dropout)]
    }
    fn describe(&self) -> String {
        "ParallelBlock".into()
    }
}

/// [`Gpt`] with its blocks split over devices: the same function, the same Dropout masks.
struct ParallelGpt {
    /// The embeddings, embedding dropout and `ln_f`; its own block list is empty.
    transformer: Transformer,
    blocks: Vec<ParallelBlock>,
}

impl ParallelGpt {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.blocks.iter().try_fold(self.transformer.embed(ids)?, |h, b| b.forward(&h))?;
        self.transformer.ln_f.forward(&x)?.matmul_t(&self.transformer.wte.weight, false, true)
    }
    /// Every nanoGPT parameter in state_dict order (without the tied `lm_head.weight`).
    fn logical(&self) -> Vec<Logical> {
        let t = &self.transformer;
        let mut out =
            vec![Logical::whole("transformer.wte.weight", t.wte.weight.clone()), Logical::whole("transformer.wpe.weight", t.wpe.weight.clone())];
        for (i, b) in self.blocks.iter().enumerate() {
            out.extend(b.logical(&format!("transformer.h.{i}")));
        }
        out.extend(norm_logical("transformer.ln_f", &t.ln_f));
        out
    }
}

/// Tensor parallelism for a [`Gpt`] (`--strategy tensor --model gpt`): the attention heads and
/// the MLP's hidden features split evenly over the devices (Megatron-LM: `c_attn` and `c_fc`
/// column-parallel, both `c_proj` row-parallel, one reduction forward and one backward per
/// attention and per MLP); the embeddings, LayerNorms, `ln_f` and the tied `lm_head` stay on
/// the first device, where the logits and the loss are computed.
///
/// Each device has its own optimizer over the tensors it holds, under the parameters' nanoGPT
/// names (so weight-decay groups by rank apply unchanged); clipping sums the squared norms of
/// all of them, each logical parameter once. Dropout masks equal [`Single`](crate::parallel::Single)'s:
/// every mask is drawn on the first device under the step's sample context, the attention
/// weights' whole `[B·H, T, T]` mask included, of which each device takes its heads' slice.
/// A separate strategy from [`super::TensorParallel`] (the last two Linears of a `Sequential`),
/// since a GPT's split needs the heads' layout of `c_attn` and its own gather.
pub struct TensorParallelGpt {
    model: ParallelGpt,
    placed: Placed,
    opts: Vec<Box<dyn Optimizer>>,
    run: StepCore,
}

impl TensorParallelGpt {
    /// What [`Parallel::tensor`](crate::parallel::Parallel::tensor) calls for a [`Gpt`].
    /// `gpt` (built on the first device, as [`Gpt::new`] makes it) split over `devices`: the
    /// blocks' Linears are copied to their devices, the rest stays. `n_head` must be a
    /// multiple of the number of devices.
    pub fn new(gpt: Gpt, devices: &[Device], opt: &OptimConfig, loss: Loss) -> Result<Self> {
        let first = devices.first().ok_or_else(|| Error::invalid("TensorParallelGpt", "no devices given"))?;
        if !gpt.config.n_head.is_multiple_of(devices.len()) {
            let what = format!(
                "n_head {} does not split evenly over {} devices ({}): each device takes the same number of whole heads",
                gpt.config.n_head,
                devices.len(),
                devices.iter().map(Device::spec).collect::<Vec<_>>().join(",")
            );
            return Err(Error::invalid("TensorParallelGpt", what));
        }
        if let Some((n, t)) = gpt.state_dict().into_iter().find(|(_, t)| !t.device().same(first)) {
            return Err(Error::invalid("TensorParallelGpt", format!("{n} is on {}, not on the first device {first}", t.device())));
        }
        let Gpt { mut transformer, .. } = gpt;
        let blocks = std::mem::take(&mut transformer.h.0).into_iter().map(|b| ParallelBlock::split(b, devices)).collect::<Result<Vec<_>>>()?;
        let model = ParallelGpt { transformer, blocks };
        let placed = Placed { logical: model.logical(), first: first.clone() };
        let opts = (0..devices.len()).map(|i| opt.build(placed.device_params(i))).collect::<Result<_>>()?;
        Ok(TensorParallelGpt { model, placed, opts, run: StepCore::new(loss, devices) })
    }

    /// Per-block activation recomputation, as [`Gpt::set_recompute`].
    pub fn set_recompute(&self, recompute: bool) {
        self.model.blocks.iter().for_each(|b| b.recompute.store(recompute, Ordering::Relaxed));
    }

    /// Each nanoGPT parameter's gradient gathered to its whole shape on the first device, in
    /// state_dict order (`None` where backward has not reached it).
    pub fn gathered_grads(&self) -> Result<Vec<(String, Option<Tensor>)>> {
        self.placed.gathered_grads()
    }
}

impl TensorParallelGpt {
    /// The loss of `part`, samples `first..` of a global batch of `total`, weighted by its share.
    fn share_loss(&self, part: &Batch, first: usize, total: usize) -> Result<Tensor> {
        let (x, y) = batch_to_device(part, &self.run.devices[0])?;
        let (model, run) = (&self.model, &self.run);
        let ctx = crate::nn::SampleContext { step: run.step, first_sample: first as u64, samples: part.len() };
        let out = crate::nn::with_samples(ctx, || run.autocast(|| model.forward(&x)))?;
        self.run.loss_share(&out, &y, part.len(), total)
    }
}

impl Replica for TensorParallelGpt {
    fn kind(&self) -> &'static str {
        "tensor group"
    }
    fn backward_share(&mut self, part: &Batch, first: usize, total: usize) -> Result<f32> {
        let loss = self.share_loss(part, first, total)?;
        super::backward_share(&loss, &self.opts)
    }
    fn slot_params(&self) -> Vec<Vec<(String, Tensor)>> {
        self.placed.slot_params(self.run.devices.len())
    }
    fn optimizers(&mut self) -> Vec<(&mut Box<dyn Optimizer>, &Device, Option<String>)> {
        super::optimizers(&mut self.opts, &self.run.devices)
    }
    fn state_of_slots(&self, per_slot: Vec<(Vec<(String, Tensor)>, u64)>) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.placed.gather_states(per_slot)
    }
    fn slots_of_state(&self, state: &[(String, Tensor)]) -> Result<Vec<Vec<(String, Tensor)>>> {
        self.placed.slice_states(self.run.devices.len(), state)
    }
}

impl Strategy for TensorParallelGpt {
    fn autocasts(&self) -> bool {
        true
    }
    fn step(&mut self, batch: &Batch) -> Result<StepReport> {
        let t0 = Instant::now();
        let loss = self.share_loss(batch, 0, batch.len())?;
        backward_and_update(loss, t0, &mut self.run, &mut self.opts)
    }
    fn predict(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to(&self.run.devices[0])?;
        no_grad(|| self.model.forward(&x))
    }
    /// nanoGPT's names and shapes, `lm_head.weight` last: a single-device [`Gpt`]'s file.
    fn state_dict(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = self.placed.state_dict()?;
        out.push(("lm_head.weight".into(), self.model.transformer.wte.weight.clone()));
        Ok(out)
    }
    /// A strict load of a single-device [`Gpt`]'s state (as [`Gpt`]'s: `lm_head.weight` may be
    /// left out and, if given, must be the embedding; nanoGPT's mask buffers are skipped).
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let skipped = |n: &str, t: &Tensor| n == "lm_head.weight" || (n.ends_with(".attn.bias") && t.rank() == 4);
        self.placed.load_state_dict("TensorParallelGpt::load_state_dict", state, &skipped)?;
        if let Some((_, head)) = state.iter().find(|s| s.0 == "lm_head.weight") {
            let wte = &self.model.transformer.wte.weight;
            if head.shape() != wte.shape() || head.to_vec()?.iter().zip(wte.to_vec()?).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(Error::invalid(
                    "TensorParallelGpt::load_state_dict",
                    "lm_head.weight differs from transformer.wte.weight; they are tied",
                ));
            }
        }
        Ok(())
    }
    /// Each parameter's state (`exp_avg`, ..) gathered like the parameter itself.
    fn optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        self.placed.optimizer_state(&self.opts)
    }
    fn load_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        self.placed.load_optimizer_state(&mut self.opts, state, steps)
    }
    fn modules(&self) -> Vec<&dyn Module> {
        let blocks = self.model.blocks.iter().map(|b| b as &dyn Module);
        std::iter::once(&self.model.transformer as &dyn Module).chain(blocks).collect()
    }
    fn core(&self) -> &StepCore {
        &self.run
    }
    fn core_mut(&mut self) -> &mut StepCore {
        &mut self.run
    }
}
