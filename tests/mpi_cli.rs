//! `tandem` under `mpirun` (cargo features `mpi` and `cli`): `train` across 2 processes
//! equals the single-process run with one log, a checkpoint written under 2 processes resumes
//! under 1 and under 3 on the uninterrupted run's curve, a failing rank ends the job naming
//! it, `devices` speaks per rank and `bench --bench allreduce` prints its JSON figures; ranks
//! started with other flags, data or chunk sizes end the job within 30 s naming what differs;
//! sharded (`--shard`) checkpoints resume under another rank count and sharding mode;
//! `--strategy data,tensor` puts a tensor group in each process and data parallelism across;
//! `--strategy pipeline` puts a GPT's stages (tensor groups with `--tensor`) on the processes.
#[path = "common/jobs.rs"]
mod jobs;

use jobs::Job;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A fresh directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let path = jobs::scratch("mpi-cli");
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One job at a time (see `jobs::SERIAL`).
fn run(cmd: Command, limit: Duration) -> Job {
    let _one = jobs::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    jobs::run(cmd, limit)
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_tandem")
}

/// `mpirun -np N tandem ARGS`.
fn mpirun(np: usize, args: &[&str]) -> Command {
    let mut cmd = jobs::mpirun(np, false, Path::new(exe()));
    cmd.args(args);
    cmd
}

/// `tandem ARGS` alone, or under `mpirun -np N` when `np > 1`.
fn tandem(np: usize, args: &[&str]) -> Command {
    if np == 1 {
        let mut cmd = Command::new(exe());
        cmd.args(args);
        cmd
    } else {
        mpirun(np, args)
    }
}

/// A successful job's JSON lines.
fn json_lines(cmd: Command) -> Vec<serde_json::Value> {
    let what = format!("{cmd:?}");
    let job = run(cmd, Duration::from_secs(120));
    assert!(job.ok, "{what} failed:\n{}\n{}", job.stdout, job.stderr);
    job.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {l}"))).collect()
}

/// The `(step, loss)` of every step line of a `--log-format json` run.
fn losses(lines: &[serde_json::Value]) -> Vec<(u64, f32)> {
    lines.iter().filter(|l| l.get("loss").is_some()).map(|l| (l["step"].as_u64().unwrap(), l["loss"].as_f64().unwrap() as f32)).collect()
}

