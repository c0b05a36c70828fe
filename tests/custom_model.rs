//! The custom-model example (examples/custom_model): PyTorch parity of 10 AdamW steps from the
//! fixture tests/fixtures/custom_model (scripts/custom_model_parity.py) on each device; every
//! strategy equal to `Single` over 10 steps with dropout on; and the example's training reaching
//! 98% test accuracy on the CPU and on `wgpu:0`.
mod common;
#[path = "../examples/custom_model/net.rs"]
mod net;

use common::assert_close;
use net::NetConfig;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use tandem::checkpoint::{read_safetensors, to_host, write_safetensors, HostData, HostTensor};
use tandem::data::{digits, Batch, Dataset, Targets};
use tandem::nn::Module;
use tandem::parallel::pipeline::{Pipeline, Schedule};
use tandem::parallel::{DataParallel, DataParallelConfig, LayerPlacement, Single, Split, Stages, Strategy};
use tandem::{BackendKind, Device, Tensor};

/// The PyTorch fixture's widths (scripts/custom_model_parity.py), dropout 0.
const FIXTURE: NetConfig = NetConfig { c1: 8, c2: 16, d: 32, hidden: 64, dropout: 0.0, freeze_bn: false, seed: 0 };

fn fixture(file: &str) -> HashMap<String, HostTensor> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/custom_model").join(file);
    read_safetensors(&path).expect("the fixture reads (scripts/custom_model_parity.py make)").0.into_iter().collect()
}

fn f32s(t: &HostTensor) -> &[f32] {
    match &t.data {
        HostData::F32(v) => v,
        HostData::I32(_) => panic!("not F32"),
    }
}

fn expected_json() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/custom_model/expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("expected.json")).expect("JSON")
}

fn numbers(v: &serde_json::Value, key: &str) -> Vec<f32> {
    v[key].as_array().expect("a list").iter().map(|x| x.as_f64().expect("a number") as f32).collect()
}

/// The fixture's batch: 32 images `[1, 28, 28]` and their labels.
fn fixture_batch() -> Batch {
    let data = fixture("data.safetensors");
    let HostData::I32(labels) = &data["y"].data else { panic!("y is int32") };
    let ds = Dataset { x: f32s(&data["x"]).to_vec(), sample_shape: vec![1, 28, 28], y: Targets::Classes { labels: labels.clone(), classes: 10 } };
    ds.batch(&(0..labels.len()).collect::<Vec<_>>()).expect("batch")
}

