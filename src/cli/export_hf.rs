//! `tandem export-hf`: a GPT of `tandem train --model gpt` (a run checkpoint or a `--save`
//! file) written as a Hugging Face GPT-2 folder, `config.json` and `model.safetensors`, which
//! `transformers`' `GPT2LMHeadModel.from_pretrained(DIR)` loads (see
//! [`tandem::nn::models::hf_gpt2`]). `tandem train --init DIR` reads such a folder back.
use clap::Args;
use std::path::PathBuf;
use tandem::nn::models::hf_gpt2;
use tandem::{Device, Result, Tensor};

/// Flags of `tandem export-hf`.
#[derive(Clone, Debug, Args)]
pub struct ExportHfArgs {
    /// A checkpoint of `tandem train --model gpt` (from --checkpoint-dir, or its --save file).
    #[arg(long, value_name = "CKPT")]
    pub init: PathBuf,
    /// The folder to write (created if missing; its config.json and model.safetensors are
    /// replaced).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Reads and checks the checkpoint as `generate` does, then writes the folder.
pub fn run(args: &ExportHfArgs) -> Result<()> {
    let ckpt = super::generate::read_checkpoint(&args.init)?;
    let cpu = Device::cpu();
    let state = ckpt.weights.into_iter().map(|(n, shape, v)| Ok((n, Tensor::from_vec(v, shape, &cpu)?))).collect::<Result<Vec<_>>>()?;
    hf_gpt2::write(&args.out, &ckpt.config, &state)?;
    let tokenizer = ckpt.vocab.map_or("token ids".to_string(), |t| format!("tokenizer {}", t.name()));
    let c = &ckpt.config;
    let shape = format!("n_layer {}, n_head {}, n_embd {}, n_positions {}, vocab_size {}", c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size);
    out!("wrote {} ({} and {}): GPT-2 of {shape}; trained on {tokenizer}", args.out.display(), hf_gpt2::CONFIG_FILE, hf_gpt2::WEIGHTS_FILE);
    Ok(())
}
