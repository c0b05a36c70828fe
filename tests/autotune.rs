//! Self-tuning matmul kernels (`backend::wgpu::autotune`) on every wgpu adapter (lavapipe and
//! llvmpipe here), each test on every adapter under test: every candidate kernel agrees with the CPU reference
//! on odd shapes and on a K past Mesa's 65,535 loop iterations; a tuned choice is the fastest
//! candidate and round-trips through the cache file; a poisoned cache file (garbage, another
//! version, an unknown kernel, a symbolic link, a directory, a FIFO) is ignored and left as it
//! is; `off` never tunes; `force` tunes again; a pinned device never tunes, and deterministic
//! data parallelism pins its devices. Every cache lives
//! in a temporary directory (`Options::cache_dir`).
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use std::path::{Path, PathBuf};
use tandem::backend::wgpu::autotune::cache_file;
use tandem::backend::wgpu::{adapters, open_with, Autotune, MatmulKernel, Options};
use tandem::backend::{MatmulSpec, Tuning};
use tandem::{BackendKind, DType, Device};

/// A fresh, empty directory under the temporary directory for `what`.
fn temp_dir(what: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("tandem-autotune-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Adapter `ordinal` opened with `options`, or `None` (saying so) where this machine lacks it.
fn open(ordinal: usize, options: Options) -> Option<Device> {
    if adapters().len() <= ordinal {
        eprintln!("skipping wgpu:{ordinal}: no such adapter here");
        return None;
    }
    Some(Device::from_backend(open_with(ordinal, options).expect("listed adapter opens")))
}

/// Tuning on, with its cache in `dir`, under the software or the hardware profile.
fn tuned(dir: &Path, autotune: Autotune, hardware_profile: bool) -> Options {
    Options { autotune, cache_dir: Some(dir.to_path_buf()), hardware_profile, ..Options::default() }
}

fn spec(batch: usize, m: usize, n: usize, k: usize, trans: (bool, bool)) -> MatmulSpec {
    let mut s = MatmulSpec::new(batch, m, n, k);
    (s.trans_a, s.trans_b) = trans;
    s
}

/// Odd shapes over all four transposes, a batch (split-K declines it), single products that
/// split-K cuts (the last slice shorter), and a K of 70,001: past 65,535, so that every
/// kernel's K loop is cut somewhere (the host's slices, or split-K's).
fn odd_shapes() -> Vec<MatmulSpec> {
    vec![
        spec(1, 37, 53, 29, (false, false)),
        spec(1, 130, 67, 301, (true, false)),
        spec(2, 65, 129, 1030, (false, true)),
        spec(1, 33, 47, 3001, (true, true)),
        spec(1, 7, 5, 70_001, (false, false)),
        spec(1, 3, 9, 70_001, (true, true)),
    ]
}

/// The one product the tuning tests run: a single product that split-K applies to.
fn tuned_spec() -> MatmulSpec {
    spec(1, 96, 80, 1500, (false, false))
}

/// Runs `tuned_spec` on `dev` against the CPU and returns the device's tuning afterwards.
fn run_tuned(dev: &Device, s: MatmulSpec) -> Vec<Tuning> {
    matmul_case(dev, &Device::cpu(), s, 90).unwrap_or_else(|e| panic!("{s:?} on {dev}: {e}"));
    dev.backend().tuning()
}

/// Every family, forced, on every odd shape, and each one that fuses a bias with it.
fn every_kernel_agrees(ordinal: usize) {
    let cpu = Device::cpu();
    for kernel in MatmulKernel::ALL {
        let Some(dev) = open(ordinal, Options { matmul: Some(kernel), hardware_profile: kernel != MatmulKernel::Registers, ..Options::default() })
        else {
            return;
        };
        for s in odd_shapes() {
            matmul_case(&dev, &cpu, s, 91).unwrap_or_else(|e| panic!("{} on {s:?} on {dev}: {e}", kernel.name()));
        }
        if kernel != MatmulKernel::Registers {
            // The register family declines most fused biases; the others take every one.
            for case in [(1, 33, 47, 3001, false), (2, 20, 131, 40, true), (1, 5, 3, 70_001, true)] {
                bias_relu_epilogue_case(&dev, &cpu, case, 92, kernel.name());
            }
        }
        assert!(dev.backend().tuning().is_empty(), "a forced family must not tune");
    }
}

/// The choice is the fastest candidate timed, every candidate of the software profile is
/// timed, the file holds it, and a device reading a copy of the file takes it without tuning.
fn choice_round_trips(ordinal: usize) {
    let dir = temp_dir("round-trip");
    let Some(dev) = open(ordinal, tuned(&dir, Autotune::On, false)) else { return };
    let tuning = run_tuned(&dev, tuned_spec());
    assert_eq!(tuning.len(), 1, "{tuning:?}");
    assert!(dev.info().matmul.ends_with(", tuned per shape class"), "{}", dev.info().matmul);
    let t = &tuning[0];
    assert!(!t.from_cache && t.class.starts_with("matmul software m128 n128 k2048 b1 NN"), "{t:?}");
    let timed: Vec<&str> = t.times_us.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(timed, ["registers", "tiled64", "tiled128", "split-k"], "{t:?}");
    let fastest = t.times_us.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(t.kernel, fastest.0, "{t:?}");
    eprintln!("{dev}: {t:?}");
    let file = cache_file(&dir, dev.info());
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).expect("the cache file is written")).unwrap();
    assert_eq!(json["choices"][&t.class]["kernel"], t.kernel.as_str(), "{json}");
    assert_eq!(json["tandem"], env!("CARGO_PKG_VERSION"));
    // Another directory holding a copy: read from disk, not from this process's memory.
    let copy = temp_dir("round-trip-copy");
    std::fs::copy(&file, cache_file(&copy, dev.info())).unwrap();
    let Some(again) = open(ordinal, tuned(&copy, Autotune::On, false)) else { return };
    let read = run_tuned(&again, tuned_spec());
    assert_eq!(read.len(), 1);
    assert!(read[0].from_cache, "{read:?}");
    assert_eq!((&read[0].kernel, &read[0].times_us), (&t.kernel, &t.times_us));
    // The same device's next product of the class neither tunes nor reads again.
    assert_eq!(run_tuned(&again, spec(1, 100, 70, 1100, (false, false))), read);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&copy).unwrap();
}