/// The reference's 10 steps on `dev` through `Single`: the schedule's lrs, the losses, the
/// gradient norms, the final weights and running statistics and the eval-mode logits; then the
/// checkpoint for `custom_model_parity.py check`, tandem's eval loss in its metadata.
fn parity(dev: &Device) -> tandem::Result<()> {
    let (info, dev) = (dev.info().clone(), dev.clone());
    let want = expected_json();
    let model = net::build(FIXTURE, &dev).expect("model");
    let init: Vec<(String, Tensor)> =
        fixture("init.safetensors").iter().map(|(n, t)| (n.clone(), Tensor::from_vec(f32s(t).to_vec(), t.shape.clone(), &dev).unwrap())).collect();
    model.load_state_dict(&init).expect("PyTorch's state_dict loads strictly");
    let mut single = Single::new(model, &net::optimizer(), net::loss(), &dev).expect("single");
    single.set_grad_clip(Some(net::CLIP)).unwrap();
    let steps = want["losses"].as_array().unwrap().len() as u64;
    let schedule = net::schedule(steps, 3);
    let batch = fixture_batch();
    let (mut lrs, mut losses, mut norms) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..steps {
        lrs.push(schedule.lr_at(step));
        single.set_lr(schedule.lr_at(step));
        let r = single.step(&batch).expect("step");
        losses.push(r.loss);
        norms.push(r.grad_norm.expect("clipping is on"));
    }
    eprintln!("{dev} ({}): losses {losses:?}", info.name);
    assert_close("learning rates", &lrs, &numbers(&want, "lrs"), 0.0, 1e-6);
    assert_close(&format!("losses on {dev}"), &losses, &numbers(&want, "losses"), 0.0, 1e-4);
    assert_close(&format!("gradient norms on {dev}"), &norms, &numbers(&want, "grad_norms"), 0.0, 1e-3);
    let expected = fixture("expected.safetensors");
    let state = single.state_dict().unwrap();
    assert_eq!(state.len() + 1, expected.len(), "every tensor of the reference's state_dict, and eval_logits");
    for (name, t) in &state {
        assert_close(&format!("{name} after {steps} steps on {dev}"), &t.to_vec().unwrap(), f32s(&expected[name]), 1e-3, 0.0);
    }
    single.set_training(false);
    let logits = single.predict(&tandem::parallel::inputs_to_device(&batch, &single.devices()[0]).unwrap()).unwrap();
    assert_close(&format!("eval-mode logits on {dev}"), &logits.to_vec().unwrap(), f32s(&expected["eval_logits"]), 1e-3, 0.0);
    let (_, y) = tandem::parallel::batch_to_device(&batch, &dev).unwrap();
    let eval_loss = logits.cross_entropy(&y).unwrap().to_scalar().unwrap();
    assert_close(&format!("eval loss on {dev}"), &[eval_loss], &[want["eval_loss"].as_f64().expect("a number") as f32], 0.0, 1e-4);

    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("custom_model_tandem_{}_{}.safetensors", info.backend.name(), info.ordinal));
    let meta = BTreeMap::from([("eval_loss".to_string(), format!("{eval_loss:.9}"))]);
    write_safetensors(&path, &to_host(&state).unwrap(), &meta).unwrap();
    eprintln!("checkpoint for `python scripts/custom_model_parity.py check`: {}", path.display());
    Ok(())
}

#[test]
fn parity_with_pytorch() {
    common::on_every_device(parity);
}

/// Ten digits batches of 16 for the equality runs.
fn digit_batches() -> Vec<Batch> {
    let (train, _) = digits::load(160, 0, 3).unwrap();
    (0..10).map(|s| train.batch(&(s * 16..(s + 1) * 16).collect::<Vec<_>>()).unwrap()).collect()
}

/// Losses, gradient norms and final state (weights and buffers, by name) of ten steps with the example's
/// optimizer, schedule and clipping.
fn run(s: &mut dyn Strategy, data: &[Batch]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    s.set_grad_clip(Some(net::CLIP)).unwrap();
    let schedule = net::schedule(data.len() as u64, 3);
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for (i, b) in data.iter().enumerate() {
        s.set_lr(schedule.lr_at(i as u64));
        let r = s.step(b).unwrap();
        losses.push(r.loss);
        norms.push(r.grad_norm.expect("clipping is on"));
    }
    // By name: stages list their parameters and buffers stage by stage.
    let mut state = s.state_dict().unwrap();
    state.sort_by(|a, b| a.0.cmp(&b.0));
    (losses, norms, state.iter().flat_map(|(_, t)| t.to_vec().unwrap()).collect())
}

