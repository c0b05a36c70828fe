//! Files and flags that ask for more memory than they hold or the machine has: a checkpoint
//! whose run configuration lies about the model's size, a token file with one huge id, a
//! model too big for the device. Each runs the `tandem` binary under a 1 GiB address-space
//! limit (`ulimit -v`) and must end with one clear error and exit status 1: no allocation of
//! gigabytes, no abort (134) and no "memory allocation of .. failed".
#![cfg(feature = "cli")]
mod common;
use common::{s, text};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tandem::checkpoint::{write_safetensors, HostTensor};

/// The address space each run may take, in KiB (`ulimit -v`).
const LIMIT_KIB: u64 = 1 << 20;

fn scratch(name: &str) -> PathBuf {
    common::scratch("hostile", name)
}

/// The limit for runs on lavapipe (`wgpu:0`), whose start-up alone reserves more than 1 GiB
/// of address space (under 1 GiB, opening the device fails with "Not enough memory left").
const WGPU_LIMIT_KIB: u64 = 4 << 20;

/// Runs `tandem args` under `ulimit -v LIMIT_KIB` and asserts it fails with exit status 1 and
/// one error line holding every one of `needles`; returns stderr.
fn refused(args: &[&str], needles: &[&str]) -> String {
    refused_under(LIMIT_KIB, args, needles)
}

fn refused_under(limit_kib: u64, args: &[&str], needles: &[&str]) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {limit_kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("sh runs");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "tandem {args:?} under ulimit -v {limit_kib}: status {:?}, stderr:\n{err}", out.status);
    assert!(!err.contains("memory allocation of") && !err.contains("panicked"), "tandem {args:?} aborted:\n{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "tandem {args:?}: one error line expected:\n{err}");
    for n in needles {
        assert!(err.contains(n), "tandem {args:?}: stderr lacks {n:?}:\n{err}");
    }
    err
}

fn write(path: &Path, tensors: Vec<(&str, HostTensor)>, meta: &[(&str, String)]) {
    let tensors: Vec<(String, HostTensor)> = tensors.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
    let meta: BTreeMap<String, String> = meta.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    write_safetensors(path, &tensors, &meta).unwrap();
}

/// A run configuration as `tandem train --model gpt` records it, of a model with `n_embd`.
fn gpt_config(n_embd: u64) -> String {
    serde_json::json!({
        "model": "gpt",
        "gpt": { "n_layer": 4, "n_head": 4, "n_embd": n_embd, "block_size": 64, "vocab_size": 3, "dropout": 0.0, "bias": true },
        "vocab": "abc",
    })
    .to_string()
}

/// A file of a few hundred bytes whose metadata claims a GPT of `n_embd` 8192 (4.3 GB of
/// parameters) or 1048576 (13 TB), and which holds no tensor to back the claim.
#[test]
fn a_checkpoint_whose_config_lies_is_refused_before_building() {
    let dir = scratch("config-lies");
    for n_embd in [8192, 1_048_576] {
        let path = dir.join(format!("lies-{n_embd}.safetensors"));
        write(&path, vec![], &[("config", gpt_config(n_embd))]);
        assert!(std::fs::metadata(&path).unwrap().len() < 512);
        let p = s(&path);
        refused(&["generate", "--init", p, "--prompt", "ab", "--devices", "cpu"], &[p, "transformer.wte.weight", "missing"]);
    }
}

/// The tensors of a real (tiny) GPT under a configuration claiming a wider one: the first
/// parameter whose shape differs is named with both shapes.
#[test]
fn a_checkpoint_whose_config_disagrees_with_its_tensors_names_the_tensor() {
    let dir = scratch("config-disagrees");
    let path = dir.join("tiny.safetensors");
    let (c, v) = (8usize, 3usize);
    let wte = HostTensor::f32(vec![v, c], vec![0.0; v * c]).unwrap();
    write(&path, vec![("transformer.wte.weight", wte)], &[("config", gpt_config(8192))]);
    refused(&["generate", "--init", s(&path), "--prompt", "ab", "--devices", "cpu"], &["transformer.wte.weight is [3, 8]", "[3, 8192]"]);
}

/// Windows `[10, 2]` of token ids, one of them `id`.
fn token_file(path: &Path, id: i32, meta: &[(&str, String)]) {
    let mut x: Vec<i32> = (0..20).map(|i| i % 5).collect();
    x[7] = id;
    let y: Vec<i32> = (0..20).map(|i| (i + 1) % 5).collect();
    write(path, vec![("x", HostTensor::i32(vec![10, 2], x).unwrap()), ("y", HostTensor::i32(vec![10, 2], y).unwrap())], meta);
}

/// One id of 2^24 made a vocabulary of 16.7M (5.2 GB of embeddings); 2^31-1 aborted.
#[test]
fn a_token_id_past_the_vocabulary_limit_is_refused() {
    let dir = scratch("huge-id");
    let limit = tandem::data::text::MAX_VOCAB.to_string();
    for id in [1 << 24, i32::MAX] {
        let path = dir.join(format!("ids-{id}.safetensors"));
        token_file(&path, id, &[]);
        let p = s(&path);
        let args = ["train", "--model", "gpt", "--data", p, "--steps", "1", "--batch", "2", "--devices", "cpu"];
        refused(&args, &[p, &id.to_string(), "flat index 7", &limit]);
    }
}

