//! Tokenizers for text: a text's own characters ([`CharVocab`], nanoGPT's shakespeare_char), or
//! GPT-2's byte-level BPE ([`Gpt2Tokenizer`], the 50,257 tokens of OpenAI's `r50k_base`
//! encoding, embedded by the `tiktoken-rs` crate: nothing is downloaded).
use super::text::CharVocab;
use crate::{Error, Result};

/// How text becomes token ids and back.
///
/// ```
/// use tandem::data::Tokenizer;
/// let gpt2 = Tokenizer::gpt2();
/// assert_eq!(gpt2.len(), 50_257);
/// let ids = gpt2.encode("Hello world")?;
/// assert_eq!(ids, [15496, 995]);
/// assert_eq!(gpt2.decode(&ids)?, "Hello world");
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tokenizer {
    /// One id per character, the characters of a vocabulary (`--tokenizer chars`).
    Chars(CharVocab),
    /// GPT-2's byte-level BPE (`--tokenizer gpt2`).
    Gpt2(Gpt2Tokenizer),
}

impl Tokenizer {
    /// The names [`Tokenizer::by_name`] takes, as `--tokenizer` lists them.
    pub const NAMES: [&'static str; 2] = ["chars", "gpt2"];

    /// GPT-2's byte-level BPE.
    pub fn gpt2() -> Tokenizer {
        Tokenizer::Gpt2(Gpt2Tokenizer::new())
    }

    /// The tokenizer called `name` for `text`: `chars` (the text's own characters) or `gpt2`;
    /// another name is an error naming it.
    pub fn by_name(name: &str, text: &str) -> Result<Tokenizer> {
        match name {
            "chars" => Ok(Tokenizer::Chars(CharVocab::from_text(text))),
            "gpt2" => Ok(Tokenizer::gpt2()),
            _ => Err(Error::invalid("--tokenizer", format!("'{name}' is not one of {}", Tokenizer::NAMES.join(", ")))),
        }
    }

    /// `chars` or `gpt2`.
    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Chars(_) => "chars",
            Tokenizer::Gpt2(_) => "gpt2",
        }
    }

    /// The number of token ids: every id lies in `0..len()`.
    pub fn len(&self) -> usize {
        match self {
            Tokenizer::Chars(v) => v.len(),
            Tokenizer::Gpt2(_) => Gpt2Tokenizer::VOCAB_SIZE,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of `text`. A character outside a [`CharVocab`] is an error; GPT-2's BPE takes
    /// any text.
    pub fn encode(&self, text: &str) -> Result<Vec<i32>> {
        match self {
            Tokenizer::Chars(v) => v.encode(text),
            Tokenizer::Gpt2(t) => Ok(t.encode(text)),
        }
    }

    /// The bytes (UTF-8) of `ids`; an id outside `0..len()` is an error. A GPT-2 token may
    /// hold part of a character: the bytes of consecutive calls concatenate to the text.
    pub fn decode_bytes(&self, ids: &[i32]) -> Result<Vec<u8>> {
        match self {
            Tokenizer::Chars(v) => Ok(v.decode(ids)?.into_bytes()),
            Tokenizer::Gpt2(t) => t.decode_bytes(ids),
        }
    }

    /// The text of `ids`; bytes that are not UTF-8 (a character cut between tokens) become
    /// U+FFFD, as `tiktoken`'s and Hugging Face's `decode` do.
    pub fn decode(&self, ids: &[i32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }
}

impl From<CharVocab> for Tokenizer {
    fn from(v: CharVocab) -> Tokenizer {
        Tokenizer::Chars(v)
    }
}

/// GPT-2's byte-level BPE: OpenAI's `r50k_base` encoding, the `encoder.json` and `vocab.bpe`
/// of GPT-2 and of Hugging Face's `GPT2Tokenizer`. Text is encoded as ordinary text
/// (`tiktoken`'s `encode_ordinary`, nanoGPT's `prepare.py`): a literal `<|endoftext|>` in it
/// is text, not [`Gpt2Tokenizer::END_OF_TEXT`]. The tables are built once per process, on first
/// use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Gpt2Tokenizer;

impl Gpt2Tokenizer {
    /// 50,000 merges, 256 bytes and `<|endoftext|>`.
    pub const VOCAB_SIZE: usize = 50_257;
    /// The id of `<|endoftext|>`, which separates documents.
    pub const END_OF_TEXT: i32 = 50_256;

    pub fn new() -> Gpt2Tokenizer {
        Gpt2Tokenizer
    }

    fn bpe() -> &'static tiktoken_rs::CoreBPE {
        tiktoken_rs::r50k_base_singleton()
    }

    /// The ids of `text`, all in `0..50256`.
    pub fn encode(&self, text: &str) -> Vec<i32> {
        // Ranks are below VOCAB_SIZE, so they fit an i32.
        Gpt2Tokenizer::bpe().encode_ordinary(text).into_iter().map(|r| r as i32).collect()
    }

    /// The bytes of `ids`; an id outside `0..50257` is an error naming it and its position.
    pub fn decode_bytes(&self, ids: &[i32]) -> Result<Vec<u8>> {
        if let Some((i, &id)) = ids.iter().enumerate().find(|&(_, &id)| !(0..Gpt2Tokenizer::VOCAB_SIZE as i32).contains(&id)) {
            return Err(Error::Label { op: "Gpt2Tokenizer::decode", label: id, index: i, classes: Gpt2Tokenizer::VOCAB_SIZE });
        }
        let ranks: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
        Gpt2Tokenizer::bpe().decode_bytes(&ranks).map_err(|e| Error::invalid("Gpt2Tokenizer::decode", format!("token id {} has no bytes", e.token)))
    }
}
