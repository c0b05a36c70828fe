//! GPT-2 in the Hugging Face layout: the folder `save_pretrained` writes for `transformers`'
//! `GPT2LMHeadModel` (`config.json` and `model.safetensors`), read into a [`Gpt`] and written
//! back, as nanoGPT's `from_pretrained` maps it.
//!
//! The names are tandem's (nanoGPT's) with `transformer.` in front (a file of `GPT2Model`'s bare
//! names, as the hub's `gpt2` has, reads too). The four projections of each block are
//! `Conv1D`s in `transformers`, whose weights are `[in, out]`: they are transposed to a
//! Linear's `[out, in]` on the way in and back on the way out. `lm_head.weight` is tied to
//! `transformer.wte.weight`; `save_pretrained` leaves it out, and where a file has it, it
//! must equal `wte`. The causal-mask buffers `attn.bias` and `attn.masked_bias` of older
//! files are skipped by name; any other tensor, a missing one or a shape that is not the
//! configuration's is an error naming it, found from the file's header before any weight is
//! converted. The configuration's sizes are bounded before anything is sized by them.
#![doc = include_str!("finetune.md")]
use super::{Gpt, GptConfig};
use crate::checkpoint::{host_from_view, parse, write_atomic, write_safetensors, HostData, HostTensor};
use crate::nn::Module;
use crate::{Device, Error, Result, Tensor};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The folder's weights file, as `save_pretrained` names it.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The folder's configuration file.
pub const CONFIG_FILE: &str = "config.json";

/// The largest values of `config.json`'s sizes tandem takes: a configuration is read before the
/// weights that vouch for it, so it must not size anything absurd.
const MAX_LAYERS: u64 = 1024;
const MAX_EMBD: u64 = 1 << 16;
const MAX_POSITIONS: u64 = 1 << 20;
/// tandem's LayerNorm epsilon, GPT-2's `layer_norm_epsilon`.
const LAYER_NORM_EPS: f64 = 1e-5;

/// The Linears stored as `Conv1D`s (`[in, out]`), by the end of their weight's name.
const CONV1D: [&str; 4] = [".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"];

/// Whether `name` (tandem's) is a `Conv1D` weight in the Hugging Face layout.
fn is_conv1d(name: &str) -> bool {
    CONV1D.iter().any(|end| name.ends_with(end))
}

/// The shape `name` (tandem's, of `shape`) has in the Hugging Face layout.
fn hf_shape(name: &str, shape: &[usize]) -> Vec<usize> {
    if is_conv1d(name) {
        shape.iter().rev().copied().collect()
    } else {
        shape.to_vec()
    }
}

/// A row-major `[rows, cols]` matrix transposed.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// The [`GptConfig`] of a Hugging Face GPT-2 `config.json` (`path` names it in errors):
/// `n_layer`, `n_head`, `n_embd`, `vocab_size`, `n_positions` (the block size; `n_ctx`, where
/// given, must agree), the three dropouts (which must agree: tandem has one). Settings tandem
/// does not compute are refused by name: an `activation_function` other than `gelu_new` (and
/// its equal `gelu_pytorch_tanh`), a `layer_norm_epsilon` other than 1e-5, an `n_inner` other
/// than `4·n_embd`, untied embeddings, unscaled or layer-scaled attention, cross-attention.
pub fn read_config(path: impl AsRef<Path>) -> Result<GptConfig> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| Error::format(path, format!("not JSON: {e}")))?;
    config_of_json(path, &json)
}

