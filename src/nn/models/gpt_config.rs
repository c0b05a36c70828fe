//! The shape of a [`Gpt`](super::Gpt): its configuration, the parameters it implies (names,
//! shapes, bytes), and the checks made before a single parameter is allocated: that the
//! numbers fit in memory, and that a state dict's tensors are the ones the configuration
//! claims (a checkpoint's metadata is not trusted to size the model).
use crate::backend::{host, BackendKind, DeviceKind};
use crate::{Device, Error, Result};
use std::collections::HashMap;

/// The shape of a [`Gpt`](super::Gpt), nanoGPT's `GPTConfig` (its defaults are GPT-2 small's,
/// with the vocabulary padded to 50304).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    /// The longest sequence the model reads (the rows of `wpe`).
    pub block_size: usize,
    pub vocab_size: usize,
    /// The drop probability of every Dropout (after the embeddings, on the attention weights,
    /// after each residual projection).
    pub dropout: f32,
    /// Biases in every Linear and LayerNorm (nanoGPT's `bias`; GPT-2 has them).
    pub bias: bool,
}

impl Default for GptConfig {
    fn default() -> Self {
        GptConfig { n_layer: 12, n_head: 12, n_embd: 768, block_size: 1024, vocab_size: 50304, dropout: 0.0, bias: true }
    }
}

/// Names listed in one error at most; the rest are counted.
const LISTED: usize = 5;

/// Which parts of the training state one device keeps only a share of, over `ranks` ranks
/// (for [`GptConfig::check_sharded_training_fits`]): ZeRO-1 shards the optimizer state, ZeRO-2
/// and ZeRO-3 the gradients too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateShards {
    pub ranks: u64,
    pub gradients: bool,
    pub optimizer: bool,
    /// The parameters too (ZeRO-3): built deferred (`build_deferred`), each device holding
    /// its shard and the one parameter being cut.
    pub parameters: bool,
    /// Bytes a gradient value takes: 4, or 2 where sharded gradients are kept in a half type
    /// (`DataParallelConfig::grad_dtype`).
    pub gradient_bytes: u64,
}

impl StateShards {
    /// Every part whole (plain data parallelism, one device).
    pub const WHOLE: StateShards = StateShards { ranks: 1, gradients: false, optimizer: false, parameters: false, gradient_bytes: 4 };
}

