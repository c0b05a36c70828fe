//! GPT-2 in the Hugging Face layout (`config.json` + `model.safetensors`, as `save_pretrained`
//! writes them): a round trip, files in `transformers`' own names and shapes, and hostile
//! folders, each refused with an error naming the tensor or the field.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tandem::checkpoint::{read_safetensors, write_safetensors, HostData, HostTensor};
use tandem::nn::models::hf_gpt2;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::Module;
use tandem::{Device, Error, Tensor};

const CFG: GptConfig = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, block_size: 6, vocab_size: 11, dropout: 0.1, bias: true };

/// A fresh directory under target/tmp.
fn scratch(what: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf-gpt2-{what}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

/// A folder of a model of `CFG` drawn from `seed`, as tandem writes it; its tensors and config.
fn saved(what: &str, seed: u64) -> (PathBuf, Gpt) {
    let dir = scratch(what);
    let gpt = Gpt::new(CFG, seed, &Device::cpu()).unwrap();
    gpt.save_hf(&dir).unwrap();
    (dir, gpt)
}

fn tensors(dir: &Path) -> Vec<(String, HostTensor)> {
    read_safetensors(dir.join("model.safetensors")).unwrap().0
}

fn rewrite(dir: &Path, tensors: &[(String, HostTensor)]) {
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(dir.join("model.safetensors"), tensors, &meta).unwrap();
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn set_config(dir: &Path, key: &str, value: serde_json::Value) {
    let mut c = config(dir);
    c[key] = value;
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
}

fn f32s(t: &HostTensor) -> &[f32] {
    match &t.data {
        HostData::F32(v) => v,
        HostData::I32(_) => panic!("integers"),
    }
}

/// The folder's error as a Format error of `file` in it: its detail.
fn refused(dir: &Path, file: &str) -> String {
    match Gpt::from_hf(dir, &Device::cpu()) {
        Err(Error::Format { path, detail }) => {
            assert_eq!(path, dir.join(file), "{detail}");
            detail
        }
        Err(e) => panic!("expected a format error of {file}, got {e}"),
        Ok(_) => panic!("expected a format error of {file}, got a model"),
    }
}

#[test]
fn a_round_trip_keeps_every_weight_and_the_logits() {
    let (dir, gpt) = saved("round-trip", 3);
    let back = Gpt::from_hf(&dir, &Device::cpu()).unwrap();
    assert_eq!(back.config, CFG);
    let (a, b) = (gpt.state_dict(), back.state_dict());
    assert_eq!(a.iter().map(|(n, _)| n).collect::<Vec<_>>(), b.iter().map(|(n, _)| n).collect::<Vec<_>>());
    for ((n, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(x.to_vec().unwrap(), y.to_vec().unwrap(), "{n}");
    }
    gpt.eval();
    let ids = Tensor::from_labels(vec![1, 5, 10, 0, 3, 7], [1, 6], &Device::cpu()).unwrap();
    assert_eq!(gpt.forward(&ids).unwrap().to_vec().unwrap(), back.forward(&ids).unwrap().to_vec().unwrap());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_files_are_in_transformers_names_shapes_and_config() {
    let (dir, gpt) = saved("layout", 4);
    let (files, meta) = read_safetensors(dir.join("model.safetensors")).unwrap();
    assert_eq!(meta.get("format").map(String::as_str), Some("pt"));
    let by_name: BTreeMap<&str, &HostTensor> = files.iter().map(|(n, t)| (n.as_str(), t)).collect();
    // Tied: save_pretrained leaves lm_head.weight out.
    assert!(!by_name.contains_key("lm_head.weight"));
    assert_eq!(by_name.len(), 2 + 12 * CFG.n_layer + 2);
    // A Conv1D weight is [in, out]: the transpose of tandem's Linear [out, in].
    let ours = gpt.state_dict().into_iter().find(|(n, _)| n == "transformer.h.1.mlp.c_fc.weight").unwrap().1;
    let theirs = by_name["transformer.h.1.mlp.c_fc.weight"];
    assert_eq!((ours.dims(), theirs.shape.as_slice()), (&[32, 8][..], &[8, 32][..]));
    let (o, t) = (ours.to_vec().unwrap(), f32s(theirs).to_vec());
    assert_eq!(t[3 * 32 + 17], o[17 * 8 + 3]);
    assert_eq!(by_name["transformer.h.0.attn.c_attn.weight"].shape, [8, 24]);
    assert_eq!(by_name["transformer.wpe.weight"].shape, [6, 8]);
    let c = config(&dir);
    assert_eq!(c["architectures"], serde_json::json!(["GPT2LMHeadModel"]));
    for (key, want) in [
        ("model_type", serde_json::json!("gpt2")),
        ("activation_function", "gelu_new".into()),
        ("n_positions", 6.into()),
        ("n_ctx", 6.into()),
        ("n_embd", 8.into()),
        ("n_layer", 2.into()),
        ("n_head", 2.into()),
        ("vocab_size", 11.into()),
        ("layer_norm_epsilon", 1e-5.into()),
        ("resid_pdrop", 0.1.into()),
    ] {
        assert_eq!(c[key], want, "{key}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn gpt2models_bare_names_buffers_and_an_equal_lm_head_load() {
    let (dir, gpt) = saved("bare", 5);
    let mut files: Vec<(String, HostTensor)> =
        tensors(&dir).into_iter().map(|(n, t)| (n.trim_start_matches("transformer.").to_string(), t)).collect();
    let wte = files.iter().find(|(n, _)| n == "wte.weight").unwrap().1.clone();
    files.push(("lm_head.weight".into(), wte));
    for i in 0..CFG.n_layer {
        files.push((format!("h.{i}.attn.bias"), HostTensor::f32(vec![1, 1, 6, 6], vec![1.0; 36]).unwrap()));
        files.push((format!("h.{i}.attn.masked_bias"), HostTensor::f32(vec![], vec![-1e4]).unwrap()));
    }
    rewrite(&dir, &files);
    let back = Gpt::from_hf(&dir, &Device::cpu()).unwrap();
    assert_eq!(back.lm_head().to_vec().unwrap(), gpt.lm_head().to_vec().unwrap());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_missing_or_misshapen_or_unknown_tensor_is_named() {
    let (dir, _) = saved("tensors", 6);
    let all = tensors(&dir);
    let without: Vec<_> = all.iter().filter(|(n, _)| n != "transformer.h.1.ln_2.bias").cloned().collect();
    rewrite(&dir, &without);
    let d = refused(&dir, "model.safetensors");
    assert!(d.contains("transformer.h.1.ln_2.bias [8] is missing"), "{d}");

    let mut wrong = all.clone();
    let at = wrong.iter().position(|(n, _)| n == "transformer.h.0.attn.c_proj.weight").unwrap();
    wrong[at].1 = HostTensor::f32(vec![4, 16], vec![0.0; 64]).unwrap();
    rewrite(&dir, &wrong);
    let d = refused(&dir, "model.safetensors");
    assert!(d.contains("transformer.h.0.attn.c_proj.weight is [4, 16]") && d.contains("needs [8, 8]"), "{d}");

    let mut extra = all.clone();
    extra.push(("transformer.h.0.attn.q_proj.weight".into(), HostTensor::f32(vec![8, 8], vec![0.0; 64]).unwrap()));
    rewrite(&dir, &extra);
    let d = refused(&dir, "model.safetensors");
    assert!(d.contains("transformer.h.0.attn.q_proj.weight is not a tensor of GPT-2"), "{d}");

    let mut head = all.clone();
    head.push(("lm_head.weight".into(), HostTensor::f32(vec![11, 8], vec![0.5; 88]).unwrap()));
    rewrite(&dir, &head);
    let d = refused(&dir, "model.safetensors");
    assert!(d.contains("lm_head.weight differs from transformer.wte.weight"), "{d}");

    let mut ints = all;
    let at = ints.iter().position(|(n, _)| n == "transformer.ln_f.weight").unwrap();
    ints[at].1 = HostTensor::i32(vec![8], vec![1; 8]).unwrap();
    rewrite(&dir, &ints);
    let d = refused(&dir, "model.safetensors");
    assert!(d.contains("transformer.ln_f.weight holds integers"), "{d}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unsupported_or_hostile_config_fields_are_named() {
    let (dir, _) = saved("config", 7);
    let original = config(&dir);
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("activation_function", "relu".into(), "activation_function \"relu\" is not supported"),
        ("activation_function", "gelu".into(), "activation_function \"gelu\" is not supported"),
        ("n_embd", (1u64 << 40).into(), "n_embd is 1099511627776; tandem takes a whole number in 1..=65536"),
        ("vocab_size", 1_000_000_000_000u64.into(), "vocab_size is 1000000000000"),
        ("n_layer", 100_000.into(), "n_layer is 100000"),
        ("n_positions", 0.into(), "n_positions is 0"),
        ("n_head", (-4).into(), "n_head is -4"),
        ("n_head", 3.into(), "n_embd 8 is not a multiple of n_head 3"),
        ("n_layer", "2".into(), "n_layer is \"2\""),
        ("n_ctx", 1024.into(), "n_ctx is 1024 but n_positions is 6"),
        ("layer_norm_epsilon", 1e-6.into(), "layer_norm_epsilon 1e-6 is not supported"),
        ("n_inner", 64.into(), "n_inner 64 is not supported"),
        ("tie_word_embeddings", false.into(), "tie_word_embeddings false is not supported"),
        ("scale_attn_by_inverse_layer_idx", true.into(), "scale_attn_by_inverse_layer_idx true is not supported"),
        ("attn_pdrop", 0.0.into(), "resid_pdrop 0.1, embd_pdrop 0.1, attn_pdrop 0 differ"),
        ("model_type", "llama".into(), "model_type is \"llama\", not \"gpt2\""),
    ];
    for (key, value, want) in cases {
        std::fs::write(dir.join("config.json"), original.to_string()).unwrap();
        set_config(&dir, key, value.clone());
        let d = refused(&dir, "config.json");
        assert!(d.contains(want), "{key} = {value}: {d}");
    }
    // Sizes that agree with each other but not with the tensors: the tensor is named.
    std::fs::write(dir.join("config.json"), original.to_string()).unwrap();
    set_config(&dir, "n_layer", 3.into());
    let d = refused(&dir, "model.safetensors");
    assert!(d.contains("transformer.h.2.ln_1.weight [8] is missing"), "{d}");
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"gpt2\"").unwrap();
    assert!(refused(&dir, "config.json").contains("not JSON"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_folder_without_one_weights_file_says_what_it_has() {
    let (dir, _) = saved("sharded", 8);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert!(refused(&dir, "model.safetensors").contains("no model.safetensors"));
    std::fs::write(dir.join("model.safetensors.index.json"), "{}").unwrap();
    assert!(refused(&dir, "model.safetensors").contains("sharded"));
    std::fs::remove_file(dir.join("config.json")).unwrap();
    assert!(matches!(Gpt::from_hf(&dir, &Device::cpu()), Err(Error::Io { path, .. }) if path == dir.join("config.json")));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_model_without_biases_is_not_written_as_gpt2() {
    let cfg = GptConfig { bias: false, ..CFG };
    let gpt = Gpt::new(cfg, 0, &Device::cpu()).unwrap();
    let dir = scratch("no-bias");
    let err = gpt.save_hf(&dir).unwrap_err().to_string();
    assert!(err.contains("has no biases"), "{err}");
    assert!(!dir.exists());
    // A state dict short of a parameter is refused before anything is written.
    let state: Vec<_> = Gpt::new(CFG, 0, &Device::cpu()).unwrap().state_dict().into_iter().filter(|(n, _)| n != "transformer.ln_f.bias").collect();
    let err = hf_gpt2::write(&dir, &CFG, &state).unwrap_err().to_string();
    assert!(err.contains("transformer.ln_f.bias"), "{err}");
    assert!(!dir.exists());
}

/// Whether python3 imports every one of `modules`; without them the Python comparison is
/// skipped, or fails under CI=true (scripts/test.sh installs them).
fn python_has(modules: &[&str]) -> bool {
    let import = format!("import {}", modules.join(", "));
    let has = std::process::Command::new("python3").args(["-c", &import]).status().is_ok_and(|s| s.success());
    if !has {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but python3 cannot {import}");
        eprintln!("skipped: python3 cannot {import}");
    }
    has
}

fn parity_script(step: &str, dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join("hf_gpt2_parity.py");
    let out = std::process::Command::new("python3").arg(script).arg(step).arg(dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hf_gpt2_parity.py {step}: {err}");
    eprintln!("{err}");
}

#[test]
fn logits_equal_the_reference_on_transformers_files_and_on_ours() {
    if !python_has(&["transformers", "safetensors", "numpy"]) {
        return;
    }
    let dir = scratch("parity");
    std::fs::create_dir_all(&dir).unwrap();
    // A batch of real text in GPT-2's tokens.
    let text = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness. \
                Ein Fuchs läuft über die Straße; 東京の狐 🦊 runs\tacross\n\nthe road, 42 times.";
    let ids = tandem::data::Tokenizer::gpt2().encode(text).unwrap();
    std::fs::write(dir.join("ids.json"), serde_json::to_string(&ids).unwrap()).unwrap();
    parity_script("make", &dir);
    let rows: Vec<Vec<i32>> = serde_json::from_str(&std::fs::read_to_string(dir.join("ids.json")).unwrap()).unwrap();
    let (b, t) = (rows.len(), rows[0].len());
    let cpu = Device::cpu();
    let gpt = Gpt::from_hf(dir.join("model"), &cpu).unwrap();
    let logits = gpt.forward(&Tensor::from_labels(rows.concat(), [b, t], &cpu).unwrap()).unwrap();
    let (want, _) = read_safetensors(dir.join("logits.safetensors")).unwrap();
    let (got, want) = (logits.to_vec().unwrap(), f32s(&want[0].1).to_vec());
    assert_eq!(got.len(), want.len());
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4, "tandem's logits differ from the reference's by {worst}");
    // Written back by tandem, the folder gives the same logits on the reference's side.
    gpt.save_hf(dir.join("out")).unwrap();
    let logits = [("logits".to_string(), HostTensor::f32(vec![b, t, gpt.config.vocab_size], got).unwrap())];
    write_safetensors(dir.join("tandem_logits.safetensors"), &logits, &BTreeMap::new()).unwrap();
    parity_script("check", &dir);
    std::fs::remove_dir_all(dir).ok();
}
