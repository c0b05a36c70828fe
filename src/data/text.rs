//! Token data for language models: text as nanoGPT's shakespeare_char (a vocabulary of the
//! sorted unique characters) or as GPT-2's byte-level BPE ([`Tokenizer`]), a 90/10
//! train/validation split, random windows with the next tokens as targets, a built-in corpus
//! generated from a seed, and windows of
//! token ids from a safetensors file or cut from a token stream, which a
//! [`WindowLoader`](super::WindowLoader) serves in epochs.
use super::Tokenizer;
use crate::checkpoint::{host_from_view, parse, HostData};
use crate::{Error, Result};
use rand::{Rng, SeedableRng};
use std::path::Path;

/// The share of the tokens (or rows) that train; the rest validate.
pub const TRAIN_FRACTION: f64 = 0.9;

/// The length of [`TextCorpus::builtin`]'s text, in characters (ASCII: bytes).
pub const BUILTIN_CHARS: usize = 200_000;

/// Which part of the data a batch is drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Val,
}

/// Token ids `x` `[batch, block]` and their next tokens `y` (same shape), row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBatch {
    pub x: Vec<i32>,
    pub y: Vec<i32>,
    pub batch: usize,
    pub block: usize,
}

/// The characters of a text, sorted and unique; a character's id is its position.
///
/// ```
/// use tandem::data::text::CharVocab;
/// let v = CharVocab::from_text("hello");
/// assert_eq!(v.chars(), ['e', 'h', 'l', 'o']);
/// assert_eq!(v.encode("hole")?, [1, 3, 2, 0]);
/// assert_eq!(v.decode(&[1, 0, 2, 2, 3])?, "hello");
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharVocab {
    chars: Vec<char>,
}

impl CharVocab {
    pub fn from_text(text: &str) -> CharVocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        CharVocab { chars }
    }
    pub fn chars(&self) -> &[char] {
        &self.chars
    }
    pub fn len(&self) -> usize {
        self.chars.len()
    }
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }
    /// The ids of `text`'s characters; a character outside the vocabulary is an error.
    pub fn encode(&self, text: &str) -> Result<Vec<i32>> {
        text.chars()
            .enumerate()
            .map(|(i, c)| match self.chars.binary_search(&c) {
                Ok(id) => Ok(id as i32),
                Err(_) => Err(Error::invalid(
                    "CharVocab::encode",
                    format!("character {c:?} at position {i} is not in the vocabulary of {} characters", self.len()),
                )),
            })
            .collect()
    }
    /// The text of `ids`; an id outside `0..len()` is an error.
    pub fn decode(&self, ids: &[i32]) -> Result<String> {
        ids.iter()
            .enumerate()
            .map(|(i, &id)| {
                usize::try_from(id).ok().and_then(|k| self.chars.get(k).copied()).ok_or(Error::Label {
                    op: "CharVocab::decode",
                    label: id,
                    index: i,
                    classes: self.len(),
                })
            })
            .collect()
    }
}

/// A text corpus: its tokenizer and its tokens, split 90/10 by position.
#[derive(Clone)]
pub struct TextCorpus {
    /// The text's characters ([`TextCorpus::from_text`]) or another [`Tokenizer`]
    /// ([`TextCorpus::tokenized`]).
    pub vocab: Tokenizer,
    pub train: Vec<i32>,
    pub val: Vec<i32>,
    /// Where the text came from (a path, or the built-in corpus and its seed), for errors.
    pub source: String,
}

