//! The CUDA libraries are found under the versioned names CUDA 13 and NCCL ship
//! (`libnvrtc.so.13`, `libcublas.so.13`, `libnccl.so.2`), which cudarc alone never tries, a
//! failed search names every file and directory it tried, and the lowest compute capability
//! among the devices (a fake driver's) chooses between CUDA 12's libraries and CUDA 13's. Each
//! case runs in a child process (the search runs once per process) with a fake library folder
//! on `TANDEM_CUDA_LIBS` and no other place to look.
#![cfg(feature = "cuda")]
use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD: &str = "TANDEM_CUDA_LIBS_CHILD";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-cuda-libs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The NVRTC 12 library of the test environment (`LD_LIBRARY_PATH`), if there is one.
fn real_nvrtc() -> Option<PathBuf> {
    let paths = std::env::var_os("LD_LIBRARY_PATH")?;
    std::env::split_paths(&paths).map(|d| d.join("libnvrtc.so.12")).find(|p| p.is_file())
}

/// Runs test `name` of this binary in a child whose only library folder is `libs`.
fn in_child(name: &str, libs: &Path) -> String {
    in_child_with(name, libs, &[])
}

/// `in_child` with the environment variables `vars` set too (`LD_LIBRARY_PATH` among them
/// is the only folder the driver is looked for in).
fn in_child_with(name: &str, libs: &Path, vars: &[(&str, &Path)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("TANDEM_CUDA_LIBS", libs)
        .env("HOME", libs)
        .env("PATH", "/usr/bin:/bin")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX")
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH")
        .env_remove("CUDA_ROOT")
        .envs(vars.iter().copied())
        .output()
        .expect("run the child test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child {name} failed:\n{text}");
    text
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

#[test]
fn nvrtc_13_name_is_found_in_a_folder_of_its_own() {
    if is_child() {
        let file = tandem::backend::cuda::library_file("nvrtc").expect("libnvrtc.so.13 in TANDEM_CUDA_LIBS");
        let (major, _) = tandem::backend::cuda::nvrtc_version().expect("NVRTC answers through cudarc");
        // The fake libnvrtc.so.13 is NVRTC 12 under CUDA 13's name.
        assert_eq!(major, 12, "{}", file.display());
        let lines = tandem::backend::cuda::compile_check("compute_52").expect("kernels compile through the library found");
        println!("loaded {}: {}", file.display(), lines.len());
        return;
    }
    let Some(real) = real_nvrtc() else {
        eprintln!("skipped: no libnvrtc.so.12 on LD_LIBRARY_PATH to stand in for libnvrtc.so.13");
        return;
    };
    let dir = scratch("nvrtc13");
    std::os::unix::fs::symlink(&real, dir.join("libnvrtc.so.13")).unwrap();
    let text = in_child("nvrtc_13_name_is_found_in_a_folder_of_its_own", &dir);
    assert!(text.contains("loaded "), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_library_names_every_file_and_folder_tried() {
    if is_child() {
        let dir = PathBuf::from(std::env::var_os("TANDEM_CUDA_LIBS").unwrap());
        let err = tandem::backend::cuda::nvrtc_version().expect_err("no NVRTC anywhere").to_string();
        for part in ["libnvrtc.so.13", "libnvrtc.so.12", &dir.display().to_string(), "/usr/local/cuda/lib64", "TANDEM_CUDA_LIBS"] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        let err = tandem::backend::cuda::library_file("cublas").expect_err("no cuBLAS").to_string();
        assert!(err.contains("libcublas.so.13") && err.contains("libcublas.so.12"), "{err}");
        println!("error named everything");
        return;
    }
    let dir = scratch("empty");
    let text = in_child("a_missing_library_names_every_file_and_folder_tried", &dir);
    assert!(text.contains("error named everything"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Files under the names only (not libraries): the search finds them, and the error says why
/// each found file did not load.
#[test]
fn cublas_13_and_nccl_2_names_are_found() {
    if is_child() {
        let dir = PathBuf::from(std::env::var_os("TANDEM_CUDA_LIBS").unwrap());
        let dir = std::fs::canonicalize(dir).unwrap();
        let err = tandem::backend::cuda::library_file("cublas").expect_err("a dummy file does not load").to_string();
        assert!(err.contains(&dir.join("libcublas.so.13").display().to_string()), "{err}");
        #[cfg(feature = "nccl")]
        {
            let err = tandem::backend::cuda::library_file("nccl").expect_err("a dummy file does not load").to_string();
            assert!(err.contains(&dir.join("libnccl.so.2").display().to_string()), "{err}");
        }
        println!("found by name");
        return;
    }
    let dir = scratch("dummies");
    for name in ["libcublas.so.13", "libnccl.so.2"] {
        std::fs::write(dir.join(name), b"not a library").unwrap();
    }
    let text = in_child("cublas_13_and_nccl_2_names_are_found", &dir);
    assert!(text.contains("found by name"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With `TANDEM_TEST_CUDA13_LIBS` naming folders (`:`-separated) of CUDA 13's own files (the
/// `nvidia-cuda-nvrtc` and `nvidia-cublas` wheels' `nvidia/cu13/lib`), NVRTC 13 and cuBLAS 13
/// load from them under their own names, whose sonames cudarc never asks for, and so does
/// `libnccl.so.2` when one of the folders holds it (`nvidia-nccl-cu12`'s `nvidia/nccl/lib`);
/// skipped without it.
#[test]
fn cuda_13_wheels_load_when_given() {
    if is_child() {
        let (major, minor) = tandem::backend::cuda::nvrtc_version().expect("NVRTC 13 loads");
        assert_eq!(major, 13);
        let lines = tandem::backend::cuda::compile_check("compute_90").expect("the kernels compile with NVRTC 13");
        let blas = tandem::backend::cuda::cublas_version().expect("cuBLAS 13 loads with its libcublasLt");
        assert!(blas.starts_with("cuBLAS 13.") && blas.contains("libcublas.so.13"), "{blas}");
        #[cfg(feature = "nccl")]
        let blas = match tandem::backend::cuda::library_file("nccl") {
            Ok(_) => format!("{blas}; NCCL {}", tandem::parallel::comm::nccl::probe().expect("NCCL answers through cudarc")),
            Err(_) => blas,
        };
        println!("NVRTC {major}.{minor}, {} families; {blas}", lines.len());
        return;
    }
    let Some(dir) = std::env::var_os("TANDEM_TEST_CUDA13_LIBS") else {
        eprintln!("skipped: TANDEM_TEST_CUDA13_LIBS names no folder of CUDA 13 libraries");
        return;
    };
    let text = in_child("cuda_13_wheels_load_when_given", Path::new(&dir));
    println!("{}", text.lines().find(|l| l.starts_with("NVRTC")).unwrap_or(&text));
}

/// A fake driver that reports one GPU and answers the device queries, and nothing more.
const FAKE_DRIVER: &str = r#"
#include <string.h>
#include <stddef.h>
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *v) { *v = DRIVER; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int d) { (void)d; strncpy(name, "Tandem Fake GPU", (size_t)len); return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)1 << 30; return 0; }
/* 75 and 76: the compute capability's major and minor number. */
int cuDeviceGetAttribute(int *v, int attr, int d) { (void)d; *v = attr == 75 ? CC_MAJOR : attr == 76 ? CC_MINOR : 8; return 0; }
"#;

/// `FAKE_DRIVER` of CUDA version `driver` (`cuDriverGetVersion`'s 13000 for 13.0) whose GPU has
/// compute capability `cc`, as `dir/libcuda.so.1` and `dir/libcuda.so`; `false` without a C
/// compiler.
fn fake_driver(dir: &Path, cc: (u32, u32), driver: u32) -> bool {
    let source = format!("#define DRIVER {driver}\n#define CC_MAJOR {}\n#define CC_MINOR {}\n{FAKE_DRIVER}", cc.0, cc.1);
    if !shared_library(dir, "libcuda.so.1", &source) {
        return false;
    }
    std::fs::copy(dir.join("libcuda.so.1"), dir.join("libcuda.so")).unwrap();
    true
}

/// Compiles `source` into the shared library `dir/name` (soname `name`); `false` without a C
/// compiler.
fn shared_library(dir: &Path, name: &str, source: &str) -> bool {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let built = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(dir.join(name)).arg(&c).arg(format!("-Wl,-soname,{name}")).output();
    match built {
        Ok(out) if out.status.success() => true,
        Ok(out) => panic!("cc failed on {name}: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => {
            eprintln!("skipped: no C compiler to build a fake {name}: {e}");
            false
        }
    }
}

/// `tandem devices` beside a GPU whose cuBLAS and NVRTC are damaged (files under the right
/// names that lack the entry points tandem calls), so that it cannot be opened: the table
/// still lists the CPU, wgpu and the CUDA device, each CUDA library with the reason it is not
/// used, a line says why `--devices auto` fails, the command succeeds, and no panic is printed.
#[cfg(feature = "cli")]
#[test]
fn devices_lists_everything_beside_broken_cuda_libraries_without_a_panic() {
    if is_child() {
        return;
    }
    let dir = scratch("broken");
    let empty = "int tandem_fake_library_marker(void) { return 0; }\n";
    let nvrtc_version_only = "int nvrtcVersion(int *major, int *minor) { *major = 12; *minor = 8; return 0; }\n";
    if !fake_driver(&dir, (8, 8), 12080) {
        return;
    }
    assert!(shared_library(&dir, "libcublas.so.12", empty) && shared_library(&dir, "libcublasLt.so.12", empty));
    assert!(shared_library(&dir, "libnvrtc.so.12", nvrtc_version_only));
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("devices")
        .env("LD_LIBRARY_PATH", &dir)
        .env("TANDEM_CUDA_LIBS", &dir)
        .env("HOME", &dir)
        .env("PATH", "/usr/bin:/bin")
        .env("TANDEM_CACHE_DIR", dir.join("cache"))
        .env("RUST_BACKTRACE", "1")
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX")
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH")
        .env_remove("CUDA_ROOT")
        .env_remove("TANDEM_BACKENDS")
        .output()
        .expect("tandem runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let both = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{both}");
    assert!(!stderr.contains("panicked") && !stderr.contains("Missing symbol") && !stderr.contains("backtrace"), "{both}");
    let row = |start: &str| stdout.lines().find(|l| l.trim_start_matches('*').trim_start().starts_with(start)).map(str::to_string);
    assert!(row("cpu").is_some(), "no CPU row:\n{both}");
    assert!(stdout.contains("wgpu"), "no word of wgpu:\n{both}");
    let cuda = row("cuda:0").unwrap_or_else(|| panic!("no CUDA row:\n{both}"));
    assert!(cuda.contains("Tandem Fake GPU"), "{cuda}");
    assert!(cuda.contains("not cuBLAS") && cuda.contains("cublasCreate_v2"), "the MATMUL column names what cuBLAS lacks: {cuda}");
    assert!(cuda.contains("no NVRTC") && cuda.contains("nvrtcCreateProgram"), "the LIBRARIES column names what NVRTC lacks: {cuda}");
    // Opening the device needs NVRTC; auto picks the CUDA device and says why it cannot.
    let auto = stdout.lines().find(|l| l.starts_with("--devices auto fails here:")).unwrap_or_else(|| panic!("no word of auto:\n{both}"));
    assert!(auto.contains("nvrtcCreateProgram"), "{auto}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The entry points tandem needs of NVRTC and cuBLAS (src/backend/cuda/libs.rs), as functions
/// that do nothing: a library that has them all is taken.
const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
];
const CUBLAS_SYMBOLS: &[&str] = &["cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSgemmStridedBatched", "cublasGetProperty"];

/// Fake NVRTC and cuBLAS (with its libcublasLt) of each CUDA major version of `majors` in `dir`.
fn fake_cuda_libraries(dir: &Path, majors: &[u32]) {
    let functions = |names: &[&str]| names.iter().map(|n| format!("int {n}(void) {{ return 0; }}\n")).collect::<String>();
    for major in majors {
        assert!(shared_library(dir, &format!("libnvrtc.so.{major}"), &functions(NVRTC_SYMBOLS)));
        assert!(shared_library(dir, &format!("libcublas.so.{major}"), &functions(CUBLAS_SYMBOLS)));
        assert!(shared_library(dir, &format!("libcublasLt.so.{major}"), "int cublasLtCreate(void) { return 0; }\n"));
    }
}

/// In a child: NVRTC and cuBLAS load from the files of the CUDA major version in
/// `TANDEM_TEST_WANT`, or, when it says `none`, each fails naming the device's capability and
/// the CUDA 12 files and wheels to install.
#[test]
fn libraries_of_the_wanted_cuda_version_load() {
    if !is_child() {
        return;
    }
    let want = std::env::var("TANDEM_TEST_WANT").unwrap();
    for (name, wheel) in [("nvrtc", "nvidia-cuda-nvrtc-cu12"), ("cublas", "nvidia-cublas-cu12")] {
        let loaded = tandem::backend::cuda::library_file(name);
        if want == "none" {
            let err = loaded.expect_err("no CUDA 12 library to load").to_string();
            let (newer, older) = (format!("lib{name}.so.13"), format!("lib{name}.so.12"));
            for part in ["cuda:0 (Tandem Fake GPU)", "compute capability 5.2", "below the 7.5 CUDA 13 supports", &newer, &older, wheel] {
                assert!(err.contains(part), "{part:?} missing from: {err}");
            }
            println!("{name}: {err}");
        } else {
            let file = loaded.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(file.file_name().unwrap().to_string_lossy(), format!("lib{name}.so.{want}"), "{name}: {}", file.display());
            println!("{name}: loaded {}", file.display());
        }
    }
}

/// A Tesla M60 (compute capability 5.2) under a CUDA 13 driver beside CUDA 13's and CUDA 12's
/// libraries gets CUDA 12's (CUDA 13's NVRTC cannot compile for it, its cuBLAS has no Maxwell
/// kernels); an H100 (9.0) under the same driver gets CUDA 13's.
#[test]
fn the_lowest_compute_capability_chooses_the_cuda_libraries() {
    if is_child() {
        return;
    }
    for (cc, want) in [((5, 2), "12"), ((9, 0), "13")] {
        let dir = scratch(&format!("cc{}{}", cc.0, cc.1));
        if !fake_driver(&dir, cc, 13000) {
            return;
        }
        fake_cuda_libraries(&dir, &[13, 12]);
        let vars = [("LD_LIBRARY_PATH", dir.as_path()), ("TANDEM_TEST_WANT", Path::new(want))];
        let text = in_child_with("libraries_of_the_wanted_cuda_version_load", &dir, &vars);
        let nvrtc = std::fs::canonicalize(&dir).unwrap().join(format!("libnvrtc.so.{want}"));
        assert!(text.contains(&format!("nvrtc: loaded {}", nvrtc.display())), "{cc:?}: {text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A Tesla M60 with only CUDA 13's libraries: the error names the device, its capability,
/// the files passed over and the CUDA 12 ones to install, and `tandem devices` shows it.
#[test]
fn a_maxwell_gpu_beside_only_cuda_13_libraries_is_told_what_to_install() {
    if is_child() {
        return;
    }
    let dir = scratch("maxwell13");
    if !fake_driver(&dir, (5, 2), 13000) {
        return;
    }
    fake_cuda_libraries(&dir, &[13]);
    let vars = [("LD_LIBRARY_PATH", dir.as_path()), ("TANDEM_TEST_WANT", Path::new("none"))];
    let text = in_child_with("libraries_of_the_wanted_cuda_version_load", &dir, &vars);
    assert!(text.contains("nvrtc: ") && text.contains("cublas: "), "{text}");
    #[cfg(feature = "cli")]
    {
        let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
            .arg("devices")
            .env("LD_LIBRARY_PATH", &dir)
            .env("TANDEM_CUDA_LIBS", &dir)
            .env("HOME", &dir)
            .env("PATH", "/usr/bin:/bin")
            .env("TANDEM_CACHE_DIR", dir.join("cache"))
            .env_remove("VIRTUAL_ENV")
            .env_remove("CONDA_PREFIX")
            .env_remove("CUDA_HOME")
            .env_remove("CUDA_PATH")
            .env_remove("CUDA_ROOT")
            .env_remove("TANDEM_BACKENDS")
            .output()
            .expect("tandem runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && !stderr.contains("panicked"), "stdout:\n{stdout}\nstderr:\n{stderr}");
        let row = stdout.lines().find(|l| l.contains("cuda:0")).unwrap_or_else(|| panic!("no CUDA row:\n{stdout}"));
        for part in ["no NVRTC", "compute capability 5.2", "nvidia-cuda-nvrtc-cu12", "nvidia-cublas-cu12"] {
            assert!(row.contains(part), "{part:?} missing from the cuda:0 row: {row}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
