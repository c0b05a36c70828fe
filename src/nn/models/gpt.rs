//! A GPT-2-shaped transformer with nanoGPT's architecture, initialisation and state_dict names.
//!
//! Shape letters: `B` batch, `T` tokens (at most `block_size`), `C` = `n_embd`, `H` = `n_head`,
//! `D` = `C / H` per head, `V` = `vocab_size`.
pub use super::gpt_config::{GptConfig, StateShards};
use crate::nn::{Dropout, Embedding, GeluApproximate, LayerNorm, Linear, Module, GELU};
use crate::{DType, Device, Error, Result, Tensor};
use rand::SeedableRng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A decoder-only transformer, nanoGPT's `GPT`: token and position embeddings, `n_layer`
/// pre-LayerNorm blocks of causal self-attention and a GELU (tanh) MLP, a final LayerNorm,
/// and an output projection tied to the token embedding.
///
/// `state_dict` has nanoGPT's names and order, `lm_head.weight` included (the same tensor as
/// `transformer.wte.weight`), so a checkpoint loads into nanoGPT's `GPT` with
/// `load_state_dict(strict=True)`; `parameters` lists the tied tensor once.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// use tandem::nn::models::{Gpt, GptConfig};
/// use tandem::nn::Module;
/// use tandem::{Device, Tensor};
/// let cfg = GptConfig { n_layer: 1, n_head: 2, n_embd: 8, block_size: 4, vocab_size: 5, ..Default::default() };
/// let dev = Device::cpu();
/// let gpt = Gpt::new(cfg, 0, &dev)?;
/// let ids = Tensor::from_labels(vec![0, 1, 2, 3, 4, 0], [2, 3], &dev)?;
/// assert_eq!(gpt.forward(&ids)?.dims(), [2, 3, 5]);
/// # Ok(()) }
/// ```
pub struct Gpt {
    pub config: GptConfig,
    pub transformer: Transformer,
    seed: u64,
    training: AtomicBool,
}