impl TextCorpus {
    /// The corpus of `text` over its own characters; `source` names it in errors.
    pub fn from_text(text: &str, source: impl Into<String>) -> Result<TextCorpus> {
        TextCorpus::tokenized(text, CharVocab::from_text(text).into(), source)
    }
    /// The corpus of `text` in the ids of `tokenizer` (GPT-2's BPE, or a character vocabulary
    /// that holds every character of `text`); `source` names it in errors.
    ///
    /// ```
    /// use tandem::data::{text::TextCorpus, Tokenizer};
    /// let c = TextCorpus::tokenized(&"Hello world. ".repeat(10), Tokenizer::gpt2(), "greetings")?;
    /// assert_eq!((c.vocab.len(), c.train.len() + c.val.len()), (50_257, 31));
    /// assert_eq!(&c.train[..3], [15496, 995, 13]);
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn tokenized(text: &str, tokenizer: Tokenizer, source: impl Into<String>) -> Result<TextCorpus> {
        let source = source.into();
        let tokens = tokenizer.encode(text)?;
        if tokens.len() < 2 {
            let unit = if matches!(tokenizer, Tokenizer::Chars(_)) { "characters" } else { "tokens" };
            return Err(Error::invalid("text data", format!("{source}: {} {unit}; a corpus needs at least 2", tokens.len())));
        }
        let n = (tokens.len() as f64 * TRAIN_FRACTION) as usize;
        Ok(TextCorpus { vocab: tokenizer, val: tokens[n..].to_vec(), train: tokens[..n].to_vec(), source })
    }
    /// The corpus of a UTF-8 text file over its own characters.
    pub fn from_file(path: impl AsRef<Path>) -> Result<TextCorpus> {
        let path = path.as_ref();
        let text = read_text(path)?;
        TextCorpus::from_text(&text, path.display().to_string())
    }
    /// The corpus of a UTF-8 text file in the ids of `tokenizer`, as [`TextCorpus::tokenized`].
    pub fn from_file_tokenized(path: impl AsRef<Path>, tokenizer: Tokenizer) -> Result<TextCorpus> {
        let path = path.as_ref();
        let text = read_text(path)?;
        TextCorpus::tokenized(&text, tokenizer, path.display().to_string())
    }
    /// The built-in corpus ([`builtin_text`] of `seed`, [`BUILTIN_CHARS`] long): no download.
    pub fn builtin(seed: u64) -> TextCorpus {
        TextCorpus::from_text(&builtin_text(seed, BUILTIN_CHARS), format!("the built-in corpus (seed {seed})")).expect("the built-in text is long")
    }
    pub fn tokens(&self, split: Split) -> &[i32] {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }
    /// `batch` windows of `block` tokens at random starts in `split` (nanoGPT's `get_batch`):
    /// `x` = tokens `i..i+block`, `y` = tokens `i+1..i+block+1`.
    pub fn batch(&self, split: Split, batch: usize, block: usize, rng: &mut impl Rng) -> Result<TokenBatch> {
        let data = self.tokens(split);
        if batch == 0 || block == 0 {
            return Err(Error::invalid("text data", format!("{}: batch {batch} and block {block} must be at least 1", self.source)));
        }
        if data.len() <= block {
            return Err(Error::invalid(
                "text data",
                format!("{}: the {split:?} split holds {} tokens; windows of {block} need at least {}", self.source, data.len(), block + 1),
            ));
        }
        let (mut x, mut y) = (batch_vec(batch, block)?, batch_vec(batch, block)?);
        for _ in 0..batch {
            let i = rng.random_range(0..data.len() - block);
            x.extend_from_slice(&data[i..i + block]);
            y.extend_from_slice(&data[i + 1..i + block + 1]);
        }
        Ok(TokenBatch { x, y, batch, block })
    }
    /// The unigram entropy of the whole corpus in nats: the loss of a model that knows only
    /// the characters' frequencies.
    pub fn unigram_entropy(&self) -> f64 {
        unigram_entropy(&[self.train.as_slice(), self.val.as_slice()].concat())
    }
}

/// The text of a UTF-8 file; other bytes are an error naming the file.
pub fn read_text(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    String::from_utf8(bytes).map_err(|e| Error::format(path, format!("not UTF-8 text: {e}")))
}

/// `-Σ p ln p` over the frequencies `p` of the distinct values in `tokens`, in nats (0 when empty).
///
/// ```
/// let h = tandem::data::text::unigram_entropy(&[0, 0, 1, 1]);
/// assert!((h - 2f64.ln()).abs() < 1e-12);
/// ```
pub fn unigram_entropy(tokens: &[i32]) -> f64 {
    let mut counts = std::collections::HashMap::new();
    for &t in tokens {
        *counts.entry(t).or_insert(0usize) += 1;
    }
    let n = tokens.len() as f64;
    counts.values().map(|&c| c as f64 / n).map(|p| -p * p.ln()).sum()
}

/// The largest vocabulary a token file may give a model (2^20 = 1,048,576 ids; GPT-2's is
/// 50,257, the largest common ones about 256k): a model is sized by its vocabulary, so one
/// stray id must not ask for gigabytes.
pub const MAX_VOCAB: usize = 1 << 20;

