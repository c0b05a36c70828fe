//! Shared test helpers: the devices every conformance test runs on, seeded inputs, and the one
//! tolerance check.
#![allow(dead_code)]
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem::backend::{Buffer, MatmulSpec, OptimStep};
use tandem::{BackendKind, DType, Device, Layout, Result};

/// Every device except the CPU reference, opened fresh; prints each skipped backend and why.
/// `TANDEM_BACKENDS` (see `Device::list`) limits them. With `CI=true`, finding no wgpu adapter
/// while the `wgpu` feature is on and not filtered out fails the test.
pub fn devices_under_test() -> Vec<Device> {
    let mut out = Vec::new();
    for info in Device::list() {
        if info.backend == BackendKind::Cpu {
            continue;
        }
        match Device::open(info.backend, info.ordinal) {
            Ok(d) => out.push(d),
            Err(e) => eprintln!("skipping {}:{} ({}): {e}", info.backend.name(), info.ordinal, info.name),
        }
    }
    if !cfg!(feature = "cuda") {
        eprintln!("skipping cuda: the `cuda` feature is off");
    } else if !out.iter().any(|d| d.info().backend == BackendKind::Cuda) {
        eprintln!("skipping cuda: no CUDA device found");
    }
    if std::env::var("TANDEM_WGPU_KERNELS").is_ok_and(|v| v == "hardware") {
        eprintln!("wgpu adapters run the hardware GPU kernels (TANDEM_WGPU_KERNELS=hardware)");
    }
    let filter = std::env::var(tandem::BACKENDS_ENV).unwrap_or_default();
    if !cfg!(feature = "wgpu") {
        eprintln!("skipping wgpu: the `wgpu` feature is off");
    } else if !filter.trim().is_empty() && !filter.split(',').any(|b| b.trim() == "wgpu") {
        eprintln!("skipping wgpu: {}={filter}", tandem::BACKENDS_ENV);
    } else if !out.iter().any(|d| d.info().backend == BackendKind::Wgpu) {
        let ci = std::env::var("CI").map(|v| v == "true").unwrap_or(false);
        assert!(!ci, "CI=true but no wgpu adapter was found (is a Vulkan/GL driver such as lavapipe installed?)");
        eprintln!("skipping wgpu: no adapter found");
    }
    out
}

/// Tests share adapters; a test moving hundreds of megabytes takes this exclusively so that
/// the others do not wait on it (wgpu's GL backend gives up on a context held for seconds).
pub static HEAVY: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    HEAVY.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    HEAVY.write().unwrap_or_else(|e| e.into_inner())
}

/// Runs `check(device, cpu)` on every device under test, the CPU reference beside it. Every
/// device runs even when one fails; the test then panics naming each failing device and why.
/// The one way a suite reaches the devices: a new backend listed by `Device::list` is under
/// every suite without a change here.
pub fn on_each_device(check: impl Fn(&Device, &Device) -> tandem::Result<()>) {
    let cpu = Device::cpu();
    run_each(devices_under_test(), |dev| check(dev, &cpu));
}

/// Runs `check(device)` on the CPU reference and then on every device under test, as
/// [`on_each_device`] does: for suites comparing every device, the reference included, with an
/// outside reference such as PyTorch's.
pub fn on_every_device(check: impl Fn(&Device) -> tandem::Result<()>) {
    run_each(every_device(), check);
}

/// The CPU reference and then every device under test, for a test that needs them all at once.
pub fn every_device() -> Vec<Device> {
    std::iter::once(Device::cpu()).chain(devices_under_test()).collect()
}

