//! Text data for language models: the character vocabulary, the 90/10 split, random windows,
//! the built-in corpus, unigram entropy, token windows from safetensors, and their errors.
use rand::SeedableRng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use tandem::checkpoint::{write_safetensors, HostTensor};
use tandem::data::text::{builtin_text, unigram_entropy, CharVocab, Split, TextCorpus, TokenWindows, BUILTIN_CHARS};
use tandem::{Error, Result};

fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("text_data_{name}"))
}

#[test]
fn vocab_is_the_sorted_unique_characters() -> Result<()> {
    let v = CharVocab::from_text("to be, or not\nto bé");
    assert_eq!(v.chars(), ['\n', ' ', ',', 'b', 'e', 'n', 'o', 'r', 't', 'é']);
    assert_eq!(v.encode("bét")?, [3, 9, 8]);
    assert_eq!(v.decode(&v.encode("not to be")?)?, "not to be");
    assert!(matches!(v.encode("tox"), Err(Error::Invalid { .. })));
    assert!(matches!(v.decode(&[0, 10]), Err(Error::Label { label: 10, index: 1, classes: 10, .. })));
    assert!(matches!(v.decode(&[-1]), Err(Error::Label { label: -1, .. })));
    Ok(())
}

#[test]
fn the_split_is_90_10_by_position() -> Result<()> {
    let text: String = (0..1000).map(|i| (b'a' + (i * 7 % 26) as u8) as char).collect();
    let c = TextCorpus::from_text(&text, "test")?;
    let all = c.vocab.encode(&text)?;
    assert_eq!((c.train.len(), c.val.len()), (900, 100));
    assert_eq!(c.train, all[..900]);
    assert_eq!(c.val, all[900..]);
    // nanoGPT's int(n * 0.9): 9 of 11 characters train
    let odd = TextCorpus::from_text("abcdefghijk", "test")?;
    assert_eq!((odd.train.len(), odd.val.len()), (9, 2));
    Ok(())
}

/// With every character distinct and sorted, a token's id is its position, so a window's
/// first id is its start.
#[test]
fn windows_are_next_token_pairs_at_every_start() -> Result<()> {
    let text: String = (0..30u8).map(|i| (b'A' + i) as char).collect();
    let c = TextCorpus::from_text(&text, "test")?;
    assert_eq!(c.train.len(), 27);
    let (block, mut starts) = (5, HashSet::new());
    let mut r = rng(1);
    for _ in 0..200 {
        let b = c.batch(Split::Train, 4, block, &mut r)?;
        assert_eq!((b.batch, b.block, b.x.len(), b.y.len()), (4, 5, 20, 20));
        for (x, y) in b.x.chunks(block).zip(b.y.chunks(block)) {
            let s = x[0];
            assert_eq!(x, (s..s + 5).collect::<Vec<_>>(), "a window is consecutive tokens");
            assert_eq!(y, (s + 1..s + 6).collect::<Vec<_>>(), "y is x shifted by one");
            starts.insert(s);
        }
    }
    assert_eq!(starts, (0..=21).collect::<HashSet<i32>>(), "every start 0..=len-block-1, no further");
    let again = c.batch(Split::Train, 4, block, &mut rng(1))?;
    assert_eq!(again, c.batch(Split::Train, 4, block, &mut rng(1))?, "a seed gives the same batch");
    assert_ne!(again, c.batch(Split::Train, 4, block, &mut rng(2))?);
    Ok(())
}

#[test]
fn validation_windows_come_from_the_validation_split() -> Result<()> {
    let text = format!("{}{}", "a".repeat(900), "b".repeat(100));
    let c = TextCorpus::from_text(&text, "test")?;
    let (a, b) = (c.vocab.encode("a")?[0], c.vocab.encode("b")?[0]);
    let mut r = rng(3);
    assert!(c.batch(Split::Train, 8, 16, &mut r)?.x.iter().all(|&t| t == a));
    let val = c.batch(Split::Val, 8, 16, &mut r)?;
    assert!(val.x.iter().chain(&val.y).all(|&t| t == b));
    Ok(())
}