/// The safetensors metadata key of a token file's vocabulary size (a decimal string).
pub const VOCAB_SIZE_KEY: &str = "vocab_size";

/// Windows of token ids from a safetensors file: `x` and `y` (I64 or I32) of one shape
/// `[N, T]`, `y` the next tokens of `x`. [`TokenWindows::batch`] draws rows at random from a
/// [`Split`]: the first 90% train, the rest validate; a [`WindowLoader`](super::WindowLoader)
/// serves chosen rows in epochs instead.
///
/// The vocabulary is the file's `vocab_size` metadata where it has one (every id must lie
/// below it), else the largest id plus one; either way at most [`MAX_VOCAB`]. An id past the
/// limit is an error naming the file, the tensor, the id and the limit.
pub struct TokenWindows {
    pub x: Vec<i32>,
    pub y: Vec<i32>,
    pub rows: usize,
    pub block: usize,
    /// The file's `vocab_size` metadata, else the largest id in `x` or `y` plus one.
    pub vocab_size: usize,
    path: String,
}

/// The `vocab_size` metadata of a token file, checked against [`MAX_VOCAB`].
fn declared_vocab(path: &Path, bytes: &[u8]) -> Result<Option<usize>> {
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
    let Some(text) = meta.metadata().as_ref().and_then(|m| m.get(VOCAB_SIZE_KEY)) else { return Ok(None) };
    match text.trim().parse::<usize>() {
        Ok(v) if (1..=MAX_VOCAB).contains(&v) => Ok(Some(v)),
        _ => Err(Error::format(path, format!("metadata {VOCAB_SIZE_KEY} = {text:?}: expected a whole number in 1..={MAX_VOCAB}"))),
    }
}