/// Flags of a short seed-CNN run on the CPU.
fn cnn(steps: &str, extra: &[&'static str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--devices", "cpu", "--steps", steps, "--log-format", "json"].map(String::from).to_vec();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

fn assert_curve(what: &str, got: &[(u64, f32)], want: &[(u64, f32)], exact: bool) {
    let steps = |c: &[(u64, f32)]| c.iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(steps(got), steps(want), "{what}: steps");
    let (g, w): (Vec<f32>, Vec<f32>) = (got.iter().map(|p| p.1).collect(), want.iter().map(|p| p.1).collect());
    if exact {
        assert!(g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: {g:?} is not bit for bit {w:?}");
    } else {
        tandem::tolerance::assert_close(what, &g, &w, 1e-5, 1e-4);
    }
}

#[test]
fn train_under_two_processes_equals_one_with_one_log() {
    let one = json_lines(tandem(1, &strs(&cnn("10", &[]))));
    let two = json_lines(tandem(2, &strs(&cnn("10", &[]))));
    // Rank 0 alone prints: ten step lines and one summary, as alone.
    assert_eq!(two.len(), 11, "{two:?}");
    assert_eq!(two.iter().filter(|l| l.get("summary").is_some()).count(), 1);
    assert_curve("seed CNN, 2 processes", &losses(&two), &losses(&one), false);

    let gpt: Vec<&str> = vec![
        "train",
        "--model",
        "gpt",
        "--data",
        "text",
        "--strategy",
        "data",
        "--devices",
        "cpu",
        "--steps",
        "10",
        "--batch",
        "8",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "16",
        "--log-format",
        "json",
    ];
    let one = losses(&json_lines(tandem(1, &gpt)));
    let two = losses(&json_lines(tandem(2, &gpt)));
    assert_eq!(one.len(), 10);
    assert_curve("GPT, 2 processes", &two, &one, false);
}

#[test]
fn a_checkpoint_of_two_processes_resumes_under_one_and_three() {
    for deterministic in [false, true] {
        let flag: &[&'static str] = if deterministic { &["--deterministic"] } else { &[] };
        let whole = losses(&json_lines(tandem(1, &strs(&cnn("10", flag)))));
        for np in [1, 3] {
            let dir = TempDir::new();
            let ckpt = dir.0.join("ckpt");
            let ckpt = ckpt.to_str().unwrap();
            let mut first = cnn("5", flag);
            first.extend(["--checkpoint-dir".into(), ckpt.into()]);
            let head = losses(&json_lines(tandem(2, &strs(&first))));
            assert!(Path::new(ckpt).join("ckpt-00000005.safetensors").is_file(), "rank 0 wrote no checkpoint at step 5");
            let mut rest = cnn("10", flag);
            rest.extend(["--checkpoint-dir".into(), ckpt.into(), "--resume".into()]);
            let tail = losses(&json_lines(tandem(np, &strs(&rest))));
            let what = format!("2 processes for 5 steps, then {np} (deterministic: {deterministic})");
            assert_curve(&what, &[head, tail].concat(), &whole, deterministic);
        }
    }
}

/// `--shard`: a ZeRO-3 run of 2 processes resumes as ZeRO-2 under 3 and a ZeRO-2 one as ZeRO-3
/// alone, both on the curve of the plain uninterrupted run (the checkpoints hold the whole
/// state, gathered from every rank's shards).
#[test]
fn sharded_checkpoints_resume_under_another_rank_count_and_mode() {
    let whole = losses(&json_lines(tandem(1, &strs(&cnn("10", &[])))));
    for (first, then, np) in [("full", "grads", 3), ("grads", "full", 1)] {
        let dir = TempDir::new();
        let ckpt = dir.0.join("ckpt");
        let ckpt = ckpt.to_str().unwrap();
        let mut head = cnn("5", &["--strategy", "data", "--checkpoint-dir"]);
        head.extend([ckpt.to_string(), "--shard".into(), first.into()]);
        let head = losses(&json_lines(tandem(2, &strs(&head))));
        let mut rest = cnn("10", &["--strategy", "data", "--resume", "--checkpoint-dir"]);
        rest.extend([ckpt.to_string(), "--shard".into(), then.into()]);
        let tail = losses(&json_lines(tandem(np, &strs(&rest))));
        assert_curve(&format!("--shard {first} on 2 processes, then --shard {then} on {np}"), &[head, tail].concat(), &whole, false);
    }
}

/// `--strategy data,tensor` under 2 processes (a tensor group of 2 inside each, data
/// parallelism across them through host memory), plain and with ZeRO-3 on the data axis,
/// trains the one-process, one-device losses; its checkpoint resumes alone under `--strategy
/// single` and a one-device checkpoint under the mesh, all on the uninterrupted curve.
#[test]
fn tensor_groups_inside_processes_with_data_across() {
    let gpt = |steps: &str, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "train",
            "--model",
            "gpt",
            "--data",
            "text",
            "--steps",
            steps,
            "--batch",
            "8",
            "--n-layer",
            "1",
            "--n-head",
            "2",
            "--n-embd",
            "16",
            "--block-size",
            "16",
            "--log-format",
            "json",
        ]
        .map(String::from)
        .to_vec();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let mesh: &[&str] = &["--strategy", "data,tensor", "--tensor", "2", "--devices", "cpu,cpu,cpu,cpu"];
    let alone: &[&str] = &["--devices", "cpu"];
    let whole = losses(&json_lines(tandem(1, &strs(&gpt("6", alone)))));
    assert_eq!(whole.len(), 6);
    assert_curve("GPT, data 2 x tensor 2 over 2 processes", &losses(&json_lines(tandem(2, &strs(&gpt("6", mesh))))), &whole, false);
    // ZeRO-3 on the data axis across the processes: each tensor shard's state sharded over the
    // two ranks that hold it.
    let zero3: &[&str] = &["--strategy", "data,tensor", "--tensor", "2", "--shard", "full", "--devices", "cpu,cpu,cpu,cpu"];
    assert_curve("GPT, data 2 (ZeRO-3) x tensor 2 over 2 processes", &losses(&json_lines(tandem(2, &strs(&gpt("6", zero3))))), &whole, false);
    for (first, np_first, then, np_then) in [(mesh, 2, alone, 1), (alone, 1, mesh, 2), (zero3, 2, alone, 1), (alone, 1, zero3, 2)] {
        let dir = TempDir::new();
        let ckpt = dir.0.join("ckpt");
        let ckpt = ckpt.to_str().unwrap();
        let head = losses(&json_lines(tandem(np_first, &strs(&gpt("3", &[first, &["--checkpoint-dir", ckpt]].concat())))));
        let tail = losses(&json_lines(tandem(np_then, &strs(&gpt("6", &[then, &["--checkpoint-dir", ckpt, "--resume"]].concat())))));
        assert_curve(&format!("{first:?} on {np_first} processes, then {then:?} on {np_then}"), &[head, tail].concat(), &whole, false);
    }
}

/// `--strategy pipeline` for the GPT under 2 processes puts one stage on each (a tensor group of
/// 2 inside each with `--tensor 2`), the embedding on rank 0 tied to the head on rank 1: both
/// train the one-device losses, and a checkpoint of tensor 2 x pipeline 2 resumes under
/// `data,tensor` across 2 processes and alone, on the uninterrupted curve.
#[test]
fn gpt_pipeline_stages_across_processes() {
    let gpt = |steps: &str, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "train",
            "--model",
            "gpt",
            "--data",
            "text",
            "--steps",
            steps,
            "--batch",
            "8",
            "--n-layer",
            "2",
            "--n-head",
            "2",
            "--n-embd",
            "16",
            "--block-size",
            "16",
            "--log-format",
            "json",
        ]
        .map(String::from)
        .to_vec();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let alone: &[&str] = &["--devices", "cpu"];
    let pipe: &[&str] = &["--strategy", "pipeline", "--devices", "cpu,cpu", "--micro-batches", "2"];
    let tensor_pipe: &[&str] = &["--strategy", "pipeline", "--tensor", "2", "--devices", "cpu,cpu,cpu,cpu", "--micro-batches", "2"];
    let mesh: &[&str] = &["--strategy", "data,tensor", "--tensor", "2", "--devices", "cpu,cpu,cpu,cpu"];
    let whole = losses(&json_lines(tandem(1, &strs(&gpt("4", alone)))));
    assert_eq!(whole.len(), 4);
    assert_curve("GPT, pipeline 2 over 2 processes", &losses(&json_lines(tandem(2, &strs(&gpt("4", pipe))))), &whole, false);
    assert_curve("GPT, tensor 2 x pipeline 2 over 2 processes", &losses(&json_lines(tandem(2, &strs(&gpt("4", tensor_pipe))))), &whole, false);
    for (then, np_then) in [(mesh, 2), (alone, 1)] {
        let dir = TempDir::new();
        let ckpt = dir.0.join("ckpt");
        let ckpt = ckpt.to_str().unwrap();
        let head = losses(&json_lines(tandem(2, &strs(&gpt("2", &[tensor_pipe, &["--checkpoint-dir", ckpt]].concat())))));
        let tail = losses(&json_lines(tandem(np_then, &strs(&gpt("4", &[then, &["--checkpoint-dir", ckpt, "--resume"]].concat())))));
        assert_curve(&format!("tensor 2 x pipeline 2 on 2 processes, then {then:?} on {np_then}"), &[head, tail].concat(), &whole, false);
    }
    // Rank 0 evaluates alone, which a pipeline spread over the ranks cannot.
    let job = run(tandem(2, &strs(&gpt("2", &[pipe, &["--eval-every", "1"]].concat()))), Duration::from_secs(60));
    assert!(!job.ok && job.stderr.contains("--eval-every"), "{}", job.stderr);
}

#[test]
fn a_failing_rank_ends_the_job_naming_it() {
    // Rank 1 alone is given an --init file that does not exist (an MPMD launch).
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "1", exe(), "train", "--devices", "cpu", "--steps", "50"]);
    cmd.args([":", "-np", "1", exe(), "train", "--devices", "cpu", "--steps", "50", "--init", "/nonexistent/w.safetensors"]);
    let started = Instant::now();
    let job = run(cmd, Duration::from_secs(60));
    let output = format!("{}\n{}", job.stdout, job.stderr);
    assert!(!job.ok, "the job succeeded:\n{output}");
    assert!(started.elapsed() < Duration::from_secs(30), "the job took {:?} to end:\n{output}", started.elapsed());
    assert!(output.contains("rank 1 of 2: error:") && output.contains("/nonexistent/w.safetensors"), "{output}");

    let job = run(mpirun(2, &["train", "--devices", "cpu", "--steps", "2", "--strategy", "pipeline"]), Duration::from_secs(60));
    let said = job.stderr.contains("of 2: error: invalid argument to --strategy: pipeline runs inside one process");
    assert!(!job.ok && said, "{}", job.stderr);
}