/// A file's `vocab_size` metadata is the vocabulary: ids must lie below it, and the model gets
/// exactly that many rows even where the ids use fewer.
#[test]
fn a_token_files_declared_vocabulary_sizes_the_model_and_bounds_its_ids() {
    use tandem::data::text::TokenWindows;
    let dir = scratch("declared-vocab");
    let ok = dir.join("declared.safetensors");
    token_file(&ok, 4, &[("vocab_size", "100".into())]);
    assert_eq!(TokenWindows::load(&ok).unwrap().vocab_size, 100);
    let past = dir.join("past.safetensors");
    token_file(&past, 100, &[("vocab_size", "100".into())]);
    let e = TokenWindows::load(&past).expect_err("an id at the declared size is refused").to_string();
    assert!(e.contains("token id 100") && e.contains("0..100") && e.contains("vocab_size"), "{e}");
    let huge = dir.join("huge.safetensors");
    token_file(&huge, 4, &[("vocab_size", "4294967296".into())]);
    let e = TokenWindows::load(&huge).expect_err("a declared size past the limit is refused").to_string();
    assert!(e.contains("vocab_size") && e.contains(&tandem::data::text::MAX_VOCAB.to_string()), "{e}");
}

/// 4 blocks of n_embd 65536 hold 824 GB of parameters: refused before the first one is drawn.
#[test]
fn a_model_too_big_for_the_cpu_is_out_of_memory() {
    let args = ["train", "--model", "gpt", "--data", "text", "--n-embd", "65536", "--steps", "1", "--batch", "2", "--devices", "cpu"];
    refused(&args, &["out of memory on cpu", "bytes free", "n_embd=65536"]);
}

/// The same on lavapipe, under the larger limit its start-up needs.
#[test]
fn a_model_too_big_for_wgpu_is_out_of_memory() {
    if !tandem::Device::list().iter().any(|d| d.backend == tandem::BackendKind::Wgpu) {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but no wgpu adapter was found");
        eprintln!("skipping: no wgpu adapter");
        return;
    }
    let args = ["train", "--model", "gpt", "--data", "text", "--n-embd", "65536", "--steps", "1", "--batch", "2", "--devices", "wgpu:0"];
    refused_under(WGPU_LIMIT_KIB, &args, &["out of memory on wgpu:0", "bytes free", "n_embd=65536"]);
}

/// Parameters that fit (400 MB) but not with their gradients and AdamW state: refused before
/// the first weight is drawn (reaching the limit midway could meet an allocation of a library
/// that aborts, such as the matmul's packing buffers).
#[test]
fn training_state_past_the_memory_is_out_of_memory() {
    let args = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--n-embd",
        "2048",
        "--n-layer",
        "2",
        "--block-size",
        "8",
        "--steps",
        "1",
        "--batch",
        "1",
        "--devices",
        "cpu",
    ];
    refused(&args, &["out of memory on cpu", "bytes free", "gradients and 2 optimizer state tensors"]);
}

/// `--batch 2^40` windows of 64 tokens would be 281 TB of ids on the host.
#[test]
fn a_batch_too_big_for_the_host_is_out_of_memory() {
    let args = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--batch",
        "1099511627776",
        "--n-layer",
        "1",
        "--n-embd",
        "16",
        "--steps",
        "1",
        "--devices",
        "cpu",
    ];
    refused(&args, &["out of memory on host", "asked for 281474976710656 bytes", "a batch of 1099511627776 windows"]);
}

/// The library's own check: a configuration whose parameters exceed the device is
/// `OutOfMemory` before any is drawn, and one whose parameter count overflows is invalid.
#[test]
fn a_gpt_config_past_the_memory_fails_cleanly_in_the_library() {
    use tandem::nn::models::{Gpt, GptConfig};
    let dev = tandem::Device::cpu();
    let big = GptConfig { n_layer: 4, n_head: 4, n_embd: 1 << 20, block_size: 64, vocab_size: 3, ..Default::default() };
    match Gpt::new(big, 0, &dev).err().expect("13 TB of parameters") {
        tandem::Error::OutOfMemory { device, requested, .. } => {
            assert_eq!(device, "cpu");
            assert_eq!(Some(requested), big.parameter_bytes());
        }
        e => panic!("{e}"),
    }
    let overflowing = GptConfig { n_layer: usize::MAX, ..big };
    let e = Gpt::new(overflowing, 0, &dev).err().expect("a count past 64 bits").to_string();
    assert!(e.contains("64 bits"), "{e}");
}

/// Host vectors sized by a caller's numbers are fallible: drawing 2^40 normal values or an
/// arange of 10^30 is `OutOfMemory` naming the host, not an abort.
#[test]
fn host_vectors_of_absurd_sizes_are_out_of_memory() {
    let dev = tandem::Device::cpu();
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0);
    let results = [
        ("randn", tandem::Tensor::randn([1usize << 40], &mut rng, &dev).map(drop)),
        ("rand_uniform", tandem::Tensor::rand_uniform(0.0, 1.0, [1usize << 20, 1 << 20], &mut rng, &dev).map(drop)),
        ("arange", tandem::Tensor::arange(0.0, 1e30, 1.0, &dev).map(drop)),
    ];
    for (op, r) in results {
        match r {
            Err(tandem::Error::OutOfMemory { device, requested, .. }) => {
                assert!(device == "host" && requested >= 1 << 40, "{op}: {device} {requested}")
            }
            other => panic!("{op}: {other:?}"),
        }
    }
}