impl Gpt {
    /// A model with GPT-2's initialisation drawn from `seed`: every Linear and Embedding
    /// weight N(0, 0.02), the residual projections (`c_proj`) N(0, 0.02/√(2·n_layer)), biases
    /// 0, LayerNorms 1 and 0. Dropout masks are drawn from `seed` too. Training mode.
    ///
    /// A configuration whose parameters alone exceed the device's memory (the host's free
    /// memory for the CPU) is `Error::OutOfMemory` before anything is allocated.
    pub fn new(config: GptConfig, seed: u64, dev: &Device) -> Result<Gpt> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        Gpt::build(config, seed, dev, &mut |shape, std| {
            let mut data = crate::tensor::normal_vec(shape.iter().product(), &mut rng)?;
            data.iter_mut().for_each(|v| *v *= std);
            Tensor::from_vec(data, shape, dev)
        })
    }

    /// A model of `config` holding the weights of `state` (a state dict, as
    /// `load_state_dict` takes it), in eval mode. The tensors are checked against the
    /// configuration first ([`GptConfig::check_shapes`]): a configuration that claims more
    /// than the tensors hold is an error, not an allocation.
    pub fn from_state_dict(config: GptConfig, state: &[(String, Tensor)], dev: &Device) -> Result<Gpt> {
        config.check_shapes(state.iter().map(|(n, t)| (n.as_str(), t.dims())))?;
        let gpt = Gpt::build(config, 0, dev, &mut |shape, _| Tensor::zeros(shape, dev))?;
        gpt.load_state_dict(state)?;
        gpt.eval();
        Ok(gpt)
    }

    fn build(cfg: GptConfig, seed: u64, dev: &Device, normal: &mut dyn FnMut(&[usize], f32) -> Result<Tensor>) -> Result<Gpt> {
        cfg.check()?;
        if !crate::tensor::defers(dev) {
            // Built deferred (ZeRO-3), the device only ever gets its shard: the strategy checks that.
            cfg.check_fits(dev)?;
        }
        let blocks = (0..cfg.n_layer).map(|i| Block::build(&cfg, seed, i, dev, normal)).collect::<Result<Vec<_>>>()?;
        let transformer = Transformer {
            wte: Embedding { weight: normal(&[cfg.vocab_size, cfg.n_embd], 0.02)?.requires_grad() },
            wpe: Embedding { weight: normal(&[cfg.block_size, cfg.n_embd], 0.02)?.requires_grad() },
            drop: dropout(&cfg, seed, 3 * cfg.n_layer + 1)?,
            h: Blocks(blocks),
            ln_f: Norm::new(cfg.n_embd, cfg.bias, dev)?,
        };
        Ok(Gpt { config: cfg, transformer, seed, training: AtomicBool::new(true) })
    }

    /// The seed the model (and its dropout masks) was drawn from.
    pub(super) fn seed(&self) -> u64 {
        self.seed
    }

    pub(super) fn training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    /// Chooses the attention kernel of every block: `true` runs one fused causal-attention
    /// kernel per layer (only the output and a logsumexp per row kept for the backward), `false`
    /// the two batched products around a fused causal softmax (the `T × T` weights kept). Both
    /// compute the same function; while training with attention dropout the products are used
    /// either way (the dropout acts on the weights). The default is `TANDEM_ATTENTION=fused`,
    /// else composed, the faster of the two on the CPU and lavapipe at GPT-tiny sizes
    /// (benches/README.md).
    pub fn set_fused_attention(&self, fused: bool) {
        for b in &self.transformer.h.0 {
            b.layers.attn.fused.store(fused, Ordering::Relaxed);
        }
    }

    /// Per-block activation recomputation (`--recompute`): with `true` each block's forward
    /// keeps only its input for the backward, which runs the block again (see
    /// [`crate::autograd::checkpoint`]): the activations kept fall from every block's
    /// intermediates to one `[B, T, C]` per block, for one more forward per step. Gradients
    /// are the plain run's; Dropout replays its masks under a strategy's sample context.
    pub fn set_recompute(&self, recompute: bool) {
        for b in &self.transformer.h.0 {
            b.recompute.store(recompute, Ordering::Relaxed);
        }
    }

    /// The output projection's weight `[V, C]`: the token embedding itself (weight tying).
    pub fn lm_head(&self) -> &Tensor {
        &self.transformer.wte.weight
    }

    /// Mean cross-entropy of logits `[B, T, V]` against the next tokens `[B, T]` (I32), over
    /// every position, as nanoGPT's training loss.
    pub fn loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let d = logits.dims();
        if d.len() != 3 || targets.dims() != &d[..2] {
            return Err(Error::shape(
                "Gpt::loss",
                format!("logits {:?} with targets {:?}: need [B, T, V] and [B, T]", logits.shape(), targets.shape()),
            ));
        }
        logits.reshape([d[0] * d[1], d[2]])?.cross_entropy(&targets.reshape([d[0] * d[1]])?)
    }
}

impl Module for Gpt {
    /// Logits `[B, T, V]` for I32 token ids `[B, T]`, `T <= block_size`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.transformer.forward(ids)?;
        x.matmul_t(self.lm_head(), false, true)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("transformer".into(), &self.transformer)]
    }
    /// nanoGPT's: the parameters, then `lm_head.weight` (the tied embedding) last.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut s = self.parameters();
        s.push(("lm_head.weight".into(), self.lm_head().clone()));
        s
    }
    /// A strict load of the parameters; `lm_head.weight` may be left out (a checkpoint of
    /// `parameters()`), and when given must equal `transformer.wte.weight`, since they are
    /// one tensor here. The causal-mask buffers `h.{i}.attn.bias` `[1, 1, block, block]` that
    /// nanoGPT keeps on PyTorch < 2 are constants, and skipped.
    fn load_state_dict(&self, state: &[(String, Tensor)]) -> Result<()> {
        let mask = |(n, t): &(String, Tensor)| n.ends_with(".attn.bias") && t.rank() == 4;
        let state: Vec<(String, Tensor)> = state.iter().filter(|p| !mask(p)).cloned().collect();
        let (head, rest): (Vec<_>, Vec<_>) = state.into_iter().partition(|(n, _)| n == "lm_head.weight");
        crate::nn::load_into(&self.parameters(), &rest)?;
        if let Some((_, head)) = head.first() {
            let wte = self.lm_head();
            if head.shape() != wte.shape() || head.dtype() != DType::F32 || !same_bits(&head.to_vec()?, &wte.to_vec()?) {
                return Err(Error::invalid(
                    "Gpt::load_state_dict",
                    format!("lm_head.weight {:?} differs from transformer.wte.weight {:?}; they are tied", head.shape(), wte.shape()),
                ));
            }
        }
        Ok(())
    }
    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
        self.transformer.set_training(training);
    }
    fn to_device(&self, dev: &Device) -> Result<Box<dyn Module>> {
        let moved = Gpt::build(self.config, self.seed, dev, &mut |shape, _| Tensor::zeros(shape, dev))?;
        moved.load_state_dict(&self.parameters())?;
        moved.set_training(self.training.load(Ordering::Relaxed));
        if let Some(first) = self.transformer.h.0.first() {
            moved.set_fused_attention(first.layers.attn.fused.load(Ordering::Relaxed));
            moved.set_recompute(first.recompute.load(Ordering::Relaxed));
        }
        Ok(Box::new(moved))
    }
    fn describe(&self) -> String {
        self.config.describe()
    }
}