#[test]
fn devices_and_the_allreduce_bench_under_two_processes() {
    let job = run(mpirun(2, &["devices"]), Duration::from_secs(60));
    assert!(job.ok, "{}", job.stderr);
    let lines: Vec<&str> = job.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", job.stdout);
    for (r, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("rank {r} of 2 (local rank {r} of 2")) && line.contains("cpu (CPU reference)"), "{line}");
    }

    let figures = json_lines(mpirun(2, &["bench", "--bench", "allreduce", "--quick", "--devices", "cpu", "--log-format", "json"]));
    for backend in ["cpu", "mpi-raw"] {
        let sizes: Vec<u64> = figures.iter().filter(|f| f["backend"] == backend).map(|f| f["bytes"].as_u64().unwrap()).collect();
        assert_eq!(sizes, [4096, 16384, 65536, 262144, 1 << 20], "{backend}: {figures:?}");
    }
    for f in &figures {
        assert_eq!((f["bench"].as_str(), f["processes"].as_u64()), (Some("allreduce"), Some(2)), "{f}");
        assert!(f["gbps"].as_f64().is_some_and(|g| g > 0.0 && g.is_finite()), "{f}");
    }

    // wgpu:0 in chunks of 1025 floats (the last one short): the bench checks every sum.
    let mut chunked = mpirun(2, &["bench", "--bench", "allreduce", "--quick", "--devices", "wgpu:0", "--log-format", "json"]);
    chunked.env("TANDEM_ALLREDUCE_CHUNK_BYTES", "4100");
    assert_eq!(json_lines(chunked).len(), 10);
}

