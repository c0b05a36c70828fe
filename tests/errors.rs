//! Bad input gives a clear error naming the op and the shapes, dtypes, devices or paths.
mod common;

use std::sync::Arc;
use tandem::backend::cpu::CpuBackend;
use tandem::nn::{models::SeedModel, Module};
use tandem::{Device, Error, Tensor};

fn t(shape: &[usize]) -> Tensor {
    Tensor::zeros(shape.to_vec(), &Device::cpu()).unwrap()
}
fn msg(r: tandem::Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("expected an error, got {t:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn shape_errors_name_op_and_shapes() {
    let m = msg(t(&[2, 3]).matmul(&t(&[4, 5])));
    assert!(m.contains("matmul") && m.contains("[2, 3]") && m.contains("[4, 5]"), "{m}");
    let m = msg(t(&[2, 3]).add(&t(&[4])));
    assert!(m.contains("add") && m.contains("[2, 3]") && m.contains("[4]"), "{m}");
    let m = msg(t(&[1, 2, 8, 8]).conv2d(&t(&[4, 3, 3, 3]), (1, 1), (0, 0)));
    assert!(m.contains("conv2d") && m.contains("[4, 3, 3, 3]"), "{m}");
    let m = msg(t(&[1, 1, 2, 2]).conv2d(&t(&[1, 1, 3, 3]), (1, 1), (0, 0)));
    assert!(m.contains("conv2d") && m.contains("does not fit"), "{m}");
    let m = msg(t(&[6]).reshape([4, 2]));
    assert!(m.contains("reshape") && m.contains("[6]"), "{m}");
    let m = msg(t(&[2, 3]).sum(2, false));
    assert!(m.contains("sum") && m.contains("axis 2"), "{m}");
    let m = msg(t(&[2, 3]).mse_loss(&t(&[3, 2])));
    assert!(m.contains("mse_loss"), "{m}");
    let m = msg(t(&[2, 3]).narrow(1, 2, 2));
    assert!(m.contains("narrow"), "{m}");
    let m = msg(t(&[2, 3]).permute(&[0, 0]));
    assert!(m.contains("permute"), "{m}");
    let m = msg(Tensor::cat(&[t(&[2, 3]), t(&[2, 4])], 0));
    assert!(m.contains("cat") && m.contains("[2, 4]"), "{m}");
    let m = msg(Tensor::from_vec(vec![1.0; 5], [2, 3], &Device::cpu()));
    assert!(m.contains("5 values") && m.contains("[2, 3]"), "{m}");
    let model = SeedModel::Cnn.build(0, &Device::cpu()).unwrap();
    let m = msg(model.forward(&t(&[2, 1, 20, 20])));
    assert!(m.contains("Linear") && m.contains("320"), "{m}");
}

#[test]
fn dtype_and_device_errors() {
    let labels = Tensor::from_labels(vec![0, 1], [2], &Device::cpu()).unwrap();
    let e = t(&[2, 3]).cross_entropy(&t(&[2])).unwrap_err();
    assert!(matches!(e, Error::DType { op: "cross_entropy", .. }), "{e}");
    assert!(matches!(labels.exp().unwrap_err(), Error::DType { .. }));
    let other = Device::from_backend(Arc::new(CpuBackend::new()));
    let b = Tensor::zeros([2, 3], &other).unwrap();
    let e = t(&[2, 3]).add(&b).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { op: "add", .. }), "{e}");
    assert!(e.to_string().contains("Tensor::to"), "{e}");
}

#[test]
fn device_spec_errors_list_what_exists() {
    for spec in ["cuda:7", "wgpu:99", "tpu:0", "cpu:x", ""] {
        let e = Device::parse(spec).unwrap_err().to_string();
        assert!(e.contains("devices found") && e.contains("cpu"), "{spec}: {e}");
    }
    assert_eq!(Device::parse("cpu").unwrap()[0].spec(), "cpu");
}

#[test]
fn backward_and_loading_errors() {
    assert!(t(&[2]).sum_all().unwrap().backward().is_err());
    let w = t(&[3]).requires_grad();
    assert!(w.square().unwrap().backward().unwrap_err().to_string().contains("scalar"));
    let model = SeedModel::Linear.build(0, &Device::cpu()).unwrap();
    let bad = vec![("linear.weight".to_string(), t(&[2, 10])), ("linear.bias".to_string(), t(&[1]))];
    let e = model.load_state_dict(&bad).unwrap_err().to_string();
    assert!(e.contains("linear.weight") && e.contains("[2, 10]") && e.contains("[1, 10]"), "{e}");
    let e = model.load_state_dict(&bad[1..]).unwrap_err().to_string();
    assert!(e.contains("missing") && e.contains("linear.weight"), "{e}");
    let e = tandem::checkpoint::load_weights("/nonexistent/w.safetensors", &Device::cpu()).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/w.safetensors"), "{e}");
}