impl TokenWindows {
    pub fn load(path: impl AsRef<Path>) -> Result<TokenWindows> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let st = parse(path, &bytes)?;
        let declared = declared_vocab(path, &bytes)?;
        let (limit, why) = match declared {
            Some(v) => (v, format!("its metadata {VOCAB_SIZE_KEY}")),
            None => (MAX_VOCAB, "the largest vocabulary tandem takes from a token file".to_string()),
        };
        let read = |name: &str| -> Result<(Vec<i32>, Vec<usize>)> {
            let view = st
                .tensor(name)
                .map_err(|_| Error::format(path, format!("no tensor named '{name}'; token windows need x and y, I64 or I32 [N, T]")))?;
            if !matches!(view.dtype(), safetensors::Dtype::I64 | safetensors::Dtype::I32) {
                return Err(Error::format(path, format!("{name} has dtype {:?}; token ids must be I64 or I32", view.dtype())));
            }
            let HostData::I32(ids) = host_from_view(path, name, &view)?.data else {
                return Err(Error::format(path, format!("{name} did not decode to integers")));
            };
            if let Some((i, &id)) = ids.iter().enumerate().find(|&(_, &id)| id < 0) {
                return Err(Error::format(path, format!("{name} holds the negative token id {id} at flat index {i}")));
            }
            if let Some((i, &id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= limit) {
                return Err(Error::format(path, format!("{name} holds the token id {id} at flat index {i}, outside 0..{limit} ({why})")));
            }
            Ok((ids, view.shape().to_vec()))
        };
        let ((x, xs), (y, ys)) = (read("x")?, read("y")?);
        if xs.len() != 2 || xs.contains(&0) || xs != ys {
            return Err(Error::format(path, format!("x {xs:?} and y {ys:?} must have one shape [N, T] with N, T >= 1")));
        }
        let vocab_size = declared.unwrap_or_else(|| x.iter().chain(&y).map(|&id| id as usize + 1).max().unwrap_or(0));
        Ok(TokenWindows { x, y, rows: xs[0], block: xs[1], vocab_size, path: path.display().to_string() })
    }
    /// Windows of `block` tokens cut from a stream of token ids end to end (`x` row `r` =
    /// tokens `r·block..(r+1)·block`, `y` the same shifted by one), every id in
    /// `0..vocab_size`: a text's tokens as rows a [`WindowLoader`](super::WindowLoader) serves
    /// in epochs. `source` names the tokens in errors. The tokens past the last whole window
    /// (and its next token) are left out.
    ///
    /// ```
    /// use tandem::data::text::TokenWindows;
    /// let w = TokenWindows::from_tokens(&[0, 1, 2, 3, 4, 5, 6], 3, 7, "seven tokens")?;
    /// assert_eq!((w.rows, w.block), (2, 3));
    /// assert_eq!((w.x.as_slice(), w.y.as_slice()), (&[0, 1, 2, 3, 4, 5][..], &[1, 2, 3, 4, 5, 6][..]));
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn from_tokens(tokens: &[i32], block: usize, vocab_size: usize, source: impl Into<String>) -> Result<TokenWindows> {
        let path = source.into();
        if block == 0 || tokens.len() <= block {
            return Err(Error::invalid(
                "TokenWindows::from_tokens",
                format!("{path}: {} tokens hold no window of {block} and its next token", tokens.len()),
            ));
        }
        if !(1..=MAX_VOCAB).contains(&vocab_size) {
            return Err(Error::invalid("TokenWindows::from_tokens", format!("{path}: vocabulary size {vocab_size} is outside 1..={MAX_VOCAB}")));
        }
        if let Some((i, &id)) = tokens.iter().enumerate().find(|&(_, &id)| id < 0 || id as usize >= vocab_size) {
            return Err(Error::invalid("TokenWindows::from_tokens", format!("{path}: token id {id} at position {i} is outside 0..{vocab_size}")));
        }
        let rows = (tokens.len() - 1) / block;
        let (mut x, mut y) = (batch_vec(rows, block)?, batch_vec(rows, block)?);
        x.extend_from_slice(&tokens[..rows * block]);
        y.extend_from_slice(&tokens[1..rows * block + 1]);
        Ok(TokenWindows { x, y, rows, block, vocab_size, path })
    }
    /// The file (or other source) the windows came from, as errors name it.
    pub fn source(&self) -> &str {
        &self.path
    }
    /// The rows of `split`: the first 90% train, the rest validate.
    pub fn rows_of(&self, split: Split) -> std::ops::Range<usize> {
        let n = (self.rows as f64 * TRAIN_FRACTION) as usize;
        match split {
            Split::Train => 0..n,
            Split::Val => n..self.rows,
        }
    }
    /// `batch` rows of `split` drawn at random (with replacement).
    pub fn batch(&self, split: Split, batch: usize, rng: &mut impl Rng) -> Result<TokenBatch> {
        let rows = self.rows_of(split);
        if rows.is_empty() || batch == 0 {
            return Err(Error::invalid(
                "token windows",
                format!("{}: a batch of {batch} from the {split:?} split, which has {} of the {} rows", self.path, rows.len(), self.rows),
            ));
        }
        self.batch_from(rows, batch, rng)
    }
    /// `batch` rows of `rows` drawn at random (with replacement), as [`TokenWindows::batch`]
    /// draws them from a split.
    pub fn batch_from(&self, rows: std::ops::Range<usize>, batch: usize, rng: &mut impl Rng) -> Result<TokenBatch> {
        if rows.is_empty() || batch == 0 || rows.end > self.rows {
            return Err(Error::invalid("token windows", format!("{}: a batch of {batch} from rows {rows:?} of the {} rows", self.path, self.rows)));
        }
        let t = self.block;
        let (mut x, mut y) = (batch_vec(batch, t)?, batch_vec(batch, t)?);
        for _ in 0..batch {
            let r = rng.random_range(rows.clone());
            x.extend_from_slice(&self.x[r * t..(r + 1) * t]);
            y.extend_from_slice(&self.y[r * t..(r + 1) * t]);
        }
        Ok(TokenBatch { x, y, batch, block: t })
    }
}

/// The source, the token counts and the vocabulary; not the ids.
impl std::fmt::Debug for TextCorpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TextCorpus({}: {} training and {} validation tokens, vocabulary {})",
            self.source,
            self.train.len(),
            self.val.len(),
            self.vocab.len()
        )
    }
}

/// The source, the shape and the vocabulary; not the ids.
impl std::fmt::Debug for TokenWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenWindows({}: {} rows of {} tokens, vocabulary {})", self.source(), self.rows, self.block, self.vocab_size)
    }
}

/// Room for `batch` windows of `block` ids: `OutOfMemory` (not an abort) for a `--batch` the
/// host cannot hold.
fn batch_vec(batch: usize, block: usize) -> Result<Vec<i32>> {
    crate::backend::host::try_vec(batch.saturating_mul(block), "host", &format!("a batch of {batch} windows of {block} tokens"))
}