/// `TANDEM_ATTENTION=fused` selects the fused attention kernel for new models.
fn fused_attention_default() -> bool {
    std::env::var("TANDEM_ATTENTION").is_ok_and(|v| v == "fused")
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The `k`-th Dropout of the model (1-based, in construction order: the three of each block,
/// then the one after the embeddings), with its own stream: layers with one seed would all
/// draw the same masks.
pub(super) fn dropout(cfg: &GptConfig, seed: u64, k: usize) -> Result<Dropout> {
    Ok(Dropout::new(cfg.dropout)?.seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(k as u64)))
}

/// `tok + pos` for I32 ids `[B, T]`, checked against the vocabulary and the block, then the
/// embedding dropout: the start of the transformer, whole or as a pipeline's first stage.
pub(super) fn embed(wte: &Embedding, wpe: &Embedding, drop: &Dropout, ids: &Tensor) -> Result<Tensor> {
    let (vocab, block) = (wte.weight.dims()[0], wpe.weight.dims()[0]);
    if ids.dtype() != DType::I32 {
        return Err(Error::DType { op: "Gpt", expected: DType::I32, got: ids.dtype() });
    }
    let t = ids.dims().get(1).copied().unwrap_or(0);
    if ids.rank() != 2 || t == 0 || ids.dims()[0] == 0 {
        return Err(Error::shape("Gpt", format!("token ids {:?}: need [B, T] with B, T >= 1", ids.shape())));
    }
    if t > block {
        return Err(Error::shape("Gpt", format!("token ids {:?}: T = {t} is longer than block_size {block}", ids.shape())));
    }
    ids.check_labels("Gpt", vocab)?;
    let tok = wte.forward(ids)?;
    let pos = wpe.weight.narrow(0, 0, t)?;
    drop.forward(&tok.add(&pos)?)
}

/// nanoGPT's `transformer` dict: embeddings, blocks, final LayerNorm. Its forward gives the
/// normalised hidden states `[B, T, C]`.
pub struct Transformer {
    pub wte: Embedding,
    pub wpe: Embedding,
    pub(crate) drop: Dropout,
    pub h: Blocks,
    pub(crate) ln_f: Norm,
}

impl Transformer {
    /// The blocks' input `[B, T, C]` for checked token ids: token plus position embeddings,
    /// dropped out (tensor parallelism runs its own blocks between this and `ln_f`).
    pub(crate) fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        embed(&self.wte, &self.wpe, &self.drop, ids)
    }
}

impl Module for Transformer {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.h.forward(&self.embed(ids)?)?;
        self.ln_f.forward(&x)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("wte".into(), &self.wte), ("wpe".into(), &self.wpe), ("drop".into(), &self.drop), ("h".into(), &self.h), ("ln_f".into(), &self.ln_f)]
    }
    fn describe(&self) -> String {
        format!("Transformer({} blocks)", self.h.0.len())
    }
}

/// The blocks in order, named `0`, `1`, .. as in a PyTorch `ModuleList`.
pub struct Blocks(pub Vec<Block>);

impl Module for Blocks {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.iter().try_fold(x.clone(), |h, b| b.forward(&h))
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.0.iter().enumerate().map(|(i, b)| (i.to_string(), b as &dyn Module)).collect()
    }
    fn describe(&self) -> String {
        format!("ModuleList({})", self.0.len())
    }
}

