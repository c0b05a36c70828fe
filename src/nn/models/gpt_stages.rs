//! A [`Gpt`] cut into pipeline stages: the embeddings (`wte`, `wpe`, dropout) open the first
//! stage, consecutive blocks follow, and `ln_f` with a copy of `wte` as `lm_head` close the
//! last. Layer names are nanoGPT's state_dict prefixes, so the stages' state_dicts together are
//! the model's, `lm_head.weight` included.
//!
//! Shape letters: `B` batch, `T` tokens, `C` = `n_embd`, `V` = `vocab_size`.
use super::gpt::{dropout, embed, Block, Gpt, Norm};
use crate::nn::{Dropout, Embedding, Module, Sequential};
use crate::{Device, Error, Result, Tensor};
use std::ops::Range;

/// The first stage's opening: token + position embeddings and their dropout, `[B, T]` I32 ids
/// to `[B, T, C]`. Named `transformer`, so its tensors are `transformer.wte.weight`, ...
struct Embeddings {
    wte: Embedding,
    wpe: Embedding,
    drop: Dropout,
}

impl Module for Embeddings {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        embed(&self.wte, &self.wpe, &self.drop, ids)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("wte".into(), &self.wte), ("wpe".into(), &self.wpe), ("drop".into(), &self.drop)]
    }
    fn describe(&self) -> String {
        "Embeddings".into()
    }
}

/// The output projection `[B, T, C]` -> logits `[B, T, V]` with its own weight `[V, C]`: on
/// another device than `wte`, it holds a copy that the pipeline keeps equal (tied).
struct Head {
    weight: Tensor,
}

impl Module for Head {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.matmul_t(&self.weight, false, true)
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone())]
    }
    fn tied_parameters(&self) -> Vec<(String, String)> {
        vec![("weight".into(), Gpt::WTE.into())]
    }
    fn describe(&self) -> String {
        format!("LmHead({}, {})", self.weight.dims()[1], self.weight.dims()[0])
    }
}

impl Gpt {
    /// The token embedding's name on the first of [`Gpt::stages`], tied to [`Gpt::LM_HEAD`].
    pub const WTE: &'static str = "transformer.wte.weight";
    /// The output projection's name on the last of [`Gpt::stages`]: a copy of [`Gpt::WTE`].
    pub const LM_HEAD: &'static str = "lm_head.weight";

    /// The model as one [`Sequential`] per device, copies of this model's weights, dropout
    /// seeds, training mode and attention kernel, for `Pipeline::builder(Stages::Built(..))`:
    /// `transformer` (the embeddings) first, `transformer.h.{i}` blocks, `transformer.ln_f` and
    /// `lm_head` last. `starts` says where the blocks are cut: `Some(starts)` gives the index of
    /// the first block of every stage after the first (strictly increasing, in `1..n_layer`),
    /// `None` near-equal runs of blocks. The stages hold [`Gpt::WTE`] on stage 0 and
    /// [`Gpt::LM_HEAD`] on the last as two tensors; the last stage declares its head a copy of
    /// the embedding ([`Module::tied_parameters`]), so a pipeline of them ties the two itself.
    pub fn stages(&self, devices: &[Device], starts: Option<&[usize]>) -> Result<Vec<Sequential>> {
        self.stages_of(0..devices.len(), devices.len(), devices, starts)
    }

    /// Stages `mine` of the model cut into `total` stages as [`Gpt::stages`] cuts it, stage
    /// `mine.start + i` on `devices[i]`: one process's part of a pipeline across processes
    /// ([`PipelineBuilder::across`](crate::parallel::pipeline::PipelineBuilder::across)), which
    /// builds only the layers it trains. The last stage's head is declared a copy of the first
    /// stage's embedding wherever they are, so the pipeline ties them across processes too.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use tandem::nn::models::{Gpt, GptConfig};
    /// let dev = tandem::Device::cpu();
    /// let cfg = GptConfig { vocab_size: 16, block_size: 8, n_layer: 4, n_head: 2, n_embd: 8, dropout: 0.0, bias: true };
    /// let gpt = Gpt::new(cfg, 0, &dev)?;
    /// // The second of two stages: blocks 2 and 3, ln_f and the head.
    /// let last = gpt.stages_of(1..2, 2, &[dev.clone()], None)?;
    /// let names: Vec<String> = last[0].layers().iter().map(|l| l.0.clone()).collect();
    /// assert_eq!(names, ["transformer.h.2", "transformer.h.3", "transformer.ln_f", "lm_head"]);
    /// # Ok(()) }
    /// ```
    pub fn stages_of(&self, mine: Range<usize>, total: usize, devices: &[Device], starts: Option<&[usize]>) -> Result<Vec<Sequential>> {
        self.stages_with(mine, total, devices, starts, &mut |_, i, dev| Ok(Box::new(self.block_copy(i, dev)?)))
    }

