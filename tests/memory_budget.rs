//! Per-device memory budgets: every backend refuses an allocation past its budget with one
//! clear error (the device, the bytes asked, the budget and the bytes in use), keeps what it
//! already holds, names the training step that asked, and leaves the run's checkpoints intact.
mod common;
use std::path::Path;
use tandem::{Device, Error, Tensor};

const MIB: u64 = 1 << 20;

/// An independent CPU device (its budget is its own) and every device under test.
fn budgeted_devices() -> Vec<Device> {
    let mut out = vec![Device::cpu_independent()];
    out.extend(common::devices_under_test());
    out
}

#[test]
fn every_backend_refuses_past_its_budget_and_keeps_what_it_holds() {
    let _guard = common::shared();
    for dev in budgeted_devices() {
        let name = format!("{dev:?}");
        let base = dev.memory().in_use;
        dev.set_memory_budget(Some(base + MIB));
        assert_eq!(dev.memory().budget, Some(base + MIB), "{name}");
        let small: Vec<f32> = (0..64 * 1024).map(|i| i as f32).collect();
        let kept = Tensor::from_vec(small.clone(), [64 * 1024], &dev).unwrap_or_else(|e| panic!("{name}: 256 KiB under a 1 MiB budget: {e}"));
        let e = Tensor::zeros([512 * 1024], &dev).expect_err(&format!("{name}: 2 MiB past a 1 MiB budget"));
        let message = e.to_string();
        let Error::OutOfMemory { device, requested, free, detail } = e else { panic!("{name}: not OutOfMemory: {message}") };
        assert!(device.contains(&dev.spec()), "{name}: the error names {device}");
        assert_eq!(requested, 2 * MIB, "{name}: {message}");
        assert!((MIB - 300 * 1024..MIB).contains(&free), "{name}: free {free}: {message}");
        assert!(detail.contains("memory budget is") && detail.contains("live tensors hold"), "{name}: {message}");
        // A cap lowered below what is held refuses new tensors but leaves the held ones valid.
        dev.set_memory_budget(Some(0));
        assert!(Tensor::zeros([1], &dev).is_err(), "{name}: a zero budget allows nothing new");
        assert_eq!(kept.to_vec().unwrap(), small, "{name}: a held tensor changed under a lowered budget");
        dev.set_memory_budget(None);
        assert_eq!(dev.memory().budget, None, "{name}");
        Tensor::zeros([512 * 1024], &dev).unwrap_or_else(|e| panic!("{name}: 2 MiB with the budget lifted: {e}"));
    }
}

/// The failing device of a data-parallel step is named, inside the worker that ran it.
#[test]
fn a_data_parallel_step_past_one_devices_budget_names_that_device_and_the_step() {
    use tandem::nn::models::SeedModel;
    use tandem::optim::SgdConfig;
    use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Strategy};
    let devices = common::cpu_devices(2);
    let model = SeedModel::Cnn.build(0, &devices[0]).unwrap();
    let optim = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let mut dp = DataParallel::new(&model, &devices, &optim, Loss::CrossEntropy, DataParallelConfig::default()).unwrap();
    let batches = common::seed_image_batches(64, 1, 0);
    dp.step(&batches[0]).unwrap();
    // Room for the weights and state already held, not for a second step's activations.
    devices[1].set_memory_budget(Some(devices[1].memory().in_use + 16 * 1024));
    let e = dp.step(&batches[0]).unwrap_err().at_step(2, None);
    let message = e.to_string();
    let Error::OutOfMemory { ref device, ref detail, .. } = *e.root_cause() else { panic!("not OutOfMemory: {message}") };
    assert_eq!(device, "cpu", "{message}");
    assert!(detail.contains("at training step 2") && detail.contains("no checkpoint was written yet"), "{message}");
}

/// The checkpoints in `dir` and their bytes (not the lock file, which holds the last run's pid).
fn checkpoints(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    out.sort();
    out
}

