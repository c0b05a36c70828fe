//! `tandem train --model gpt --init DIR` where DIR is a Hugging Face GPT-2 folder
//! (`config.json` and `model.safetensors`, as `save_pretrained` writes them): the model takes
//! the folder's shape, and its weights start the run. As nanoGPT's `crop_block_size`, a
//! shorter `--block-size` keeps the first rows of the position embeddings.
use super::gpt::Tokens;
use super::TrainArgs;
use std::path::Path;
use tandem::nn::models::hf_gpt2::{self, HfGpt2};
use tandem::nn::models::GptConfig;
use tandem::{Device, Error, Result, Tensor};

/// The folder `--init` names, if it names a folder (a file is a state dict).
pub(super) fn folder(args: &TrainArgs) -> Option<&Path> {
    args.init.as_deref().filter(|p| p.is_dir())
}

/// The model of the folder's `config.json`: the shape flags, where given, must agree with it;
/// the windows are `--block-size` long (the folder's `n_positions` by default, at most that);
/// `--dropout` replaces the folder's; the data's tokenizer must have the model's vocabulary.
pub(super) fn config(args: &TrainArgs, data: &Tokens, dir: &Path) -> Result<GptConfig> {
    let g = &args.gpt;
    let hf = hf_gpt2::read_config(dir.join(hf_gpt2::CONFIG_FILE))?;
    let init = dir.display();
    for (flag, given, theirs) in [("--n-layer", g.n_layer, hf.n_layer), ("--n-head", g.n_head, hf.n_head), ("--n-embd", g.n_embd, hf.n_embd)] {
        if let Some(n) = given.filter(|&n| n != theirs) {
            return Err(Error::invalid(flag, format!("{n}, but the model of --init {init} has {theirs}")));
        }
    }
    let asked = match data {
        Tokens::Text(_) => Some(g.block_size.unwrap_or(hf.block_size)),
        Tokens::Windows(..) => g.block_size,
    };
    let block = data.block(asked)?;
    if block > hf.block_size {
        return Err(Error::invalid(
            "--block-size",
            format!("windows of {block} tokens, but the model of --init {init} reads at most {} (n_positions)", hf.block_size),
        ));
    }
    if data.vocab_size() != hf.vocab_size {
        let what = format!(
            "the model of --init {init} has a vocabulary of {} tokens, but --data has {} (for GPT-2's folders give --tokenizer gpt2)",
            hf.vocab_size,
            data.vocab_size()
        );
        return Err(Error::invalid("--tokenizer", what));
    }
    Ok(GptConfig { block_size: block, dropout: g.dropout.unwrap_or(hf.dropout), ..hf })
}

/// The folder's weights for a model of `cfg` (as [`config`] gave it): the position embeddings
/// cut to `cfg.block_size` rows.
pub(super) fn weights(dir: &Path, cfg: &GptConfig) -> Result<Vec<(String, Tensor)>> {
    let mut hf = HfGpt2::read(dir)?;
    if hf.config.n_layer != cfg.n_layer || hf.config.n_embd != cfg.n_embd || hf.config.vocab_size != cfg.vocab_size {
        return Err(Error::format(dir, "the folder changed while the run started: its model is not the one its config.json gave"));
    }
    for (name, t) in &mut hf.weights {
        if name == "transformer.wpe.weight" {
            t.shape[0] = cfg.block_size;
            if let tandem::checkpoint::HostData::F32(v) = &mut t.data {
                v.truncate(cfg.block_size * cfg.n_embd);
            }
        }
    }
    hf.tensors(&Device::cpu())
}