impl GptConfig {
    /// Every size at least 1, `n_embd` a multiple of `n_head`, dropout in [0, 1), and a
    /// parameter count that fits in 64 bits.
    pub(super) fn check(&self) -> Result<()> {
        let sizes = [
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
            ("block_size", self.block_size),
            ("vocab_size", self.vocab_size),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid("Gpt", format!("{name} must be at least 1 in {self:?}")));
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::invalid("Gpt", format!("n_embd {} is not a multiple of n_head {}", self.n_embd, self.n_head)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::invalid("Gpt", format!("dropout {} is not in [0, 1)", self.dropout)));
        }
        if self.parameter_bytes().is_none() {
            return Err(Error::invalid("Gpt", format!("{self:?} has more parameter bytes than 64 bits can count")));
        }
        Ok(())
    }

    /// The number of parameters (`lm_head` is `wte`, counted once); `None` when it overflows.
    ///
    /// ```
    /// let cfg = tandem::nn::models::GptConfig::default();
    /// assert_eq!(cfg.parameter_count(), Some(124_475_904)); // GPT-2 small, vocabulary 50304
    /// ```
    pub fn parameter_count(&self) -> Option<u64> {
        let (c, l) = (self.n_embd as u64, self.n_layer as u64);
        // Per block: the four Linears' 12·C² weights, two LayerNorm weights, and biases of
        // 2C (LayerNorms) + 3C + C + 4C + C (Linears).
        let per_block = c.checked_mul(c)?.checked_mul(12)?.checked_add(c.checked_mul(if self.bias { 13 } else { 2 })?)?;
        let embeddings = (self.vocab_size as u64).checked_add(self.block_size as u64)?.checked_mul(c)?;
        let ln_f = c.checked_mul(if self.bias { 2 } else { 1 })?;
        per_block.checked_mul(l)?.checked_add(embeddings)?.checked_add(ln_f)
    }

    /// The parameters' bytes (f32); `None` when they overflow.
    pub fn parameter_bytes(&self) -> Option<u64> {
        self.parameter_count()?.checked_mul(4)
    }

    /// The parameters' names (nanoGPT's) and shapes, in `parameters()` order (`lm_head.weight`,
    /// the tied `wte`, not listed). Lazy: a configuration of absurd `n_layer` costs nothing
    /// until iterated.
    pub fn parameter_shapes(&self) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
        let (c, v, b, bias) = (self.n_embd, self.vocab_size, self.block_size, self.bias);
        let norm = move |name: String| {
            let mut p = vec![(format!("{name}.weight"), vec![c])];
            if bias {
                p.push((format!("{name}.bias"), vec![c]));
            }
            p
        };
        let linear = move |name: String, inputs: usize, outputs: usize| {
            let mut p = vec![(format!("{name}.weight"), vec![outputs, inputs])];
            if bias {
                p.push((format!("{name}.bias"), vec![outputs]));
            }
            p
        };
        let embeddings = [("transformer.wte.weight".to_string(), vec![v, c]), ("transformer.wpe.weight".to_string(), vec![b, c])];
        let blocks = (0..self.n_layer).flat_map(move |i| {
            let at = |part: &str| format!("transformer.h.{i}.{part}");
            let mut p = norm(at("ln_1"));
            p.extend(linear(at("attn.c_attn"), c, c.saturating_mul(3)));
            p.extend(linear(at("attn.c_proj"), c, c));
            p.extend(norm(at("ln_2")));
            p.extend(linear(at("mlp.c_fc"), c, c.saturating_mul(4)));
            p.extend(linear(at("mlp.c_proj"), c.saturating_mul(4), c));
            p
        });
        embeddings.into_iter().chain(blocks).chain(norm("transformer.ln_f".into()))
    }

    /// Checks `tensors` (name, shape) against the parameters of this configuration before
    /// anything is built from it: every parameter present with its shape, nothing else
    /// (`lm_head.weight` may come too, with `wte`'s shape; nanoGPT's rank-4 causal-mask
    /// buffers `*.attn.bias` are skipped). Each field of the configuration is thereby vouched
    /// for by the tensors, except `n_head`, which shapes do not show.
    pub fn check_shapes<'a>(&self, tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> Result<()> {
        self.check()?;
        let mut given: HashMap<&str, &[usize]> = HashMap::new();
        let mut head = None;
        for (name, shape) in tensors {
            match name {
                "lm_head.weight" => head = Some(shape),
                n if n.ends_with(".attn.bias") && shape.len() == 4 => {}
                n => {
                    given.insert(n, shape);
                }
            }
        }
        let bad = |detail: String| Error::invalid("Gpt", detail);
        for (name, want) in self.parameter_shapes() {
            match given.remove(name.as_str()) {
                Some(got) if got == want.as_slice() => {}
                Some(got) => return Err(bad(format!("{name} is {got:?}, but {} needs {want:?}", self.describe()))),
                None => return Err(bad(format!("{} needs {name} {want:?}, which is missing", self.describe()))),
            }
        }
        if !given.is_empty() {
            let mut extra: Vec<&str> = given.into_keys().collect();
            extra.sort_unstable();
            let more = extra.len().saturating_sub(LISTED);
            let listed = extra[..extra.len().min(LISTED)].join(", ");
            let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
            return Err(bad(format!("{} has no parameter {listed}{tail}", self.describe())));
        }
        let wte = [self.vocab_size, self.n_embd];
        if let Some(h) = head.filter(|h| *h != wte.as_slice()) {
            return Err(bad(format!("lm_head.weight is {h:?}, but it is tied to transformer.wte.weight {wte:?}")));
        }
        Ok(())
    }

    /// Errors when the parameters alone cannot fit `dev`: the host's free memory for the CPU
    /// and software rasterizers (lavapipe, llvmpipe), the device's memory where the driver
    /// reports it, and what the device's memory budget leaves. Training needs more (gradients and optimizer state): see
    /// [`GptConfig::check_training_fits`].
    pub(super) fn check_fits(&self, dev: &Device) -> Result<()> {
        let Some(need) = self.parameter_bytes() else { return self.check() };
        let detail = format!("the {} parameters of {}", self.parameter_count().unwrap_or(u64::MAX), self.describe());
        Self::fits(dev, need, detail)
    }

    /// Errors when training the whole model on `dev` cannot fit it: the parameters, their
    /// gradients and `optimizer_states` state tensors per parameter (see
    /// [`crate::optim::OptimConfig::states_per_parameter`]), before activations. For a model
    /// that lives whole on each device (one device, data parallelism); checked before anything
    /// is allocated, because a run that reaches the limit midway may meet an allocation of a
    /// library that cannot fail gracefully.
    ///
    /// ```
    /// use tandem::nn::models::GptConfig;
    /// let big = GptConfig { n_layer: 2, n_head: 4, n_embd: 1 << 16, block_size: 8, vocab_size: 3, ..Default::default() };
    /// assert!(matches!(big.check_training_fits(&tandem::Device::cpu(), 2), Err(tandem::Error::OutOfMemory { .. })));
    /// ```
    pub fn check_training_fits(&self, dev: &Device, optimizer_states: u64) -> Result<()> {
        self.check_sharded_training_fits(dev, optimizer_states, StateShards::WHOLE)
    }

    /// As [`GptConfig::check_training_fits`] for a device that keeps only its share of the
    /// gradients or the optimizer state (sharded data parallelism, ZeRO-1/2/3), and the
    /// parameters under ZeRO-3, whose build holds a device's shard and one whole parameter.
    ///
    /// ```
    /// use tandem::nn::models::{GptConfig, StateShards};
    /// let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 256, block_size: 8, vocab_size: 3, ..Default::default() };
    /// let dev = tandem::Device::cpu_independent();
    /// let p = cfg.parameter_bytes().unwrap();
    /// // Room for the parameters and a quarter of the gradients and of Adam's two moments.
    /// dev.set_memory_budget(Some(p + 3 * p / 4 + 4096));
    /// assert!(cfg.check_training_fits(&dev, 2).is_err());
    /// cfg.check_sharded_training_fits(&dev, 2, StateShards { ranks: 4, gradients: true, optimizer: true, parameters: false, gradient_bytes: 4 })?;
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn check_sharded_training_fits(&self, dev: &Device, optimizer_states: u64, shards: StateShards) -> Result<()> {
        let Some(params) = self.parameter_bytes() else { return self.check() };
        let ranks = shards.ranks.max(1);
        let part = |bytes: u64, sharded: bool| if sharded { bytes.div_ceil(ranks) } else { bytes };
        let grads = (params / 4).saturating_mul(shards.gradient_bytes);
        let state = part(params, shards.parameters)
            .saturating_add(part(grads, shards.gradients))
            .saturating_add(part(params.saturating_mul(optimizer_states), shards.optimizer));
        // ZeRO-3's deferred build: the shard so far and the parameter being cut.
        let (c, v, b) = (self.n_embd as u64, self.vocab_size as u64, self.block_size as u64);
        let largest =
            [v.saturating_mul(c), b.saturating_mul(c), c.saturating_mul(c).saturating_mul(4)].into_iter().max().unwrap_or(0).saturating_mul(4);
        let need = if shards.parameters { state.max(part(params, true).saturating_add(largest)) } else { state };
        let kept = match (shards.parameters, shards.gradients, shards.optimizer) {
            (false, false, false) => String::new(),
            (p, g, o) => {
                let what = [p.then_some("parameters"), g.then_some("gradients"), o.then_some("optimizer state")]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" and ");
                format!(", the {what} sharded over {ranks} ranks")
            }
        };
        let detail = format!(
            "the parameters, gradients and {optimizer_states} optimizer state tensors of {} ({} parameters){kept}",
            self.describe(),
            self.parameter_count().unwrap_or(u64::MAX)
        );
        Self::fits(dev, need, detail)
    }

    /// `OutOfMemory` naming `detail` when `need` bytes exceed what `dev` has free.
    fn fits(dev: &Device, need: u64, detail: String) -> Result<()> {
        let info = dev.info();
        let on_host = info.backend == BackendKind::Cpu || matches!(info.kind, DeviceKind::Cpu | DeviceKind::Software);
        let mem = dev.memory();
        let budgeted = mem.budget.map(|b| b.saturating_sub(mem.in_use));
        let free = [on_host.then(host::available).flatten(), info.memory, budgeted].into_iter().flatten().min();
        let detail = match mem.budget {
            Some(b) => format!(
                "{detail}; the device's memory budget is {}, of which live tensors hold {}",
                crate::backend::format_bytes(b),
                crate::backend::format_bytes(mem.in_use)
            ),
            None => detail,
        };
        match free {
            Some(free) if need > free => Err(Error::OutOfMemory { device: dev.spec(), requested: need, free, detail }),
            _ => Ok(()),
        }
    }

    /// `Gpt(n_layer=.., ..)`, as `Module::describe` of the model.
    pub fn describe(&self) -> String {
        format!(
            "Gpt(n_layer={}, n_head={}, n_embd={}, block_size={}, vocab_size={})",
            self.n_layer, self.n_head, self.n_embd, self.block_size, self.vocab_size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::GptConfig;
    use crate::nn::models::Gpt;
    use crate::nn::Module;
    use crate::Device;

    /// The shapes and the count are derived without a model: they must be the model's own.
    #[test]
    fn shapes_and_count_are_the_models() {
        for bias in [true, false] {
            let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, block_size: 5, vocab_size: 7, dropout: 0.0, bias };
            let gpt = Gpt::new(cfg, 0, &Device::cpu()).unwrap();
            let real: Vec<(String, Vec<usize>)> = gpt.parameters().into_iter().map(|(n, t)| (n, t.dims().to_vec())).collect();
            assert_eq!(cfg.parameter_shapes().collect::<Vec<_>>(), real);
            assert_eq!(cfg.parameter_count(), Some(real.iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum()));
        }
    }
}
