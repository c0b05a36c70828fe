//! `tandem generate` as a shell tool: values that can never sample (`--temperature 0`,
//! `--top-k 0`) and a `--micro-batches` that does not divide `--batch` are usage errors (exit 2)
//! naming the flag; the text streams out as it is drawn, and a reader that goes away
//! (`| head -c 100`) ends the process with status 141 and no panic.
#![cfg(feature = "cli")]
mod common;
use common::{ok, s, tandem, text};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A GPT trained for one step on the built-in text, saved in a fresh directory.
fn tiny_gpt(name: &str) -> (PathBuf, PathBuf) {
    let dir = common::scratch("generate-cli", name);
    let save = dir.join("w.safetensors");
    ok(&[
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--devices",
        "cpu",
        "--steps",
        "1",
        "--batch",
        "4",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "8",
        "--save",
        s(&save),
    ]);
    (dir, save)
}

/// Asserts that `args` is a usage error (exit 2) whose message names each of `flags` and
/// shows no panic and no Rust value (`Some(3)`).
fn usage_error(args: &[&str], flags: &[&str]) {
    let out = common::run(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "tandem {args:?} should be a usage error (exit 2):\n{err}");
    assert!(!err.contains("panicked") && !err.contains("Some("), "tandem {args:?}:\n{err}");
    for flag in flags {
        assert!(err.contains(flag), "tandem {args:?}: stderr does not name {flag}:\n{err}");
    }
}

#[test]
fn values_that_cannot_sample_are_usage_errors_naming_the_flag() {
    // Refused before the checkpoint is read: the file need not exist.
    let base = ["generate", "--init", "/nonexistent/w.safetensors", "--prompt", "The"];
    for t in ["0", "-1", "NaN", "inf", "-inf", "warm"] {
        usage_error(&[&base[..], &["--temperature", t]].concat(), &["--temperature", t]);
    }
    for k in ["0", "-3"] {
        usage_error(&[&base[..], &["--top-k", k]].concat(), &["--top-k"]);
    }
}

#[test]
fn micro_batches_that_do_not_divide_the_batch_are_usage_errors_naming_both_flags() {
    let seed = ["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--steps", "1", "--batch", "4"];
    let gpt = ["train", "--model", "gpt", "--data", "text", "--devices", "cpu", "--steps", "1", "--batch", "4"];
    for base in [&seed[..], &gpt[..]] {
        usage_error(&[base, &["--micro-batches", "3"]].concat(), &["--micro-batches 3 does not divide --batch 4"]);
        usage_error(&[base, &["--micro-batches", "0"]].concat(), &["--micro-batches", "at least 1"]);
    }
}

/// Starts `generate` from `save` with stdout and stderr piped.
fn spawn_generate(save: &Path, tokens: &str) -> Child {
    tandem()
        .args(["generate", "--init", s(save), "--prompt", "The", "--tokens", tokens, "--seed", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tandem starts")
}

/// The first `n` bytes of the child's stdout, read on a thread so that a silent child fails
/// the test within `limit` instead of hanging it; the pipe is dropped after reading.
fn first_bytes(child: &mut Child, n: usize, limit: Duration) -> Vec<u8> {
    let mut stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; n];
        let got = stdout.read_exact(&mut buf).map(|()| buf);
        let _ = tx.send(got);
        // `stdout` (the pipe's only read end) is dropped here.
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let _ = child.kill();
            panic!("reading generate's output: {e}");
        }
        Err(_) => {
            let _ = child.kill();
            panic!("generate wrote fewer than {n} bytes in {limit:?}");
        }
    }
}

/// Waits for the child at most `limit`, killing it after; its status code and stderr.
fn finish(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("generate still runs {limit:?} after its reader went away");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), text(&out.stderr))
}

/// With a billion tokens asked, the prompt and the first tokens arrive while the process is
/// still drawing (a run that wrote only at the end would write nothing here).
#[test]
fn tokens_stream_out_while_generation_runs() {
    let (dir, save) = tiny_gpt("stream");
    let mut child = spawn_generate(&save, "1000000000");
    let head = first_bytes(&mut child, 40, Duration::from_secs(60));
    assert!(head.starts_with(b"The"), "{:?}", String::from_utf8_lossy(&head));
    assert!(child.try_wait().unwrap().is_none(), "generate ended before its billion tokens");
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// `tandem generate --tokens 1000000000 | head -c 100`: once the reader has gone, the process
/// ends at once with status 141 (128 + SIGPIPE), as a shell tool killed by SIGPIPE, and says
/// nothing of a panic.
#[test]
fn a_reader_that_goes_away_ends_generate_with_141() {
    let (dir, save) = tiny_gpt("pipe");
    let mut child = spawn_generate(&save, "1000000000");
    first_bytes(&mut child, 100, Duration::from_secs(60));
    let (code, err) = finish(child, Duration::from_secs(30));
    assert_eq!(code, Some(141), "stderr:\n{err}");
    assert!(!err.contains("panicked") && err.trim().is_empty(), "stderr:\n{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The streamed text is the one `--tokens N` asked for, then a newline, whatever N.
#[test]
fn the_streamed_text_has_every_token_and_ends_with_a_newline() {
    let (dir, save) = tiny_gpt("whole");
    let out = ok(&["generate", "--init", s(&save), "--prompt", "The", "--tokens", "50", "--seed", "3"]);
    let text = text(&out.stdout);
    assert!(text.starts_with("The") && text.ends_with('\n'), "{text:?}");
    assert_eq!(text.trim_end_matches('\n').chars().count(), 53, "{text:?}");
    std::fs::remove_dir_all(dir).unwrap();
}
