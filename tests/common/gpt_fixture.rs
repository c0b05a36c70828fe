//! The PyTorch GPT fixture (tests/fixtures/gpt_tiny.safetensors, made by
//! `scripts/gpt_parity.py make`): nanoGPT's initial weights, ten token batches, the AdamW
//! settings, and the reference's losses, gradient norms and final weights.
// Each test file that includes this uses part of it.
#![allow(dead_code)]
use std::collections::HashMap;
use tandem::checkpoint::{read_safetensors, HostData, HostTensor};
use tandem::data::Batch;
use tandem::nn::models::GptConfig;
use tandem::optim::{AdamConfig, OptimConfig, ParamGroups};
use tandem::parallel::{Loss, Strategy};
use tandem::{Device, Tensor};

pub struct Fixture {
    tensors: HashMap<String, HostTensor>,
    /// Each metadata entry parsed as JSON (a string where it is not).
    meta: serde_json::Value,
}

impl Fixture {
    pub fn load() -> Fixture {
        Fixture::file(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_tiny.safetensors"))
    }
    /// PyTorch's losses under autocast from this fixture's start (`losses_f32`, `losses_bf16`,
    /// `losses_f16`; made by scripts/gpt_amp_parity.py).
    pub fn amp() -> Fixture {
        Fixture::file(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_tiny_amp.safetensors"))
    }
    fn file(path: &str) -> Fixture {
        let (tensors, meta) =
            read_safetensors(path).unwrap_or_else(|e| panic!("the fixture reads (scripts/gpt_parity.py, gpt_amp_parity.py make): {e}"));
        let meta: serde_json::Map<String, serde_json::Value> =
            meta.into_iter().map(|(k, v)| (k, serde_json::from_str(&v).unwrap_or(serde_json::Value::String(v)))).collect();
        Fixture { tensors: tensors.into_iter().collect(), meta: meta.into() }
    }
    pub fn json(&self, key: &str) -> &serde_json::Value {
        &self.meta[key]
    }
    pub fn config(&self) -> GptConfig {
        let n = |k: &str| self.meta["config"][k].as_u64().expect("a size") as usize;
        GptConfig {
            n_layer: n("n_layer"),
            n_head: n("n_head"),
            n_embd: n("n_embd"),
            block_size: n("block_size"),
            vocab_size: n("vocab_size"),
            dropout: 0.0,
            bias: true,
        }
    }
    /// A training hyper-parameter (`lr`, `beta1`, ..).
    pub fn hp(&self, k: &str) -> f32 {
        self.meta["train"][k].as_f64().expect("a number") as f32
    }
    pub fn f32s(&self, name: &str) -> &[f32] {
        match &self.tensors[name].data {
            HostData::F32(v) => v,
            HostData::I32(_) => panic!("{name} is not F32"),
        }
    }
    /// Row-major I32 values and their shape (the fixture stores I64, read back as I32).
    pub fn ids(&self, name: &str) -> (&[i32], &[usize]) {
        match &self.tensors[name].data {
            HostData::I32(v) => (v, &self.tensors[name].shape),
            HostData::F32(_) => panic!("{name} is not integer"),
        }
    }
    /// The tensors named `prefix.*` on `dev`, without the prefix, sorted by name.
    pub fn state(&self, prefix: &str, dev: &Device) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .tensors
            .iter()
            .filter_map(|(n, t)| {
                n.strip_prefix(prefix).map(|rest| (rest.to_string(), Tensor::from_vec(self.f32s(n).to_vec(), t.shape.clone(), dev).expect("upload")))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
    /// nanoGPT's initial state_dict (`lm_head.weight` included) on `dev`.
    pub fn init(&self, dev: &Device) -> Vec<(String, Tensor)> {
        self.state("init.", dev)
    }
    /// Training batch `step`: the fixture's `x[step]`, `y[step]` windows.
    pub fn batch(&self, step: usize) -> Batch {
        let ((x, shape), (y, _)) = (self.ids("x"), self.ids("y"));
        let (b, t) = (shape[1], shape[2]);
        let r = step * b * t..(step + 1) * b * t;
        Batch::tokens(x[r.clone()].to_vec(), y[r].to_vec(), t, self.config().vocab_size).unwrap()
    }
    /// nanoGPT's AdamW with its weight-decay groups (none on biases and LayerNorms).
    pub fn adamw(&self) -> OptimConfig {
        let c = AdamConfig {
            lr: self.hp("lr"),
            beta1: self.hp("beta1"),
            beta2: self.hp("beta2"),
            eps: self.hp("eps"),
            weight_decay: self.hp("weight_decay"),
            decoupled: true,
        };
        OptimConfig::adam(c).with_groups(ParamGroups::no_decay_for_biases_and_norms())
    }
    /// The fixture's steps under `s`, clipped as nanoGPT clips: PyTorch's losses within 1e-4
    /// relative, its gradient norms within 1e-3 and its final weights within 1e-3 (the tied
    /// `lm_head.weight` is the embedding, compared under that name), then
    /// [`check_val_and_save`](Self::check_val_and_save). Returns the final state.
    pub fn check_steps(&self, s: &mut dyn Strategy, what: &str) -> HashMap<String, Tensor> {
        s.set_grad_clip(Some(self.hp("grad_clip"))).unwrap();
        let (mut losses, mut norms) = (Vec::new(), Vec::new());
        for i in 0..self.json("train")["steps"].as_u64().unwrap() as usize {
            let rep = s.step(&self.batch(i)).unwrap_or_else(|e| panic!("{what}: step {i}: {e}"));
            losses.push(rep.loss);
            norms.push(rep.grad_norm.expect("clipping is on"));
        }
        eprintln!("{what}: losses {losses:?}");
        let close = tandem::tolerance::assert_close;
        close(&format!("{what}: losses"), &losses, self.f32s("losses"), 0.0, 1e-4);
        close(&format!("{what}: gradient norms"), &norms, self.f32s("grad_norms"), 0.0, 1e-3);
        let state: HashMap<String, Tensor> = s.state_dict().unwrap().into_iter().collect();
        assert!(state.len() > 3, "{what}: {} tensors in the state", state.len());
        for (name, t) in state.iter().filter(|(n, _)| n.as_str() != tandem::nn::models::Gpt::LM_HEAD) {
            close(&format!("{what}: {name} after the steps"), &t.to_vec().unwrap(), self.f32s(&format!("final.{name}")), 1e-3, 0.0);
        }
        self.check_val_and_save(s, what);
        state
    }
    /// The validation loss of a trained strategy, checked against nanoGPT's within 1e-3, and
    /// its checkpoint written under target/tmp for `python scripts/gpt_parity.py check` (a
    /// strict load into nanoGPT's GPT), named for `what`.
    pub fn check_val_and_save(&self, s: &mut dyn Strategy, what: &str) {
        let ((vx, shape), (vy, _)) = (self.ids("val_x"), self.ids("val_y"));
        let val_batch = Batch::tokens(vx.to_vec(), vy.to_vec(), shape[1], self.config().vocab_size).unwrap();
        s.set_training(false);
        let logits = s.predict(&tandem::parallel::inputs_to_device(&val_batch, &s.devices()[0]).unwrap()).unwrap();
        s.set_training(true);
        let (_, y) = tandem::parallel::batch_to_device(&val_batch, logits.device()).unwrap();
        let val = Loss::CrossEntropy.compute(&logits, &y).unwrap().to_scalar().unwrap();
        tandem::tolerance::assert_close(&format!("{what}: validation loss"), &[val], self.f32s("val_loss"), 0.0, 1e-3);
        let file: String = what.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let path = crate::common::target_tmp().join(format!("gpt_tiny_tandem_{file}.safetensors"));
        let meta = std::collections::BTreeMap::from([("val_loss".to_string(), format!("{val:.9}"))]);
        tandem::checkpoint::write_safetensors(&path, &tandem::checkpoint::to_host(&s.state_dict().unwrap()).unwrap(), &meta).unwrap();
    }
}