/// Runs `check` on each of `devices` under the shared adapter lock, catching errors and panics,
/// and panics listing the devices that failed.
fn run_each(devices: Vec<Device>, check: impl Fn(&Device) -> tandem::Result<()>) {
    let _guard = shared();
    let mut failures = Vec::new();
    for dev in devices {
        let name = format!("{dev} ({})", dev.info().name);
        eprintln!("running on {name}");
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&dev))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("on {name}: {e}")),
            Err(panic) => {
                let msg = panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied());
                failures.push(format!("on {name}: panicked: {}", msg.unwrap_or("(no message)")));
            }
        }
    }
    assert!(failures.is_empty(), "{} device(s) failed:\n{}", failures.len(), failures.join("\n"));
}

/// Passes when `|got - want| <= atol + rtol * |want|` everywhere (NaN matches NaN); otherwise
/// panics naming the op and the worst element.
/// The library's one tolerance rule (`|a-b| <= atol + rtol*|ref|`), panicking on failure.
#[track_caller]
pub fn assert_close(op: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    tandem::tolerance::assert_close(op, got, want, atol, rtol)
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn uniform(r: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(lo..hi)).collect()
}

pub fn up(dev: &Device, v: &[f32]) -> Buffer {
    dev.backend().upload(bytemuck::cast_slice(v), DType::F32).expect("upload")
}

pub fn up_i32(dev: &Device, v: &[i32]) -> Buffer {
    dev.backend().upload(bytemuck::cast_slice(v), DType::I32).expect("upload")
}

pub fn down(dev: &Device, b: &Buffer) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&dev.backend().download(b).expect("download"))
}

pub fn down_i32(dev: &Device, b: &Buffer) -> Vec<i32> {
    bytemuck::pod_collect_to_vec(&dev.backend().download(b).expect("download"))
}

/// The CPU reference, then the first two wgpu adapters (here lavapipe Vulkan and llvmpipe GL):
/// devices of different backends for the parallel strategies. `None`, with the reason printed,
/// when they are not there, except with `CI=true`, where that fails the test.
pub fn mixed_devices() -> Option<Vec<Device>> {
    let wgpu: Vec<_> = Device::list().into_iter().filter(|i| i.backend == BackendKind::Wgpu).collect();
    if wgpu.len() < 2 {
        let ci = std::env::var("CI").map(|v| v == "true").unwrap_or(false);
        assert!(!ci, "CI=true but fewer than two wgpu adapters were found (lavapipe Vulkan and llvmpipe GL expected)");
        eprintln!("skipping mixed-device test: {} wgpu adapter(s) found, 2 needed", wgpu.len());
        return None;
    }
    let mut out = vec![Device::cpu()];
    for info in &wgpu[..2] {
        out.push(Device::open(info.backend, info.ordinal).expect("listed adapter opens"));
    }
    Some(out)
}

/// `n` fresh logical devices of each family under test, named: independent CPU reference
/// devices, then, for each other backend among [`devices_under_test`], its first device opened
/// `n` times.
pub fn device_families(n: usize) -> Vec<(String, Vec<Device>)> {
    let mut out = vec![("cpu".to_string(), cpu_devices(n))];
    let mut seen = vec![BackendKind::Cpu];
    for dev in devices_under_test() {
        let info = dev.info().clone();
        if seen.contains(&info.backend) {
            continue;
        }
        seen.push(info.backend);
        let mut devs = vec![dev.clone()];
        devs.extend((1..n).map(|_| Device::open(info.backend, info.ordinal).expect("a device under test opens again")));
        out.push((format!("{}:{}", info.backend.name(), info.ordinal), devs));
    }
    out
}

/// `n` independent CPU reference devices.
pub fn cpu_devices(n: usize) -> Vec<Device> {
    (0..n).map(|_| Device::from_backend(std::sync::Arc::new(tandem::backend::cpu::CpuBackend::new()))).collect()
}

/// Distinct values for rank `r` of a collective: `len` entries.
pub fn rank_values(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (r as f32 + 1.0) * 0.5 + i as f32 * 0.25 - (i % 3) as f32).collect()
}

