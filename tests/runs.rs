//! Runs that never lose work and keep their promises, driven through the `tandem` binary:
//! checkpoints that belong to one run, a lock per checkpoint directory, a finite checkpoint
//! after a NaN/inf stop, a graceful stop on SIGTERM, `--deterministic` across device counts
//! and on a mixed-backend pipeline, outputs checked up front and the documented exit codes.
mod common;
use common::{ok, run, s, tandem, text};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use tandem::checkpoint::{read_safetensors, HostData};

/// Runs `args`, expects exit status `code` and `needle` on stderr; returns stderr.
fn fails_with(code: i32, args: &[&str], needle: &str) -> String {
    let out = run(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "tandem {args:?}: stderr:\n{err}");
    assert!(!err.contains("panicked"), "tandem {args:?} panicked:\n{err}");
    assert!(err.contains(needle), "tandem {args:?}: stderr lacks '{needle}':\n{err}");
    err
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch("runs", name)
}

fn ckpt(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("ckpt-{step:08}.safetensors"))
}

/// The entries of `dir` other than dot files, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| !n.starts_with('.')).collect();
    v.sort();
    v
}

fn ckpt_names(steps: &[u64]) -> Vec<String> {
    steps.iter().map(|s| format!("ckpt-{s:08}.safetensors")).collect()
}

/// Every file's bytes, by name, to show that a refused run changed nothing.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    names(dir).into_iter().map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap())).collect()
}

/// The seed linear model on the synthetic rows: fast enough for many runs per test.
const LINEAR: [&str; 8] = ["train", "--model", "seed-linear", "--data", "synthetic", "--devices", "cpu", "--batch=10"];

