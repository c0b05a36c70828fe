//! GPT-2 from the command line: `--tokenizer gpt2` trains on a text in GPT-2's BPE tokens and
//! records it, so `generate` reads the prompt with it; `export-hf` writes a Hugging Face folder
//! and `train --init DIR` fine-tunes from one, taking its shape.
#![cfg(feature = "cli")]
mod common;
use common::{ok, s, text};
use std::path::{Path, PathBuf};
use tandem::checkpoint::read_safetensors;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::Device;

const TEXT: &str = "Ein Fuchs läuft über die Straße. The fox runs 🦊 across the road.\n\tLe renard traverse la route.  ";

/// A directory with a text of GPT-2 tokens and nothing else.
fn with_text(name: &str) -> (PathBuf, PathBuf) {
    let dir = common::scratch("gpt2-cli", name);
    let path = dir.join("input.txt");
    std::fs::write(&path, TEXT.repeat(30)).unwrap();
    (dir, path)
}

/// A tiny GPT trained for one step on `data` in GPT-2 tokens, saved to `save`.
fn train_gpt2(data: &Path, save: &Path, extra: &[&str]) -> std::process::Output {
    let data = format!("text:{}", s(data));
    let args = [
        &["train", "--model", "gpt", "--data", &data, "--tokenizer", "gpt2", "--devices", "cpu", "--steps", "1", "--batch", "2"][..],
        extra,
        &["--save", s(save)],
    ]
    .concat();
    ok(&args)
}

fn usage_error(args: &[&str], needles: &[&str]) {
    let out = common::run(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "tandem {args:?} should be a usage error (exit 2):\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "tandem {args:?}: stderr does not say {n:?}:\n{err}");
    }
}

