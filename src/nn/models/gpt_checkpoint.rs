//! A [`Gpt`](super::Gpt)'s configuration and weights read back from a file of `tandem train
//! --model gpt` (a run checkpoint or a `--save` file), whose `config` metadata names the shape
//! and, for text, the tokenizer (a character vocabulary, or GPT-2's BPE). The metadata is only a claim: every parameter's
//! name and shape is checked against the file's tensors before anything is built, so a small
//! file cannot ask for a large model.
use super::GptConfig;
use crate::checkpoint::{read_safetensors, HostData, HostTensor};
use crate::data::text::CharVocab;
use crate::data::Tokenizer;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// A GPT file's contents, checked: the configuration agrees with the weights.
pub struct GptCheckpoint {
    pub config: GptConfig,
    /// The tokenizer of a model trained on text (or on token ids `--tokenizer` named);
    /// `None` for other token ids.
    pub vocab: Option<Tokenizer>,
    /// The model's state dict by name (a run checkpoint's `model.` prefix removed, its
    /// `optim.*` state left out): shapes and F32 values on the host.
    pub weights: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl GptCheckpoint {
    /// Reads `path` and checks it as [`GptCheckpoint::from_parts`] does. A run checkpoint's
    /// checksum is not verified here; `tandem generate` does that first.
    pub fn read(path: impl AsRef<Path>) -> Result<GptCheckpoint> {
        let path = path.as_ref();
        let (tensors, meta) = read_safetensors(path)?;
        GptCheckpoint::from_parts(path, tensors, &meta)
    }

    /// The configuration in `meta` (as [`GptConfig::from_metadata`]) checked against `tensors`
    /// (as [`GptConfig::check_shapes`]); a disagreement is an [`Error::Format`] of `path`.
    pub fn from_parts(path: &Path, tensors: Vec<(String, HostTensor)>, meta: &BTreeMap<String, String>) -> Result<GptCheckpoint> {
        let (config, vocab) = GptConfig::from_metadata(meta, path)?;
        let mut weights = Vec::new();
        for (name, h) in tensors {
            let name = match name.strip_prefix("model.") {
                Some(n) => n.to_string(),
                None if name.starts_with("optim.") => continue,
                None => name,
            };
            let HostData::F32(v) = h.data else { return Err(Error::format(path, format!("{name} is not F32"))) };
            weights.push((name, h.shape, v));
        }
        config.check_shapes(weights.iter().map(|(n, shape, _)| (n.as_str(), shape.as_slice()))).map_err(|e| disagrees(path, e))?;
        Ok(GptCheckpoint { config, vocab, weights })
    }
}

/// A check's failure as the file's: its configuration and its tensors disagree.
pub(crate) fn disagrees(path: &Path, e: Error) -> Error {
    match e {
        Error::Invalid { detail, .. } | Error::Shape { detail, .. } => {
            Error::format(path, format!("its run configuration and its tensors disagree: {detail}"))
        }
        e => e,
    }
}

impl GptConfig {
    /// The configuration and vocabulary of a file of `tandem train --model gpt`, checked
    /// against the file's tensors ([`GptCheckpoint::read`] keeps the weights too):
    ///
    /// ```no_run
    /// # fn main() -> tandem::Result<()> {
    /// let (cfg, vocab) = tandem::nn::models::GptConfig::from_checkpoint("runs/gpt/model.safetensors")?;
    /// println!("{} layers, {} tokens", cfg.n_layer, vocab.map_or(0, |v| v.len()));
    /// # Ok(()) }
    /// ```
    pub fn from_checkpoint(path: impl AsRef<Path>) -> Result<(GptConfig, Option<Tokenizer>)> {
        let c = GptCheckpoint::read(path)?;
        Ok((c.config, c.vocab))
    }

    /// The configuration and tokenizer that a file's `config` metadata entry claims (`vocab`,
    /// a character vocabulary, or `tokenizer: "gpt2"`), not yet checked against any tensor
    /// (see [`GptConfig::check_shapes`]). A missing or malformed entry, an unknown tokenizer
    /// or one with more ids than the model's `vocab_size` is an [`Error::Format`] of `path`.
    pub fn from_metadata(meta: &BTreeMap<String, String>, path: &Path) -> Result<(GptConfig, Option<Tokenizer>)> {
        let config: serde_json::Value = match meta.get("config") {
            Some(c) => serde_json::from_str(c).map_err(|e| Error::format(path, format!("metadata 'config' is not JSON: {e}")))?,
            None => {
                return Err(Error::format(path, "no run configuration in its metadata; give a checkpoint or --save file of tandem train --model gpt"))
            }
        };
        let bad = |what: &str| Error::format(path, format!("not a GPT checkpoint of tandem train --model gpt: {what}"));
        if config.get("model").and_then(|m| m.as_str()) != Some("gpt") {
            return Err(bad("its configuration names no gpt model"));
        }
        let g = config.get("gpt").ok_or_else(|| bad("no gpt configuration"))?;
        let n = |k: &str| g.get(k).and_then(serde_json::Value::as_u64).map(|v| v as usize).ok_or_else(|| bad(&format!("no {k}")));
        let cfg = GptConfig {
            n_layer: n("n_layer")?,
            n_head: n("n_head")?,
            n_embd: n("n_embd")?,
            block_size: n("block_size")?,
            vocab_size: n("vocab_size")?,
            dropout: g.get("dropout").and_then(serde_json::Value::as_f64).unwrap_or(0.0) as f32,
            bias: g.get("bias").and_then(serde_json::Value::as_bool).unwrap_or(true),
        };
        let vocab = match (config.get("tokenizer"), config.get("vocab").and_then(|v| v.as_str())) {
            (None | Some(serde_json::Value::Null), chars) => chars.map(|c| Tokenizer::Chars(CharVocab::from_text(c))),
            (Some(t), _) if t.as_str() == Some("gpt2") => Some(Tokenizer::gpt2()),
            (Some(t), _) => return Err(bad(&format!("its tokenizer {t} is not one of {}", Tokenizer::NAMES.join(", ")))),
        };
        match &vocab {
            Some(v @ Tokenizer::Chars(_)) if v.len() != cfg.vocab_size => {
                return Err(bad(&format!("its vocabulary has {} characters but vocab_size is {}", v.len(), cfg.vocab_size)));
            }
            // A padded vocabulary (nanoGPT's 50304) holds every id of the tokenizer.
            Some(v) if v.len() > cfg.vocab_size => {
                return Err(bad(&format!("its tokenizer {} has {} tokens but vocab_size is {}", v.name(), v.len(), cfg.vocab_size)));
            }
            _ => {}
        }
        Ok((cfg, vocab))
    }
}
