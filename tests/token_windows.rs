//! Token windows in epochs: a `WindowLoader` serves every row once per epoch (shuffled by
//! `(seed, epoch)` as a `DataLoader`, or in order), over a chosen range of rows, resumes from
//! its `LoaderState`, and builds the GPT's batches (`Inputs::I32`, `Targets::Tokens`).
use std::collections::BTreeMap;
use std::sync::Arc;
use tandem::checkpoint::{write_safetensors, HostTensor};
use tandem::data::text::{Split, TokenWindows};
use tandem::data::{Batch, BatchSource, Inputs, LoaderState, Targets, WindowLoader};
use tandem::Error;

/// `rows` windows of 3 tokens whose row `r` is `[10 r, 10 r + 1, 10 r + 2]` (vocabulary 1000),
/// its targets the same plus one, so a batch reveals its rows.
fn numbered(rows: usize) -> Arc<TokenWindows> {
    let x: Vec<i32> = (0..rows).flat_map(|r| (0..3).map(move |k| (10 * r + k) as i32)).collect();
    let y: Vec<i32> = x.iter().map(|v| v + 1).collect();
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tandem-token-windows-{}-{k}.safetensors", std::process::id()));
    let t = |v: Vec<i32>| HostTensor::i32(vec![rows, 3], v).unwrap();
    let meta = BTreeMap::from([("vocab_size".to_string(), "1000".to_string())]);
    write_safetensors(&path, &[("x".into(), t(x)), ("y".into(), t(y))], &meta).unwrap();
    let w = TokenWindows::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    Arc::new(w)
}

fn rows_of(b: &Batch) -> Vec<usize> {
    let Inputs::I32(x) = &b.x else { panic!("token ids") };
    x.chunks(3).map(|c| c[0] as usize / 10).collect()
}

#[test]
fn batches_are_the_gpt_s_token_batches() {
    let mut l = WindowLoader::new(numbered(12), 0..12, 2, false, 0).unwrap();
    let b = l.next_batch();
    assert_eq!(b, Batch::tokens(vec![0, 1, 2, 10, 11, 12], vec![1, 2, 3, 11, 12, 13], 3, 1000).unwrap());
    assert_eq!(b.x_shape, [2, 3]);
    assert!(matches!(&b.y, Targets::Tokens { shape_per_sample, classes: 1000, .. } if shape_per_sample == &[3]));
}

#[test]
fn shuffled_epochs_serve_every_row_once_in_the_data_loaders_order() {
    let mut l = WindowLoader::new(numbered(12), 0..12, 5, true, 5).unwrap();
    assert_eq!((l.batches_per_epoch(), l.smallest_batch()), (3, 2));
    let mut orders = Vec::new();
    for epoch in 0..2u64 {
        let sizes_and_rows: Vec<(usize, Vec<usize>)> = l.epoch().map(|b| (b.len(), rows_of(&b))).collect();
        assert_eq!(sizes_and_rows.iter().map(|s| s.0).collect::<Vec<_>>(), [5, 5, 2], "epoch {epoch}");
        orders.push(sizes_and_rows.into_iter().flat_map(|s| s.1).collect::<Vec<_>>());
        assert_eq!(l.state(), LoaderState { epoch: epoch + 1, position: 0 });
    }
    // ChaCha8 keyed by (seed 5, epoch), as a DataLoader of 12 samples shuffles them.
    assert_eq!(orders[0], [7, 5, 11, 1, 0, 4, 8, 6, 9, 2, 3, 10]);
    assert_eq!(orders[1], [3, 0, 6, 1, 10, 9, 11, 4, 2, 7, 5, 8]);
    let other: Vec<usize> = WindowLoader::new(numbered(12), 0..12, 12, true, 6).unwrap().epoch().flat_map(|b| rows_of(&b)).collect();
    assert_ne!(other, orders[0], "another seed, another order");
}

#[test]
fn sequential_epochs_repeat_the_rows_in_order_and_drop_the_short_tail() {
    let mut l = WindowLoader::new(numbered(7), 0..7, 3, false, 0).unwrap().drop_last(true).unwrap();
    assert_eq!((l.batches_per_epoch(), l.smallest_batch()), (2, 3));
    let stream: Vec<Vec<usize>> = l.by_ref().take(5).map(|b| rows_of(&b)).collect();
    assert_eq!(stream, [vec![0, 1, 2], vec![3, 4, 5], vec![0, 1, 2], vec![3, 4, 5], vec![0, 1, 2]]);
    assert_eq!(l.state(), LoaderState { epoch: 2, position: 3 });
    assert!(WindowLoader::new(numbered(7), 0..7, 8, false, 0).unwrap().drop_last(true).is_err(), "no full batch of 8 in 7 rows");
}