#[test]
fn a_gpt2_tokenized_run_records_its_tokenizer_and_generate_uses_it() {
    let (dir, data) = with_text("generate");
    let save = dir.join("w.safetensors");
    train_gpt2(&data, &save, &["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]);
    let (_, meta) = read_safetensors(&save).unwrap();
    let config: serde_json::Value = serde_json::from_str(&meta["config"]).unwrap();
    assert_eq!((&config["tokenizer"], &config["gpt"]["vocab_size"], &config["vocab"]), (&"gpt2".into(), &50257.into(), &serde_json::Value::Null));
    // A prompt of characters the training text never had: GPT-2's BPE takes any text.
    let out = ok(&["generate", "--init", s(&save), "--prompt", "Καλημέρα 👋", "--tokens", "12", "--seed", "1"]);
    let said = text(&out.stdout);
    assert!(said.starts_with("Καλημέρα 👋") && said.len() > "Καλημέρα 👋\n".len(), "{said:?}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_resume_under_another_tokenizer_is_refused_naming_the_flag() {
    let (dir, data) = with_text("resume");
    let ckpt = dir.join("ckpt");
    let base = [
        "train",
        "--model",
        "gpt",
        "--data",
        &format!("text:{}", s(&data)),
        "--devices",
        "cpu",
        "--steps",
        "1",
        "--batch",
        "2",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "8",
        "--checkpoint-dir",
        s(&ckpt),
    ];
    ok(&[&base[..], &["--tokenizer", "gpt2"]].concat());
    let out = common::run(&[&base[..], &["--steps", "2", "--resume"]].concat());
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("--tokenizer chars (checkpoint: gpt2)"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn tokenizer_flags_that_cannot_apply_are_usage_errors() {
    let (dir, data) = with_text("usage");
    let text_data = format!("text:{}", s(&data));
    usage_error(
        &["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--steps", "1", "--tokenizer", "gpt2"],
        &["--tokenizer", "--model gpt only"],
    );
    usage_error(
        &["train", "--model", "gpt", "--data", &text_data, "--devices", "cpu", "--steps", "1", "--tokenizer", "gpt3"],
        &["--tokenizer", "gpt3"],
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn export_hf_writes_a_folder_that_train_init_fine_tunes_and_exports_again() {
    let (dir, data) = with_text("hf");
    let save = dir.join("w.safetensors");
    let shape = ["--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "24"];
    train_gpt2(&data, &save, &shape);
    let hf = dir.join("hf");
    let out = ok(&["export-hf", "--init", s(&save), "--out", s(&hf)]);
    assert!(text(&out.stdout).contains("tokenizer gpt2"), "{}", text(&out.stdout));
    let model = Gpt::from_hf(&hf, &Device::cpu()).unwrap();
    assert_eq!(model.config, GptConfig { n_layer: 2, n_head: 2, n_embd: 16, block_size: 24, vocab_size: 50257, dropout: 0.0, bias: true });
    let (saved, _) = read_safetensors(&save).unwrap();
    let wte = saved.iter().find(|(n, _)| n == "transformer.wte.weight").unwrap();
    assert_eq!(tandem::checkpoint::HostData::F32(model.lm_head().to_vec().unwrap()), wte.1.data);

    // Fine-tune from the folder: its shape, windows cut to --block-size, then export again.
    let tuned = dir.join("tuned.safetensors");
    train_gpt2(&data, &tuned, &["--init", s(&hf), "--block-size", "12"]);
    let back = dir.join("hf2");
    ok(&["export-hf", "--init", s(&tuned), "--out", s(&back)]);
    let again = Gpt::from_hf(&back, &Device::cpu()).unwrap();
    assert_eq!((again.config.n_layer, again.config.n_embd, again.config.block_size), (2, 16, 12));
    assert_ne!(again.lm_head().to_vec().unwrap(), model.lm_head().to_vec().unwrap(), "a step of AdamW moves the weights");
    // The position embeddings kept are the folder's first 12 rows, moved by the step.
    assert_eq!(again.transformer.wpe.weight.dims(), [12, 16]);

    // A shape flag the folder does not have, or a vocabulary it does not read, is refused.
    let text_data = format!("text:{}", s(&data));
    let base = ["train", "--model", "gpt", "--data", &text_data, "--devices", "cpu", "--steps", "1", "--init", s(&hf)];
    usage_error(&[&base[..], &["--tokenizer", "gpt2", "--n-layer", "3"]].concat(), &["--n-layer", "3, but the model of --init"]);
    usage_error(&base, &["--tokenizer", "vocabulary of 50257 tokens"]);
    usage_error(&[&base[..], &["--tokenizer", "gpt2", "--block-size", "25"]].concat(), &["--block-size", "at most 24"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_run_from_a_hugging_face_folder_records_its_weights_and_resumes_with_it() {
    let (dir, data) = with_text("hf-resume");
    let save = dir.join("w.safetensors");
    train_gpt2(&data, &save, &["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8"]);
    let hf = dir.join("hf");
    ok(&["export-hf", "--init", s(&save), "--out", s(&hf)]);
    let ckpt = dir.join("ckpt");
    let text_data = format!("text:{}", s(&data));
    let base = [
        "train",
        "--model",
        "gpt",
        "--data",
        &text_data,
        "--tokenizer",
        "gpt2",
        "--devices",
        "cpu",
        "--batch",
        "2",
        "--init",
        s(&hf),
        "--checkpoint-dir",
        s(&ckpt),
    ];
    ok(&[&base[..], &["--steps", "1"]].concat());
    // The folder given again (as a scheduler restarts the same command) is the run's: accepted.
    ok(&[&base[..], &["--steps", "2", "--resume"]].concat());
    // Another folder is refused, naming both.
    let other = dir.join("other");
    ok(&["export-hf", "--init", s(&ckpt.join("ckpt-00000002.safetensors")), "--out", s(&other)]);
    let moved = [&base[..11], &["--init", s(&other), "--checkpoint-dir", s(&ckpt), "--steps", "3", "--resume"]].concat();
    usage_error(&moved, &["--init", "is not the file the run being resumed started from"]);
    std::fs::remove_dir_all(dir).ok();
}

/// One Hugging Face folder fine-tuned under sharded data parallelism, a pipeline, data ×
/// tensor, tensor × pipeline and the planner (`--strategy auto`) gives one device's losses
/// (1e-5 relative; the planner's 1e-4), and under `--precision bf16` the same first loss
/// within bf16's rounding.
#[test]
fn a_hugging_face_folder_fine_tunes_under_every_strategy_and_precision() {
    let (dir, data) = with_text("hf-strategies");
    let save = dir.join("w.safetensors");
    train_gpt2(&data, &save, &["--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "24"]);
    let hf = dir.join("hf");
    ok(&["export-hf", "--init", s(&save), "--out", s(&hf)]);
    let text_data = format!("text:{}", s(&data));
    let base = [
        "train",
        "--model",
        "gpt",
        "--data",
        &text_data,
        "--tokenizer",
        "gpt2",
        "--init",
        s(&hf),
        "--block-size",
        "12",
        "--batch",
        "4",
        "--steps",
        "2",
    ];
    let run = |extra: &[&str]| common::logged_losses(&[&base[..], extra].concat());
    let single = run(&["--devices", "cpu"]);
    assert_eq!(single.len(), 2, "{single:?}");
    let layouts: [&[&str]; 4] = [
        &["--strategy", "data", "--shard", "full", "--devices", "cpu,cpu"],
        &["--strategy", "pipeline", "--micro-batches", "2", "--devices", "cpu,cpu"],
        &["--strategy", "data,tensor", "--tensor", "2", "--devices", "cpu,cpu,cpu,cpu"],
        &["--strategy", "pipeline", "--tensor", "2", "--micro-batches", "2", "--devices", "cpu,cpu,cpu,cpu"],
    ];
    for layout in layouts {
        common::assert_close(&format!("{layout:?} from the folder"), &run(layout), &single, 0.0, 1e-5);
    }
    common::assert_close("--strategy auto from the folder", &run(&["--strategy", "auto", "--devices", "cpu,cpu"]), &single, 0.0, 1e-4);
    let bf16 = run(&["--devices", "cpu", "--precision", "bf16"]);
    assert!(bf16.iter().all(|l| l.is_finite()), "{bf16:?}");
    common::assert_close("--precision bf16's first loss from the folder", &bf16[..1], &single[..1], 0.0, 2e-2);
    std::fs::remove_dir_all(dir).ok();
}
