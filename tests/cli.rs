//! End-to-end tests of the `tandem` binary on the CPU device: JSON logs, weights round trips,
//! crash-safe resume (SIGKILL, then bit-identical weights), damaged checkpoints, and one clear
//! error for each kind of bad input.
mod common;
use common::{ok, s, tandem, text};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use tandem::checkpoint::{read_safetensors, write_safetensors, HostTensor};

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch("cli", name)
}

/// Asserts the run fails with 1-3 lines on stderr, no panic, mentioning `needle`.
fn fails(args: &[&str], needle: &str) {
    let err = common::fails(args, needle);
    let lines = err.lines().filter(|l| !l.trim().is_empty()).count();
    assert!((1..=3).contains(&lines), "tandem {args:?}: {lines} lines on stderr:\n{err}");
}

/// Random-looking but reproducible f32s in [-1, 1).
fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

fn write(path: &Path, tensors: Vec<(&str, HostTensor)>) {
    let tensors: Vec<(String, HostTensor)> = tensors.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
    write_safetensors(path, &tensors, &BTreeMap::new()).unwrap();
}

/// `n` 1x28x28 images with labels `label(i)`, as a `--data` file.
fn image_file(path: &Path, n: usize, label: impl Fn(usize) -> i32) {
    let x = HostTensor::f32(vec![n, 1, 28, 28], noise(n * 784, 7)).unwrap();
    let y = HostTensor::i32(vec![n], (0..n).map(label).collect()).unwrap();
    write(path, vec![("x", x), ("y", y)]);
}

#[test]
fn devices_lists_the_cpu() {
    let out = ok(&["devices"]);
    let table = text(&out.stdout);
    assert!(table.lines().any(|l| l.contains("cpu") && l.starts_with('*')), "{table}");
}

#[test]
fn json_log_has_one_object_per_step_then_a_summary() {
    let dir = scratch("json");
    let (plot, trace) = (dir.join("loss.svg"), dir.join("trace.json"));
    let out = ok(&[
        "train",
        "--data",
        "digits",
        "--steps",
        "3",
        "--batch",
        "8",
        "--devices",
        "cpu",
        "--log-format",
        "json",
        "--plot",
        s(&plot),
        "--trace",
        s(&trace),
    ]);
    let lines: Vec<serde_json::Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("each stdout line is JSON")).collect();
    assert_eq!(lines.len(), 4);
    for (i, l) in lines[..3].iter().enumerate() {
        assert_eq!(l["step"], i as u64 + 1);
        assert!(l["loss"].as_f64().unwrap().is_finite());
    }
    let summary = &lines[3];
    let acc = summary["test_accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc));
    assert!(summary["samples_per_sec"].as_f64().unwrap() > 0.0);
    assert!(summary["wall_s"].as_f64().unwrap() > 0.0);
    assert!(std::fs::read_to_string(&plot).unwrap().starts_with("<svg"));
    let trace: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(trace["traceEvents"].as_array().unwrap().len() > 3);
}

#[test]
fn save_then_init_round_trips_the_weights() {
    let dir = scratch("roundtrip");
    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    let base = ["train", "--model", "seed-two-layer", "--data", "synthetic", "--devices", "cpu", "--batch", "50"];
    ok(&[&base[..], &["--steps", "5", "--save", s(&a)]].concat());
    // lr 0 leaves the weights as loaded, so what is saved must be exactly what was read.
    ok(&[&base[..], &["--steps", "1", "--lr", "0", "--init", s(&a), "--save", s(&b)]].concat());
    let (ta, tb) = (read_safetensors(&a).unwrap().0, read_safetensors(&b).unwrap().0);
    let names: Vec<&str> = ta.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(names, ["linear1.bias", "linear1.weight", "linear2.bias", "linear2.weight"]);
    assert_eq!(ta, tb);
}

