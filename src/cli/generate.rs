//! `tandem generate`: continue a prompt with a GPT from one checkpoint file, which carries the
//! model's shape and its character vocabulary in the run configuration (see `gpt::run_config`).
//! The configuration only names the shape: every parameter's name and shape is checked
//! against the tensors the file holds before anything is built, so a small file cannot ask
//! for a large model.
use super::GenerateArgs;
use tandem::train::run_file as checkpoints;
use tandem::checkpoint::read_safetensors;
use tandem::nn::models::{Gpt, GptCheckpoint};
use tandem::{Device, Error, Result, Tensor};

/// The metadata key of a `tandem-checkpoint-1` file's format, checked before its checksum.
const CHECKPOINT_FORMAT: &str = "tandem-checkpoint-1";

pub fn run(args: &GenerateArgs) -> Result<()> {
    let path = &args.init;
    if args.prompt.is_empty() {
        return Err(Error::invalid("--prompt", "must hold at least one character"));
    }
    let (tensors, meta) = read_safetensors(path)?;
    // A run checkpoint is sealed by a checksum: check it, so a damaged file is named as such.
    if meta.get("format").map(String::as_str) == Some(CHECKPOINT_FORMAT) {
        checkpoints::verify(path)?;
    }
    super::setup::finite_weights(path, &tensors)?;
    let GptCheckpoint { config: cfg, vocab, weights } = GptCheckpoint::from_parts(path, tensors, &meta)?;
    let vocab = vocab.ok_or_else(|| Error::format(path, "trained on token ids, not text: there is no character vocabulary to read a prompt with"))?;
    let prompt = vocab.encode(&args.prompt).map_err(|e| match e {
        Error::Invalid { detail, .. } => Error::invalid("--prompt", format!("{detail} of {}", path.display())),
        e => e,
    })?;
    let dev = Device::parse(&args.devices)?.into_iter().next().ok_or_else(|| Error::invalid("--devices", "names no device"))?;
    let weights = weights.into_iter().map(|(n, shape, v)| Ok((n, Tensor::from_vec(v, shape, &dev)?))).collect::<Result<Vec<_>>>()?;
    let model = Gpt::from_state_dict(cfg, &weights, &dev).map_err(|e| disagrees(path, e))?;
    let n = prompt.len();
    let ids = Tensor::from_labels(prompt, [1, n], &dev)?;
    let out = model.generate(&ids, args.tokens, args.temperature, args.top_k, args.seed)?.to_vec_i32()?;
    let text = vocab.decode(&out)?;
    out!("{text}");
    Ok(())
}

/// A model the file's configuration cannot take its weights into: the file's error, as
/// `GptCheckpoint::read` reports a disagreement it finds.
fn disagrees(path: &std::path::Path, e: Error) -> Error {
    match e {
        Error::Invalid { detail, .. } | Error::Shape { detail, .. } => Error::format(path, format!("its run configuration and its tensors disagree: {detail}")),
        e => e,
    }
}
