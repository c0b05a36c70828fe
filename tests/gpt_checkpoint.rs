//! `GptConfig::from_checkpoint`: a GPT's shape and vocabulary read back from the `config`
//! metadata of a tandem file, vouched for by the file's tensors.
use std::collections::BTreeMap;
use tandem::checkpoint::{to_host, write_safetensors};
use tandem::nn::models::{Gpt, GptCheckpoint, GptConfig};
use tandem::nn::Module;
use tandem::{Device, Error};

const CFG: GptConfig = GptConfig { n_layer: 1, n_head: 2, n_embd: 4, block_size: 3, vocab_size: 3, dropout: 0.0, bias: true };

/// A `--save` file of a GPT over the characters "abc", whose metadata claims `gpt`.
fn saved(name: &str, gpt: serde_json::Value) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("tandem-gptckpt-{name}-{}.safetensors", std::process::id()));
    let model = Gpt::new(CFG, 0, &Device::cpu()).unwrap();
    let config = serde_json::json!({ "model": "gpt", "gpt": gpt, "vocab": "abc" });
    let meta = BTreeMap::from([("config".to_string(), config.to_string())]);
    write_safetensors(&path, &to_host(&model.state_dict()).unwrap(), &meta).unwrap();
    path
}

fn claim(n_layer: usize) -> serde_json::Value {
    serde_json::json!({ "n_layer": n_layer, "n_head": 2, "n_embd": 4, "block_size": 3, "vocab_size": 3, "dropout": 0.0, "bias": true })
}

#[test]
fn the_config_and_vocabulary_come_back_from_the_file() {
    let path = saved("ok", claim(1));
    let (cfg, vocab) = GptConfig::from_checkpoint(&path).unwrap();
    assert_eq!(cfg, CFG);
    assert_eq!(vocab.unwrap().encode("cab").unwrap(), vec![2, 0, 1]);
    let whole = GptCheckpoint::read(&path).unwrap();
    let model = Gpt::from_state_dict(
        whole.config,
        &whole.weights.into_iter().map(|(n, s, v)| (n, tandem::Tensor::from_vec(v, s, &Device::cpu()).unwrap())).collect::<Vec<_>>(),
        &Device::cpu(),
    );
    assert!(model.is_ok());
    std::fs::remove_file(path).ok();
}

#[test]
fn a_config_that_claims_more_than_the_tensors_is_refused() {
    let path = saved("big", claim(40));
    match GptConfig::from_checkpoint(&path) {
        Err(Error::Format { path: p, detail }) => {
            assert_eq!(p, path);
            assert!(detail.contains("its run configuration and its tensors disagree"), "{detail}");
        }
        other => panic!("a file claiming 40 layers with 1 must be refused, got {:?}", other.map(|r| r.0)),
    }
    std::fs::remove_file(path).ok();
}