    /// [`Gpt::stages_of`] with each block made by `block(stage, i, device)` (block `i` of stage
    /// `stage` on its device): tensor-parallel stages put split blocks there.
    pub(crate) fn stages_with(
        &self,
        mine: Range<usize>,
        total: usize,
        devices: &[Device],
        starts: Option<&[usize]>,
        block: &mut BlockMaker,
    ) -> Result<Vec<Sequential>> {
        let ranges = self.block_ranges(total, starts)?;
        if mine.is_empty() || mine.end > total || devices.len() != mine.len() {
            let what =
                format!("stages {mine:?} of {total} on {} devices: give a non-empty range within 0..{total} and one device per stage", devices.len());
            return Err(Error::invalid("Gpt::stages", what));
        }
        let (cfg, t) = (self.config, &self.transformer);
        let training = |m: &dyn Module| m.set_training(self.training());
        let last = total - 1;
        let mut out = Vec::with_capacity(devices.len());
        for (s, (dev, r)) in mine.clone().zip(devices.iter().zip(ranges[mine].iter().cloned())) {
            let mut stage = Sequential::new();
            if s == 0 {
                let drop = dropout(&cfg, self.seed(), 3 * cfg.n_layer + 1)?;
                let e =
                    Embeddings { wte: Embedding { weight: leaf(&t.wte.weight, dev)? }, wpe: Embedding { weight: leaf(&t.wpe.weight, dev)? }, drop };
                training(&e);
                stage.push_boxed("transformer".into(), Box::new(e));
            }
            for i in r {
                stage.push_boxed(format!("transformer.h.{i}"), block(s, i, dev)?);
            }
            if s == last {
                let ln_f = Norm::new(cfg.n_embd, cfg.bias, dev)?;
                ln_f.load_state_dict(&t.ln_f.state_dict())?;
                stage.push_boxed("transformer.ln_f".into(), Box::new(ln_f));
                stage.push_boxed("lm_head".into(), Box::new(Head { weight: leaf(&t.wte.weight, dev)? }));
            }
            out.push(stage);
        }
        Ok(out)
    }

    /// A copy of block `i` on `dev`: its weights, dropout seeds, training mode, attention
    /// kernel and recomputation.
    pub(crate) fn block_copy(&self, i: usize, dev: &Device) -> Result<Block> {
        let b = Block::build(&self.config, self.seed(), i, dev, &mut |shape, _| Tensor::zeros(shape, dev))?;
        let from = &self.transformer.h.0[i];
        b.load_state_dict(&from.state_dict())?;
        b.set_fused_attention(from.fused_attention());
        b.set_recompute(from.recompute());
        b.set_training(self.training());
        Ok(b)
    }

    /// The blocks of each of `p` stages (`starts` as [`Gpt::stages`] takes them).
    pub(crate) fn block_ranges(&self, p: usize, starts: Option<&[usize]>) -> Result<Vec<Range<usize>>> {
        let n = self.config.n_layer;
        if p == 0 || p > n {
            return Err(Error::invalid("Gpt::stages", format!("{p} stages for {n} blocks: give 1 to {n} devices (every stage holds a block)")));
        }
        let mut bounds = vec![0];
        match starts {
            None => bounds.extend(crate::shape::even_ranges(n, p).iter().skip(1).map(|r| r.start)),
            Some(starts) => {
                if starts.len() != p - 1 || starts.windows(2).any(|w| w[0] >= w[1]) || starts.iter().any(|&b| b == 0 || b >= n) {
                    return Err(Error::invalid(
                        "Gpt::stages",
                        format!("block starts {starts:?} for {p} stages of {n} blocks: give {} strictly increasing indices in 1..{n}", p - 1),
                    ));
                }
                bounds.extend(starts);
            }
        }
        bounds.push(n);
        Ok(bounds.windows(2).map(|w| w[0]..w[1]).collect())
    }
}

/// Makes block `i` of stage `stage` on its device: `block(stage, i, device)`.
pub(crate) type BlockMaker<'a> = dyn FnMut(usize, usize, &Device) -> Result<Box<dyn Module>> + 'a;

/// A fresh trainable copy of `t` on `dev`, sharing no storage with it.
fn leaf(t: &Tensor, dev: &Device) -> Result<Tensor> {
    let own = Tensor::zeros(t.shape().clone(), dev)?;
    own.assign(t)?;
    Ok(own.requires_grad())
}