/// From the command line: a resumed run whose step cannot fit `--memory-limit` fails with the
/// error (no panic), naming the step and the checkpoint it leaves as it was.
#[test]
fn the_cli_names_the_step_and_keeps_the_checkpoint() {
    let dir = common::scratch("memory_budget", "resume");
    let ck = dir.join("ck");
    let args =
        ["train", "--model", "seed-linear", "--data", "synthetic", "--batch", "200", "--devices", "cpu", "--checkpoint-dir", ck.to_str().unwrap()];
    common::ok(&[&args[..], &["--steps", "2", "--checkpoint-every", "2"]].concat());
    let before = checkpoints(&ck);
    assert!(!before.is_empty(), "no checkpoint written");
    let err = common::fails(&[&args[..], &["--steps", "4", "--resume", "--memory-limit", "4KiB"]].concat(), "out of memory on cpu");
    for needle in ["memory budget is 4 KiB", "at training step 3", "the newest checkpoint", "is intact"] {
        assert!(err.contains(needle), "{needle:?} missing from:\n{err}");
    }
    assert!(checkpoints(&ck) == before, "the failed run changed the checkpoint directory");
    // The same resume with room continues from the checkpoint.
    common::ok(&[&args[..], &["--steps", "4", "--resume", "--memory-limit", "64MiB"]].concat());
    for (bad, needle) in [("lots", "not a size"), ("cpu=1MiB,cpu=2MiB", "given twice"), ("wgpu:7=1GiB", "names no device")] {
        common::fails(&[&args[..], &["--steps", "4", "--overwrite-checkpoints", "--memory-limit", bad]].concat(), needle);
    }
}

/// The final loss of a `tandem train --log-format json` run.
fn final_loss(out: &std::process::Output) -> f64 {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("\"summary\"")).unwrap_or_else(|| panic!("no summary in:\n{text}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["final_loss"].as_f64().unwrap()
}

/// Sharding is what makes a GPT fit four budgeted devices: under a 9 MiB budget per device
/// plain data parallelism fails with the out-of-memory error (naming the step), while ZeRO-2
/// and ZeRO-3 train, to the loss of an unbudgeted plain run. Device 0 (the host CPU) also
/// holds the text corpus, about 4.6 MiB of the 9.
#[test]
fn sharding_fits_a_gpt_that_plain_data_parallelism_cannot() {
    let gpt = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--devices",
        "cpu,cpu,cpu,cpu",
        "--strategy",
        "data",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "128",
        "--block-size",
        "32",
        "--batch",
        "8",
        "--steps",
        "3",
        "--optimizer",
        "adamw",
        "--log-format",
        "json",
    ];
    let plain = final_loss(&common::ok(&gpt));
    let budget = ["--memory-limit", "9MiB"];
    let err = common::fails(&[&gpt[..], &budget, &["--shard", "none"]].concat(), "out of memory on cpu");
    assert!(err.contains("memory budget is 9 MiB") && err.contains("at training step"), "{err}");
    for mode in ["grads", "full"] {
        let loss = final_loss(&common::ok(&[&gpt[..], &budget, &["--shard", mode]].concat()));
        assert!((loss - plain).abs() <= 1e-5 * plain.abs(), "--shard {mode} under 9 MiB: loss {loss}, plain unbudgeted {plain}");
    }
    // The check before any weight is drawn counts what each mode keeps: whole, the 1.6 MB of
    // f32 parameters with their gradients and AdamW's moments (6.5 MB) pass no 6 MiB device,
    // and ZeRO-3's quarter of the rest (2.8 MB) does.
    let six = ["--memory-limit", "6MiB", "--shard"];
    let err = common::fails(&[&gpt[..], &six, &["none"]].concat(), "out of memory on cpu");
    assert!(err.contains("asked for 6504448 bytes") && err.contains("optimizer state tensors"), "{err}");
    let err = common::fails(&[&gpt[..], &six, &["full"]].concat(), "out of memory on cpu");
    assert!(!err.contains("optimizer state tensors") && err.contains("at training step"), "the fit check refused ZeRO-3: {err}");
}
