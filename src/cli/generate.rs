//! `tandem generate`: continue a prompt with a GPT from one checkpoint file, which carries the
//! model's shape and its tokenizer in the run configuration (see `gpt::run_config`).
//! The configuration only names the shape: every parameter's name and shape is checked
//! against the tensors the file holds before anything is built, so a small file cannot ask
//! for a large model. The text is streamed as it is drawn (see [`run`]).
use super::GenerateArgs;
use std::io::Write;
use std::ops::ControlFlow;
use tandem::checkpoint::read_safetensors;
use tandem::nn::models::{Gpt, GptCheckpoint};
use tandem::train::run_file as checkpoints;
use tandem::{Device, Error, Result, Tensor};

/// The metadata key of a `tandem-checkpoint-1` file's format, checked before its checksum.
const CHECKPOINT_FORMAT: &str = "tandem-checkpoint-1";

/// Reads the checkpoint and the prompt, then writes the prompt and each drawn token to
/// standard output as it comes.
pub fn run(args: &GenerateArgs) -> Result<()> {
    let path = &args.init;
    if args.prompt.is_empty() {
        return Err(Error::invalid("--prompt", "must hold at least one character"));
    }
    let GptCheckpoint { config: cfg, vocab, weights } = read_checkpoint(path)?;
    let vocab = vocab.ok_or_else(|| Error::format(path, "trained on token ids, not text: there is no tokenizer to read a prompt with"))?;
    let prompt = vocab.encode(&args.prompt).map_err(|e| match e {
        Error::Invalid { detail, .. } => Error::invalid("--prompt", format!("{detail} of {}", path.display())),
        e => e,
    })?;
    let dev = Device::parse(&args.devices)?.into_iter().next().ok_or_else(|| Error::invalid("--devices", "names no device"))?;
    let weights = weights.into_iter().map(|(n, shape, v)| Ok((n, Tensor::from_vec(v, shape, &dev)?))).collect::<Result<Vec<_>>>()?;
    let model = Gpt::from_state_dict(cfg, &weights, &dev).map_err(|e| disagrees(path, e))?;
    let n = prompt.len();
    let ids = Tensor::from_labels(prompt, [1, n], &dev)?;
    // The prompt, then each token's bytes as it is drawn, then a newline: a reader sees the
    // text grow, and nothing but the model's context is kept however many --tokens are asked.
    // A GPT-2 token may end inside a character, whose next bytes come with the next token.
    let mut stdout = std::io::stdout();
    write(&mut stdout, args.prompt.as_bytes())?;
    model.generate_with(&ids, args.tokens, args.temperature, args.top_k, args.seed, |tokens| {
        write(&mut stdout, &vocab.decode_bytes(tokens)?)?;
        Ok(ControlFlow::Continue(()))
    })?;
    write(&mut stdout, b"\n")
}

/// A GPT file of `tandem train --model gpt`, checked: a run checkpoint's checksum, finite
/// weights, a configuration its tensors vouch for.
pub(super) fn read_checkpoint(path: &std::path::Path) -> Result<GptCheckpoint> {
    let (tensors, meta) = read_safetensors(path)?;
    // A run checkpoint is sealed by a checksum: check it, so a damaged file is named as such.
    if meta.get("format").map(String::as_str) == Some(CHECKPOINT_FORMAT) {
        checkpoints::verify(path)?;
    }
    super::setup::finite_weights(path, &tensors)?;
    GptCheckpoint::from_parts(path, tensors, &meta)
}

/// Writes and flushes `bytes` to standard output; a reader that has gone ends the process
/// quietly with status 141, as `out!` does (see `cli::write_out`).
fn write(stdout: &mut impl Write, bytes: &[u8]) -> Result<()> {
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(super::BROKEN_PIPE_STATUS),
        Err(e) => Err(Error::io("standard output", e)),
    }
}

/// A model the file's configuration cannot take its weights into: the file's error, as
/// `GptCheckpoint::read` reports a disagreement it finds.
fn disagrees(path: &std::path::Path, e: Error) -> Error {
    match e {
        Error::Invalid { detail, .. } | Error::Shape { detail, .. } => {
            Error::format(path, format!("its run configuration and its tensors disagree: {detail}"))
        }
        e => e,
    }
}
