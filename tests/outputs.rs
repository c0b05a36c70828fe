//! Outputs that are not regular files: `write_atomic` and `tandem train --save/--plot` follow a
//! symbolic link and keep it, write a character device or a FIFO in place, and refuse a
//! directory or a block device, never replacing any of them with a regular file. Every node is
//! made in a temporary directory; device nodes need root, and their tests say so and skip
//! otherwise.
mod common;
use common::{mkfifo, mknod, run, s, text};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use tandem::checkpoint::{output_target, write_atomic, OutputTarget};

fn scratch(name: &str) -> PathBuf {
    common::scratch("outputs", name)
}

fn kind(path: &Path) -> std::fs::FileType {
    std::fs::symlink_metadata(path).unwrap().file_type()
}

#[test]
fn a_symlink_is_followed_and_kept() {
    let dir = scratch("symlink");
    std::fs::create_dir(dir.join("real")).unwrap();
    std::fs::write(dir.join("real/state.json"), b"old").unwrap();
    std::os::unix::fs::symlink("real/state.json", dir.join("link")).unwrap();
    write_atomic(dir.join("link"), b"new").unwrap();
    assert!(kind(&dir.join("link")).is_symlink(), "the link was replaced");
    assert_eq!(std::fs::read(dir.join("real/state.json")).unwrap(), b"new");
    // The temp file went next to the target, and is gone.
    assert_eq!(std::fs::read_dir(dir.join("real")).unwrap().count(), 1);

    // A link to nothing yet leads to a new file where it points; a chain of links too.
    std::os::unix::fs::symlink(dir.join("real/new.json"), dir.join("dangling")).unwrap();
    std::os::unix::fs::symlink("dangling", dir.join("chain")).unwrap();
    write_atomic(dir.join("chain"), b"{}").unwrap();
    assert!(kind(&dir.join("chain")).is_symlink() && kind(&dir.join("dangling")).is_symlink());
    assert_eq!(std::fs::read(dir.join("real/new.json")).unwrap(), b"{}");
    assert_eq!(output_target(&dir.join("chain")).unwrap(), OutputTarget::File(dir.join("real/new.json")));

    // A link to a directory, and a loop, are errors naming the path given.
    std::os::unix::fs::symlink("real", dir.join("to_dir")).unwrap();
    let e = write_atomic(dir.join("to_dir"), b"x").unwrap_err().to_string();
    assert!(e.contains("to_dir") && e.contains("is a directory"), "{e}");
    std::os::unix::fs::symlink("loop_b", dir.join("loop_a")).unwrap();
    std::os::unix::fs::symlink("loop_a", dir.join("loop_b")).unwrap();
    let e = write_atomic(dir.join("loop_a"), b"x").unwrap_err().to_string();
    assert!(e.contains("loop_a") && e.contains("symbolic links deep"), "{e}");
    assert!(kind(&dir.join("loop_a")).is_symlink() && kind(&dir.join("to_dir")).is_symlink());
}

#[test]
fn a_fifo_is_written_in_place_or_refused_without_a_reader() {
    use std::io::Read;
    let dir = scratch("fifo");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    // Nobody reads: an error at once, not a wait for a reader that never comes.
    let e = write_atomic(&fifo, b"lost").unwrap_err().to_string();
    assert!(e.contains("fifo") && e.contains("no process is reading"), "{e}");
    assert!(kind(&fifo).is_fifo(), "the FIFO was replaced");
    // Opened read-write, this end counts as a reader without blocking (Linux).
    let mut reader = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).unwrap();
    write_atomic(&fifo, b"through the pipe").unwrap();
    let mut got = [0u8; 16];
    reader.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"through the pipe");
    assert!(kind(&fifo).is_fifo(), "the FIFO was replaced");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "a temp file was left");
}

#[test]
fn device_nodes_are_written_in_place_or_refused() {
    let dir = scratch("devices");
    let (null, full, disk) = (dir.join("null"), dir.join("full"), dir.join("disk"));
    if !mknod(&null, "c", 1, 3) {
        return;
    }
    write_atomic(&null, b"discarded").unwrap();
    assert!(kind(&null).is_char_device(), "the null device was replaced");
    assert!(mknod(&full, "c", 1, 7));
    let e = write_atomic(&full, b"no room").unwrap_err().to_string();
    assert!(e.contains("full") && e.to_lowercase().contains("no space"), "{e}");
    assert!(kind(&full).is_char_device(), "the full device was replaced");
    // A block device (loop0's numbers; it is never opened) is refused before any write.
    assert!(mknod(&disk, "b", 7, 0));
    let e = write_atomic(&disk, b"x").unwrap_err().to_string();
    assert!(e.contains("disk") && e.contains("block device"), "{e}");
    assert!(kind(&disk).is_block_device(), "the block device was replaced");
    // A link to a device leads to the device, written in place.
    std::os::unix::fs::symlink(&null, dir.join("to_null")).unwrap();
    write_atomic(dir.join("to_null"), b"discarded").unwrap();
    assert!(kind(&dir.join("to_null")).is_symlink() && kind(&null).is_char_device());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 4, "a temp file was left");
}

const LINEAR: [&str; 12] =
    ["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--batch=10", "--steps", "2", "--log-format", "json"];

fn train(extra: &[&str]) -> std::process::Output {
    run(&[&LINEAR[..], extra].concat())
}

#[test]
fn train_writes_through_links_and_into_devices() {
    let dir = scratch("train");
    std::fs::create_dir(dir.join("real")).unwrap();
    std::os::unix::fs::symlink("real/plot.svg", dir.join("plot.svg")).unwrap();
    std::os::unix::fs::symlink("real/w.safetensors", dir.join("w.safetensors")).unwrap();
    let out = train(&["--save", s(&dir.join("w.safetensors")), "--plot", s(&dir.join("plot.svg"))]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(kind(&dir.join("plot.svg")).is_symlink() && kind(&dir.join("w.safetensors")).is_symlink(), "a link was replaced");
    assert!(std::fs::read_to_string(dir.join("real/plot.svg")).unwrap().contains("<svg"));
    assert!(tandem::checkpoint::read_safetensors(dir.join("real/w.safetensors")).is_ok());

    // No reader on the FIFO: the run says so and the FIFO stays one.
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let out = train(&["--save", s(&fifo)]);
    assert!(!out.status.success() && text(&out.stderr).contains("no process is reading"), "{}", text(&out.stderr));
    assert!(kind(&fifo).is_fifo(), "--save replaced the FIFO");

    let null = dir.join("null");
    if !mknod(&null, "c", 1, 3) {
        return;
    }
    // Both outputs may be discarded into one device: nothing is replaced.
    let out = train(&["--save", s(&null), "--plot", s(&null)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(kind(&null).is_char_device(), "--save/--plot replaced the device node");
    let disk = dir.join("disk");
    assert!(mknod(&disk, "b", 7, 0));
    let out = train(&["--save", s(&disk)]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("block device") && text(&out.stdout).is_empty(),
        "a step ran before the block device was refused: {err}"
    );
    assert!(kind(&disk).is_block_device());
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.starts_with('.')), "temp or probe files left: {names:?}");
}
