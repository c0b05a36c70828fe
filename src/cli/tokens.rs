//! Where a `--model gpt` run's tokens come from: `--data` (the built-in text, a text file or
//! a file of token ids) read with `--tokenizer` (the text's characters, or GPT-2's BPE).
use super::TrainArgs;
use clap::ValueEnum;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tandem::data::text::{builtin_text, read_text, Split, TextCorpus, TokenBatch, TokenWindows, BUILTIN_CHARS};
use tandem::data::{Batch, Gpt2Tokenizer, Tokenizer};
use tandem::{Error, Result};

/// The seed of `--data text`'s corpus: fixed, so that `--seed` changes the model, not the data.
const BUILTIN_CORPUS_SEED: u64 = 0;

/// `--tokenizer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TokenizerArg {
    Chars,
    Gpt2,
}

/// Where a GPT's tokens come from (`--data`, read with `--tokenizer`).
pub(super) enum Tokens {
    Text(Arc<TextCorpus>),
    /// Token ids, and the tokenizer they are ids of where `--tokenizer` names one.
    Windows(Arc<TokenWindows>, Option<Tokenizer>),
}

impl Tokens {
    /// The tokens of `--data` in `--tokenizer`'s ids.
    pub(super) fn of(args: &TrainArgs) -> Result<Tokens> {
        Tokens::load(&args.data, args.gpt.tokenizer)
    }

    fn load(data: &str, tokenizer: Option<TokenizerArg>) -> Result<Tokens> {
        let text = |text: &str, source: String| match tokenizer {
            Some(TokenizerArg::Gpt2) => TextCorpus::tokenized(text, Tokenizer::gpt2(), source),
            None | Some(TokenizerArg::Chars) => TextCorpus::from_text(text, source),
        };
        if data == "text" {
            let source = format!("the built-in corpus (seed {BUILTIN_CORPUS_SEED})");
            return Ok(Tokens::Text(Arc::new(text(&builtin_text(BUILTIN_CORPUS_SEED, BUILTIN_CHARS), source)?)));
        }
        match data.strip_prefix("text:") {
            Some("") => Err(Error::invalid("--data", "text: needs a file, as in text:input.txt")),
            Some(path) => Ok(Tokens::Text(Arc::new(text(&read_text(path)?, path.to_string())?))),
            None if data.ends_with(".safetensors") => {
                let mut w = TokenWindows::load(data)?;
                let tokenizer = match tokenizer {
                    None => None,
                    Some(TokenizerArg::Chars) => {
                        return Err(Error::invalid(
                            "--tokenizer",
                            format!("chars reads a text --data; {data} holds token ids (give gpt2 if they are GPT-2's)"),
                        ))
                    }
                    // The ids are GPT-2's: the model has its whole vocabulary, which `generate` decodes.
                    Some(TokenizerArg::Gpt2) if w.vocab_size > Gpt2Tokenizer::VOCAB_SIZE => {
                        let what = format!("gpt2 has {} tokens, but {data} has a vocabulary of {}", Gpt2Tokenizer::VOCAB_SIZE, w.vocab_size);
                        return Err(Error::invalid("--tokenizer", what));
                    }
                    Some(TokenizerArg::Gpt2) => {
                        w.vocab_size = Gpt2Tokenizer::VOCAB_SIZE;
                        Some(Tokenizer::gpt2())
                    }
                };
                Ok(Tokens::Windows(Arc::new(w), tokenizer))
            }
            None => Err(Error::invalid("--data", format!("'{data}' is not text, text:PATH or a PATH.safetensors of token ids (for --model gpt)"))),
        }
    }

    pub(super) fn vocab_size(&self) -> usize {
        match self {
            Tokens::Text(c) => c.vocab.len(),
            Tokens::Windows(w, _) => w.vocab_size,
        }
    }

    /// The tokenizer of the ids, where they come from text or `--tokenizer` names it.
    pub(super) fn tokenizer(&self) -> Option<&Tokenizer> {
        match self {
            Tokens::Text(c) => Some(&c.vocab),
            Tokens::Windows(_, t) => t.as_ref(),
        }
    }

    /// The window length: --block-size for text (64 by default); a file's `T`, which
    /// --block-size must then agree with.
    pub(super) fn block(&self, asked: Option<usize>) -> Result<usize> {
        match (self, asked) {
            (Tokens::Text(_), b) => Ok(b.unwrap_or(64)),
            (Tokens::Windows(w, _), Some(b)) if b != w.block => {
                Err(Error::invalid("--block-size", format!("{b}, but the token windows in --data are {} long", w.block)))
            }
            (Tokens::Windows(w, _), _) => Ok(w.block),
        }
    }

    /// `batch` random windows of `split` drawn from `rng`.
    pub(super) fn batch(&self, split: Split, batch: usize, block: usize, rng: &mut ChaCha8Rng) -> Result<Batch> {
        let TokenBatch { x, y, block, .. } = match self {
            Tokens::Text(c) => c.batch(split, batch, block, rng)?,
            Tokens::Windows(w, _) => w.batch(split, batch, rng)?,
        };
        Batch::tokens(x, y, block, self.vocab_size())
    }
}