/// One pre-LayerNorm block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`; with `recompute`
/// under `autograd::checkpoint` (its layers shared with the recomputation, hence the `Arc`).
pub struct Block {
    pub(crate) layers: Arc<BlockLayers>,
    recompute: AtomicBool,
}

impl Block {
    /// Block `i` of a model of `cfg` drawn from `seed`: its weights from `normal(shape, std)`
    /// in nanoGPT's order, its dropouts the `3i+1..=3i+3`-th of the model.
    pub(super) fn build(
        cfg: &GptConfig,
        seed: u64,
        i: usize,
        dev: &Device,
        normal: &mut dyn FnMut(&[usize], f32) -> Result<Tensor>,
    ) -> Result<Block> {
        let c = cfg.n_embd;
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f32).sqrt();
        let mut linear = |inputs: usize, o: usize, std: f32| -> Result<Linear> {
            let bias = if cfg.bias { Some(Tensor::zeros([o], dev)?.requires_grad()) } else { None };
            Ok(Linear { weight: normal(&[o, inputs], std)?.requires_grad(), bias })
        };
        let (c_attn, c_proj) = (linear(c, 3 * c, 0.02)?, linear(c, c, proj_std)?);
        let fused = AtomicBool::new(fused_attention_default());
        let attn = Attention {
            c_attn,
            c_proj,
            attn_dropout: dropout(cfg, seed, 3 * i + 1)?,
            resid_dropout: dropout(cfg, seed, 3 * i + 2)?,
            n_head: cfg.n_head,
            fused,
            training: AtomicBool::new(true),
        };
        let (c_fc, c_proj) = (linear(c, 4 * c, 0.02)?, linear(4 * c, c, proj_std)?);
        let mlp = Mlp { c_fc, gelu: GELU { approximate: GeluApproximate::Tanh }, c_proj, dropout: dropout(cfg, seed, 3 * i + 3)? };
        let layers = BlockLayers { ln_1: Norm::new(c, cfg.bias, dev)?, attn, ln_2: Norm::new(c, cfg.bias, dev)?, mlp };
        Ok(Block { layers: Arc::new(layers), recompute: AtomicBool::new(false) })
    }

    /// Whether this block runs the fused attention kernel.
    pub(super) fn fused_attention(&self) -> bool {
        self.layers.attn.fused.load(Ordering::Relaxed)
    }

    pub(super) fn set_fused_attention(&self, fused: bool) {
        self.layers.attn.fused.store(fused, Ordering::Relaxed);
    }

    pub(super) fn set_recompute(&self, recompute: bool) {
        self.recompute.store(recompute, Ordering::Relaxed);
    }
}

/// A block's layers; tensor parallelism takes them apart to split the Linears.
pub(crate) struct BlockLayers {
    pub(crate) ln_1: Norm,
    pub(crate) attn: Attention,
    pub(crate) ln_2: Norm,
    pub(crate) mlp: Mlp,
}

impl BlockLayers {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        x.add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }
}

impl Block {
    /// Whether the block runs under `autograd::checkpoint` (see `Gpt::set_recompute`).
    pub(crate) fn recompute(&self) -> bool {
        self.recompute.load(Ordering::Relaxed)
    }
}

/// `forward(layers, x)` of the block `module` whose layers these are; while `recompute` is set,
/// under `autograd::checkpoint` over the block's parameters (see `Gpt::set_recompute`). The
/// tensor-parallel blocks' forward too.
pub(crate) fn block_forward<L: Send + Sync + 'static>(
    module: &dyn Module,
    layers: &Arc<L>,
    recompute: &AtomicBool,
    forward: fn(&L, &Tensor) -> Result<Tensor>,
    x: &Tensor,
) -> Result<Tensor> {
    if !recompute.load(Ordering::Relaxed) {
        return forward(layers, x);
    }
    let (layers, params): (_, Vec<Tensor>) = (layers.clone(), module.parameters().into_iter().map(|p| p.1).collect());
    crate::autograd::checkpoint(Arc::new(move |x: &Tensor| forward(&layers, x)), x, &params)
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        block_forward(self, &self.layers, &self.recompute, BlockLayers::forward, x)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let l = &*self.layers;
        vec![("ln_1".into(), &l.ln_1), ("attn".into(), &l.attn), ("ln_2".into(), &l.ln_2), ("mlp".into(), &l.mlp)]
    }
    fn describe(&self) -> String {
        "Block".into()
    }
}