/// `cross_entropy` rejects labels outside `0..classes` on every device, naming the first bad
/// label, its index and the class count: labels from the host (bounds known), labels made on
/// the device (checked there), and labels overwritten since their bounds were noted.
#[test]
fn out_of_range_labels_are_errors() {
    common::on_every_device(|dev| {
        let logits = Tensor::zeros([4, 10], dev).unwrap();
        let label_err = |labels: &Tensor| match logits.cross_entropy(labels) {
            Ok(l) => panic!("on {dev}: a loss of {:?} from bad labels", l.to_vec()),
            Err(Error::Label { op, label, index, classes }) => {
                assert_eq!((op, classes), ("cross_entropy", 10), "on {dev}");
                (label, index)
            }
            Err(e) => panic!("on {dev}: {e}"),
        };
        let host = |v: Vec<i32>| Tensor::from_labels(v, [4], dev).unwrap();
        assert_eq!(label_err(&host(vec![0, 9, 10, 3])), (10, 2));
        assert_eq!(label_err(&host(vec![0, -1, 1, -7])), (-1, 1));
        let e = logits.cross_entropy(&host(vec![0, 9, 10, 3])).unwrap_err().to_string();
        assert!(e.contains("label 10") && e.contains("index 2") && e.contains("10 classes"), "{e}");
        let ok = logits.cross_entropy(&host(vec![0, 9, 5, 3])).unwrap().to_scalar().unwrap();
        assert!((ok - 10f32.ln()).abs() < 1e-5, "on {dev}: {ok}");

        // Labels computed on the device (an argmax) have no host-side bounds.
        let one_hot = |pos: [usize; 4]| {
            let mut v = vec![0.0; 4 * 12];
            pos.iter().enumerate().for_each(|(r, &p)| v[r * 12 + p] = 1.0);
            Tensor::from_vec(v, [4, 12], dev).unwrap().argmax(1).unwrap()
        };
        assert_eq!(label_err(&one_hot([1, 11, 3, 10])), (11, 1));
        let made = logits.cross_entropy(&one_hot([1, 2, 9, 0])).unwrap().to_scalar().unwrap();
        assert!((made - 10f32.ln()).abs() < 1e-5, "on {dev}: {made}");
        let e = logits.gather_rows(&one_hot([0, 0, 0, 10])).unwrap_err();
        assert!(matches!(e, Error::Label { op: "gather_rows", label: 10, index: 3, classes: 10 }), "on {dev}: {e}");

        // Writing into labels forgets the bounds noted when they were uploaded.
        let labels = host(vec![0, 1, 2, 3]);
        labels.assign(&one_hot([0, 1, 11, 2])).unwrap();
        assert_eq!(label_err(&labels), (11, 2));
        Ok(())
    });
}

/// An error's `Debug` is its sentence, as `Display` writes it (what `unwrap` and a `main` that
/// returns `Err` print); `{:#?}` puts the variant's name first.
#[test]
fn debug_prints_the_sentence() {
    let errors = [
        Error::ResumeMismatch { path: "ck/ckpt-00000004.safetensors".into(), changed: vec!["precision bf16 (checkpoint: f32)".into()] },
        Error::invalid("Trainer::epochs", "3 epochs is too many"),
        Error::NonFinite { step: 7, what: "loss is NaN at step 7".into(), kept: None },
        Error::io("/no/such/file", std::io::Error::from(std::io::ErrorKind::NotFound)),
        t(&[2, 3]).matmul(&t(&[4, 5])).unwrap_err(),
    ];
    for e in &errors {
        let debug = format!("{e:?}");
        assert_eq!(debug, e.to_string());
        assert!(!debug.contains(" { ") && !debug.contains("path:"), "{debug}");
        assert_eq!(format!("{e:#?}"), format!("{}: {e}", e.variant()));
    }
    assert_eq!(format!("{:?}", errors[0]), "resume: ck/ckpt-00000004.safetensors was written with other settings: precision bf16 (checkpoint: f32)");
    assert!(format!("{:#?}", errors[0]).starts_with("ResumeMismatch: resume: "));
}

const MAIN_CHILD: &str = "TANDEM_ERRORS_MAIN_CHILD";

/// What a program's `fn main() -> tandem::Result<()>` does with an error, as this binary's
/// child (a test that returns `Err` is reported the same way: `Error: {err:?}`).
#[test]
fn main_child() -> tandem::Result<()> {
    if std::env::var(MAIN_CHILD).is_ok() {
        Tensor::from_vec(vec![1.0; 5], [2, 3], &Device::cpu())?;
    }
    Ok(())
}

#[test]
fn a_main_returning_an_error_prints_the_sentence() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "main_child", "--nocapture", "--test-threads", "1"])
        .env(MAIN_CHILD, "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Error: from_vec: shape mismatch: 5 values for shape [2, 3]"), "{text}");
    assert!(!text.contains("Shape {"), "{text}");
}