#[test]
fn a_row_range_is_a_validation_source_apart_from_training() {
    let w = numbered(20);
    let (train_rows, val_rows) = (w.rows_of(Split::Train), w.rows_of(Split::Val));
    assert_eq!((train_rows.clone(), val_rows.clone()), (0..18, 18..20));
    let mut train = WindowLoader::new(w.clone(), train_rows, 4, true, 1).unwrap();
    let seen: Vec<usize> = train.epoch().flat_map(|b| rows_of(&b)).collect();
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, (0..18).collect::<Vec<_>>(), "training serves rows 0..18 only, each once");
    let mut val = WindowLoader::new(w.clone(), val_rows, 4, false, 0).unwrap();
    assert_eq!(val.rows(), 18..20);
    // A validation pass, as the Trainer makes one: epoch 0 from its start, through BatchSource.
    let source: &mut dyn BatchSource = &mut val;
    source.set_state(LoaderState { epoch: 0, position: 0 }).unwrap();
    let pass: Vec<Vec<usize>> = (0..source.batches_per_epoch()).map(|_| rows_of(&source.next_batch().unwrap())).collect();
    assert_eq!(pass, [vec![18, 19]]);
}

#[test]
fn a_saved_state_resumes_the_same_stream() {
    let make = || WindowLoader::new(numbered(10), 2..10, 3, true, 9).unwrap().drop_last(true).unwrap();
    let mut whole = make();
    let want: Vec<Batch> = whole.by_ref().take(7).collect();
    for stop in [0, 1, 2, 3, 5] {
        let mut first = make();
        first.by_ref().take(stop).count();
        let saved = BatchSource::state(&first);
        let mut resumed = make();
        BatchSource::set_state(&mut resumed, saved).unwrap();
        let rest: Vec<Batch> = (stop..7).map(|_| BatchSource::next_batch(&mut resumed).unwrap()).collect();
        assert_eq!(rest, want[stop..], "resumed after {stop} batches ({saved:?})");
    }
    let mut l = make();
    assert!(l.set_state(LoaderState { epoch: 0, position: 9 }).is_err(), "past the 8 rows");
    // A position inside the dropped tail moves on to the next epoch.
    l.set_state(LoaderState { epoch: 4, position: 7 }).unwrap();
    assert_eq!(l.state(), LoaderState { epoch: 5, position: 0 });
}

#[test]
fn bad_loaders_are_errors_naming_the_problem() {
    let w = numbered(4);
    for (rows, batch) in [(0..0, 1), (2..5, 1), (0..4, 0)] {
        let err = WindowLoader::new(w.clone(), rows.clone(), batch, false, 0).unwrap_err();
        assert!(matches!(err, Error::Invalid { op: "WindowLoader::new", .. }), "{rows:?} batch {batch}: {err}");
    }
    let mut bad = TokenWindows::from_tokens(&[0, 1, 2, 3, 4, 5, 6], 3, 7, "seven tokens").unwrap();
    bad.y[4] = 7;
    let err = WindowLoader::new(Arc::new(bad), 0..2, 1, false, 0).unwrap_err().to_string();
    assert!(err.contains("seven tokens") && err.contains("y row 1 holds token id 7, outside 0..7"), "{err}");
    let mut short = TokenWindows::from_tokens(&[0, 1, 2, 3, 4, 5, 6], 3, 7, "seven tokens").unwrap();
    short.x.pop();
    assert!(matches!(WindowLoader::new(Arc::new(short), 0..2, 1, false, 0), Err(Error::Shape { .. })));
}

#[test]
fn windows_cut_end_to_end_from_a_token_stream() {
    let w = TokenWindows::from_tokens(&(0..11).collect::<Vec<i32>>(), 4, 11, "eleven").unwrap();
    assert_eq!((w.rows, w.block, w.vocab_size, w.source()), (2, 4, 11, "eleven"));
    assert_eq!((w.x.clone(), w.y.clone()), ((0..8).collect::<Vec<_>>(), (1..9).collect::<Vec<_>>()), "the last two tokens make no whole window");
    for (tokens, block, vocab, needle) in
        [(vec![0, 1, 2], 3, 3, "no window of 3"), (vec![0, 1, 5], 1, 5, "token id 5 at position 2"), (vec![0, 1], 1, 0, "vocabulary size 0")]
    {
        let err = TokenWindows::from_tokens(&tokens, block, vocab, "stream").unwrap_err().to_string();
        assert!(err.contains(needle) && err.contains("stream"), "{needle}: {err}");
    }
    // Random windows from a chosen range of rows, as the random order draws them.
    let w = numbered(10);
    let b = w.batch_from(3..5, 20, &mut <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0)).unwrap();
    assert!(b.x.chunks(3).all(|c| (30..50).contains(&c[0])), "{:?}", b.x);
    assert!(w.batch_from(8..11, 1, &mut <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0)).is_err());
}
