//! Many processes under `mpirun` (cargo feature `mpi`): examples/dist_train across 2 and 3
//! processes trains as one process does, deterministic mode is bit-identical across process
//! and device layouts, and a rank that panics, is killed or stops answering ends the whole
//! job within 30 s with a non-zero exit and a message naming a rank; collectives called with
//! other lengths on each rank return an error on every rank; sharded data parallelism (ZeRO-1,
//! 2, 3) across processes trains as one process does, with equal or unequal batch shares.
#[path = "common/jobs.rs"]
mod jobs;

use jobs::{run, SERIAL};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// examples/dist_train, built once.
fn example() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| jobs::example("dist_train"))
}

/// `mpirun -np N` of the example (`tcp`: over TCP instead of shared memory, as across nodes).
fn mpirun(np: usize, tcp: bool, args: &[&str]) -> Command {
    let mut cmd = jobs::mpirun(np, tcp, example());
    cmd.args(args);
    cmd
}

/// The example alone, without a launcher: a group of one.
fn alone(args: &[&str]) -> Command {
    let mut cmd = Command::new(example());
    cmd.args(args);
    cmd
}

/// A training run's losses (and their bits) per step, and its final weights.
struct Run {
    losses: Vec<f32>,
    bits: Vec<u32>,
    weights: Vec<f32>,
    devices: u64,
}

fn train(cmd: impl FnOnce(&[&str]) -> Command, args: &[&str]) -> Run {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = jobs::scratch("weights");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--weights-out", path.to_str().unwrap()]);
    let job = run(cmd(&all), Duration::from_secs(300));
    assert!(job.ok, "{args:?} failed:\n{}\n{}", job.stdout, job.stderr);
    let lines: Vec<serde_json::Value> = job.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    Run {
        losses: lines.iter().map(|l| l["loss"].as_f64().unwrap() as f32).collect(),
        bits: lines.iter().map(|l| l["loss_bits"].as_u64().unwrap() as u32).collect(),
        weights: bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        devices: lines.first().map_or(0, |l| l["devices"].as_u64().unwrap()),
    }
}

#[test]
fn two_and_three_processes_train_as_one() {
    let base = ["--devices", "cpu", "--steps", "10"];
    let one = train(alone, &base);
    assert_eq!(one.losses.len(), 10);
    assert!(one.losses[9] < one.losses[0], "the reference run does not learn: {:?}", one.losses);
    let cases = [(2, false, "cpu"), (3, true, "cpu"), (2, true, "cpu,cpu,cpu,cpu")];
    for (np, tcp, devices) in cases {
        let mut args = base.to_vec();
        args[1] = devices;
        let many = train(|a| mpirun(np, tcp, a), &args);
        let what = format!("{np} processes (tcp: {tcp}, devices {devices})");
        // The spec names one machine's devices: fewer than the processes are shared.
        assert_eq!(many.devices as usize, devices.split(',').count().max(np), "{what}");
        tandem::tolerance::assert_close(&format!("losses, {what}"), &many.losses, &one.losses, 1e-5, 1e-4);
        tandem::tolerance::assert_close(&format!("weights, {what}"), &many.weights, &one.weights, 1e-5, 1e-4);
    }
}

