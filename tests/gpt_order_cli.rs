//! `tandem train --model gpt` in epochs: `--order shuffle|sequential` serves every training
//! window once per epoch, `--val-data` names the validation windows; two runs with the same
//! flags see the same batches, and a run stopped and resumed equals the uninterrupted one.
mod common;
use common::{fails, ok, s, text};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tandem::checkpoint::{read_safetensors, write_safetensors, HostTensor};
use tandem::data::LoaderState;

/// A tiny GPT over windows of 16 tokens.
const TINY: [&str; 8] = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--batch", "8"];
const T: usize = 16;
const VOCAB: usize = 11;

fn scratch(name: &str) -> PathBuf {
    common::scratch("gpt-order", name)
}

/// `rows` windows of `T` token ids from a stream that `salt` varies, `y` the next tokens.
fn token_file(path: &Path, rows: usize, salt: usize) {
    let seq: Vec<i32> = (0..rows * T + 1).map(|i| ((i * 7 + salt * i / 5) % VOCAB) as i32).collect();
    let x: Vec<i32> = (0..rows).flat_map(|r| seq[r * T..r * T + T].to_vec()).collect();
    let y: Vec<i32> = (0..rows).flat_map(|r| seq[r * T + 1..r * T + T + 1].to_vec()).collect();
    let t = |v| HostTensor::i32(vec![rows, T], v).unwrap();
    let meta = BTreeMap::from([("vocab_size".to_string(), VOCAB.to_string())]);
    write_safetensors(path, &[("x".into(), t(x)), ("y".into(), t(y))], &meta).unwrap();
}

fn train(data: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--model", "gpt", "--data", s(data), "--devices", "cpu", "--log-format", "json"].map(String::from).to_vec();
    a.extend(TINY.map(String::from));
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

fn run(data: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let args = train(data, extra);
    let out = ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}"))).collect()
}

fn fail(data: &Path, extra: &[&str], needle: &str) -> String {
    let args = train(data, extra);
    fails(&args.iter().map(String::as_str).collect::<Vec<_>>(), needle)
}

/// The training losses of a run's log, step by step.
fn losses(lines: &[serde_json::Value]) -> Vec<f64> {
    lines.iter().filter(|l| l.get("loss").is_some() && l.get("summary").is_none()).map(|l| l["loss"].as_f64().unwrap()).collect()
}

fn val_losses(lines: &[serde_json::Value]) -> Vec<f64> {
    lines.iter().filter(|l| l.get("val_loss").is_some() && l.get("summary").is_none()).map(|l| l["val_loss"].as_f64().unwrap()).collect()
}

fn weights(path: &Path) -> Vec<(String, HostTensor)> {
    read_safetensors(path).unwrap().0.into_iter().filter(|(n, _)| n.starts_with("model.")).collect()
}

fn loader_at(ckpt: &Path) -> LoaderState {
    tandem::train::run_file::verify(ckpt).unwrap().loader
}

#[test]
fn the_same_flags_replay_the_same_batches_and_a_resume_equals_the_uninterrupted_run() {
    let dir = scratch("replay");
    let data = dir.join("tokens.safetensors");
    // 24 rows: the first 21 train, in 2 full batches of 8 per epoch.
    token_file(&data, 24, 0);
    let flags = ["--order", "shuffle", "--steps", "7", "--dropout", "0.1", "--checkpoint-every", "3"];
    let ck = |name: &str| dir.join(name);
    let a = run(&data, &[&flags[..], &["--checkpoint-dir", s(&ck("a"))]].concat());
    let b = run(&data, &[&flags[..], &["--checkpoint-dir", s(&ck("b"))]].concat());
    assert_eq!(losses(&a).len(), 7);
    assert_eq!(losses(&a), losses(&b), "two runs with the same flags see the same batches");
    let last = "ckpt-00000007.safetensors";
    assert_eq!(weights(&ck("a").join(last)), weights(&ck("b").join(last)));
    // The checkpoint records where the loader stands: 3 steps are epoch 0's 2 batches and one of epoch 1.
    assert_eq!(loader_at(&ck("a").join("ckpt-00000003.safetensors")), LoaderState { epoch: 1, position: 8 });
    assert_eq!(loader_at(&ck("a").join(last)), LoaderState { epoch: 3, position: 8 });

    // Another order is another stream of batches.
    let seq = run(&data, &["--order", "sequential", "--steps", "7", "--dropout", "0.1"]);
    assert_ne!(losses(&seq), losses(&a));

    // Stopped after 3 steps (mid-epoch), resumed to 7: the same batches, the same weights.
    run(&data, &[&flags[..], &["--checkpoint-dir", s(&ck("part")), "--steps", "3"]].concat());
    let resumed = run(&data, &[&flags[..], &["--checkpoint-dir", s(&ck("part")), "--resume"]].concat());
    assert_eq!(losses(&resumed), losses(&a)[3..], "steps 4..7 after the resume");
    assert_eq!(weights(&ck("part").join(last)), weights(&ck("a").join(last)), "the resumed run's weights differ");

    // A resume under another order is refused, naming the flag.
    fail(
        &data,
        &["--order", "sequential", "--steps", "9", "--dropout", "0.1", "--checkpoint-dir", s(&ck("a")), "--resume"],
        "--order sequential (checkpoint: shuffle)",
    );
}