/// Runs `args` until it finishes; returns whether it was cut short by SIGKILL.
fn run_and_kill_after_first_checkpoint(args: &[&str], ckpt_dir: &Path, delay: Duration) -> bool {
    let mut child = tandem().args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let has_checkpoint = || std::fs::read_dir(ckpt_dir).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with("ckpt-"));
    while !has_checkpoint() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(delay);
    let killed = child.try_wait().unwrap().is_none();
    child.kill().unwrap_or(());
    child.wait().unwrap();
    killed
}

#[test]
fn sigkill_then_resume_ends_with_the_uninterrupted_weights() {
    let dir = scratch("kill");
    let data = dir.join("data.safetensors");
    // 50 samples at batch 8: 6 batches an epoch, so 60 steps cross many epoch boundaries.
    image_file(&data, 50, |i| (i % 10) as i32);
    let common = ["train", "--data", s(&data), "--batch", "8", "--steps", "60", "--devices", "cpu", "--checkpoint-every", "5"];
    let (full, resumed) = (dir.join("full.safetensors"), dir.join("resumed.safetensors"));
    let (ck_full, ck_kill) = (dir.join("ck-full"), dir.join("ck-kill"));
    std::fs::create_dir_all(&ck_kill).unwrap();
    ok(&[&common[..], &["--checkpoint-dir", s(&ck_full), "--save", s(&full)]].concat());

    let killing = [&common[..], &["--checkpoint-dir", s(&ck_kill)]].concat();
    // A delay that varies from run to run, so that over many runs the kill lands anywhere.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let delay = Duration::from_millis(u64::from(nanos % 200));
    let killed = run_and_kill_after_first_checkpoint(&killing, &ck_kill, delay);
    eprintln!("killed mid-run: {killed} (after {delay:?})");
    let out = ok(&[&killing[..], &["--resume", "--save", s(&resumed)]].concat());
    assert!(text(&out.stderr).contains("resuming from"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&full).unwrap(), std::fs::read(&resumed).unwrap(), "weights differ after resume");
}

#[test]
fn damaged_checkpoints_are_skipped_with_a_message() {
    let dir = scratch("corrupt");
    let ck = dir.join("ck");
    let args = [
        "train",
        "--model",
        "seed-linear",
        "--data",
        "synthetic",
        "--batch",
        "10",
        "--devices",
        "cpu",
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "5",
    ];
    ok(&[&args[..], &["--steps", "20"]].concat());
    let names: Vec<String> = {
        // Dot files (the directory's lock) are not checkpoints.
        let mut v: Vec<String> =
            std::fs::read_dir(&ck).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| !n.starts_with('.')).collect();
        v.sort();
        v
    };
    assert_eq!(names, ["ckpt-00000010.safetensors", "ckpt-00000015.safetensors", "ckpt-00000020.safetensors"]);
    // Newest: one flipped bit in the tensor bytes. Next: cut in half.
    let newest = ck.join(&names[2]);
    let mut bytes = std::fs::read(&newest).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    std::fs::write(&newest, bytes).unwrap();
    let middle = ck.join(&names[1]);
    let len = std::fs::metadata(&middle).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&middle).unwrap().set_len(len / 2).unwrap();

    let out = ok(&[&args[..], &["--steps", "25", "--resume"]].concat());
    let err = text(&out.stderr);
    assert!(err.contains("ckpt-00000020.safetensors") && err.contains("checksum"), "{err}");
    assert!(err.contains("ckpt-00000015.safetensors"), "{err}");
    assert!(err.contains("resuming from") && err.contains("(step 10)"), "{err}");
    fails(&[&args[..], &["--steps", "30", "--resume", "--batch", "20"]].concat(), "was written with other settings: --batch 20 (checkpoint: 10)");
    // Another seed is named once, as the flag (the run's settings hold it).
    let err = common::fails(&[&args[..], &["--steps", "30", "--resume", "--seed", "3"]].concat(), "other settings: --seed 3 (checkpoint: 0)");
    assert!(!err.contains(", seed 3"), "{err}");
}

