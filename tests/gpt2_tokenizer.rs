//! GPT-2's byte-level BPE ([`Tokenizer::gpt2`]) against the reference implementation, OpenAI's
//! `tiktoken` (scripts/gpt2_tokens.py), on a generated multilingual text of emoji and runs of
//! whitespace. Without Python's `tiktoken` the comparison is skipped, or fails under CI=true
//! (scripts/test.sh installs it).
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::Command;
use tandem::data::text::{Split, TextCorpus};
use tandem::data::{Gpt2Tokenizer, Tokenizer};
use tandem::Error;

/// Words and fragments of many scripts, emoji (with skin tones, ZWJ sequences and flags),
/// digits, contractions, code and markup.
const PIECES: &[&str] = &[
    "the",
    "The",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "don't",
    "I'm",
    "we've",
    "they'll",
    "she'd",
    "you're",
    "it's",
    "IT'S",
    "O'Neil",
    "rock'n'roll",
    "Straße",
    "Müller",
    "naïve",
    "façade",
    "crème brûlée",
    "Ærøskøbing",
    "Привет",
    "мир",
    "съешь",
    "Ελληνικά",
    "λόγος",
    "日本語",
    "東京",
    "こんにちは",
    "カタカナ",
    "中文",
    "汉字",
    "你好世界",
    "한국어",
    "안녕하세요",
    "العربية",
    "مرحبا",
    "עברית",
    "שלום",
    "हिन्दी",
    "नमस्ते",
    "ภาษาไทย",
    "สวัสดี",
    "Tiếng Việt",
    "ქართული",
    "Հայերեն",
    "😀",
    "😂🤣",
    "👍🏽",
    "👩‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇯🇵",
    "🇺🇸🇬🇧",
    "❤️",
    "🤖",
    "🧑🏿‍🚀",
    "✨🎉",
    "0",
    "42",
    "3.14159",
    "1,000,000",
    "2026-12-07",
    "12:30",
    "$9.99",
    "100%",
    "#1",
    "v0.12.1",
    "0x7fff",
    "1e-4",
    "fn main() { println!(\"hi\"); }",
    "x = [1, 2, 3]",
    "if (a && b) || c:",
    "<div class=\"x\">",
    "</div>",
    "https://example.com/a?b=c&d=e",
    "user@example.org",
    "C:\\Windows\\System32",
    "¯\\_(ツ)_/¯",
    "...",
    "—",
    "–",
    "«»",
    "“quoted”",
    "‘single’",
    "¿Qué?",
    "¡Sí!",
    "<|endoftext|>",
    "\u{200b}",
    "\u{feff}",
    "a\u{301}",
    "ﬁ",
    "Ⅻ",
    "①②③",
];

/// Whitespace between pieces: spaces, tabs, newlines, CRLF, no-break and ideographic spaces,
/// and long runs of each.
const GAPS: &[&str] = &[
    " ", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\t\t", " \t ", "\u{a0}", "\u{3000}", "\u{2003}", "\u{85}",
    "\u{2028}", "", "",
];

/// `bytes` or more of text drawn from `seed`, ending in a run of whitespace.
fn text(seed: u64, bytes: usize) -> String {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut t = String::with_capacity(bytes + 64);
    while t.len() < bytes {
        t.push_str(PIECES[rng.random_range(0..PIECES.len())]);
        match rng.random_range(0..40) {
            0 => t.push_str(&" ".repeat(rng.random_range(2..40))),
            1 => t.push_str(&"\n".repeat(rng.random_range(2..12))),
            2 => t.push_str(&" \t".repeat(rng.random_range(1..8))),
            _ => t.push_str(GAPS[rng.random_range(0..GAPS.len())]),
        }
    }
    t.push_str("  \n\t ");
    t
}

/// A fresh directory under target/tmp.
fn scratch(what: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gpt2-tokenizer-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `r50k_base.tiktoken` the tiktoken-rs crate embeds, from Cargo's registry sources.
fn crate_asset() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    for registry in std::fs::read_dir(home.join("registry").join("src")).ok()?.flatten() {
        for dir in std::fs::read_dir(registry.path()).ok()?.flatten() {
            let asset = dir.path().join("assets").join("r50k_base.tiktoken");
            if dir.file_name().to_string_lossy().starts_with("tiktoken-rs-") && asset.is_file() {
                return Some(asset);
            }
        }
    }
    None
}