#[test]
fn every_window_trains_once_per_epoch() {
    let dir = scratch("epochs");
    let data = dir.join("tokens.safetensors");
    token_file(&data, 24, 1);
    // At learning rate 0 each step's loss is a function of its batch alone.
    let still = ["--lr", "0", "--batch", "1"];
    let seq = losses(&run(&data, &[&still[..], &["--order", "sequential", "--epochs", "2"]].concat()));
    assert_eq!(seq.len(), 42, "--epochs 2 of the 21 training windows");
    assert_eq!(seq[..21], seq[21..], "sequential epochs repeat the windows in order");
    let shuffled = losses(&run(&data, &[&still[..], &["--order", "shuffle", "--epochs", "2"]].concat()));
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v
    };
    assert_ne!(shuffled[..21], seq[..21], "shuffled");
    assert_ne!(shuffled[..21], shuffled[21..], "each epoch in its own order");
    for epoch in [&shuffled[..21], &shuffled[21..]] {
        assert_eq!(sorted(epoch), sorted(&seq[..21]), "each window once per epoch, none twice");
    }
    // The random order draws with replacement and keeps its default: no epochs.
    let random = losses(&run(&data, &[&still[..], &["--steps", "21"]].concat()));
    assert_ne!(sorted(&random), sorted(&seq[..21]), "windows at random, some twice");
    fail(&data, &["--epochs", "1"], "--order random draws windows with replacement");
    fail(&data, &["--order", "shuffle", "--batch", "22", "--steps", "1"], "--batch: 22 exceeds the 21 training windows");
}

#[test]
fn val_data_is_the_validation_set_and_all_of_data_trains() {
    let dir = scratch("val");
    let (data, val) = (dir.join("tokens.safetensors"), dir.join("val.safetensors"));
    token_file(&data, 24, 2);
    token_file(&val, 5, 3);
    // All 24 rows train with --val-data: 3 full batches of 8 per epoch.
    let lines = run(&data, &["--order", "sequential", "--epochs", "1", "--lr", "0", "--val-data", s(&val), "--eval-every", "3"]);
    assert_eq!(losses(&lines).len(), 3);
    let v = val_losses(&lines);
    assert_eq!(v.len(), 1);
    // At learning rate 0 the validation loss is that of the untrained model on all 5 windows,
    // whatever trains: the same when the validation file itself is --data.
    let other = run(&val, &["--order", "sequential", "--steps", "1", "--batch", "5", "--lr", "0", "--val-data", s(&val), "--eval-every", "1"]);
    tandem::tolerance::assert_close("validation loss over --val-data", &[val_losses(&other)[0] as f32], &[v[0] as f32], 1e-6, 1e-6);
    let without = run(&data, &["--order", "sequential", "--steps", "3", "--lr", "0", "--eval-every", "3"]);
    assert_ne!(val_losses(&without), v, "without --val-data, the last 10% of --data validates");
    // The random order trains on all rows with --val-data too.
    assert_eq!(val_losses(&run(&data, &["--steps", "1", "--lr", "0", "--val-data", s(&val), "--eval-every", "1"])), v);

    let short = dir.join("short.safetensors");
    let t8 = |v: Vec<i32>| HostTensor::i32(vec![2, 8], v).unwrap();
    write_safetensors(&short, &[("x".into(), t8(vec![1; 16])), ("y".into(), t8(vec![2; 16]))], &BTreeMap::new()).unwrap();
    fail(&data, &["--steps", "1", "--val-data", s(&short)], "windows of 8 tokens, but those of --data are 16 long");
    let wide = dir.join("wide.safetensors");
    let t16 = |v: Vec<i32>| HostTensor::i32(vec![1, T], v).unwrap();
    write_safetensors(&wide, &[("x".into(), t16(vec![1; T])), ("y".into(), t16(vec![VOCAB as i32; T]))], &BTreeMap::new()).unwrap();
    fail(&data, &["--steps", "1", "--val-data", s(&wide)], "token id 11 at flat index 16 (x, then y) is outside the vocabulary of --data, 0..11");
    fail(&data, &["--steps", "1", "--val-data", "text:x.txt"], "--val-data: 'text:x.txt' is not a PATH.safetensors");
    fails(&["train", "--model", "seed-linear", "--data", "synthetic", "--val-data", s(&val)], "--val-data: applies to --model gpt only");
    fails(&["train", "--model", "seed-linear", "--data", "synthetic", "--order", "shuffle"], "--order: applies to --model gpt only");
}

#[test]
fn a_text_trains_in_epochs_and_validates_on_another_text() {
    let dir = scratch("text");
    let (train_txt, val_txt, bad_txt) = (dir.join("train.txt"), dir.join("val.txt"), dir.join("bad.txt"));
    std::fs::write(&train_txt, "to be or not to be, that is the question. ".repeat(20)).unwrap();
    std::fs::write(&val_txt, "the question is to be. ".repeat(5)).unwrap();
    std::fs::write(&bad_txt, "zebra").unwrap();
    let args = |extra: &[&str]| {
        let mut a = vec!["train", "--model", "gpt", "--data", &format!("text:{}", s(&train_txt))].into_iter().map(String::from).collect::<Vec<_>>();
        a.extend(["--devices", "cpu", "--log-format", "json", "--block-size", "16"].map(String::from));
        a.extend(TINY.map(String::from));
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let go = |extra: &[&str]| ok(&args(extra).iter().map(String::as_str).collect::<Vec<_>>());
    // 860 characters end to end in windows of 16: 53 windows, 6 full batches per epoch.
    let vd = format!("text:{}", s(&val_txt));
    let out = go(&["--order", "shuffle", "--epochs", "1", "--val-data", &vd, "--eval-every", "6"]);
    let lines: Vec<serde_json::Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(losses(&lines).len(), 6);
    assert_eq!(val_losses(&lines).len(), 1);
    let bad = format!("text:{}", s(&bad_txt));
    fails(&args(&["--steps", "1", "--val-data", &bad]).iter().map(String::as_str).collect::<Vec<_>>(), "'z' at position 0");
}