#[test]
fn each_bad_input_gets_a_clear_error() {
    let dir = scratch("errors");
    let p = |n: &str| dir.join(n).to_str().unwrap().to_string();
    std::fs::write(p("text.safetensors"), "this is not a safetensors file").unwrap();
    image_file(&dir.join("labels.safetensors"), 20, |i| if i == 13 { 12 } else { 1 });
    let good = dir.join("good.safetensors");
    write(
        &good,
        vec![("linear.weight", HostTensor::f32(vec![1, 10], vec![0.1; 10]).unwrap()), ("linear.bias", HostTensor::f32(vec![1], vec![0.0]).unwrap())],
    );
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(p("truncated.safetensors"), &bytes[..bytes.len() - 7]).unwrap();
    write(&dir.join("names.safetensors"), vec![("fc.weight", HostTensor::f32(vec![1, 10], vec![0.1; 10]).unwrap())]);
    write(
        &dir.join("shape.safetensors"),
        vec![("linear.weight", HostTensor::f32(vec![2, 10], vec![0.1; 20]).unwrap()), ("linear.bias", HostTensor::f32(vec![1], vec![0.0]).unwrap())],
    );
    write(
        &dir.join("dtype.safetensors"),
        vec![("linear.weight", HostTensor::i32(vec![1, 10], vec![1; 10]).unwrap()), ("linear.bias", HostTensor::f32(vec![1], vec![0.0]).unwrap())],
    );
    let mut x = noise(200, 3);
    x[37] = f32::NAN;
    write(
        &dir.join("nan.safetensors"),
        vec![("x", HostTensor::f32(vec![20, 10], x).unwrap()), ("y", HostTensor::f32(vec![20, 1], noise(20, 4)).unwrap())],
    );
    std::fs::create_dir_all(dir.join("empty-ck")).unwrap();

    let lin = ["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--steps", "2"];
    let with = |extra: &[&str]| -> Vec<String> { lin.iter().chain(extra).map(|a| a.to_string()).collect() };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (with(&["--model", "seed-rnn"]), "invalid value 'seed-rnn'"),
        (with(&["--optimizer", "rmsprop"]), "invalid value 'rmsprop'"),
        (with(&["--strategy", "magic"]), "invalid value 'magic'"),
        (with(&["--log-format", "xml"]), "invalid value 'xml'"),
        (with(&["--data", "imagenet"]), "is not digits, synthetic"),
        (with(&["--devices", "cuda:7"]), "no device matches 'cuda:7'"),
        (with(&["--strategy", "pipeline", "--devices", "cpu,cpu,cpu"]), "3 stages (one per device) but the model has only 1 layers"),
        (with(&["--init", &p("missing.safetensors")]), "missing.safetensors"),
        (with(&["--init", &p("truncated.safetensors")]), "not a valid safetensors file"),
        (with(&["--init", &p("text.safetensors")]), "not a valid safetensors file"),
        (with(&["--init", &p("names.safetensors")]), "missing [linear.weight, linear.bias], unexpected [fc.weight]"),
        (with(&["--init", &p("shape.safetensors")]), "linear.weight has shape [2, 10]"),
        (with(&["--init", &p("dtype.safetensors")]), "linear.weight holds integers"),
        (with(&["--data", &p("missing.safetensors")]), "missing.safetensors"),
        (with(&["--data", &p("truncated.safetensors")]), "not a valid safetensors file"),
        (with(&["--data", &p("text.safetensors")]), "not a valid safetensors file"),
        (
            ["train", "--model", "seed-linear", "--data", "synthetic", "--epochs", "18446744073709551615"].map(String::from).to_vec(),
            "more steps than can be counted",
        ),
        (with(&["--data", &p("labels.safetensors")]), "seed-linear takes inputs of shape [10]"),
        (with(&["--model", "seed-cnn", "--data", &p("labels.safetensors")]), "label 12 at index 13, outside 0..10"),
        (with(&["--micro-batches", "3"]), "3 does not divide --batch 64"),
        (with(&["--batch", "0"]), "--batch"),
        (with(&["--batch", "5000"]), "exceeds the 1000 training samples"),
        (with(&["--lr", "-0.5"]), "finite number >= 0"),
        (with(&["--lr", "NaN"]), "finite number >= 0"),
        (with(&["--resume", "--checkpoint-dir", &p("empty-ck")]), "no checkpoint in"),
        (with(&["--resume"]), "--checkpoint-dir"),
        (with(&["--save", &p("no-such-dir/w.safetensors")]), "does not exist"),
        (with(&["--save", &p("empty-ck")]), "is a directory"),
        (with(&["--steps", "50", "--lr", "1e30"]), "at step"),
        (with(&["--data", &p("nan.safetensors"), "--batch", "20"]), "nan.safetensors: tensor 'x' [20, 10] holds NaN at flat index 37 (index [3, 7])"),
    ];
    for (args, needle) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, needle);
    }
}

