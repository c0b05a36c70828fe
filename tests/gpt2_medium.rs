//! GPT-2 medium's shape (355M parameters, 5.7 GB of f32 AdamW training state) fine-tunes from a
//! Hugging Face folder on four logical CPU devices under a per-device `--memory-limit` that its
//! unsharded state does not fit: ZeRO-3 (`--shard full`) trains and saves; plain data
//! parallelism under the same budget runs out of memory. Minutes long and about 14 GB of host
//! memory, so `#[ignore]`d: scripts/gpt2-medium-check.sh runs it, and src/nn/models/finetune.md
//! records its numbers.
#![cfg(feature = "cli")]
mod common;
use common::s;
use std::time::Instant;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::Module;
use tandem::Device;

const MEDIUM: GptConfig = GptConfig { n_layer: 24, n_head: 16, n_embd: 1024, block_size: 1024, vocab_size: 50257, dropout: 0.0, bias: true };
/// Each device's budget: a quarter of the f32 state (1.32 GiB) and a step's activations, blocks
/// recomputed, fit; the whole state (5.29 GiB) does not.
const LIMIT: &str = "2GiB";
const LIMIT_BYTES: u64 = 2 << 30;
const BLOCK: usize = 64;

/// The most resident memory any finished child process had, in bytes.
fn children_max_rss() -> u64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) }, 0);
    usage.ru_maxrss as u64 * 1024
}

#[test]
#[ignore = "minutes and about 14 GB of memory: scripts/gpt2-medium-check.sh runs it"]
fn gpt2_medium_fine_tunes_on_four_cpu_devices_under_a_budget_it_does_not_fit_unsharded() {
    let dir = common::scratch("gpt2-medium", "check");
    let folder = dir.join("gpt2-medium");
    let t = Instant::now();
    let params = {
        let gpt = Gpt::new(MEDIUM, 0, &Device::cpu()).unwrap();
        gpt.save_hf(&folder).unwrap();
        gpt.parameters().iter().map(|(_, p)| p.numel() as u64).sum::<u64>()
    };
    eprintln!("a fresh GPT-2 medium ({params} parameters) written with save_hf in {:.0} s", t.elapsed().as_secs_f64());
    assert_eq!(params, 354_823_168, "GPT-2 medium's parameter count");
    // Parameters, gradients and AdamW's two moments in f32: 16 bytes a parameter.
    assert!(16 * params > LIMIT_BYTES, "the budget must be smaller than the unsharded state");
    let data = format!("text:{}", s(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")));
    let tuned = dir.join("tuned.safetensors");
    let block = BLOCK.to_string();
    let run = |shard: &str, steps: &str| -> Vec<String> {
        [
            "train",
            "--model",
            "gpt",
            "--init",
            s(&folder),
            "--data",
            &data,
            "--tokenizer",
            "gpt2",
            "--devices",
            "cpu,cpu,cpu,cpu",
            "--strategy",
            "data",
            "--shard",
            shard,
            "--recompute",
            "--memory-limit",
            LIMIT,
            "--block-size",
            &block,
            "--batch",
            "4",
            "--lr",
            "3e-5",
            "--steps",
            steps,
        ]
        .map(String::from)
        .to_vec()
    };
    let sharded = [run("full", "2"), vec!["--save".into(), s(&tuned).into()]].concat();
    let t = Instant::now();
    let out = common::ok(&sharded.iter().map(String::as_str).collect::<Vec<_>>());
    let (secs, rss) = (t.elapsed().as_secs_f64(), children_max_rss());
    eprintln!("{}", common::text(&out.stderr));
    let gib = rss as f64 / (1u64 << 30) as f64;
    eprintln!("ZeRO-3 over 4 CPU devices under {LIMIT} each: 2 steps in {secs:.0} s; the process's peak resident memory {gib:.2} GiB");
    // Back to a Hugging Face folder: GPT-2 medium with its positions cut to the run's block.
    let exported = dir.join("tuned-hf");
    common::ok(&["export-hf", "--init", s(&tuned), "--out", s(&exported)]);
    assert_eq!(Gpt::from_hf(&exported, &Device::cpu()).unwrap().config, GptConfig { block_size: BLOCK, ..MEDIUM });

    let plain = run("none", "1");
    let t = Instant::now();
    let err = common::fails(&plain.iter().map(String::as_str).collect::<Vec<_>>(), "out of memory on cpu");
    let oom = err.lines().find(|l| l.contains("out of memory")).unwrap_or("");
    eprintln!("unsharded under {LIMIT} each, after {:.0} s: {oom}", t.elapsed().as_secs_f64());
    std::fs::remove_dir_all(dir).ok();
}