/// Two ranks started with different flags (shape, seed, precision, gradient type) or data (an
/// MPMD launch, `mpirun -np 1 tandem A : -np 1 tandem B`, each rank in a directory of its own)
/// end within 30 s, failing, with a message that names the flag and both ranks' values, and
/// nothing corrupts memory.
#[test]
fn ranks_started_differently_end_the_job_naming_the_flag() {
    let dir = TempDir::new();
    let (a, b) = (dir.0.join("a"), dir.0.join("b"));
    for (d, seed) in [(&a, 1u64), (&b, 2)] {
        std::fs::create_dir_all(d).unwrap();
        // Same length and alphabet, other text: the path and size alone would not tell them apart.
        let text: String = (0..4000u64).map(|i| (b'a' + ((i * 7 + seed * i / 3) % 26) as u8) as char).collect();
        std::fs::write(d.join("corpus.txt"), &text).unwrap();
        std::fs::write(d.join("other.txt"), &text).unwrap();
    }
    let base: Vec<String> = [
        "train",
        "--model",
        "gpt",
        "--data",
        "text:corpus.txt",
        "--devices",
        "cpu",
        "--steps",
        "3",
        "--batch",
        "4",
        "--n-layer",
        "1",
        "--n-head",
        "2",
        "--n-embd",
        "16",
        "--block-size",
        "8",
        "--seed",
        "1",
        "--log-format",
        "json",
    ]
    .map(String::from)
    .to_vec();
    // (what, rank 1's extra flags (a repeated flag overrides), rank 1's directory, the message)
    let cases: [(&str, &[&str], &Path, &[&str]); 8] = [
        ("model shape", &["--n-embd", "32"], &a, &["--n-embd: rank 0 = 16, rank 1 = 32"]),
        ("data file", &["--data", "text:other.txt"], &a, &["--data: rank 0 = text:corpus.txt (4000 bytes", "rank 1 = text:other.txt (4000 bytes"]),
        (
            "data content",
            &[],
            &b,
            &["--data: rank 0 = text:corpus.txt (4000 bytes, sha256 of its ends ", "rank 1 = text:corpus.txt (4000 bytes, sha256 of its ends "],
        ),
        ("seed", &["--seed", "2"], &a, &["--seed: rank 0 = 1, rank 1 = 2"]),
        ("batch", &["--batch", "8"], &a, &["--batch: rank 0 = 4, rank 1 = 8"]),
        ("steps", &["--steps", "5"], &a, &["--steps: rank 0 = 3, rank 1 = 5"]),
        ("precision", &["--precision", "bf16"], &a, &["--precision: rank 0 = f32, rank 1 = bf16"]),
        ("gradient type", &["--grad-dtype", "bf16"], &a, &["--grad-dtype: rank 0 = f32, rank 1 = bf16"]),
    ];
    for (what, extra, rank1_dir, expect) in cases {
        let mut other = base.clone();
        other.extend(extra.iter().map(|s| s.to_string()));
        let mut cmd = jobs::mpmd(Path::new(exe()), &[(&a, base.clone()), (rank1_dir, other)]);
        // A rank left waiting would end at this timeout, far past the 30 s asked for.
        cmd.env("TANDEM_DIST_TIMEOUT_S", "120");
        let job = run(cmd, Duration::from_secs(60));
        let output = format!("{}\n{}", job.stdout, job.stderr);
        jobs::assert_no_memory_fault(&output);
        assert!(!job.ok, "{what}: the job succeeded:\n{output}");
        assert!(job.took < Duration::from_secs(30), "{what}: the job took {:?} to end:\n{output}", job.took);
        assert!(output.contains("not started with the same run configuration"), "{what}:\n{output}");
        for e in expect {
            assert!(output.contains(e), "{what}: the output does not say {e:?}:\n{output}");
        }
    }
}