fn losses(out: &Output) -> Vec<f32> {
    text(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()).map(|l| l as f32))
        .collect()
}

/// Every `--strategy` on two logical devices of one adapter (lavapipe here, when the wgpu
/// feature finds it; otherwise two CPU devices) logs the single-device losses.
#[test]
fn every_strategy_matches_single_device_losses() {
    let has_wgpu = cfg!(feature = "wgpu") && text(&ok(&["devices"]).stdout).contains("wgpu:0");
    if !has_wgpu && std::env::var("CI").is_ok_and(|v| v == "true") && cfg!(feature = "wgpu") {
        panic!("CI=true but no wgpu adapter was found");
    }
    let (one, two) = if has_wgpu { ("wgpu:0", "wgpu:0,wgpu:0") } else { ("cpu", "cpu,cpu") };
    let base = ["train", "--model", "seed-cnn", "--data", "synthetic", "--steps", "4", "--batch", "32", "--log-format", "json"];
    let want = losses(&ok(&[&base[..], &["--devices", one]].concat()));
    assert_eq!(want.len(), 4);
    for (strategy, extra) in [
        ("data", &[][..]),
        ("model", &[]),
        ("tensor", &[]),
        ("pipeline", &["--micro-batches", "4", "--schedule", "1f1b"][..]),
        ("pipeline", &["--micro-batches", "2", "--schedule", "gpipe"]),
    ] {
        let args = [&base[..], &["--devices", two, "--strategy", strategy], extra].concat();
        let got = losses(&ok(&args));
        if let Err(e) = tandem::tolerance::check_close(&format!("--strategy {strategy} {extra:?} on {two}"), &got, &want, 1e-5, 1e-4) {
            panic!("{e}");
        }
    }
}