fn with(base: &[&str], extra: &[&str]) -> Vec<String> {
    base.iter().chain(extra).map(|a| a.to_string()).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Item 1: retention keeps this run's three newest files, whatever else is in the directory.
#[test]
fn retention_counts_only_this_runs_files() {
    let ck = scratch("retention");
    let base = with(&LINEAR, &["--checkpoint-dir", s(&ck), "--checkpoint-every", "5"]);
    ok(&strs(&with(&strs(&base), &["--steps", "15"])));
    for step in 900..903 {
        std::fs::write(ckpt(&ck, step), b"not a checkpoint of this run").unwrap();
    }
    let out = ok(&strs(&with(&strs(&base), &["--steps", "30", "--resume"])));
    assert!(text(&out.stderr).contains("(step 15)"), "{}", text(&out.stderr));
    assert_eq!(names(&ck), ckpt_names(&[20, 25, 30, 900, 901, 902]));
    let out = ok(&strs(&with(&strs(&base), &["--steps", "35", "--resume"])));
    assert!(text(&out.stderr).contains("(step 30)"), "{}", text(&out.stderr));
}

/// Item 2: a fresh run does not mix into a directory holding another run's checkpoints.
#[test]
fn a_fresh_run_refuses_a_directory_with_checkpoints() {
    let ck = scratch("fresh");
    let base = with(&LINEAR, &["--checkpoint-dir", s(&ck), "--checkpoint-every", "10", "--steps", "20"]);
    ok(&strs(&with(&strs(&base), &["--seed", "0"])));
    let before = contents(&ck);
    assert_eq!(names(&ck), ckpt_names(&[10, 20]));
    let err = fails_with(2, &strs(&with(&strs(&base), &["--seed", "7"])), "--overwrite-checkpoints");
    assert!(err.contains("--resume") && err.contains("ckpt-00000020.safetensors"), "{err}");
    assert!(contents(&ck) == before, "a refused run changed the directory");
    ok(&strs(&with(&strs(&base), &["--seed", "7", "--overwrite-checkpoints"])));
    assert_eq!(names(&ck), ckpt_names(&[10, 20]));
    let (_, meta) = read_safetensors(ckpt(&ck, 10)).unwrap();
    assert!(meta["config"].contains("\"seed\":7"), "{meta:?}");
}

/// Item 3: damaged files never count toward the kept ones; a directory named like a
/// checkpoint stops a run before its first step (nothing in a checkpoint directory is
/// followed or replaced but a regular file) and is not touched.
#[test]
fn damaged_files_and_directories_do_not_count() {
    let ck = scratch("damaged");
    let base = with(&LINEAR, &["--checkpoint-dir", s(&ck)]);
    ok(&strs(&with(&strs(&base), &["--steps", "20", "--checkpoint-every", "5"])));
    let mut bytes = std::fs::read(ckpt(&ck, 20)).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    std::fs::write(ckpt(&ck, 20), &bytes).unwrap();
    std::fs::create_dir(ckpt(&ck, 1)).unwrap();
    let resume = with(&strs(&base), &["--steps", "18", "--checkpoint-every", "1", "--resume"]);
    fails_with(1, &strs(&resume), &format!("{}: is a directory, not a regular file", ckpt(&ck, 1).display()));
    assert!(ckpt(&ck, 1).is_dir());
    std::fs::remove_dir(ckpt(&ck, 1)).unwrap();
    let out = ok(&strs(&resume));
    assert!(text(&out.stderr).contains("(step 15)"), "{}", text(&out.stderr));
    assert_eq!(names(&ck), ckpt_names(&[16, 17, 18, 20]));
    assert_eq!(std::fs::read(ckpt(&ck, 20)).unwrap(), bytes, "the damaged file was replaced");
}

fn all_finite(path: &Path) -> bool {
    read_safetensors(path).unwrap().0.iter().all(|(_, t)| match &t.data {
        HostData::F32(v) => v.iter().all(|x| x.is_finite()),
        HostData::I32(_) => true,
    })
}

/// Item 4: after an inf/NaN stop, the checkpoint named in the message (and every other one
/// kept) holds finite weights and optimizer state.
#[test]
fn an_inf_stop_leaves_a_finite_checkpoint() {
    let ck = scratch("inf");
    let args = [
        "train",
        "--data",
        "synthetic",
        "--batch",
        "8",
        "--devices",
        "cpu",
        "--steps",
        "10",
        "--lr",
        "1e38",
        "--checkpoint-every",
        "1",
        "--checkpoint-dir",
        s(&ck),
    ];
    let err = fails_with(1, &args, "the newest finite checkpoint is");
    let named = err.split("the newest finite checkpoint is ").nth(1).unwrap().trim();
    assert!(Path::new(named).is_file(), "{err}");
    let files = names(&ck);
    assert!(!files.is_empty());
    for f in files {
        assert!(all_finite(&ck.join(&f)), "{f} holds a non-finite value; stderr: {err}");
    }
}

/// A spawned run, killed if the test fails before it ends, so no run outlives its test.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

type Lines = std::io::Lines<std::io::BufReader<std::process::ChildStdout>>;

/// Spawns `args` with stdout piped; returns it once the JSON log has shown step `step`.
fn spawn_until_step(args: &[&str], step: u64) -> (Running, Lines) {
    use std::io::BufRead;
    let mut child = Running(tandem().args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap());
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["step"].as_u64().is_some_and(|s| s >= step) {
            return (child, lines);
        }
    }
    panic!("tandem {args:?} ended before step {step}");
}