/// English-like text of `chars` characters from a small grammar, the same for a seed: sentences
/// whose verbs agree with singular or plural subjects, places and times, quoted speech, and
/// counting rhymes, in paragraphs. Enough structure that a small model's loss falls well below
/// the unigram entropy; nothing to download.
pub fn builtin_text(seed: u64, chars: usize) -> String {
    let mut g = Grammar { rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed) };
    let mut text = String::with_capacity(chars + 512);
    while text.len() < chars {
        let sentences = g.rng.random_range(3..7);
        let paragraph: Vec<String> = (0..sentences).map(|_| capitalise(&g.sentence())).collect();
        text.push_str(&paragraph.join(" "));
        text.push('\n');
    }
    text.truncate(chars);
    text
}

const NAMES: [&str; 8] = ["Ada", "Bram", "Cora", "Dov", "Elin", "Finn", "Gus", "Hana"];
const ADJECTIVES: [&str; 8] = ["old", "young", "red", "small", "quiet", "brave", "grey", "tall"];
/// (singular, plural)
const NOUNS: [(&str, &str); 8] = [
    ("fox", "foxes"),
    ("hen", "hens"),
    ("king", "kings"),
    ("child", "children"),
    ("miller", "millers"),
    ("crow", "crows"),
    ("wolf", "wolves"),
    ("sailor", "sailors"),
];
/// (with a singular subject, with a plural one)
const VERBS: [(&str, &str); 7] = [
    ("sees", "see"),
    ("follows", "follow"),
    ("sings to", "sing to"),
    ("waits for", "wait for"),
    ("finds", "find"),
    ("carries", "carry"),
    ("watches", "watch"),
];
const PLACES: [&str; 6] = ["by the river", "in the wood", "at the mill", "on the hill", "under the bridge", "near the sea"];
const TIMES: [&str; 4] = ["at dawn", "at night", "in spring", "after the rain"];
const NUMBERS: [&str; 6] = ["one", "two", "three", "four", "five", "six"];

struct Grammar {
    rng: rand_chacha::ChaCha8Rng,
}

impl Grammar {
    fn pick<'a>(&mut self, words: &[&'a str]) -> &'a str {
        words[self.rng.random_range(0..words.len())]
    }
    /// A noun phrase and whether it is plural.
    fn subject(&mut self) -> (String, bool) {
        if self.rng.random_bool(0.25) {
            return (self.pick(&NAMES).to_string(), false);
        }
        let plural = self.rng.random_bool(0.4);
        let (sg, pl) = NOUNS[self.rng.random_range(0..NOUNS.len())];
        let det = if plural { self.pick(&["the", "two", "three", "some", "many"]) } else { self.pick(&["the", "a", "one", "that"]) };
        let adj = if self.rng.random_bool(0.5) { format!("{} ", self.pick(&ADJECTIVES)) } else { String::new() };
        let det = if det == "a" && adj.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { det };
        (format!("{det} {adj}{}", if plural { pl } else { sg }), plural)
    }
    fn clause(&mut self) -> String {
        let (subj, plural) = self.subject();
        let (sg, pl) = VERBS[self.rng.random_range(0..VERBS.len())];
        let (obj, _) = self.subject();
        let mut c = format!("{subj} {} {obj}", if plural { pl } else { sg });
        if self.rng.random_bool(0.5) {
            c = format!("{c} {}", self.pick(&PLACES));
        }
        c
    }
    fn sentence(&mut self) -> String {
        match self.rng.random_range(0..10) {
            0..=4 => format!("{}.", self.clause()),
            5 | 6 => format!("{}, {}.", self.pick(&TIMES), self.clause()),
            7 | 8 => {
                let name = self.pick(&NAMES);
                let said = self.pick(&["said", "asked", "sang"]);
                let end = if said == "asked" { "?" } else { "!" };
                format!("{name} {said}, \"{}{end}\"", capitalise(&self.clause()))
            }
            _ => {
                let (sg, pl) = NOUNS[self.rng.random_range(0..NOUNS.len())];
                let n = self.rng.random_range(2..=NUMBERS.len());
                let counted: Vec<String> = NUMBERS[..n].iter().enumerate().map(|(i, k)| format!("{k} {}", if i == 0 { sg } else { pl })).collect();
                format!("{}.", counted.join(", "))
            }
        }
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}
