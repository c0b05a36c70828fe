//! `--init` with `--resume`, driven through the `tandem` binary: a job restarted as schedulers
//! do (its own command with `--resume` added) continues from its checkpoint when `--init` names
//! the file the run started from, under any path, and ends on the weights of an uninterrupted
//! run; another file, or an `--init` for a run that did not start from one, is refused naming
//! both.
#![cfg(feature = "cli")]
mod common;
use common::{ok, run, s, text};
use sha2::{Digest, Sha256};
use std::path::Path;
use tandem::checkpoint::read_safetensors;

/// The seed linear model on the synthetic rows: fast enough for many runs per test.
const LINEAR: [&str; 8] = ["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--batch=10"];

fn train(extra: &[&str]) -> Vec<String> {
    LINEAR.iter().chain(extra).map(|a| a.to_string()).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn sha256(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `args`, expects exit status 2 (a usage error of `--init`) and every one of `needles` on
/// stderr; returns stderr.
fn refused(args: &[String], needles: &[&str]) -> String {
    let out = run(&strs(args));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "tandem {args:?}: stderr:\n{err}");
    assert!(!err.contains("panicked"), "panicked:\n{err}");
    for n in needles {
        assert!(err.contains(n), "tandem {args:?}: stderr lacks '{n}':\n{err}");
    }
    err
}

#[test]
fn a_restart_with_the_same_init_resumes_and_another_init_is_refused() {
    let dir = common::scratch("init-resume", "restart");
    let (a, b, a_copy) = (dir.join("a.safetensors"), dir.join("b.safetensors"), dir.join("copy-of-a.safetensors"));
    ok(&strs(&train(&["--steps", "1", "--seed", "3", "--save", s(&a)])));
    ok(&strs(&train(&["--steps", "1", "--seed", "4", "--save", s(&b)])));
    std::fs::copy(&a, &a_copy).unwrap();
    let (whole, resumed) = (dir.join("whole.safetensors"), dir.join("resumed.safetensors"));
    let (ck_whole, ck) = (dir.join("ck-whole"), dir.join("ck"));
    ok(&strs(&train(&["--init", s(&a), "--steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", s(&ck_whole), "--save", s(&whole)])));

    // The first half, then the same command with --resume added.
    let job = |steps: &str| train(&["--init", s(&a), "--steps", steps, "--checkpoint-every", "3", "--checkpoint-dir", s(&ck)]);
    ok(&strs(&job("3")));
    let (_, meta) = read_safetensors(ck.join("ckpt-00000003.safetensors")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&meta["config"]).unwrap();
    assert_eq!(config["init"]["sha256"].as_str(), Some(sha256(&a).as_str()), "the checkpoint does not record --init: {config}");

    // Another file is refused, naming both files and hashes, and changes nothing.
    let before = std::fs::read(ck.join("ckpt-00000003.safetensors")).unwrap();
    let other = [&job("6")[..], &["--resume".to_string()]].concat();
    let other: Vec<String> = other.iter().map(|x| if x == s(&a) { s(&b).to_string() } else { x.clone() }).collect();
    refused(&other, &["--init", s(&b), &sha256(&b), s(&a), &sha256(&a)]);
    assert_eq!(std::fs::read(ck.join("ckpt-00000003.safetensors")).unwrap(), before);
    assert!(!ck.join("ckpt-00000006.safetensors").exists(), "the refused run trained");

    // The same file, here under another path, resumes and ends on the uninterrupted weights.
    let same = [&job("6")[..], &["--resume".to_string(), "--save".to_string(), s(&resumed).to_string()]].concat();
    let same: Vec<String> = same.iter().map(|x| if x == s(&a) { s(&a_copy).to_string() } else { x.clone() }).collect();
    let out = ok(&strs(&same));
    assert!(text(&out.stderr).contains("(step 3)"), "did not resume from step 3:\n{}", text(&out.stderr));
    assert_eq!(std::fs::read(&resumed).unwrap(), std::fs::read(&whole).unwrap(), "the resumed run's weights differ from the uninterrupted run's");

    // Resuming without --init continues the run too.
    ok(&strs(&train(&["--steps", "9", "--checkpoint-every", "3", "--checkpoint-dir", s(&ck), "--resume"])));
    assert!(ck.join("ckpt-00000009.safetensors").exists());
}

#[test]
fn an_init_for_a_run_that_did_not_start_from_a_file_is_refused() {
    let dir = common::scratch("init-resume", "no-init");
    let (a, ck) = (dir.join("a.safetensors"), dir.join("ck"));
    ok(&strs(&train(&["--steps", "1", "--save", s(&a)])));
    ok(&strs(&train(&["--steps", "2", "--checkpoint-dir", s(&ck)])));
    let err = refused(
        &train(&["--init", s(&a), "--steps", "4", "--checkpoint-dir", s(&ck), "--resume"]),
        &["--init", s(&a), "did not start from a file", "ckpt-00000002.safetensors"],
    );
    assert!(!err.contains("cannot be used with"), "{err}");
    assert!(!ck.join("ckpt-00000004.safetensors").exists(), "the refused run trained");
}
