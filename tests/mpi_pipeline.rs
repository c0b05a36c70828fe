//! Strategies whose parts live on different processes (cargo feature `mpi`), through
//! examples/dist_pipeline under `mpirun`: pipeline stages on 2 and 3 ranks train as `Single`
//! does (also clipping by the norm over every rank), a GPT's stages on 2 ranks (whole, or
//! tensor-parallel groups of 2) with the embedding tied to the head across them train as one
//! device, ties the ranks do not agree on are an error, ZeRO-1 over 2 ranks trains as plain
//! data parallelism with the optimizer state split between them, and NCCL across processes
//! refuses devices it cannot use on every rank without hanging.
#[path = "common/jobs.rs"]
mod jobs;

use jobs::scratch;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// examples/dist_pipeline, built once.
fn example() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| jobs::example("dist_pipeline"))
}

/// What a job printed (stdout, then stderr), whether it succeeded and how long it took.
fn run(np: usize, tcp: bool, args: &[&str], limit: Duration) -> (bool, String, Duration) {
    let _one = jobs::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = if np == 1 { Command::new(example()) } else { jobs::mpirun(np, tcp, example()) };
    cmd.args(args);
    let job = jobs::run(cmd, limit);
    (job.ok, format!("{}{}", job.stdout, job.stderr), job.took)
}

/// A run's losses per step, its final weights and optimizer state (sorted by name), and the
/// optimizer-state bytes of each rank (data-parallel modes).
struct Trained {
    losses: Vec<f32>,
    /// The gradient norm before clipping, per step (with `--clip`).
    norms: Vec<f32>,
    state: Vec<f32>,
    state_bytes: Vec<u64>,
}

fn train(np: usize, tcp: bool, args: &[&str]) -> Trained {
    train_steps(np, tcp, args, 10)
}

fn train_steps(np: usize, tcp: bool, args: &[&str], steps: usize) -> Trained {
    let path = scratch("state");
    let mut all = args.to_vec();
    let steps = steps.to_string();
    all.extend(["--steps", &steps, "--state-out", path.to_str().unwrap()]);
    let (ok, output, took) = run(np, tcp, &all, Duration::from_secs(240));
    assert!(ok, "{all:?} on {np} processes failed:\n{output}");
    eprintln!("{args:?} on {np} processes: {took:?}");
    let lines: Vec<serde_json::Value> = output.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    Trained {
        losses: lines.iter().filter_map(|l| l["loss"].as_f64()).map(|l| l as f32).collect(),
        norms: lines.iter().filter_map(|l| l["grad_norm"].as_f64()).map(|l| l as f32).collect(),
        state: bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        state_bytes: lines
            .iter()
            .find_map(|l| l["optimizer_state_bytes"].as_array().map(|a| a.iter().map(|v| v.as_u64().unwrap()).collect()))
            .unwrap_or_default(),
    }
}

fn assert_same_run(what: &str, got: &Trained, want: &Trained) {
    assert_eq!(got.losses.len(), want.losses.len(), "{what}: {} losses", got.losses.len());
    tandem::tolerance::assert_close(&format!("losses, {what}"), &got.losses, &want.losses, 1e-5, 1e-4);
    tandem::tolerance::assert_close(&format!("weights and optimizer state, {what}"), &got.state, &want.state, 1e-5, 1e-4);
}

#[test]
fn pipeline_stages_on_two_and_three_processes_train_as_single() {
    let single = train(1, false, &["--mode", "single"]);
    assert!(single.losses[9] < single.losses[0], "the reference run does not learn: {:?}", single.losses);
    let two = train(2, false, &["--mode", "pipeline", "--split", "6", "--micro", "4", "--schedule", "1f1b"]);
    assert_same_run("2 processes, 1F1B, 4 micro-batches", &two, &single);
    let three = train(3, true, &["--mode", "pipeline", "--split", "3,7", "--micro", "2", "--schedule", "gpipe", "--recompute"]);
    assert_same_run("3 processes over tcp, GPipe with recomputation", &three, &single);
}

/// The GPT's embedding (rank 0) and head (rank 1) are one parameter across the processes: its
/// gradient is summed on rank 0 before the clipped update and the new value sent back, so the
/// run equals one device's, weights and AdamW state included (the head has none of its own).
#[test]
fn gpt_stages_on_two_processes_train_as_one_device() {
    let single = train_steps(1, false, &["--mode", "gpt", "--clip", "0.5"], 4);
    assert!(single.losses[3] < single.losses[0], "the reference run does not learn: {:?}", single.losses);
    assert!(single.norms.iter().any(|&n| n > 0.5), "the bound never clips: norms {:?}", single.norms);
    let cases: [(&str, &[&str]); 2] = [
        ("pipeline 2 across", &["--devices", "cpu,cpu"]),
        ("tensor 2 inside x pipeline 2 across", &["--devices", "cpu,cpu,cpu,cpu", "--tensor", "2"]),
    ];
    for (what, flags) in cases {
        let args = [&["--mode", "gpt-pipeline", "--micro", "2", "--clip", "0.5"][..], flags].concat();
        let two = train_steps(2, false, &args, 4);
        assert_same_run(what, &two, &single);
        tandem::tolerance::assert_close(&format!("gradient norms, {what}"), &two.norms, &single.norms, 1e-5, 1e-4);
    }
}

