//! Whole jobs for the multi-process tests: a binary alone or under `mpirun`, its output in
//! files (a pipe could fill while mpirun waits), ended after a time limit so nothing hangs.
// Each test file that includes this uses part of it.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One job at a time: the ranks of two jobs would share the machine's cores, and the fault
/// tests time them.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// What a job printed, how it ended and how long it took.
pub struct Job {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

/// A fresh path under the temporary directory, named for the test process and `what`.
pub fn scratch(what: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!("tandem-job-{}-{what}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// Runs `cmd` to completion, or fails the test after `limit` (SIGTERM first: mpirun forwards
/// it to its ranks, which SIGKILL would orphan).
pub fn run(mut cmd: Command, limit: Duration) -> Job {
    let dir = scratch("job");
    std::fs::create_dir_all(&dir).unwrap();
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    cmd.stdin(Stdio::null()).stdout(std::fs::File::create(&out).unwrap()).stderr(std::fs::File::create(&err).unwrap());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("the job starts (is Open MPI's mpirun installed?)");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not end within {limit:?}; stderr:\n{}", std::fs::read_to_string(&err).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let job = Job {
        ok: status.success(),
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr: std::fs::read_to_string(&err).unwrap(),
        took: start.elapsed(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    job
}

/// `mpirun -np N EXE` (`tcp`: over TCP instead of shared memory, as across machines); the
/// caller adds the arguments.
pub fn mpirun(np: usize, tcp: bool, exe: &Path) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()]);
    if tcp {
        cmd.args(["--mca", "btl", "tcp,self"]);
    }
    cmd.arg(exe);
    cmd
}

/// `mpirun -np 1 EXE ARGS : -np 1 EXE ARGS …` (MPMD): one rank per entry of `ranks`, each run
/// in its own working directory with its own arguments, as ranks on machines set up apart.
pub fn mpmd(exe: &Path, ranks: &[(&Path, Vec<String>)]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe"]);
    for (i, (dir, args)) in ranks.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", "1", "-wdir"]).arg(dir).arg(exe).args(args);
    }
    cmd
}

/// Fails the test when a job's output shows a heap corruption or a crash: glibc's malloc
/// checks, or a rank ended by a signal (an abort is signal 6).
pub fn assert_no_memory_fault(output: &str) {
    for sign in ["malloc", "corrupted", "double free", "signal 6", "Signal: Aborted", "Segmentation fault", "signal 11"] {
        assert!(!output.contains(sign), "the job's output says {sign:?}:\n{output}");
    }
}

/// `examples/NAME` built once per test process with this test's features and profile, so the
/// library is not built a second time.
pub fn example(name: &str) -> PathBuf {
    let features: Vec<&str> = [
        ("wgpu", cfg!(feature = "wgpu")),
        ("cli", cfg!(feature = "cli")),
        ("cuda", cfg!(feature = "cuda")),
        ("nccl", cfg!(feature = "nccl")),
        ("mpi", true),
    ]
    .iter()
    .filter(|f| f.1)
    .map(|f| f.0)
    .collect();
    let profile_dir = std::env::current_exe().unwrap().parent().and_then(Path::parent).unwrap().to_path_buf();
    let status = Command::new(env!("CARGO"))
        .args(["build", "--example", name, "--no-default-features", "--features", &features.join(",")])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .args(["--profile", if profile_dir.ends_with("release") { "release" } else { "test" }])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building examples/{name} failed");
    profile_dir.join("examples").join(name)
}