#[test]
fn a_split_too_short_for_the_block_is_an_error() -> Result<()> {
    let c = TextCorpus::from_text(&"abcdefghij".repeat(3), "short.txt")?;
    let err = c.batch(Split::Val, 1, 3, &mut rng(0)).expect_err("3 validation tokens for a window of 3");
    assert!(err.to_string().contains("short.txt") && err.to_string().contains("Val"), "{err}");
    assert!(c.batch(Split::Train, 0, 3, &mut rng(0)).is_err());
    assert!(c.batch(Split::Train, 1, 0, &mut rng(0)).is_err());
    assert!(TextCorpus::from_text("a", "one.txt").is_err());
    Ok(())
}

#[test]
fn unigram_entropy_by_hand() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(close(unigram_entropy(&[0, 0, 1, 1]), 2f64.ln()));
    assert!(close(unigram_entropy(&[3, 1, 2, 0]), 4f64.ln()));
    assert!(close(unigram_entropy(&[5; 4]), 0.0));
    // p = (3/4, 1/4)
    assert!(close(unigram_entropy(&[7, 7, 7, 1]), -(0.75f64 * 0.75f64.ln() + 0.25 * 0.25f64.ln())));
    assert_eq!(unigram_entropy(&[]), 0.0);
}

/// `H(next | previous)` in nats: what a model that sees one character back can reach.
fn bigram_entropy(t: &[i32]) -> f64 {
    let mut pairs: HashMap<(i32, i32), f64> = HashMap::new();
    let mut firsts: HashMap<i32, f64> = HashMap::new();
    for w in t.windows(2) {
        *pairs.entry((w[0], w[1])).or_default() += 1.0;
        *firsts.entry(w[0]).or_default() += 1.0;
    }
    let n = (t.len() - 1) as f64;
    pairs.iter().map(|(&(a, _), &c)| -(c / n) * (c / firsts[&a]).ln()).sum()
}

#[test]
fn the_builtin_corpus_is_seeded_small_and_structured() {
    let text = builtin_text(0, BUILTIN_CHARS);
    assert_eq!(text.len(), BUILTIN_CHARS);
    assert!(text.is_ascii());
    assert_eq!(text, builtin_text(0, BUILTIN_CHARS), "a seed gives the same text");
    assert_ne!(text[..2000], builtin_text(1, BUILTIN_CHARS)[..2000]);
    assert_eq!(builtin_text(0, 500), text[..500], "a shorter corpus is a prefix");
    let c = TextCorpus::builtin(0);
    assert!(c.vocab.len() < 60, "{} characters", c.vocab.len());
    let h = c.unigram_entropy();
    let h2 = bigram_entropy(&[c.train.as_slice(), c.val.as_slice()].concat());
    eprintln!("built-in corpus: {} characters, unigram entropy {h:.3} nats, bigram {h2:.3}", c.vocab.len());
    assert!(h > 2.5, "unigram entropy {h}");
    assert!(h2 < h - 1.0, "one character of context must help: bigram {h2} vs unigram {h}");
    let sample = &text[..300];
    assert!(sample.contains(". ") && sample.contains('\n'), "{sample}");
}

#[test]
fn a_text_file_loads_and_its_errors_name_the_path() -> Result<()> {
    let path = scratch("ok.txt");
    std::fs::write(&path, "first line\nsecond line\n").unwrap();
    let c = TextCorpus::from_file(&path)?;
    assert_eq!(c.vocab, CharVocab::from_text("first line\nsecond line\n").into());
    assert_eq!(c.train.len() + c.val.len(), 23);
    let missing = scratch("missing.txt");
    assert!(matches!(TextCorpus::from_file(&missing), Err(Error::Io { path, .. }) if path == missing));
    let latin1 = scratch("latin1.txt");
    std::fs::write(&latin1, [b'c', b'a', 0xe9, b'!']).unwrap();
    assert!(matches!(TextCorpus::from_file(&latin1), Err(Error::Format { path, .. }) if path == latin1));
    let tiny = scratch("tiny.txt");
    std::fs::write(&tiny, "x").unwrap();
    let err = TextCorpus::from_file(&tiny).expect_err("one character");
    assert!(err.to_string().contains("tiny.txt"), "{err}");
    Ok(())
}

