//! scripts/gpu-check.sh without a GPU: it stops at once, saying why, where `xz` is missing
//! (packing with --rehearse, unpacking on the GPU machine), and a failing test suite runs once
//! more with `CUDA_LAUNCH_BLOCKING=1` and one test thread, both rows in its table. Each case runs
//! a copy of the script in a scratch repository, whose packed binaries are shell scripts.
#![cfg(unix)]
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-gpu-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("repo/scripts")).unwrap();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check.sh"), d.join("repo/scripts/gpu-check.sh")).unwrap();
    d
}

fn executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A folder whose only programs are `bash` and `dirname`: no `xz`.
fn without_xz(dir: &Path) -> PathBuf {
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    for tool in ["bash", "dirname"] {
        let found = ["/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(tool)).find(|p| p.is_file());
        std::os::unix::fs::symlink(found.unwrap_or_else(|| panic!("no {tool}")), tools.join(tool)).unwrap();
    }
    tools
}

fn run(dir: &Path, args: &[&str], path: &Path) -> (Output, String) {
    let out = Command::new(path.join("bash"))
        .arg(dir.join("repo/scripts/gpu-check.sh"))
        .args(args)
        .env("PATH", path)
        .env("TMPDIR", dir)
        .output()
        .expect("bash runs the script");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

#[test]
fn without_xz_the_rehearsal_stops_before_building_and_says_why() {
    let dir = scratch("rehearse");
    let (out, text) = run(&dir, &["--rehearse"], &without_xz(&dir));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("xz is not installed here") && text.contains("xz-utils"), "{text}");
    assert!(!text.contains("building"), "it started the build: {text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_xz_the_run_stops_before_unpacking_and_says_why() {
    let dir = scratch("unpack");
    std::fs::create_dir_all(dir.join("repo/.gpu")).unwrap();
    std::fs::write(dir.join("repo/.gpu/bin.tar.xz"), b"packed elsewhere").unwrap();
    let (out, text) = run(&dir, &[], &without_xz(&dir));
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("xz is not installed on this machine") && text.contains(".gpu/bin.tar.xz") && text.contains(".gpu/bin instead"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The packed binaries are scripts that note each call: cuda_smoke fails unless launches
/// block, halves fails whatever; every other suite passes. No nvidia-smi lists a GPU, no
/// python3 answers and `tandem devices` shows no CUDA device.
#[test]
fn a_failing_suite_runs_again_with_blocking_launches_and_one_thread() {
    let dir = scratch("rerun");
    let bin = dir.join("repo/.gpu/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(dir.join("repo/.gpu/MANIFEST"), "commit fake\n").unwrap();
    let calls = dir.join("calls");
    let fake = r#"#!/bin/sh
name=$(basename "$0")
echo "$name CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING:-} $*" >>"$GPU_CHECK_TEST_CALLS"
case $name in
  cuda_smoke) [ "${CUDA_LAUNCH_BLOCKING:-}" = 1 ] || { echo "CUDA_ERROR_ILLEGAL_ADDRESS"; exit 101; } ;;
  halves) echo "a wrong bit"; exit 101 ;;
esac
exit 0
"#;
    let suites = "halves half_ops fused transformer_kernels tensor_ops long_axes gather batched_matmul losses layers memory_budget gpt optim";
    for name in ["nvrtc", "cuda_smoke", "conformance", "tandem", "nccl", "precision", "builder_precision"].into_iter().chain(suites.split(' ')) {
        executable(&bin.join(name), fake);
    }
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    for tool in ["nvidia-smi", "python3"] {
        executable(&tools.join(tool), "#!/bin/sh\nexit 1\n");
    }
    let out = Command::new("bash")
        .arg(dir.join("repo/scripts/gpu-check.sh"))
        .env("PATH", format!("{}:/usr/bin:/bin", tools.display()))
        .env("TMPDIR", &dir)
        .env("GPU_CHECK_TEST_CALLS", &calls)
        .env_remove("TANDEM_TEST_DEVICES")
        .output()
        .expect("bash runs the script");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "a required suite failed:\n{text}");
    let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("STEP ")).collect();
    let row = |name: &str| table.iter().find(|l| l.split_whitespace().next() == Some(name)).map(|l| l.to_string());
    let rerun = "re-run of cuda-smoke with CUDA_LAUNCH_BLOCKING=1 --test-threads 1";
    assert!(row("cuda-smoke").is_some_and(|r| r.contains(" FAIL ") && r.contains("exit 101")), "{text}");
    assert!(row("cuda-smoke-blocking").is_some_and(|r| r.contains(" PASS ") && r.contains(rerun)), "{text}");
    assert!(row("cuda-halves").is_some_and(|r| r.contains(" FAIL ")), "{text}");
    assert!(row("cuda-halves-blocking").is_some_and(|r| r.contains(" FAIL ") && r.contains("re-run of cuda-halves")), "{text}");
    assert!(row("nvrtc").is_some_and(|r| r.contains(" PASS ")) && row("nvrtc-blocking").is_none(), "a passing suite ran again:\n{text}");
    assert!(row("cuda-optim").is_some_and(|r| r.contains(" PASS ")), "offload's suite on cuda:0:\n{text}");
    for suite in ["precision", "builder_precision"] {
        assert!(row(&format!("cuda-{suite}")).is_some_and(|r| r.contains(" SKIP ") && r.contains("no cuda:0")), "{text}");
    }
    // The re-run takes the suite's own arguments, its thread count replaced by one.
    let calls = std::fs::read_to_string(&calls).unwrap();
    let runs = |name: &str| calls.lines().filter(|l| l.split_whitespace().next() == Some(name)).map(str::to_string).collect::<Vec<_>>();
    let halves = ["halves CUDA_LAUNCH_BLOCKING= --test-threads 4 --nocapture", "halves CUDA_LAUNCH_BLOCKING=1 --nocapture --test-threads 1"];
    assert_eq!(runs("halves"), halves);
    let smoke = ["cuda_smoke CUDA_LAUNCH_BLOCKING= --nocapture", "cuda_smoke CUDA_LAUNCH_BLOCKING=1 --nocapture --test-threads 1"];
    assert_eq!(runs("cuda_smoke"), smoke);
    assert_eq!(runs("nvrtc").len(), 1, "{calls}");
    std::fs::remove_dir_all(&dir).unwrap();
}