/// `tiktoken`'s ids of the text in `path`, or `None` (a skip) where Python has no `tiktoken`
/// and CI is not set.
fn reference_ids(path: &Path, dir: &Path) -> Option<Vec<i32>> {
    let has_tiktoken = Command::new("python3").args(["-c", "import tiktoken"]).status().is_ok_and(|s| s.success());
    if !has_tiktoken {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but python3 cannot import tiktoken (pip install tiktoken)");
        eprintln!("skipped: python3 cannot import tiktoken (pip install tiktoken)");
        return None;
    }
    let out = dir.join("ids.txt");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join("gpt2_tokens.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(path).arg(&out);
    if let Some(asset) = crate_asset() {
        cmd.arg("--asset").arg(asset);
    }
    let run = cmd.output().unwrap();
    assert!(run.status.success(), "gpt2_tokens.py failed: {}", String::from_utf8_lossy(&run.stderr));
    let ids = std::fs::read_to_string(&out).unwrap();
    Some(ids.split_whitespace().map(|id| id.parse().unwrap()).collect())
}

#[test]
fn ids_equal_tiktokens_on_a_multilingual_emoji_and_whitespace_heavy_text_of_100_kb() {
    let text = text(53, 120_000);
    assert!(text.len() >= 100_000 && text.contains("\u{3000}") && text.contains("👩‍👩‍👧‍👦") && text.ends_with(" \n\t "));
    let gpt2 = Tokenizer::gpt2();
    let ids = gpt2.encode(&text).unwrap();
    // Every token's bytes, in order, are the text's: the ids decode back exactly.
    assert_eq!(gpt2.decode_bytes(&ids).unwrap(), text.as_bytes());
    assert_eq!(gpt2.decode(&ids).unwrap(), text);
    let dir = scratch("reference");
    let path = dir.join("text.txt");
    std::fs::write(&path, &text).unwrap();
    if let Some(want) = reference_ids(&path, &dir) {
        assert_eq!(ids.len(), want.len(), "token counts differ");
        if let Some(i) = ids.iter().zip(&want).position(|(a, b)| a != b) {
            let at = gpt2.decode(&want[i.saturating_sub(3)..(i + 3).min(want.len())]).unwrap();
            panic!("token {i}: tandem {} and tiktoken {} differ, near {at:?}", ids[i], want[i]);
        }
        eprintln!("{} bytes, {} tokens equal tiktoken's", text.len(), ids.len());
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn known_ids_and_the_end_of_text_token() {
    let gpt2 = Tokenizer::gpt2();
    // GPT-2's ids of "Hello world" and of a literal "<|endoftext|>" (ordinary text, not 50256).
    assert_eq!(gpt2.encode("Hello world").unwrap(), [15496, 995]);
    assert_eq!(gpt2.encode("<|endoftext|>").unwrap(), [27, 91, 437, 1659, 5239, 91, 29]);
    assert_eq!(gpt2.decode(&[Gpt2Tokenizer::END_OF_TEXT]).unwrap(), "<|endoftext|>");
    assert_eq!((gpt2.len(), gpt2.name()), (50_257, "gpt2"));
    // A token that ends inside a character: its bytes, and U+FFFD in a string.
    let ids = gpt2.encode("😀").unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    assert_eq!(gpt2.decode(&ids[..1]).unwrap().chars().last(), Some('\u{fffd}'));
}

#[test]
fn an_id_outside_the_vocabulary_is_an_error_naming_it() {
    let gpt2 = Tokenizer::gpt2();
    for id in [50_257, -1, i32::MAX] {
        match gpt2.decode(&[15496, id]) {
            Err(Error::Label { label, index: 1, classes: 50_257, .. }) => assert_eq!(label, id),
            other => panic!("id {id}: {other:?}"),
        }
    }
    let msg = gpt2.decode(&[50_300]).unwrap_err().to_string();
    assert!(msg.contains("token id 50300") && msg.contains("0..50257"), "{msg}");
}

#[test]
fn a_corpus_and_its_windows_in_gpt2_tokens() {
    let text = text(7, 5_000);
    let corpus = TextCorpus::tokenized(&text, Tokenizer::gpt2(), "mixed.txt").unwrap();
    let all = [corpus.train.as_slice(), corpus.val.as_slice()].concat();
    assert_eq!(all, Tokenizer::gpt2().encode(&text).unwrap());
    let b = corpus.batch(Split::Train, 4, 16, &mut rand_chacha::ChaCha8Rng::seed_from_u64(0)).unwrap();
    assert!(b.x.iter().chain(&b.y).all(|&id| (0..50_257).contains(&id)));
    // Too short a text names the source and counts tokens, not characters.
    let err = TextCorpus::tokenized("Hello", Tokenizer::gpt2(), "tiny.txt").err().unwrap().to_string();
    assert!(err.contains("tiny.txt: 1 tokens"), "{err}");
    // By name, as the CLI's --tokenizer.
    assert_eq!(Tokenizer::by_name("gpt2", "").unwrap(), Tokenizer::gpt2());
    let err = Tokenizer::by_name("gpt3", "").unwrap_err().to_string();
    assert!(err.contains("--tokenizer") && err.contains("'gpt3'") && err.contains("chars, gpt2"), "{err}");
}
