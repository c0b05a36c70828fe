//! Slips a user makes (wrong targets for a loss, a token id outside the vocabulary, a layer of
//! width 0, tensors on two devices): each is an error that names what the user wrote.
mod common;
use tandem::nn::models::{Gpt, GptConfig};
use tandem::nn::{BatchNorm1d, BatchNorm2d, Conv2d, Embedding, LayerNorm, Linear, Module};
use tandem::parallel::Loss;
use tandem::{Device, Error, Tensor};

#[test]
fn mse_loss_on_class_labels_names_mse_loss_and_the_dtype() {
    let dev = Device::cpu();
    let pred = Tensor::from_vec(vec![0.5; 4], [4], &dev).unwrap();
    let labels = Tensor::from_labels(vec![0, 1, 1, 0], [4], &dev).unwrap();
    let e = pred.mse_loss(&labels).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Invalid { op: "mse_loss", .. }), "{e:?}");
    assert!(msg.contains("I32") && msg.contains("F32") && msg.contains("cross_entropy"), "{msg}");
}

#[test]
fn loss_mse_on_class_labels_points_to_cross_entropy() {
    let dev = Device::cpu();
    let logits = Tensor::from_vec(vec![0.5; 8], [4, 2], &dev).unwrap();
    let labels = Tensor::from_labels(vec![0, 1, 1, 0], [4], &dev).unwrap();
    let e = Loss::Mse.compute(&logits, &labels).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Invalid { op: "Loss::Mse", .. }), "{e:?}");
    assert!(msg.contains("F32 targets of the prediction's shape [4, 2]") && msg.contains("Loss::CrossEntropy"), "{msg}");
}

#[test]
fn a_token_id_outside_the_vocabulary_is_named_as_one() {
    let dev = Device::cpu();
    let emb = Embedding::new(5, 3, &mut common::rng(0), &dev).unwrap();
    let ids = Tensor::from_labels(vec![1, 7, 2], [3], &dev).unwrap();
    let msg = emb.forward(&ids).unwrap_err().to_string();
    assert_eq!(msg, "Embedding: token id 7 at index 1 is outside 0..5 (vocab_size 5)");
    let cfg = GptConfig { n_layer: 1, n_head: 1, n_embd: 4, block_size: 4, vocab_size: 6, dropout: 0.0, bias: true };
    let gpt = Gpt::new(cfg, 0, &dev).unwrap();
    let ids = Tensor::from_labels(vec![0, 1, 2, 9], [1, 4], &dev).unwrap();
    let msg = gpt.forward(&ids).unwrap_err().to_string();
    assert_eq!(msg, "Gpt: token id 9 at index 3 is outside 0..6 (vocab_size 6)");
    // class labels keep their own wording
    let logits = Tensor::from_vec(vec![0.0; 4], [2, 2], &dev).unwrap();
    let msg = logits.cross_entropy(&Tensor::from_labels(vec![0, 3], [2], &dev).unwrap()).unwrap_err().to_string();
    assert_eq!(msg, "cross_entropy: label 3 at index 1 is outside 0..2 (2 classes)");
}

#[test]
fn a_layer_of_width_zero_is_refused_naming_the_argument() {
    let dev = Device::cpu();
    let r = &mut common::rng(0);
    let named = |e: Error, layer: &str, arg: &str| {
        let msg = e.to_string();
        assert!(matches!(&e, Error::Invalid { op, .. } if *op == layer) && msg.contains(arg), "{layer}: {msg}");
    };
    named(Linear::new(0, 5, r, &dev).err().unwrap(), "Linear", "inputs");
    named(Linear::new(5, 0, r, &dev).err().unwrap(), "Linear", "outputs");
    named(Conv2d::new(0, 4, 3, r, &dev).err().unwrap(), "Conv2d", "inputs");
    named(Conv2d::new(3, 0, 3, r, &dev).err().unwrap(), "Conv2d", "outputs");
    named(Conv2d::new(3, 4, 0, r, &dev).err().unwrap(), "Conv2d", "kernel");
    named(Embedding::new(0, 4, r, &dev).err().unwrap(), "Embedding", "num_embeddings");
    named(Embedding::new(4, 0, r, &dev).err().unwrap(), "Embedding", "embedding_dim");
    named(BatchNorm1d::new(0, &dev).err().unwrap(), "BatchNorm1d", "num_features");
    named(BatchNorm2d::new(0, &dev).err().unwrap(), "BatchNorm2d", "num_features");
    named(LayerNorm::new(&[4, 0], &dev).err().unwrap(), "LayerNorm", "normalized_shape");
    assert!(Linear::new(1, 1, r, &dev).is_ok());
}

/// Two CPU instances share the spec `cpu`, so the message adds the instance; a CPU and a wgpu
/// tensor differ by spec alone.
#[test]
fn device_mismatches_name_devices_as_a_user_types_them() {
    let devs = common::cpu_devices(2);
    let a = Tensor::from_vec(vec![1.0], [1], &devs[0]).unwrap();
    let b = Tensor::from_vec(vec![1.0], [1], &devs[1]).unwrap();
    let msg = a.add(&b).unwrap_err().to_string();
    let want = format!("add: tensors live on different devices (cpu (instance {}) and cpu (instance {}))", devs[0].id(), devs[1].id());
    assert!(msg.starts_with(&want), "{msg}");
    assert!(!msg.contains("Device(") && !msg.contains('#'), "{msg}");
    if let Ok(w) = Device::parse("wgpu:0") {
        let c = Tensor::from_vec(vec![1.0], [1], &w[0]).unwrap();
        let msg = a.add(&c).unwrap_err().to_string();
        assert!(msg.contains("(cpu and wgpu:0)"), "{msg}");
    }
}