/// A tensor's name, values and shape.
type Named = (&'static str, Vec<i64>, Vec<usize>);

/// A safetensors file of I64 tensors, written by the safetensors crate (tandem writes F32 and I32).
fn write_i64(path: &PathBuf, tensors: &[Named]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, v, _)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(&str, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, _, s), b)| (*n, safetensors::tensor::TensorView::new(safetensors::Dtype::I64, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn token_windows_load_from_i64_and_i32() -> Result<()> {
    let (n, t) = (10, 4);
    let seq: Vec<i64> = (0..(n * t + 1) as i64).map(|i| i * 3 % 17).collect();
    let x: Vec<i64> = (0..n).flat_map(|r| seq[r * t..r * t + t].to_vec()).collect();
    let y: Vec<i64> = (0..n).flat_map(|r| seq[r * t + 1..r * t + t + 1].to_vec()).collect();
    let p64 = scratch("tokens64.safetensors");
    write_i64(&p64, &[("x", x.clone(), vec![n, t]), ("y", y.clone(), vec![n, t])]);
    let w = TokenWindows::load(&p64)?;
    assert_eq!((w.rows, w.block, w.vocab_size), (n, t, 17));
    assert_eq!(w.x, x.iter().map(|&v| v as i32).collect::<Vec<_>>());
    assert_eq!((w.rows_of(Split::Train), w.rows_of(Split::Val)), (0..9, 9..10));
    let val = w.batch(Split::Val, 3, &mut rng(0))?;
    assert_eq!(val.x, [w.x[36..40].to_vec(), w.x[36..40].to_vec(), w.x[36..40].to_vec()].concat(), "row 9 is the only validation row");
    assert_eq!(val.y, [w.y[36..40].to_vec(), w.y[36..40].to_vec(), w.y[36..40].to_vec()].concat());
    let p32 = scratch("tokens32.safetensors");
    let host = |v: &[i64]| HostTensor::i32(vec![n, t], v.iter().map(|&a| a as i32).collect()).unwrap();
    write_safetensors(&p32, &[("x".into(), host(&x)), ("y".into(), host(&y))], &BTreeMap::new())?;
    let w32 = TokenWindows::load(&p32)?;
    assert_eq!((w32.x, w32.y), (w.x, w.y));
    Ok(())
}

#[test]
fn bad_token_files_are_errors_naming_the_path() {
    let cases: Vec<(&str, Vec<Named>)> = vec![
        ("no_y", vec![("x", vec![1, 2], vec![1, 2])]),
        ("shapes", vec![("x", vec![1, 2], vec![1, 2]), ("y", vec![1, 2], vec![2, 1])]),
        ("rank", vec![("x", vec![1, 2], vec![2]), ("y", vec![1, 2], vec![2])]),
        ("negative", vec![("x", vec![1, -2], vec![1, 2]), ("y", vec![1, 2], vec![1, 2])]),
    ];
    for (name, tensors) in cases {
        let path = scratch(&format!("bad_{name}.safetensors"));
        write_i64(&path, &tensors);
        let err = TokenWindows::load(&path).err().unwrap_or_else(|| panic!("{name} loads"));
        assert!(matches!(&err, Error::Format { path: p, .. } if *p == path), "{name}: {err}");
    }
    let floats = scratch("bad_f32.safetensors");
    let f = HostTensor::f32(vec![1, 2], vec![1.0, 2.0]).unwrap();
    write_safetensors(&floats, &[("x".into(), f.clone()), ("y".into(), f)], &BTreeMap::new()).unwrap();
    let err = TokenWindows::load(&floats).expect_err("F32 ids");
    assert!(err.to_string().contains("I64 or I32"), "{err}");
    let one_row = scratch("one_row.safetensors");
    write_i64(&one_row, &[("x", vec![1, 2], vec![1, 2]), ("y", vec![2, 3], vec![1, 2])]);
    let w = TokenWindows::load(&one_row).unwrap();
    let err = w.batch(Split::Train, 1, &mut rng(0)).expect_err("no training rows");
    assert!(err.to_string().contains("one_row.safetensors"), "{err}");
    assert!(matches!(TokenWindows::load(scratch("absent.safetensors")), Err(Error::Io { .. })));
}