fn config_of_json(path: &Path, json: &Value) -> Result<GptConfig> {
    let bad = |what: String| Error::format(path, what);
    if !json.is_object() {
        return Err(bad("not a JSON object".into()));
    }
    match json.get("model_type").and_then(Value::as_str) {
        Some("gpt2") => {}
        other => {
            return Err(bad(format!(
                "model_type is {}, not \"gpt2\": tandem reads GPT-2's layout",
                other.map_or("missing".to_string(), |m| format!("{m:?}"))
            )))
        }
    }
    let size = |key: &str, max: u64| -> Result<usize> {
        let v = json.get(key).ok_or_else(|| bad(format!("{key} is missing")))?;
        match v.as_u64() {
            Some(n) if (1..=max).contains(&n) => Ok(n as usize),
            _ => Err(bad(format!("{key} is {v}; tandem takes a whole number in 1..={max}"))),
        }
    };
    let n_layer = size("n_layer", MAX_LAYERS)?;
    let n_embd = size("n_embd", MAX_EMBD)?;
    let n_head = size("n_head", MAX_EMBD)?;
    let block_size = size("n_positions", MAX_POSITIONS)?;
    let vocab_size = size("vocab_size", crate::data::text::MAX_VOCAB as u64)?;
    if !n_embd.is_multiple_of(n_head) {
        return Err(bad(format!("n_embd {n_embd} is not a multiple of n_head {n_head}")));
    }
    if let Some(ctx) = json.get("n_ctx").filter(|v| !v.is_null()) {
        if ctx.as_u64() != Some(block_size as u64) {
            return Err(bad(format!("n_ctx is {ctx} but n_positions is {block_size}; tandem's block size is one number")));
        }
    }
    match json.get("activation_function").and_then(Value::as_str) {
        None | Some("gelu_new" | "gelu_pytorch_tanh") => {}
        Some(other) => {
            return Err(bad(format!("activation_function {other:?} is not supported: tandem's GPT computes gelu_new (GELU, tanh approximation)")))
        }
    }
    if let Some(eps) = json.get("layer_norm_epsilon").filter(|v| !v.is_null()) {
        if eps.as_f64().is_none_or(|e| (e - LAYER_NORM_EPS).abs() > 1e-12) {
            return Err(bad(format!("layer_norm_epsilon {eps} is not supported: tandem's LayerNorm uses 1e-5")));
        }
    }
    if let Some(inner) = json.get("n_inner").filter(|v| !v.is_null()) {
        if inner.as_u64() != Some(4 * n_embd as u64) {
            return Err(bad(format!("n_inner {inner} is not supported: tandem's MLP is 4·n_embd = {} wide", 4 * n_embd)));
        }
    }
    for (key, want) in
        [("tie_word_embeddings", true), ("scale_attn_weights", true), ("scale_attn_by_inverse_layer_idx", false), ("add_cross_attention", false)]
    {
        if let Some(v) = json.get(key).filter(|v| !v.is_null()) {
            if v.as_bool() != Some(want) {
                return Err(bad(format!("{key} {v} is not supported: tandem's GPT-2 has {key} {want}")));
            }
        }
    }
    let mut dropouts = Vec::new();
    for key in ["resid_pdrop", "embd_pdrop", "attn_pdrop"] {
        // transformers' default where a key is absent.
        let v = json.get(key).cloned().unwrap_or(Value::from(0.1));
        match v.as_f64() {
            Some(p) if (0.0..1.0).contains(&p) => dropouts.push((key, p)),
            _ => return Err(bad(format!("{key} is {v}; a drop probability is a number in [0, 1)"))),
        }
    }
    if dropouts.iter().any(|&(_, p)| p != dropouts[0].1) {
        let listed: Vec<String> = dropouts.iter().map(|(k, p)| format!("{k} {p}")).collect();
        return Err(bad(format!("{} differ; tandem's GPT has one drop probability", listed.join(", "))));
    }
    let cfg = GptConfig { n_layer, n_head, n_embd, block_size, vocab_size, dropout: dropouts[0].1 as f32, bias: true };
    cfg.check().map_err(|e| bad(e.to_string()))?;
    Ok(cfg)
}

/// The `config.json` of `cfg`, as `GPT2Config(...).save_pretrained` writes it: `architectures`
/// `["GPT2LMHeadModel"]`, `model_type` `gpt2`, and every field `transformers` reads.
pub fn config_json(cfg: &GptConfig) -> Result<Value> {
    if !cfg.bias {
        return Err(Error::invalid("hf_gpt2::config_json", format!("{} has no biases; GPT-2's layout has them", cfg.describe())));
    }
    cfg.check()?;
    // The f32's shortest decimal (0.1, not 0.10000000149011612).
    let p: f64 = cfg.dropout.to_string().parse().unwrap_or(0.0);
    // GPT-2's <|endoftext|>, where the vocabulary holds it.
    let eot = (cfg.vocab_size > 50_256).then_some(50_256);
    Ok(serde_json::json!({
        "activation_function": "gelu_new",
        "add_cross_attention": false,
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": p,
        "bos_token_id": eot,
        "embd_pdrop": p,
        "eos_token_id": eot,
        "initializer_range": 0.02,
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "model_type": "gpt2",
        "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_head": cfg.n_head,
        "n_inner": null,
        "n_layer": cfg.n_layer,
        "n_positions": cfg.block_size,
        "pad_token_id": null,
        "reorder_and_upcast_attn": false,
        "resid_pdrop": p,
        "scale_attn_by_inverse_layer_idx": false,
        "scale_attn_weights": true,
        "summary_activation": null,
        "summary_first_dropout": p,
        "summary_proj_to_labels": true,
        "summary_type": "cls_index",
        "summary_use_proj": true,
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
        "use_cache": true,
        "vocab_size": cfg.vocab_size,
    }))
}