/// Ranks that cut one all-reduce into chunks of different sizes (`TANDEM_ALLREDUCE_CHUNK_BYTES`
/// differs, here on wgpu:0 where the chunked path runs) agree once per tensor, see that they
/// disagree, and end at once naming both chunk sizes instead of mixing their chunks.
#[test]
fn ranks_that_chunk_an_all_reduce_differently_end_the_job() {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe"]);
    for (i, bytes) in ["4100", "8200"].iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args([
            "-np",
            "1",
            "-x",
            &format!("TANDEM_ALLREDUCE_CHUNK_BYTES={bytes}"),
            exe(),
            "bench",
            "--bench",
            "allreduce",
            "--quick",
            "--devices",
            "wgpu:0",
            "--log-format",
            "json",
        ]);
    }
    cmd.env("TANDEM_DIST_TIMEOUT_S", "120");
    let job = run(cmd, Duration::from_secs(60));
    let output = format!("{}\n{}", job.stdout, job.stderr);
    jobs::assert_no_memory_fault(&output);
    assert!(!job.ok && job.took < Duration::from_secs(30), "the job succeeded or took {:?}:\n{output}", job.took);
    assert!(
        output.contains("rank 0 all_reduce of 4096 f32 values in chunks of 1025, rank 1 all_reduce of 4096 f32 values in chunks of 2050"),
        "{output}"
    );
}