/// ZeRO-1, 2 and 3 over two processes' devices train as one plain process does: the
/// gradients reduce-scattered and the shards all-gathered across processes, clipping aside.
#[test]
fn sharded_data_parallelism_across_processes_trains_as_one() {
    let base = ["--devices", "cpu", "--steps", "6"];
    let one = train(alone, &base);
    for (np, devices) in [(2, "cpu"), (2, "cpu,cpu,cpu,cpu")] {
        for shard in ["optimizer", "grads", "full"] {
            let mut args = base.to_vec();
            args[1] = devices;
            args.extend(["--shard", shard]);
            let many = train(|a| mpirun(np, false, a), &args);
            let what = format!("--shard {shard}, {np} processes, devices {devices}");
            tandem::tolerance::assert_close(&format!("losses, {what}"), &many.losses, &one.losses, 1e-5, 1e-4);
            tandem::tolerance::assert_close(&format!("weights, {what}"), &many.weights, &one.weights, 1e-5, 1e-4);
        }
    }
    // Deterministic mode: ZeRO-2 and ZeRO-3 over 2 processes are one plain process bit for bit.
    // Over four devices (two a process) each computes one of the four micro-shards and ZeRO-3
    // all-gathers unit by unit across processes; over three, whose micro-shard counts differ,
    // it gathers the whole model before forward.
    let det = |devices| ["--devices", devices, "--steps", "6", "--deterministic"];
    let one = train(alone, &det("cpu"));
    for (shard, np, devices) in [("grads", 2, "cpu,cpu,cpu,cpu"), ("full", 2, "cpu,cpu,cpu,cpu"), ("full", 3, "cpu")] {
        let many = train(|a| mpirun(np, false, a), &[&det(devices)[..], &["--shard", shard]].concat());
        let what = format!("--shard {shard} --deterministic, {np} processes, devices {devices}");
        assert_eq!(many.bits, one.bits, "{what}: losses {:?} against {:?}", many.losses, one.losses);
        assert!(many.weights.iter().zip(&one.weights).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: the weights differ");
    }
}

/// Batch weights for every device of the job cut the whole batch unequally across processes
/// (3:1, as a planned job gives a slower process fewer samples), and still train as one
/// process does; so do ZeRO-2 and the same weights over four devices.
#[test]
fn unequal_shares_across_processes_train_as_one() {
    let base = ["--devices", "cpu", "--steps", "6"];
    let one = train(alone, &base);
    for (devices, split, shard) in [("cpu", "3,1", "none"), ("cpu", "3,1", "grads"), ("cpu,cpu,cpu,cpu", "1,2,3,4", "none")] {
        let args = ["--devices", devices, "--steps", "6", "--split", split, "--shard", shard];
        let many = train(|a| mpirun(2, false, a), &args);
        let what = format!("--split {split} --shard {shard}, 2 processes, devices {devices}");
        tandem::tolerance::assert_close(&format!("losses, {what}"), &many.losses, &one.losses, 1e-5, 1e-4);
        tandem::tolerance::assert_close(&format!("weights, {what}"), &many.weights, &one.weights, 1e-5, 1e-4);
    }
}

#[test]
fn two_processes_on_wgpu_train_as_one() {
    let Some(adapter) = tandem::Device::list().into_iter().find(|d| d.backend == tandem::BackendKind::Wgpu) else {
        eprintln!("skipping: no wgpu adapter (or the wgpu feature is off)");
        return;
    };
    eprintln!("wgpu:0 is {}", adapter.name);
    let args = ["--devices", "wgpu:0", "--steps", "10"];
    let one = train(alone, &args);
    let two = train(|a| mpirun(2, false, a), &args);
    assert_eq!(two.devices, 2);
    tandem::tolerance::assert_close("losses, 2 processes on wgpu:0", &two.losses, &one.losses, 1e-5, 1e-4);
    tandem::tolerance::assert_close("weights, 2 processes on wgpu:0", &two.weights, &one.weights, 1e-5, 1e-4);
}

#[test]
fn deterministic_mode_is_bit_identical_across_layouts() {
    let args = |devices| ["--devices", devices, "--steps", "10", "--deterministic"];
    let one = train(alone, &args("cpu"));
    let layouts = [
        ("1 process x 2 devices", train(alone, &args("cpu,cpu"))),
        ("2 processes x 1 device", train(|a| mpirun(2, false, a), &args("cpu"))),
        ("3 processes x 1 device over tcp", train(|a| mpirun(3, true, a), &args("cpu"))),
    ];
    for (what, run) in layouts {
        assert_eq!(run.bits, one.bits, "{what}: losses {:?} against {:?}", run.losses, one.losses);
        let same = run.weights.len() == one.weights.len() && run.weights.iter().zip(&one.weights).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: the final weights differ from 1 process x 1 device");
    }
}

/// Runs a 2-process job whose last rank meets `fault` at step 3, with collectives timing out
/// after `timeout_s`; it must end, failing, within 30 s, with `expect` in its output.
fn fault_ends_the_job(fault: &str, tcp: bool, timeout_s: &str, expect: &[&str]) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    example();
    let mut cmd = mpirun(2, tcp, &["--devices", "cpu", "--steps", "50", fault, "3"]);
    cmd.env("TANDEM_DIST_TIMEOUT_S", timeout_s);
    let job = run(cmd, Duration::from_secs(150));
    let output = format!("{}\n{}", job.stdout, job.stderr);
    assert!(!job.ok, "{fault}: the job exited with success:\n{output}");
    assert!(job.took < Duration::from_secs(30), "{fault}: the job took {:?} to end:\n{output}", job.took);
    for e in expect {
        assert!(output.contains(e), "{fault}: the output does not say {e:?}:\n{output}");
    }
}