/// A Hugging Face GPT-2 folder read and checked: its configuration and its weights under
/// tandem's names and in tandem's layout (the `Conv1D` weights transposed), F32 on the host,
/// in [`GptConfig::parameter_shapes`] order (`lm_head.weight` left out: it is `wte`).
pub struct HfGpt2 {
    pub config: GptConfig,
    pub weights: Vec<(String, HostTensor)>,
}

impl HfGpt2 {
    /// Reads `dir/config.json` ([`read_config`]) and `dir/model.safetensors` (F32, F16 or
    /// BF16), checking every tensor against the configuration before converting any.
    pub fn read(dir: impl AsRef<Path>) -> Result<HfGpt2> {
        let dir = dir.as_ref();
        let config = read_config(dir.join(CONFIG_FILE))?;
        let path = dir.join(WEIGHTS_FILE);
        if !path.exists() {
            let why = if dir.join("model.safetensors.index.json").exists() {
                "the weights are sharded (model.safetensors.index.json); save them as one file (save_pretrained(dir, max_shard_size=\"100GB\"))"
            } else {
                "the folder has no model.safetensors (save_pretrained(dir, safe_serialization=True) writes it)"
            };
            return Err(Error::format(&path, why));
        }
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let st = parse(&path, &bytes)?;
        let bad = |what: String| Error::format(&path, what);
        // The file's names, `transformer.` put in front of GPT2Model's bare names.
        let mut stored: HashMap<String, String> = HashMap::new();
        let mut head = None;
        for name in st.names() {
            let ours = if name.starts_with("transformer.") || name == "lm_head.weight" { name.to_string() } else { format!("transformer.{name}") };
            if ours.ends_with(".attn.bias") || ours.ends_with(".attn.masked_bias") {
                continue;
            }
            if ours == "lm_head.weight" {
                head = Some(name.to_string());
            } else if stored.insert(ours.clone(), name.to_string()).is_some() {
                return Err(bad(format!("{ours} is stored twice, with and without the transformer. prefix")));
            }
        }
        let view = |name: &str| st.tensor(name).map_err(|e| bad(format!("tensor {name}: {e}")));
        let mut wanted = Vec::new();
        for (ours, shape) in config.parameter_shapes() {
            let Some(name) = stored.remove(&ours) else {
                return Err(bad(format!("{ours} {:?} is missing ({} of {})", hf_shape(&ours, &shape), config.describe(), CONFIG_FILE)));
            };
            let got = view(&name)?.shape().to_vec();
            let want = hf_shape(&ours, &shape);
            if got != want {
                return Err(bad(format!("{name} is {got:?}, but {CONFIG_FILE} ({}) needs {want:?}", config.describe())));
            }
            wanted.push((ours, name, shape));
        }
        if let Some(extra) = stored.values().min() {
            let more = match stored.len() - 1 {
                0 => String::new(),
                n => format!(" ({n} more unknown)"),
            };
            return Err(bad(format!("{extra} is not a tensor of GPT-2{more}")));
        }
        let wte_shape = [config.vocab_size, config.n_embd];
        if let Some(h) = &head {
            let got = view(h)?.shape().to_vec();
            if got != wte_shape {
                return Err(bad(format!("lm_head.weight is {got:?}, but it is tied to transformer.wte.weight {wte_shape:?}")));
            }
        }
        let f32s = |name: &str| -> Result<Vec<f32>> {
            match host_from_view(&path, name, &view(name)?)?.data {
                HostData::F32(v) => Ok(v),
                HostData::I32(_) => Err(bad(format!("{name} holds integers; weights must be F32, F16 or BF16"))),
            }
        };
        let mut weights = Vec::with_capacity(wanted.len());
        for (ours, name, shape) in wanted {
            let mut v = f32s(&name)?;
            if is_conv1d(&ours) {
                v = transpose(&v, shape[1], shape[0]);
            }
            weights.push((ours, HostTensor::f32(shape, v)?));
        }
        if let Some(h) = &head {
            let wte = weights.iter().find(|(n, _)| n == "transformer.wte.weight").map(|(_, t)| &t.data);
            if wte != Some(&HostData::F32(f32s(h)?)) {
                return Err(bad("lm_head.weight differs from transformer.wte.weight; tandem's GPT ties them (tie_word_embeddings)".into()));
            }
        }
        Ok(HfGpt2 { config, weights })
    }