/// `--strategy auto` under a launcher plans every rank's devices together: `tandem plan`
/// prints one plan of data parallelism over both processes (rank 0 alone prints and saves),
/// training with it (fresh, or from the saved file) gives one process's losses, and a plan
/// of one process is refused by the job, as the job's is by one process.
#[test]
fn a_job_of_two_processes_is_planned_as_one_cluster() {
    let dir = TempDir::new();
    let saved = dir.0.join("job.json");
    let single = dir.0.join("single.json");
    let plan = ["plan", "--model", "seed-cnn", "--devices", "cpu", "--batch", "32"];
    let job = run(uncached(mpirun(2, &[&plan[..], &["--save-plan", saved.to_str().unwrap()]].concat())), Duration::from_secs(120));
    assert!(job.ok, "{}\n{}", job.stdout, job.stderr);
    assert_eq!(job.stdout.matches("plan for r0:cpu,r1:cpu (batch 32)").count(), 1, "{}", job.stdout);
    assert!(job.stdout.contains("data 2 x tensor 1 x pipeline 1"), "{}", job.stdout);
    assert!(job.stdout.contains("a job of several processes runs on all its 2 devices, not 1"), "{}", job.stdout);
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(file["plan"]["processes"], serde_json::json!([[0, 0], [1, 0]]), "{file}");
    // The job tried its choice, both ranks running each trial, rank 0 alone saying so.
    assert_eq!(job.stdout.matches("tried before choosing").count(), 1, "{}", job.stdout);
    let tried = file["plan"]["tried"].as_array().unwrap_or_else(|| panic!("no trials in {file}"));
    assert!(tried.iter().any(|t| t["layout"] == file["plan"]["best"]["layout"] && t["measured_s"].as_f64().is_some_and(|s| s > 0.0)), "{file}");

    let train = |np: usize, extra: &[&str]| {
        let args =
            [&["train", "--model", "seed-cnn", "--devices", "cpu", "--batch", "32", "--steps", "6", "--log-format", "json"][..], extra].concat();
        let what = format!("{np} processes, {extra:?}");
        let job = run(uncached(tandem(np, &args)), Duration::from_secs(120));
        assert!(job.ok, "{what}:\n{}\n{}", job.stdout, job.stderr);
        let lines: Vec<serde_json::Value> = job.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        (losses(&lines), job.stderr)
    };
    let (one, _) = train(1, &[]);
    let (auto, err) = train(2, &["--strategy", "auto"]);
    assert_eq!(err.matches("calibration measured").count(), 1, "the job did not plan, or more than rank 0 said so:\n{err}");
    assert_eq!(err.matches("for a few steps before choosing").count(), 1, "{err}");
    assert_curve("planned job", &auto, &one, false);
    let (from_file, _) = train(2, &["--plan", saved.to_str().unwrap()]);
    assert_curve("the job's saved plan", &from_file, &one, false);

    let alone = run(
        uncached(tandem(
            1,
            &["train", "--model", "seed-cnn", "--devices", "cpu", "--batch", "32", "--steps", "1", "--plan", saved.to_str().unwrap()],
        )),
        Duration::from_secs(60),
    );
    assert!(!alone.ok && alone.stderr.contains("the plan is for cpu,cpu"), "{}", alone.stderr);
    let made = run(
        uncached(tandem(1, &["plan", "--model", "seed-cnn", "--devices", "cpu,cpu", "--batch", "32", "--save-plan", single.to_str().unwrap()])),
        Duration::from_secs(60),
    );
    assert!(made.ok, "{}", made.stderr);
    let refused = run(
        uncached(mpirun(
            2,
            &["train", "--model", "seed-cnn", "--devices", "cpu", "--batch", "32", "--steps", "1", "--plan", single.to_str().unwrap()],
        )),
        Duration::from_secs(60),
    );
    assert!(!refused.ok && refused.stderr.contains("plan again under the launcher"), "{}", refused.stderr);
}