/// A valid cache file for `ordinal` under the hardware profile, its class and its JSON.
fn valid_file(ordinal: usize) -> Option<(String, serde_json::Value)> {
    let dir = temp_dir("valid");
    let dev = open(ordinal, tuned(&dir, Autotune::On, true))?;
    let t = run_tuned(&dev, hardware_spec()).remove(0);
    let json = serde_json::from_slice(&std::fs::read(cache_file(&dir, dev.info())).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    Some((t.class, json))
}

/// The product of the poisoning tests: batched (no split-K), so that the hardware profile
/// times two candidates only.
fn hardware_spec() -> MatmulSpec {
    spec(2, 40, 72, 50, (false, true))
}

/// Each poisoned file in turn: the device opens, the product is right, the class is tuned
/// afresh, and a path that is not a regular file is left as it was.
fn poisoned_cache_is_ignored(ordinal: usize) {
    let Some((class, valid)) = valid_file(ordinal) else { return };
    let info = adapters()[ordinal].clone();
    let mut stale = valid.clone();
    stale["tandem"] = "0.0.0-another".into();
    let mut unknown = valid.clone();
    unknown["choices"][&class]["kernel"] = "tiled256".into();
    let mut other_adapter = valid.clone();
    other_adapter["adapter"] = "another GPU".into();
    let outside = temp_dir("outside").join("target.json");
    std::fs::write(&outside, valid.to_string()).unwrap();
    type Poison<'a> = Box<dyn Fn(&Path) + 'a>;
    let write = |bytes: Vec<u8>| -> Poison { Box::new(move |p: &Path| std::fs::write(p, &bytes).unwrap()) };
    let poisons: Vec<(&str, Poison)> = vec![
        ("garbage", write(vec![0xff, 0x00, b'{', 0x80])),
        ("truncated", write(valid.to_string().as_bytes()[..40].to_vec())),
        ("another version", write(stale.to_string().into_bytes())),
        ("another adapter", write(other_adapter.to_string().into_bytes())),
        ("an unknown kernel", write(unknown.to_string().into_bytes())),
        ("a symlink", Box::new(|p: &Path| std::os::unix::fs::symlink(&outside, p).unwrap())),
        ("a directory", Box::new(|p: &Path| std::fs::create_dir(p).unwrap())),
        ("a FIFO", Box::new(|p: &Path| assert!(std::process::Command::new("mkfifo").arg(p).status().unwrap().success()))),
    ];
    for (what, poison) in poisons {
        let dir = temp_dir("poison");
        let file = cache_file(&dir, &info);
        poison(&file);
        let Some(dev) = open(ordinal, tuned(&dir, Autotune::On, true)) else { return };
        let t = run_tuned(&dev, hardware_spec());
        assert!(t.len() == 1 && !t[0].from_cache && t[0].class == class, "{what}: {t:?}");
        let kind = std::fs::symlink_metadata(&file).unwrap().file_type();
        match what {
            "a symlink" => assert!(kind.is_symlink(), "{what}: the link was replaced"),
            "a directory" => assert!(kind.is_dir(), "{what}: the directory was replaced"),
            "a FIFO" => assert!(!kind.is_file() && !kind.is_dir(), "{what}: the FIFO was replaced"),
            // A regular file is rewritten with the fresh choice, readable again.
            _ => {
                let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
                assert_eq!(json["choices"][&class]["kernel"], t[0].kernel.as_str(), "{what}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), valid.to_string(), "the symlink's target was written");
    std::fs::remove_dir_all(outside.parent().unwrap()).unwrap();
}

/// `off` neither tunes nor writes nor takes a cached choice, and `auto` does not tune on a
/// software adapter.
fn off_never_tunes(ordinal: usize) {
    let Some((_, valid)) = valid_file(ordinal) else { return };
    let dir = temp_dir("off");
    let file = cache_file(&dir, &adapters()[ordinal]);
    std::fs::write(&file, valid.to_string()).unwrap();
    for mode in [Autotune::Off, Autotune::Auto] {
        let Some(dev) = open(ordinal, tuned(&dir, mode, true)) else { return };
        assert!(run_tuned(&dev, hardware_spec()).is_empty(), "{mode:?} tuned");
        assert!(!dev.info().matmul.contains("tuned"), "{mode:?}: {}", dev.info().matmul);
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), valid.to_string(), "the cache file was rewritten");
    let empty = temp_dir("off-empty");
    let Some(dev) = open(ordinal, tuned(&empty.join("sub"), Autotune::Off, false)) else { return };
    assert!(run_tuned(&dev, tuned_spec()).is_empty());
    assert!(!empty.join("sub").exists(), "off created its cache directory");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
}

/// A cached choice with made-up times is taken by `on` as it is, and measured again by `force`,
/// which rewrites the file with real times.
fn force_tunes_again(ordinal: usize) {
    let Some((class, mut file_json)) = valid_file(ordinal) else { return };
    let made_up = serde_json::json!({ "kernel": "tiled128", "times_us": [["tiled64", 2.0], ["tiled128", 1.0]], "clock": "wall" });
    file_json["choices"][&class] = made_up;
    let dir = temp_dir("force");
    let file = cache_file(&dir, &adapters()[ordinal]);
    std::fs::write(&file, file_json.to_string()).unwrap();
    let Some(on) = open(ordinal, tuned(&dir, Autotune::On, true)) else { return };
    let t = run_tuned(&on, hardware_spec());
    assert!(t[0].from_cache && t[0].kernel == "tiled128" && t[0].times_us[1].1 == 1.0, "{t:?}");
    let Some(force) = open(ordinal, tuned(&dir, Autotune::Force, true)) else { return };
    let t = run_tuned(&force, hardware_spec());
    assert!(!t[0].from_cache && t[0].times_us.iter().all(|(_, us)| *us != 1.0 && *us != 2.0), "{t:?}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(json["choices"][&class]["times_us"], serde_json::json!(t[0].times_us), "force did not rewrite the file");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A pinned device runs the untuned kernel: no tuning, and bit for bit what `off` computes.
fn pinned_device_never_tunes(ordinal: usize) {
    let dir = temp_dir("pinned");
    let (Some(pinned), Some(off)) = (open(ordinal, tuned(&dir, Autotune::Force, true)), open(ordinal, tuned(&dir, Autotune::Off, true))) else {
        return;
    };
    pinned.backend().pin_kernels();
    let s = tuned_spec();
    let mut r = rng(93);
    let (a, b) = (uniform(&mut r, s.m * s.k, -1.0, 1.0), uniform(&mut r, s.k * s.n, -1.0, 1.0));
    let product = |d: &Device| {
        let out = d.backend().alloc(s.m * s.n, DType::F32).unwrap();
        d.backend().matmul(&up(d, &a), &up(d, &b), &out, s).unwrap();
        down(d, &out).iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(product(&pinned), product(&off));
    assert!(pinned.backend().tuning().is_empty());
    assert!(!cache_file(&dir, pinned.info()).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Deterministic data parallelism pins its devices (`Backend::pin_kernels`): a seed-CNN step
/// on a device set to tune every class runs no tuning, where the same step without
/// `deterministic` tunes its products.
fn deterministic_data_parallel_pins(ordinal: usize) {
    use tandem::nn::models::SeedModel;
    use tandem::optim::SgdConfig;
    use tandem::parallel::{DataParallel, DataParallelConfig, Loss, OptimConfig, Strategy};
    let model = SeedModel::Cnn.build(7, &Device::cpu()).unwrap();
    let data = tandem::data::synthetic::seed_images(4, 0).unwrap();
    let batch = data.batch(&[0, 1, 2, 3]).unwrap();
    let sgd = OptimConfig::sgd(SgdConfig { lr: 0.05, ..Default::default() });
    for deterministic in [true, false] {
        let dir = temp_dir("deterministic");
        let Some(dev) = open(ordinal, tuned(&dir, Autotune::Force, true)) else { return };
        let cfg = DataParallelConfig { deterministic, ..Default::default() };
        let mut dp = DataParallel::new(&model, std::slice::from_ref(&dev), &sgd, Loss::CrossEntropy, cfg).unwrap();
        dp.step(&batch).unwrap();
        let tuning = dev.backend().tuning();
        assert_eq!(tuning.is_empty(), deterministic, "deterministic {deterministic}: {tuning:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// lavapipe and llvmpipe share a name: their files differ by the driver (which names the wgpu
/// backend), stay in the directory given, and are plain file names whatever the adapter's name.
#[test]
fn one_cache_file_per_adapter_and_driver() {
    let info = |name: &str, driver: &str| tandem::DeviceInfo {
        backend: BackendKind::Wgpu,
        ordinal: 0,
        name: name.into(),
        kind: tandem::DeviceKind::Software,
        memory: None,
        driver: driver.into(),
        matmul: String::new(),
        libraries: String::new(),
    };
    let dir = Path::new("/cache");
    let vulkan = cache_file(dir, &info("llvmpipe (LLVM 15.0.6, 256 bits)", "Vulkan llvmpipe Mesa 22.3.6"));
    let gl = cache_file(dir, &info("llvmpipe (LLVM 15.0.6, 256 bits)", "Gl 4.5 (Core Profile) Mesa 22.3.6"));
    assert_ne!(vulkan, gl);
    assert_eq!(vulkan, cache_file(dir, &info("llvmpipe (LLVM 15.0.6, 256 bits)", "Vulkan llvmpipe Mesa 22.3.6")));
    let hostile = cache_file(dir, &info("../../etc/passwd\0 GPU", "d"));
    assert_eq!(hostile.parent(), Some(dir), "{hostile:?}");
    let name = hostile.file_name().unwrap().to_str().unwrap();
    assert!(name.ends_with(".json") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'), "{name}");
}

/// Runs `check(ordinal)` for every wgpu adapter among the devices under test.
fn on_each_adapter(check: fn(usize)) {
    on_each_device(|dev, _| {
        if dev.info().backend == BackendKind::Wgpu {
            check(dev.info().ordinal);
        }
        Ok(())
    });
}

#[test]
fn every_kernel_agrees_on_each_adapter() {
    on_each_adapter(every_kernel_agrees);
}

#[test]
fn choice_round_trips_on_each_adapter() {
    on_each_adapter(choice_round_trips);
}

#[test]
fn poisoned_cache_is_ignored_on_each_adapter() {
    on_each_adapter(poisoned_cache_is_ignored);
}

#[test]
fn off_never_tunes_on_each_adapter() {
    on_each_adapter(off_never_tunes);
}

#[test]
fn force_tunes_again_on_each_adapter() {
    on_each_adapter(force_tunes_again);
}

#[test]
fn pinned_device_never_tunes_on_each_adapter() {
    on_each_adapter(pinned_device_never_tunes);
}

#[test]
fn deterministic_data_parallel_pins_on_each_adapter() {
    on_each_adapter(deterministic_data_parallel_pins);
}