/// The example's network at the fixture's widths with dropout 0.1 on every strategy, against
/// `Single`. BatchNorm in training mode normalises each data-parallel shard and each pipeline
/// micro-batch by its own statistics (see README), so DataParallel and Pipeline are compared
/// with frozen BatchNorm (eval mode: running statistics, affine part trained, the usual
/// fine-tuning setup); LayerPlacement sees whole batches and is compared in training mode.
#[test]
fn every_strategy_trains_the_example_like_single() {
    let _guard = common::shared();
    let data = digit_batches();
    let training = NetConfig { dropout: 0.1, ..FIXTURE };
    let frozen = NetConfig { freeze_bn: true, ..training };
    let (opt, loss) = (net::optimizer(), net::loss());
    for (family, devs) in common::device_families(3) {
        let (d0, pair) = (&devs[0], &devs[1..]);
        for (cfg, what) in [(training, "BatchNorm training"), (frozen, "BatchNorm frozen")] {
            let want = run(&mut Single::new(net::build(cfg, d0).unwrap(), &opt, loss.clone(), d0).unwrap(), &data);
            assert!(want.1[0] > net::CLIP, "{family}: the first norm {} should exceed the bound", want.1[0]);
            let no_dropout = NetConfig { dropout: 0.0, ..cfg };
            let plain = run(&mut Single::new(net::build(no_dropout, d0).unwrap(), &opt, loss.clone(), d0).unwrap(), &data);
            assert_ne!(plain.0, want.0, "{family}: dropout must be on in the compared runs");
            let full = net::build(cfg, d0).unwrap();
            let cases: Vec<(&str, Box<dyn Strategy>)> = if cfg.freeze_bn {
                vec![
                    (
                        "data parallel",
                        Box::new(
                            DataParallel::from_factory(|d| net::build(cfg, d), pair, &opt, loss.clone(), DataParallelConfig::default()).unwrap(),
                        ),
                    ),
                    (
                        "1F1B pipeline, 4 micro-batches",
                        Box::new(
                            Pipeline::builder(Stages::Split(&full, Split::At(vec![4])), pair, &opt, loss.clone())
                                .micro_batches(4)
                                .schedule(Schedule::OneFOneB)
                                .build()
                                .unwrap(),
                        ),
                    ),
                ]
            } else {
                vec![(
                    "layer placement",
                    Box::new(LayerPlacement::with_stages(Stages::Split(&full, Split::At(vec![4])), pair, &opt, loss.clone()).unwrap()),
                )]
            };
            for (name, mut s) in cases {
                let got = run(&mut *s, &data);
                let what = format!("{name} on {family} ({what})");
                assert_close(&format!("{what}: losses"), &got.0, &want.0, 1e-5, 1e-4);
                assert_close(&format!("{what}: gradient norms"), &got.1, &want.1, 1e-5, 1e-4);
                assert_close(&format!("{what}: weights and buffers"), &got.2, &want.2, 1e-4, 1e-3);
            }
        }
    }
}

/// The example's network, optimizer, schedule, loss and loop on `dev` (a smaller training set
/// and fewer steps than the example, to fit a debug test): at least 98% of the built-in digits
/// test set right.
fn reaches_98_percent(dev: &Device) {
    let (train, test) = digits::load(TRAIN, 1024, 0).unwrap();
    let single = Single::new(net::build(NetConfig::EXAMPLE, dev).unwrap(), &net::optimizer(), net::loss(), dev).unwrap();
    let mut trainer = net::trainer(Box::new(single), STEPS, Arc::new(test)).unwrap();
    let fit = trainer.fit(&mut net::loader(Arc::new(train), BATCH).unwrap()).unwrap();
    let (last, acc) = (fit.final_loss().unwrap(), fit.metric("accuracy").unwrap());
    eprintln!("{dev}: {STEPS} steps of {BATCH}, last loss {last:.4}, test accuracy {:.2}% ({:.1} s)", 100.0 * acc, fit.train_s);
    assert!(acc >= 0.98, "{dev}: test accuracy {:.2}% < 98%", 100.0 * acc);
}

const TRAIN: usize = 2048;
const STEPS: u64 = 100;
const BATCH: usize = 64;

#[test]
fn example_reaches_98_percent_on_cpu() {
    reaches_98_percent(&Device::cpu());
}

#[test]
fn example_reaches_98_percent_on_wgpu_0() {
    if !Device::list().iter().any(|i| i.backend == BackendKind::Wgpu && i.ordinal == 0) {
        eprintln!("skipping wgpu:0: no adapter");
        return;
    }
    let _guard = common::shared();
    reaches_98_percent(&Device::open(BackendKind::Wgpu, 0).unwrap());
}