    /// The weights as tensors on `dev`, named as [`Module::load_state_dict`] takes them.
    pub fn tensors(&self, dev: &Device) -> Result<Vec<(String, Tensor)>> {
        self.weights
            .iter()
            .map(|(n, h)| match &h.data {
                HostData::F32(v) => Ok((n.clone(), Tensor::from_vec(v.clone(), h.shape.clone(), dev)?)),
                HostData::I32(_) => Err(Error::invalid("HfGpt2::tensors", format!("{n} holds integers"))),
            })
            .collect()
    }
}

/// Writes a GPT-2 of `config` with the weights `state` (tandem's names and layout, as
/// `state_dict` gives them; `lm_head.weight` may come, and is left out as `save_pretrained`
/// leaves it) to `dir` (created if missing) in the Hugging Face layout: `config.json`
/// ([`config_json`]) and `model.safetensors` (F32, metadata `{"format": "pt"}`). Every
/// parameter of `config` must be in `state` with its shape.
pub fn write(dir: impl AsRef<Path>, config: &GptConfig, state: &[(String, Tensor)]) -> Result<()> {
    let dir = dir.as_ref();
    let json = config_json(config)?;
    let state: Vec<&(String, Tensor)> = state.iter().filter(|(n, _)| n != "lm_head.weight").collect();
    config.check_shapes(state.iter().map(|(n, t)| (n.as_str(), t.dims())))?;
    let mut tensors = Vec::with_capacity(state.len());
    for (name, t) in state {
        let (shape, mut v) = (t.dims().to_vec(), t.to_vec()?);
        if is_conv1d(name) {
            v = transpose(&v, shape[0], shape[1]);
        }
        tensors.push((name.clone(), HostTensor::f32(hf_shape(name, &shape), v)?));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(dir.join(WEIGHTS_FILE), &tensors, &meta)?;
    let text = serde_json::to_string_pretty(&json).map_err(|e| Error::Msg(format!("encoding {CONFIG_FILE}: {e}")))?;
    write_atomic(dir.join(CONFIG_FILE), format!("{text}\n").as_bytes())
}

impl Gpt {
    /// The GPT-2 of a Hugging Face folder (`GPT2LMHeadModel.save_pretrained(dir)`): its
    /// configuration and weights, checked as [`HfGpt2::read`] checks them, on `dev`, in eval
    /// mode.
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// use tandem::nn::models::{Gpt, GptConfig};
    /// use tandem::Device;
    /// let cfg = GptConfig { n_layer: 1, n_head: 2, n_embd: 8, block_size: 4, vocab_size: 5, ..Default::default() };
    /// let dir = std::env::temp_dir().join(format!("tandem-hf-doc-{}", std::process::id()));
    /// Gpt::new(cfg, 0, &Device::cpu())?.save_hf(&dir)?;
    /// let back = Gpt::from_hf(&dir, &Device::cpu())?;
    /// assert_eq!(back.config, cfg);
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok(()) }
    /// ```
    pub fn from_hf(dir: impl AsRef<Path>, dev: &Device) -> Result<Gpt> {
        let hf = HfGpt2::read(dir)?;
        Gpt::from_state_dict(hf.config, &hf.tensors(dev)?, dev)
    }

    /// Writes the model to `dir` in the Hugging Face layout, for
    /// `GPT2LMHeadModel.from_pretrained(dir)` (see [`write()`]).
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        write(dir, &self.config, &self.state_dict())
    }
}
