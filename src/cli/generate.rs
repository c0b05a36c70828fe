//! `tandem generate`: continue a prompt with a GPT from one checkpoint file, which carries the
//! model's shape and its character vocabulary in the run configuration (see `gpt::run_config`).
//! The configuration only names the shape: every parameter's name and shape is checked
//! against the tensors the file holds before anything is built, so a small file cannot ask
//! for a large model.
use super::{checkpoints, gpt, GenerateArgs};
use crate::checkpoint::{read_safetensors, HostData};
use crate::nn::models::Gpt;
use crate::{Device, Error, Result, Tensor};

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
    let config: serde_json::Value = match meta.get("config") {
        Some(c) => serde_json::from_str(c).map_err(|e| Error::format(path, format!("metadata 'config' is not JSON: {e}")))?,
        None => return Err(Error::format(path, "no run configuration in its metadata; give a checkpoint or --save file of tandem train --model gpt")),
    };
    let (cfg, vocab) = gpt::config_of(&config, path)?;
    let vocab = vocab.ok_or_else(|| Error::format(path, "trained on token ids, not text: there is no character vocabulary to read a prompt with"))?;
    let prompt = vocab.encode(&args.prompt).map_err(|e| match e {
        Error::Invalid { detail, .. } => Error::invalid("--prompt", format!("{detail} of {}", path.display())),
        e => e,
    })?;
    let mut weights = Vec::new();
    for (name, h) in tensors {
        // A run checkpoint holds `model.*` weights beside `optim.*` state; a --save file only weights.
        let name = match name.strip_prefix("model.") {
            Some(n) => n.to_string(),
            None if name.starts_with("optim.") => continue,
            None => name,
        };
        let HostData::F32(v) = h.data else { return Err(Error::format(path, format!("{name} is not F32"))) };
        weights.push((name, h.shape, v));
    }
    // The configuration is metadata: only the tensors the file holds may size the model.
    let disagrees = |e: Error| match e {
        Error::Invalid { detail, .. } | Error::Shape { detail, .. } => Error::format(path, format!("its run configuration and its tensors disagree: {detail}")),
        e => e,
    };
    cfg.check_shapes(weights.iter().map(|(n, shape, _)| (n.as_str(), shape.as_slice()))).map_err(disagrees)?;
    let dev = Device::parse(&args.devices)?.into_iter().next().ok_or_else(|| Error::invalid("--devices", "names no device"))?;
    let weights = weights.into_iter().map(|(n, shape, v)| Ok((n, Tensor::from_vec(v, shape, &dev)?))).collect::<Result<Vec<_>>>()?;
    let model = Gpt::from_state_dict(cfg, &weights, &dev).map_err(disagrees)?;
    let n = prompt.len();
    let ids = Tensor::from_labels(prompt, [1, n], &dev)?;
    let out = model.generate(&ids, args.tokens, args.temperature, args.top_k, args.seed)?.to_vec_i32()?;
    let text = vocab.decode(&out)?;
    out!("{text}");
    Ok(())
}