/// One tensor of `shape` on each device, rank `r`'s holding [`rank_values`] of `r`.
pub fn rank_tensors(devices: &[Device], shape: &[usize]) -> Vec<tandem::Tensor> {
    let len = shape.iter().product();
    devices.iter().enumerate().map(|(r, d)| tandem::Tensor::from_vec(rank_values(r, len), shape.to_vec(), d).unwrap()).collect()
}

/// `n` devices for a parallel strategy: independent CPU reference devices, or the devices of
/// `TANDEM_TEST_DEVICES` (such as `cpu,wgpu:0,wgpu:1`) cycled to `n`.
pub fn cycled_devices(n: usize) -> Vec<Device> {
    match std::env::var("TANDEM_TEST_DEVICES") {
        Ok(spec) => {
            let list = Device::parse(&spec).expect("TANDEM_TEST_DEVICES names devices");
            (0..n).map(|i| list[i % list.len()].clone()).collect()
        }
        Err(_) => cpu_devices(n),
    }
}

/// `steps` batches of `n` synthetic seed images drawn with `seed`.
pub fn seed_image_batches(n: usize, steps: usize, seed: u64) -> Vec<tandem::data::Batch> {
    let ds = tandem::data::synthetic::seed_images(n * steps, seed).unwrap();
    (0..steps).map(|s| ds.batch(&(s * n..(s + 1) * n).collect::<Vec<_>>()).unwrap()).collect()
}

pub fn layout(shape: &[usize], strides: &[usize], offset: usize) -> Layout {
    Layout { shape: shape.to_vec(), strides: strides.to_vec(), offset }
}

/// Runs `f` on `dev` and on the CPU with the same host inputs and compares the f32 outputs.
pub fn same_f32(dev: &Device, cpu: &Device, op: &str, atol: f32, rtol: f32, f: impl Fn(&Device) -> Result<Vec<f32>>) -> Result<()> {
    let (got, want) = (f(dev)?, f(cpu)?);
    assert_close(op, &got, &want, atol, rtol);
    Ok(())
}

/// One matmul on seeded inputs sized for `spec`, against the CPU reference.
pub fn matmul_case(dev: &Device, cpu: &Device, spec: MatmulSpec, seed: u64) -> Result<()> {
    let a_len = spec.a_offset + spec.a_batch_stride * (spec.batch - 1) + spec.m * spec.k;
    let b_len = spec.b_offset + spec.b_batch_stride * (spec.batch - 1) + spec.k * spec.n;
    let mut r = rng(seed);
    let (a, b) = (uniform(&mut r, a_len, -1.0, 1.0), uniform(&mut r, b_len, -1.0, 1.0));
    let tol = 1e-5 * spec.k as f32 + 1e-6;
    same_f32(dev, cpu, &format!("matmul {spec:?}"), tol, 1e-5, |d| {
        let (x, y) = (up(d, &a), up(d, &b));
        let out = d.backend().alloc(spec.batch * spec.m * spec.n, DType::F32)?;
        d.backend().matmul(&x, &y, &out, spec)?;
        Ok(down(d, &out))
    })
}