/// A job whose ranks drive different kinds of device (`--devices cpu,wgpu:0` under two
/// processes: rank 0 the CPU, rank 1 lavapipe's Vulkan adapter) trains as one process on both
/// devices does: with batch shares measured across the ranks (`--strategy data`, whose default
/// balance is by speed when the devices differ), recorded in the checkpoint so that resuming,
/// under the job or one process, repeats them (another share would be another run, refused);
/// and with the plan of the job, which names each rank's device.
#[test]
fn a_job_of_a_cpu_and_a_vulkan_process_trains_as_one() {
    let dir = TempDir::new();
    let base = ["train", "--model", "seed-cnn", "--devices", "cpu,wgpu:0", "--batch", "32", "--log-format", "json"];
    let train = |np: usize, extra: &[&str]| losses(&json_lines(uncached(tandem(np, &[&base[..], extra].concat()))));
    let whole = train(1, &["--steps", "6", "--strategy", "data", "--balance", "even"]);
    for resume_np in [2, 1] {
        let ckpt = dir.0.join(format!("ckpt-{resume_np}"));
        let ckpt = ckpt.to_str().unwrap();
        let head = train(2, &["--steps", "3", "--strategy", "data", "--checkpoint-dir", ckpt]);
        let weights = recorded_batch_weights(&Path::new(ckpt).join("ckpt-00000003.safetensors"));
        assert!(weights.len() == 2 && weights.iter().all(|w| *w > 0.0 && w.is_finite()), "one measured weight per device of the job: {weights:?}");
        let tail = train(resume_np, &["--steps", "6", "--strategy", "data", "--checkpoint-dir", ckpt, "--resume"]);
        assert_curve(&format!("cpu and wgpu:0 in 2 processes, resumed under {resume_np}"), &[head, tail].concat(), &whole, false);
    }
    assert_curve("the plan of a cpu and a wgpu:0 process", &train(2, &["--steps", "6", "--strategy", "auto"]), &whole, false);
    let plan = run(uncached(mpirun(2, &["plan", "--model", "seed-cnn", "--devices", "cpu,wgpu:0", "--batch", "32"])), Duration::from_secs(120));
    assert!(plan.ok, "{}\n{}", plan.stdout, plan.stderr);
    assert!(
        plan.stdout.contains("plan for r0:cpu,r1:wgpu:0 (batch 32)") || plan.stdout.contains("plan for r1:wgpu:0,r0:cpu (batch 32)"),
        "{}",
        plan.stdout
    );
    assert!(plan.stdout.contains("data 2 x tensor 1 x pipeline 1"), "{}", plan.stdout);
}

/// The `batch_weights` of the run configuration a checkpoint recorded.
fn recorded_batch_weights(path: &Path) -> Vec<f64> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let config: serde_json::Value = serde_json::from_str(&meta.metadata().as_ref().unwrap()["config"]).unwrap();
    serde_json::from_value(config["batch_weights"].clone()).unwrap_or_else(|e| panic!("batch_weights in {config}: {e}"))
}

/// `cmd` measuring afresh and keeping no calibration on disk.
fn uncached(mut cmd: Command) -> Command {
    cmd.env("TANDEM_CALIBRATION", "off");
    cmd
}