#[test]
fn a_panicking_rank_ends_the_job() {
    // A timeout longer than the test's 30 s: the panic hook, not the timeout, must end the job.
    fault_ends_the_job("--panic-at", false, "120", &["rank 1 of 2 panicked", "injected panic"]);
}

#[test]
fn a_killed_rank_ends_the_job() {
    // Open MPI's mpirun sees the rank die and ends the others; its message names the rank.
    fault_ends_the_job("--kill-at", true, "120", &["rank 1"]);
}

#[test]
fn a_rank_that_stops_answering_times_out() {
    // Rank 0 waits in the next collective: the gradients' all-reduce, or the trainer's agreement
    // on stopping after the step.
    fault_ends_the_job("--hang-at", false, "5", &["rank 0 of 2: all_", "did not complete within the timeout (TANDEM_DIST_TIMEOUT_S = 5.0 s"]);
}

/// Each collective called with another length (or root, or kind) on each rank returns, on
/// every rank, an error naming the collective and every rank's length, and the group is still
/// in step afterwards: no rank reads past a buffer, crashes or waits for the timeout.
#[test]
fn collectives_that_disagree_are_an_error_on_every_rank() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    example();
    for np in [2, 3] {
        let mut cmd = mpirun(np, false, &["--mismatched-collectives"]);
        cmd.env("TANDEM_DIST_TIMEOUT_S", "20");
        let job = run(cmd, Duration::from_secs(45));
        let output = format!("{}\n{}", job.stdout, job.stderr);
        jobs::assert_no_memory_fault(&output);
        assert!(job.ok, "{np} processes: the job failed:\n{output}");
        let lines: Vec<serde_json::Value> = job.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        for rank in 0..np as u64 {
            let mine: Vec<&serde_json::Value> = lines.iter().filter(|l| l["rank"] == rank).collect();
            let error = |case: &str| -> String {
                let line = mine.iter().find(|l| l["case"] == case).unwrap_or_else(|| panic!("rank {rank} printed no {case:?} line:\n{output}"));
                line["error"].as_str().unwrap_or_else(|| panic!("rank {rank}: {case} succeeded:\n{output}")).to_string()
            };
            let e = error("broadcast");
            let lengths: Vec<String> = (0..np).map(|r| format!("broadcast of {} f32 values", 3 + r)).collect();
            assert!(e.contains("Group::broadcast") && lengths.iter().all(|l| e.contains(l.as_str())), "rank {rank}: {e}");
            assert!(e.contains(if np == 2 { "rank 1 differs from rank 0" } else { "ranks 1, 2 differ from rank 0" }), "rank {rank}: {e}");
            assert!(error("broadcast root").contains("from rank 1"), "rank {rank}");
            assert!(error("all_reduce").contains("rank 1 all_reduce of 4 f32 values"), "rank {rank}");
            assert!(error("all_reduce ranks").contains("in rank order"), "rank {rank}");
            assert!(error("all_reduce_into").contains("Group::all_reduce_into"), "rank {rank}");
            assert!(error("broadcast_bytes").contains("broadcast of 101 f32 values"), "rank {rank}");
            assert!(error("kind").contains("rank 0 broadcast of 4 f32 values from rank 0"), "rank {rank}");
            assert!(error("gather type").contains("all_gather of 1 u64 values"), "rank {rank}");
            assert!(error("barrier").contains("rank 0 barrier"), "rank {rank}");
            assert!(error("hierarchical all_reduce").contains("all_reduce of 3 f32 values"), "rank {rank}");
            let after = mine.iter().find(|l| l.get("after").is_some()).unwrap_or_else(|| panic!("rank {rank} did not finish:\n{output}"));
            assert_eq!(after["after"], serde_json::json!(vec![np as f64; 4]), "rank {rank}: the group is out of step after the errors");
        }
    }
}