/// `matmul_row_bias` with and without ReLU on `dev` against the CPU's plain product plus the
/// bias (a shared A, B batched, `trans_b` as given), and the plain product itself; `kernels`
/// names the kernel family that must take the epilogue instead of declining it.
pub fn bias_relu_epilogue_case(dev: &Device, cpu: &Device, (batch, m, n, k, trans_b): (usize, usize, usize, usize, bool), seed: u64, kernels: &str) {
    let mut s = MatmulSpec::new(batch, m, n, k);
    s.trans_b = trans_b;
    s.a_batch_stride = 0;
    let mut r = rng(seed);
    let (a, b) = (uniform(&mut r, m * k, -1.0, 1.0), uniform(&mut r, batch * k * n, -1.0, 1.0));
    let bias = uniform(&mut r, m, -1.0, 1.0);
    let product = |d: &Device| -> Result<Vec<f32>> {
        let out = d.backend().alloc(batch * m * n, DType::F32)?;
        d.backend().matmul(&up(d, &a), &up(d, &b), &out, s)?;
        Ok(down(d, &out))
    };
    let plain = product(cpu).expect("reference product");
    let tol = 1e-5 * k as f32 + 1e-5;
    assert_close(&format!("matmul {s:?} on {dev}"), &product(dev).expect("product"), &plain, tol, 1e-5);
    for relu in [false, true] {
        let want: Vec<f32> = plain.iter().enumerate().map(|(i, v)| v + bias[(i / n) % m]).map(|v| if relu && v < 0.0 { 0.0 } else { v }).collect();
        let out = dev.backend().alloc(batch * m * n, DType::F32).expect("alloc");
        let fused = dev.backend().matmul_row_bias(&up(dev, &a), &up(dev, &b), &up(dev, &bias), &out, s, relu).expect("matmul_row_bias");
        assert!(fused, "{s:?} relu {relu}: {kernels} declined the epilogue on {dev}");
        assert_close(&format!("matmul_row_bias {s:?} relu {relu} on {dev}"), &down(dev, &out), &want, tol, 1e-5);
    }
}

/// The optimizer update written out from PyTorch's formulas, element by element: what every
/// backend's fused `optim_step` must match (`s0`, `s1` its state buffers).
pub fn host_step(step: OptimStep, p: &mut [f32], g: &[f32], s0: &mut [f32], s1: &mut [f32]) {
    for i in 0..p.len() {
        match step {
            OptimStep::Sgd { lr, momentum, dampening, nesterov, weight_decay, first } => {
                let mut d = g[i] + weight_decay * p[i];
                if momentum != 0.0 {
                    s0[i] = if first { d } else { momentum * s0[i] + (1.0 - dampening) * d };
                    d = if nesterov { d + momentum * s0[i] } else { s0[i] };
                }
                p[i] -= lr * d;
            }
            OptimStep::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, step } => {
                let mut d = g[i];
                if decoupled {
                    p[i] *= 1.0 - lr * weight_decay;
                } else {
                    d += weight_decay * p[i];
                }
                s0[i] = beta1 * s0[i] + (1.0 - beta1) * d;
                s1[i] = beta2 * s1[i] + (1.0 - beta2) * d * d;
                let (bc1, bc2) = (1.0 - beta1.powi(step as i32), 1.0 - beta2.powi(step as i32));
                p[i] -= lr * (s0[i] / bc1) / ((s1[i] / bc2).sqrt() + eps);
            }
        }
    }
}

/// The `tandem` binary of this build, for the end-to-end tests of the command line;
/// `TANDEM_TEST_BIN` names another copy (scripts/gpu-check.sh runs the test binaries on a
/// machine where this build's paths do not exist). Its caches (the planner's calibrations, PTX,
/// autotuning) go to a directory of this test process unless `TANDEM_CACHE_DIR` names one,
/// never to the user's: what one test run measured is not another's.
#[cfg(feature = "cli")]
pub fn tandem() -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::var_os("TANDEM_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_tandem").into()));
    if std::env::var_os("TANDEM_CACHE_DIR").is_none() {
        cmd.env("TANDEM_CACHE_DIR", std::env::temp_dir().join(format!("tandem-test-cache-{}", std::process::id())));
    }
    cmd
}

/// The folder for files a test leaves for later checks (the PyTorch side of the parity tests
/// reads them): this build's `target/tmp`, or `TANDEM_TEST_TMPDIR` (see [`tandem`]).
pub fn target_tmp() -> std::path::PathBuf {
    std::env::var_os("TANDEM_TEST_TMPDIR").map_or_else(|| env!("CARGO_TARGET_TMPDIR").into(), Into::into)
}

/// Runs the binary with `args` to completion.
#[cfg(feature = "cli")]
pub fn run(args: &[&str]) -> std::process::Output {
    tandem().args(args).output().expect("the tandem binary runs")
}