/// `tandem train | head -1`: when the reader of the log goes away, the run ends with status
/// 141 (128 + SIGPIPE) instead of panicking in `println!`.
#[test]
fn a_closed_output_pipe_ends_the_run_without_a_panic() {
    use std::io::{BufRead, BufReader};
    let mut child = tandem()
        .args(["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--steps", "100000", "--log-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tandem starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut first).expect("one line of log");
    assert!(first.contains("\"step\""), "first line: {first}");
    // the reader (and with it the pipe's only read end) is dropped here
    let out = child.wait_with_output().expect("tandem ends");
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "tandem panicked on the closed pipe:\n{err}");
    assert_eq!(out.status.code(), Some(141), "stderr:\n{err}");
}

/// `tandem bench --quick` prints every figure of issue 16 on the CPU and on `wgpu:0` (lavapipe
/// here) as one JSON object per line, each with finite, positive values; bubbles lie in [0, 1)
/// and the theory is (p-1)/(m+p-1).
#[test]
fn bench_prints_every_figure_on_cpu_and_wgpu() {
    let mut devices = vec!["cpu"];
    if tandem::Device::parse("wgpu:0").is_ok() {
        devices.push("wgpu:0");
    }
    for dev in devices {
        let out = ok(&["bench", "--devices", dev, "--quick", "--log-format", "json"]);
        let figs: Vec<serde_json::Value> =
            text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}"))).collect();
        let count = |bench: &str| figs.iter().filter(|f| f["bench"] == bench && f["device"] == dev).count();
        assert_eq!(count("matmul"), 4, "{dev}: matmul at 256..2048");
        assert_eq!(count("train-step"), 2, "{dev}: seed-CNN steps at batch 64 and 1000");
        assert_eq!(count("dispatch"), 1, "{dev}");
        assert_eq!(count("pipeline-bubble"), 8, "{dev}: two models at m = 1, 2, 4, 8");
        assert_eq!(count("dp-overlap"), 1, "{dev}");
        for f in &figs {
            for key in ["gflops", "median_ms", "us_per_op", "step_ms", "allreduce_ms", "step_ms_1", "step_ms_n"] {
                if let Some(v) = f.get(key) {
                    let v = v.as_f64().unwrap_or(f64::NAN);
                    assert!(v.is_finite() && v > 0.0, "{dev}: {key} = {v} in {f}");
                }
            }
            if f["bench"] == "pipeline-bubble" {
                let m = f["micro_batches"].as_f64().unwrap();
                assert_eq!(f["bubble_theoretical"].as_f64().unwrap(), 1.0 / (m + 1.0), "{f}");
                for key in ["bubble_measured", "bubble_of_split"] {
                    let b = f[key].as_f64().unwrap();
                    assert!((0.0..1.0).contains(&b), "{dev}: {key} = {b} in {f}");
                }
            }
            if f["bench"] == "dp-overlap" {
                let h = f["hidden_fraction"].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&h), "{dev}: hidden fraction {h}");
            }
        }
    }
}

/// `train --log-format json > /dev/full`: a log that could not be written is not a success,
/// though the run finishes and writes its files. (A closed pipe stays status 141, above.)
#[test]
fn an_unwritable_standard_output_fails_the_command() {
    let dir = scratch("full");
    let Some(full) = common::full_device(&dir) else { return };
    let save = dir.join("w.safetensors");
    let out = tandem()
        .args([
            "train",
            "--model",
            "seed-linear",
            "--data",
            "synthetic",
            "--devices",
            "cpu",
            "--steps",
            "3",
            "--log-format",
            "json",
            "--save",
            s(&save),
        ])
        .stdout(full)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{err}");
    assert!(err.contains("standard output") && err.to_lowercase().contains("no space"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(save.exists(), "the run stopped before writing --save");
    // clap's help too, which `print!` would panic on.
    let full = std::fs::OpenOptions::new().write(true).open(dir.join("full")).unwrap();
    let out = tandem().arg("--help").stdout(full).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{err}");
    assert!(err.contains("standard output") && !err.contains("panicked"), "{err}");
}

/// A file of thousands of tensors makes an error of one short line, not one listing them all.
#[test]
fn errors_list_a_few_names_and_count_the_rest() {
    let dir = scratch("many");
    let many = dir.join("many.safetensors");
    let one = || HostTensor::f32(vec![1], vec![0.0]).unwrap();
    let tensors: Vec<(String, HostTensor)> = (0..5000).map(|i| (format!("layer{i:05}.weight"), one())).collect();
    write_safetensors(&many, &tensors, &BTreeMap::new()).unwrap();
    let base = ["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--steps", "1"];
    for args in [[&base[..], &["--init", s(&many)]].concat(), [&base[..], &["--data", s(&many)]].concat()] {
        let err = common::fails(&args, "and ");
        assert!(err.len() < 1000 && err.contains("more"), "{} bytes on stderr: {}", err.len(), &err[..err.len().min(300)]);
    }
}