/// Causal multi-head self-attention: one projection to q, k, v; per head
/// `softmax(q·kᵀ/√D + mask)·v` over `B·H`, either as two batched products around a fused causal
/// softmax or as one fused attention kernel (`fused`, see `Gpt::set_fused_attention`); the
/// heads joined and projected.
pub(crate) struct Attention {
    pub(crate) c_attn: Linear,
    pub(crate) c_proj: Linear,
    pub(crate) attn_dropout: Dropout,
    pub(crate) resid_dropout: Dropout,
    pub(crate) n_head: usize,
    fused: AtomicBool,
    training: AtomicBool,
}

impl Attention {
    /// Whether the fused attention kernel is chosen (see `Gpt::set_fused_attention`).
    pub(crate) fn fused(&self) -> bool {
        self.fused.load(Ordering::Relaxed)
    }
}

impl Module for Attention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let (h, d) = (self.n_head, c / self.n_head);
        // [B, T, 3C] -> [3, B·H, T, D]: q, k and v each a contiguous run of heads.
        let qkv = self.c_attn.forward(x)?.reshape([b, t, 3, h, d])?.permute(&[2, 0, 3, 1, 4])?.reshape([3, b * h, t, d])?;
        let part = |i: usize| qkv.narrow(0, i, 1)?.reshape([b * h, t, d]);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let scale = 1.0 / (d as f32).sqrt();
        // Dropout on the attention weights needs them, which the fused attention never forms.
        let dropping = self.attn_dropout.p > 0.0 && self.training.load(Ordering::Relaxed);
        let y = if self.fused.load(Ordering::Relaxed) && !dropping {
            Tensor::causal_attention(&q, &k, &v, scale)?
        } else {
            self.attn_dropout.forward(&q.matmul_t(&k, false, true)?.causal_softmax(scale)?)?.matmul(&v)?
        };
        let y = y.reshape([b, h, t, d])?.permute(&[0, 2, 1, 3])?.reshape([b, t, c])?;
        self.resid_dropout.forward(&self.c_proj.forward(&y)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let (a, p) = (&self.c_attn, &self.c_proj);
        vec![("c_attn".into(), a), ("c_proj".into(), p), ("attn_dropout".into(), &self.attn_dropout), ("resid_dropout".into(), &self.resid_dropout)]
    }
    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
        for (_, c) in self.children() {
            c.set_training(training);
        }
    }
    fn describe(&self) -> String {
        format!("CausalSelfAttention(n_head={})", self.n_head)
    }
}

/// `dropout(c_proj(gelu(c_fc(x))))`, C -> 4C -> C.
pub(crate) struct Mlp {
    pub(crate) c_fc: Linear,
    pub(crate) gelu: GELU,
    pub(crate) c_proj: Linear,
    pub(crate) dropout: Dropout,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.dropout.forward(&self.c_proj.forward(&self.gelu.forward(&self.c_fc.forward(x)?)?)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("c_fc".into(), &self.c_fc), ("gelu".into(), &self.gelu), ("c_proj".into(), &self.c_proj), ("dropout".into(), &self.dropout)]
    }
    fn describe(&self) -> String {
        "MLP".into()
    }
}

/// nanoGPT's LayerNorm: PyTorch's, with the bias optional (without one the shift is a
/// constant 0, neither trained nor saved).
pub(crate) struct Norm {
    ln: LayerNorm,
    bias: bool,
}

impl Norm {
    pub(super) fn new(c: usize, bias: bool, dev: &Device) -> Result<Norm> {
        let mut ln = LayerNorm::new(&[c], dev)?;
        if !bias {
            ln.bias = Tensor::zeros([c], dev)?;
        }
        Ok(Norm { ln, bias })
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.ln.forward(x)
    }
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.ln.weight.clone())];
        if self.bias {
            p.push(("bias".into(), self.ln.bias.clone()));
        }
        p
    }
    fn describe(&self) -> String {
        format!("LayerNorm({}, bias={})", self.ln.weight.numel(), self.bias)
    }
}
