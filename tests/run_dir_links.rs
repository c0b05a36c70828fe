//! Nothing in a checkpoint directory is followed, driven through the `tandem` binary: a
//! symbolic link (to a file outside, or dangling), a FIFO or a directory where a checkpoint the
//! run will write, a checkpoint's temp file or the lock goes stops `tandem train` before its
//! first step, with an error naming the path, and what a link points to is left byte for byte.
#![cfg(all(feature = "cli", unix))]
mod common;
use common::{mkfifo, run, s, text};
use std::path::{Path, PathBuf};

/// The seed linear model on the synthetic rows, a checkpoint after every one of 3 steps.
const LINEAR: [&str; 12] =
    ["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--batch=10", "--steps", "3", "--checkpoint-every", "1"];

fn ckpt(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("ckpt-{step:08}.safetensors"))
}

/// Runs 3 steps with checkpoints in `dir`, expects exit status 1 with `path` and `needle` on
/// stderr, no step run (no progress line, no checkpoint written) and no panic.
fn refused(dir: &Path, path: &Path, needle: &str) {
    let args = [&LINEAR[..], &["--checkpoint-dir", s(dir), "--log-format", "json"]].concat();
    let out = run(&args);
    let (err, stdout) = (text(&out.stderr), text(&out.stdout));
    assert_eq!(out.status.code(), Some(1), "{}: stderr:\n{err}", path.display());
    assert!(!err.contains("panicked"), "panicked:\n{err}");
    assert!(err.contains(&path.display().to_string()) && err.contains(needle), "stderr lacks {} and '{needle}':\n{err}", path.display());
    assert!(!stdout.contains("\"step\""), "a step ran before the refusal:\n{stdout}");
    // Without following a link planted there.
    let written = std::fs::symlink_metadata(ckpt(dir, 1)).is_ok_and(|m| m.is_file());
    assert!(!written, "checkpoint 1 was written before the refusal");
}

/// A file outside the directory and a link to it in the directory at `name`.
fn linked(tag: &str, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (dir, outside) = (common::scratch("links", tag), common::scratch("links", &format!("{tag}-outside")));
    let target = outside.join("precious.bin");
    std::fs::write(&target, b"not to be replaced").unwrap();
    std::os::unix::fs::symlink(&target, dir.join(name)).unwrap();
    (dir, outside, target)
}

#[test]
fn a_link_to_a_file_outside_at_a_checkpoint_name_is_refused_and_the_file_kept() {
    for step in [1, 2, 3] {
        let name = format!("ckpt-{step:08}.safetensors");
        let (dir, _, target) = linked(&format!("file-{step}"), &name);
        refused(&dir, &dir.join(&name), "is a symbolic link, not a regular file");
        assert_eq!(std::fs::read(&target).unwrap(), b"not to be replaced", "checkpoint {step} was written through the link");
        assert!(std::fs::symlink_metadata(dir.join(&name)).unwrap().file_type().is_symlink(), "the link was removed");
    }
}

#[test]
fn a_dangling_link_at_a_checkpoint_name_is_refused_and_creates_nothing() {
    let dir = common::scratch("links", "dangling");
    let outside = common::scratch("links", "dangling-outside");
    std::os::unix::fs::symlink(outside.join("new.bin"), ckpt(&dir, 2)).unwrap();
    refused(&dir, &ckpt(&dir, 2), "is a symbolic link");
    assert!(!outside.join("new.bin").exists(), "a file was created through the dangling link");
}

#[test]
fn a_fifo_or_a_directory_at_a_checkpoint_name_is_refused() {
    let dir = common::scratch("links", "fifo");
    mkfifo(&ckpt(&dir, 3));
    refused(&dir, &ckpt(&dir, 3), "is a FIFO, not a regular file");
    let dir = common::scratch("links", "dir");
    std::fs::create_dir(ckpt(&dir, 2)).unwrap();
    refused(&dir, &ckpt(&dir, 2), "is a directory, not a regular file");
    assert!(ckpt(&dir, 2).is_dir());
}

#[test]
fn a_link_or_a_fifo_at_the_lock_is_refused() {
    let (dir, _, target) = linked("lock", ".tandem-lock");
    refused(&dir, &dir.join(".tandem-lock"), "is a symbolic link, not a regular file");
    assert_eq!(std::fs::read(&target).unwrap(), b"not to be replaced", "the lock truncated the file it links to");
    let dir = common::scratch("links", "lock-fifo");
    mkfifo(&dir.join(".tandem-lock"));
    refused(&dir, &dir.join(".tandem-lock"), "is a FIFO, not a regular file; the lock must be a regular file");
}

#[test]
fn a_link_at_a_temp_name_is_refused_and_left() {
    let name = ".ckpt-00000002.safetensors.tmp-4242-0";
    let (dir, _, target) = linked("temp", name);
    refused(&dir, &dir.join(name), "is a symbolic link");
    assert!(std::fs::symlink_metadata(dir.join(name)).unwrap().file_type().is_symlink(), "the link was removed");
    assert_eq!(std::fs::read(&target).unwrap(), b"not to be replaced");
}