/// Runs the binary with `args` and asserts it succeeds.
#[cfg(feature = "cli")]
pub fn ok(args: &[&str]) -> std::process::Output {
    let out = run(args);
    assert!(out.status.success(), "tandem {args:?} failed:\n{}", text(&out.stderr));
    out
}

/// Asserts the run fails without a panic and says `needle` on stderr; returns stderr.
#[cfg(feature = "cli")]
pub fn fails(args: &[&str], needle: &str) -> String {
    let out = run(args);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "tandem {args:?} should fail; stderr:\n{err}");
    assert!(!err.contains("panicked"), "tandem {args:?} panicked:\n{err}");
    assert!(err.contains(needle), "tandem {args:?}: stderr lacks '{needle}':\n{err}");
    err
}

/// A process's output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The losses a `tandem train` run logs with `args` (`--log-format json` added), step by step.
#[cfg(feature = "cli")]
pub fn logged_losses(args: &[&str]) -> Vec<f32> {
    let out = ok(&[args, &["--log-format", "json"]].concat());
    let lines = text(&out.stdout);
    lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["step"].is_u64())
        .filter_map(|v| v["loss"].as_f64())
        .map(|v| v as f32)
        .collect()
}

/// im2col and col2im of random data through window `s` on `dev`, against the CPU reference
/// (im2col exactly; col2im sums overlaps, in any order).
pub fn im2col_and_col2im_against_cpu(dev: &Device, cpu: &Device, s: tandem::backend::WindowSpec, seed: u64) -> Result<()> {
    let mut r = rng(seed);
    let x = uniform(&mut r, s.n * s.c * s.h * s.w, -1.0, 1.0);
    let cols_len = s.n * s.col_rows() * s.col_len();
    let c = uniform(&mut r, cols_len, -1.0, 1.0);
    same_f32(dev, cpu, &format!("im2col {s:?}"), 0.0, 0.0, |d| {
        let (xb, cb) = (up(d, &x), d.backend().alloc(cols_len, DType::F32)?);
        d.backend().im2col(&xb, &cb, s)?;
        Ok(down(d, &cb))
    })?;
    same_f32(dev, cpu, &format!("col2im {s:?}"), 1e-6, 1e-6, |d| {
        let (cb, xb) = (up(d, &c), up(d, &x));
        d.backend().col2im(&cb, &xb, s)?;
        Ok(down(d, &xb))
    })
}

/// A fresh, empty directory `tandem-TAG-PID-NAME` under the temp dir, for one test.
pub fn scratch(tag: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-{tag}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A path as the `&str` a command line takes.
pub fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// Makes a device node with `mknod PATH TYPE MAJOR MINOR` (in a test's own directory, never
/// under /dev); `false`, with the reason printed, where this user may not (not root).
pub fn mknod(path: &std::path::Path, kind: &str, major: u32, minor: u32) -> bool {
    let out = std::process::Command::new("mknod").arg(path).args([kind, &major.to_string(), &minor.to_string()]).output().unwrap();
    if !out.status.success() {
        eprintln!("skipping: mknod {} {kind} {major} {minor} failed (not root?): {}", path.display(), text(&out.stderr).trim());
    }
    out.status.success()
}

/// Makes a FIFO with `mkfifo PATH`.
pub fn mkfifo(path: &std::path::Path) {
    assert!(std::process::Command::new("mkfifo").arg(path).status().unwrap().success(), "mkfifo {}", path.display());
}

/// A write handle on a node like /dev/full (every write fails with ENOSPC) made in `dir`, for
/// a child's standard output; `None` where nodes cannot be made.
pub fn full_device(dir: &std::path::Path) -> Option<std::fs::File> {
    let path = dir.join("full");
    mknod(&path, "c", 1, 7).then(|| std::fs::OpenOptions::new().write(true).open(&path).unwrap())
}