/// Ranks given different ties, or a tie of two shapes, end the job with an error naming the
/// parameters, every rank agreeing on it.
#[test]
fn ties_the_ranks_do_not_agree_on_are_an_error() {
    let cases = [
        ("one-rank", "rank 1 does not tie stage 1's lm_head.weight to stage 0's transformer.wte.weight"),
        ("shape", "stage 0's transformer.wpe.weight is [8, 8] F32, stage 1's transformer.ln_f.weight, tied to it, is [8] F32"),
    ];
    for (bad, expect) in cases {
        let args = ["--mode", "gpt-pipeline", "--devices", "cpu,cpu", "--micro", "2", "--steps", "1", "--bad-tie", bad];
        let (ok, output, took) = run(2, false, &args, Duration::from_secs(120));
        assert!(!ok, "--bad-tie {bad}: the job succeeded:\n{output}");
        assert!(output.contains(expect), "--bad-tie {bad}: the output does not say {expect:?}:\n{output}");
        assert!(took < Duration::from_secs(60), "--bad-tie {bad}: the job took {took:?} to end");
    }
}

#[test]
fn zero_over_two_processes_trains_as_plain_data_parallelism() {
    let plain = train(2, false, &["--mode", "dp"]);
    let zero = train(2, false, &["--mode", "zero"]);
    assert_same_run("ZeRO-1 over 2 processes", &zero, &plain);
    // Plain data parallelism keeps all the state on each rank; ZeRO-1 splits it between them.
    let (full, split) = (&plain.state_bytes, &zero.state_bytes);
    assert!(full.len() == 2 && full[0] == full[1] && full[0] > 0, "plain: {full:?}");
    assert!(split.len() == 2 && split.iter().all(|&b| b > 0 && b < full[0]), "ZeRO-1: {split:?} against {full:?}");
    assert_eq!(split[0] + split[1], full[0], "ZeRO-1's shards add up to the whole state");
    // Two devices per process: four owners, two in each process.
    let devices = ["--devices", "cpu,cpu,cpu,cpu"];
    let plain4 = train(2, false, &[&["--mode", "dp"][..], &devices].concat());
    let zero4 = train(2, false, &[&["--mode", "zero"][..], &devices].concat());
    assert_same_run("ZeRO-1 over 2 processes x 2 devices", &zero4, &plain4);
    let (full, split) = (&plain4.state_bytes, &zero4.state_bytes);
    assert!(split.len() == 2 && split.iter().all(|&b| b > 0 && b < full[0]), "ZeRO-1 over 4 devices: {split:?} against {full:?}");
    assert_eq!(split[0] + split[1], full[0] / 2, "each process held both its devices' full state without ZeRO-1");
}

#[test]
fn a_pipeline_across_processes_clips_by_the_norm_over_every_rank() {
    let single = train(1, false, &["--mode", "single", "--clip", "0.5"]);
    assert!(single.norms.iter().any(|&n| n > 0.5), "the bound never clips: norms {:?}", single.norms);
    let two = train(2, false, &["--mode", "pipeline", "--split", "6", "--micro", "2", "--clip", "0.5"]);
    assert_same_run("2 processes clipping at 0.5", &two, &single);
    tandem::tolerance::assert_close("gradient norms, 2 processes", &two.norms, &single.norms, 1e-5, 1e-4);
}

#[test]
fn nccl_across_processes_refuses_cpu_devices_without_hanging() {
    let (ok, output, took) = run(2, false, &["--mode", "dp", "--comm", "nccl", "--devices", "cpu", "--steps", "1"], Duration::from_secs(120));
    assert!(!ok, "the job succeeded:\n{output}");
    assert!(took < Duration::from_secs(30), "the job took {took:?} to end:\n{output}");
    let expect: &[&str] = if cfg!(feature = "nccl") {
        &["cannot take part in NCCL across processes", "not a CUDA device", " of 2"]
    } else {
        &["without the `nccl` cargo feature"]
    };
    for e in expect {
        assert!(output.contains(e), "the output does not say {e:?}:\n{output}");
    }
}