/// Waits until no thread of `child` has signal `sig` pending (Linux's /proc status masks):
/// a handler has taken it.
fn handled(child: &Running, sig: u32) {
    let pending = |status: &str, key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|m| m & (1 << (sig - 1)) != 0)
    };
    let pid = child.0.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let shared = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().map(|e| e.path().join("status")).collect::<Vec<_>>())
            .unwrap_or_default();
        let any_thread = tasks.iter().any(|t| pending(&std::fs::read_to_string(t).unwrap_or_default(), "SigPnd:"));
        if !pending(&shared, "ShdPnd:") && !any_thread {
            // Taken; the handler's store follows at once on the thread that took it.
            std::thread::sleep(std::time::Duration::from_millis(20));
            return;
        }
        assert!(std::time::Instant::now() < deadline, "signal {sig} still pending in {pid} after 30 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn signal(child: &Running, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &child.0.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Item 5: a second run in a directory in use is refused by name, and the first goes on
/// untouched.
#[test]
fn a_second_run_in_a_directory_in_use_is_refused() {
    let ck = scratch("lock");
    let args = with(&LINEAR, &["--checkpoint-dir", s(&ck), "--checkpoint-every", "100", "--steps", "100000000", "--log-format", "json"]);
    let (mut first, lines) = spawn_until_step(&strs(&args), 1);
    // Short, so that without a lock they would end instead of running beside the first.
    for extra in [&[][..], &["--resume"], &["--overwrite-checkpoints"]] {
        let second = with(&strs(&args), &[extra, &["--steps", "3"]].concat());
        let err = fails_with(1, &strs(&second), "in use by another tandem run");
        assert!(err.contains(&format!("pid {}", first.0.id())), "{err}");
    }
    assert!(first.0.try_wait().unwrap().is_none(), "the first run ended early");
    signal(&first, "TERM");
    let summary: serde_json::Value = serde_json::from_str(&lines.last().unwrap().unwrap()).unwrap();
    assert_eq!(first.0.wait().unwrap().code(), Some(143));
    assert_eq!(summary["stopped_by"], "SIGTERM");
    // Its checkpoint is whole, and the run can be continued from it.
    let stopped_at = summary["steps"].as_u64().unwrap();
    let more = (stopped_at + 3).to_string();
    let out = ok(&strs(&with(&strs(&args), &["--resume", "--steps", &more])));
    assert!(text(&out.stderr).contains(&format!("(step {stopped_at})")), "{}", text(&out.stderr));
}

/// Item 6: SIGTERM mid-run finishes the step, writes a checkpoint, prints the summary and
/// exits 143; resuming ends with exactly the weights of an uninterrupted run.
#[test]
fn sigterm_then_resume_matches_an_uninterrupted_run() {
    let dir = scratch("sigterm");
    let (full, resumed, ck) = (dir.join("full.safetensors"), dir.join("resumed.safetensors"), dir.join("ck"));
    let common =
        ["train", "--model", "seed-two-layer", "--data", "synthetic", "--batch", "8", "--steps", "3000", "--devices", "cpu", "--log-format", "json"];
    ok(&[&common[..], &["--save", s(&full)]].concat());
    let args = [&common[..], &["--checkpoint-dir", s(&ck), "--checkpoint-every", "100000"]].concat();
    let (mut child, lines) = spawn_until_step(&args, 5);
    signal(&child, "TERM");
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert_eq!(child.0.wait().unwrap().code(), Some(143));
    let summary: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(summary["stopped_by"], "SIGTERM");
    let stopped_at = summary["steps"].as_u64().unwrap();
    assert!(stopped_at < 3000, "the run ended before the signal");
    assert_eq!(names(&ck), ckpt_names(&[stopped_at]));
    let out = ok(&[&args[..], &["--resume", "--save", s(&resumed)]].concat());
    assert!(text(&out.stderr).contains(&format!("(step {stopped_at})")), "{}", text(&out.stderr));
    assert!(std::fs::read(&full).unwrap() == std::fs::read(&resumed).unwrap(), "weights differ after SIGTERM and resume");
}

/// Item 6 for `--model gpt`: SIGTERM ends the run after the step, with its checkpoint, and the
/// summary keeps the validation loss of that step.
#[test]
fn a_stopped_gpt_run_keeps_its_checkpoint_and_last_validation_loss() {
    let ck = scratch("gpt-sigterm");
    let tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch", "8"];
    let run = ["train", "--model", "gpt", "--data", "text", "--devices", "cpu", "--log-format", "json", "--steps", "100000000", "--eval-every", "1"];
    let args = [&run[..], &tiny, &["--checkpoint-every", "100000000", "--checkpoint-dir", s(&ck)]].concat();
    let (mut child, lines) = spawn_until_step(&args, 2);
    signal(&child, "TERM");
    let rest: Vec<serde_json::Value> = lines.map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
    assert_eq!(child.0.wait().unwrap().code(), Some(143));
    let summary = rest.last().unwrap();
    assert_eq!(summary["stopped_by"], "SIGTERM");
    let stopped_at = summary["steps"].as_u64().unwrap();
    assert_eq!(names(&ck), ckpt_names(&[stopped_at]));
    let last_val = rest.iter().rev().find(|l| l.get("val_loss").is_some() && l.get("summary").is_none()).expect("a validation line after the signal");
    assert_eq!(last_val["step"].as_u64(), Some(stopped_at));
    assert!(summary["val_loss"].is_f64() && summary["val_loss"] == last_val["val_loss"], "{summary}");
}

/// Item 6: a second signal does not wait for the step: the run ends at once (130 or 143)
/// and writes no checkpoint.
#[test]
fn a_second_signal_stops_at_once() {
    let ck = scratch("twice");
    // Whole-set batches of the CNN: each step takes far longer than sending two signals.
    let args = [
        "train",
        "--data",
        "synthetic",
        "--batch",
        "1000",
        "--steps",
        "100000",
        "--devices",
        "cpu",
        "--log-format",
        "json",
        "--checkpoint-dir",
        s(&ck),
    ];
    let (mut child, _lines) = spawn_until_step(&args, 1);
    // Two different signals from one shell, microseconds apart: the kernel merges two pending
    // SIGTERMs into one, and separate `kill` processes could straddle the end of a step.
    let pid = child.0.id().to_string();
    let sent = Command::new("sh").args(["-c", "kill -INT $0 && kill -TERM $0", &pid]).status().unwrap();
    assert!(sent.success());
    // Pending together, the two may be taken by different threads in either order: the
    // status is that of whichever was handled second.
    let code = child.0.wait().unwrap().code();
    assert!(matches!(code, Some(130 | 143)), "exit status {code:?}");
    assert!(names(&ck).is_empty(), "a checkpoint was written after the second signal: {:?}", names(&ck));
}

/// Item 7: `--deterministic` on one device gives the bits of two devices.
#[test]
fn deterministic_is_the_same_on_one_device_as_on_two() {
    let dir = scratch("det");
    let base = ["train", "--data", "synthetic", "--batch", "16", "--steps", "4", "--deterministic"];
    let (one, two) = (dir.join("one.safetensors"), dir.join("two.safetensors"));
    ok(&[&base[..], &["--devices", "cpu", "--save", s(&one)]].concat());
    ok(&[&base[..], &["--devices", "cpu,cpu", "--save", s(&two)]].concat());
    assert!(std::fs::read(&one).unwrap() == std::fs::read(&two).unwrap(), "--deterministic: 1 and 2 devices differ");
}

/// Item 7: a pipeline and a layer placement over two backends give the same bits in every
/// run with `--deterministic` (the stage split no longer depends on measured times).
#[test]
fn deterministic_mixed_backend_runs_are_identical() {
    let has_wgpu = cfg!(feature = "wgpu") && text(&ok(&["devices"]).stdout).contains("wgpu:0");
    if !has_wgpu {
        assert!(!std::env::var("CI").is_ok_and(|v| v == "true") || !cfg!(feature = "wgpu"), "CI=true but no wgpu adapter was found");
        eprintln!("skipped: no wgpu adapter");
        return;
    }
    let dir = scratch("mixed");
    let base = ["train", "--data", "synthetic", "--batch", "16", "--steps", "3", "--devices", "cpu,wgpu:0", "--deterministic"];
    for (strategy, runs) in [(&["--strategy", "pipeline", "--micro-batches", "4"][..], 6), (&["--strategy", "model"][..], 3)] {
        let mut first: Option<Vec<u8>> = None;
        for i in 0..runs {
            let out = dir.join(format!("w{i}.safetensors"));
            ok(&[&base[..], strategy, &["--save", s(&out)]].concat());
            let bytes = std::fs::read(&out).unwrap();
            match &first {
                None => first = Some(bytes),
                Some(f) => assert!(*f == bytes, "{strategy:?}: run {i} differs from run 0"),
            }
        }
    }
}

/// Item 8 (the parts without devices): outputs checked before step 1, two outputs on one path
/// refused, usage errors exit 2, and a resume with nothing to do is an error that saves nothing.
#[test]
fn outputs_and_exit_codes_keep_the_readme_promises() {
    let dir = scratch("outputs");
    let lin = |extra: &[&str]| with(&LINEAR, &[&["--steps", "2", "--log-format", "json"][..], extra].concat());
    if cfg!(target_os = "linux") {
        let out = run(&strs(&lin(&["--checkpoint-dir", "/proc/self"])));
        assert!(
            !out.status.success() && text(&out.stdout).is_empty(),
            "a step ran before /proc/self was refused:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let both = dir.join("both.out");
    let err = fails_with(2, &strs(&lin(&["--save", s(&both), "--plot", &format!("{}/./both.out", s(&dir))])), "--save");
    assert!(!both.exists(), "{err}");
    fails_with(2, &strs(&lin(&["--batch", "0"])), "--batch");
    fails_with(2, &strs(&lin(&["--micro-batches", "3"])), "--micro-batches");
    fails_with(2, &strs(&lin(&["--model", "seed-rnn"])), "seed-rnn");
    fails_with(1, &strs(&lin(&["--init", s(&dir.join("missing.safetensors"))])), "missing.safetensors");

    let ck = dir.join("ck");
    ok(&strs(&with(&LINEAR, &["--steps", "10", "--checkpoint-dir", s(&ck)])));
    let before = contents(&ck);
    let save = dir.join("w.safetensors");
    fails_with(2, &strs(&with(&LINEAR, &["--steps", "5", "--resume", "--checkpoint-dir", s(&ck), "--save", s(&save)])), "nothing to do");
    assert!(contents(&ck) == before && !save.exists(), "a resume with nothing to do wrote files");
}

/// `--save` (or `--plot`, `--trace`) naming a file the run keeps in its checkpoint directory is
/// a usage error before any step, and that file is left as it was.
#[test]
fn an_output_may_not_name_the_runs_own_checkpoint() {
    let dir = scratch("own");
    let ck = dir.join("ck");
    let lin = |extra: &[&str]| with(&LINEAR, &[&["--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", s(&ck)][..], extra].concat());
    ok(&strs(&lin(&["--steps", "2"])));
    let before = contents(&ck);
    // The next checkpoint, spelt another way; and one already there.
    let next = format!("{}/../ck/ckpt-00000004.safetensors", s(&ck));
    for (flag, path) in [("--save", next.as_str()), ("--plot", s(&ckpt(&ck, 2)))] {
        let out = run(&strs(&lin(&["--resume", flag, path])));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {path}: {err}");
        assert!(err.contains(flag) && err.contains("--checkpoint-dir") && text(&out.stdout).is_empty(), "{err}");
    }
    // A link to the checkpoint is followed, and refused too.
    let link = dir.join("link.safetensors");
    std::os::unix::fs::symlink(ckpt(&ck, 4), &link).unwrap();
    fails_with(2, &strs(&lin(&["--resume", "--save", s(&link)])), "--save");
    assert!(contents(&ck) == before, "a refused run changed the checkpoint directory");
}

/// `--init` with `--resume` of a run that did not start from a file is refused, for the seed
/// models as for a GPT (tests/init_resume.rs has the run that did).
#[test]
fn init_with_resume_is_refused() {
    let dir = scratch("init-resume");
    let (ck, w) = (dir.join("ck"), dir.join("w.safetensors"));
    ok(&strs(&with(&LINEAR, &["--steps", "2", "--checkpoint-dir", s(&ck), "--save", s(&w)])));
    for model in [&LINEAR[..], &["train", "--model", "gpt", "--data", "text", "--devices", "cpu"]] {
        let err = fails_with(
            2,
            &strs(&with(model, &["--steps", "3", "--resume", "--checkpoint-dir", s(&ck), "--init", s(&w)])),
            "did not start from a file",
        );
        assert!(err.contains("--init") && err.contains(s(&w)), "{err}");
    }
}

/// A signal before the first checkpoint does not advise `--resume`, which would fail: there
/// is nothing to continue. (`--init` is a FIFO, so the run waits in its setup, where the
/// signal is sent.)
#[test]
fn a_stop_before_any_checkpoint_does_not_advise_resume() {
    use std::io::{Read, Write};
    let dir = scratch("early-stop");
    let (w, fifo, ck) = (dir.join("w.safetensors"), dir.join("init.safetensors"), dir.join("ck"));
    ok(&strs(&with(&LINEAR, &["--steps", "1", "--save", s(&w)])));
    common::mkfifo(&fifo);
    let args = with(&LINEAR, &["--steps", "5", "--checkpoint-dir", s(&ck), "--init", s(&fifo)]);
    let mut child = Running(tandem().args(strs(&args)).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    // Opening the FIFO's write end returns once the run has opened it to read: by then its
    // signal handlers are in place.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    signal(&child, "TERM");
    // A signal is asynchronous: it may wait, pending, for a thread of the run to be scheduled,
    // while the run reads its weights and starts. Written once it has been taken, the weights
    // reach a run that has seen the stop.
    handled(&child, 15);
    writer.write_all(&std::fs::read(&w).unwrap()).unwrap();
    drop(writer);
    let mut err = String::new();
    child.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(child.0.wait().unwrap().code(), Some(143), "{err}");
    assert!(err.contains("stopped by SIGTERM after step 0") && !err.contains("--resume"), "{err}");
    assert!(names(&ck).is_empty(), "a checkpoint was written: {err}");
}
