//! wgpu kernel benchmarks: matmul GFLOP/s, each of autotuning's candidates forced, per-op
//! dispatch overhead, im2col.
//! Device: `TANDEM_BENCH_DEVICE` (default `wgpu:0`). Run `cargo bench --bench wgpu_kernels`.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;
use tandem::backend::wgpu::{open_with, MatmulKernel, Options};
use tandem::backend::{BinaryOp, MatmulSpec, WindowSpec};
use tandem::{DType, Device, Layout, Shape};

fn device() -> Option<Device> {
    let spec = std::env::var("TANDEM_BENCH_DEVICE").unwrap_or_else(|_| "wgpu:0".into());
    match Device::parse(&spec) {
        Ok(mut d) => d.pop(),
        Err(e) => {
            eprintln!("skipping wgpu benchmarks: {e}");
            None
        }
    }
}

fn filled(dev: &Device, n: usize, v: f32) -> tandem::backend::Buffer {
    let b = dev.backend().alloc(n, DType::F32).expect("alloc");
    dev.backend().fill(&b, v).expect("fill");
    b
}

fn matmul(c: &mut Criterion) {
    let Some(dev) = device() else { return };
    square_products(c, &dev, &format!("matmul {}", dev.info().name), &[256, 512, 1024, 2048]);
}

/// The kernels a hardware GPU runs (the forced hardware profile: 64×64 tiles, 128×128 from
/// 1024 on) on the same adapter: on a real GPU what the README's WGSL figures are; on lavapipe
/// a check that they still run.
fn matmul_hardware_profile(c: &mut Criterion) {
    let Some(dev) = device() else { return };
    if dev.info().backend != tandem::BackendKind::Wgpu {
        return;
    }
    let options = Options { hardware_profile: true, ..Options::default() };
    let hw = Device::from_backend(open_with(dev.info().ordinal, options).expect("open_with"));
    square_products(c, &hw, &format!("matmul hardware profile {}", hw.info().name), &[256, 1024]);
}

/// Each of autotuning's candidates forced on the same adapter, on a square product and two with
/// a long K (one past Mesa's 65,535 loop iterations), where split-K applies: what
/// `tandem::backend::wgpu::autotune` chooses among, timed by criterion instead of its few runs.
fn matmul_candidates(c: &mut Criterion) {
    let Some(dev) = device() else { return };
    if dev.info().backend != tandem::BackendKind::Wgpu {
        return;
    }
    let mut g = c.benchmark_group(format!("matmul candidates {}", dev.info().name));
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for kernel in [MatmulKernel::Registers, MatmulKernel::Tiled64, MatmulKernel::Tiled128, MatmulKernel::SplitK] {
        let options = Options { matmul: Some(kernel), hardware_profile: kernel != MatmulKernel::Registers, ..Options::default() };
        let forced = Device::from_backend(open_with(dev.info().ordinal, options).expect("open_with"));
        for (m, n, k) in [(256, 256, 256), (128, 128, 8192), (64, 64, 70_001)] {
            let (a, b, out) = (filled(&forced, m * k, 0.5), filled(&forced, k * n, 0.25), filled(&forced, m * n, 0.0));
            let spec = MatmulSpec::new(1, m, n, k);
            g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
            g.bench_function(format!("{} {m}x{n}x{k}", kernel.name()), |bench| {
                bench.iter(|| {
                    forced.backend().matmul(&a, &b, &out, spec).expect("matmul");
                    forced.sync().expect("sync");
                })
            });
        }
    }
    g.finish();
}

/// GFLOP/s of `n`×`n` products on `dev`, one benchmark per size.
fn square_products(c: &mut Criterion, dev: &Device, group: &str, sizes: &[usize]) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for &n in sizes {
        let (a, b, out) = (filled(dev, n * n, 0.5), filled(dev, n * n, 0.25), filled(dev, n * n, 0.0));
        let spec = MatmulSpec::new(1, n, n, n);
        dev.backend().matmul(&a, &b, &out, spec).expect("matmul");
        dev.sync().expect("sync");
        g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| {
                dev.backend().matmul(&a, &b, &out, spec).expect("matmul");
                dev.sync().expect("sync");
            })
        });
    }
    g.finish();
}

fn dispatch_overhead(c: &mut Criterion) {
    let Some(dev) = device() else { return };
    let mut g = c.benchmark_group("dispatch");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let l = Layout::contiguous(&Shape::new([64]));
    let (a, b) = (filled(&dev, 64, 1.0), filled(&dev, 64, 2.0));
    let outs: Vec<_> = (0..1000).map(|_| filled(&dev, 64, 0.0)).collect();
    // Elements = ops, so the reported rate inverts to time per op.
    g.throughput(Throughput::Elements(1000));
    g.bench_function("1000 small adds + sync", |bench| {
        bench.iter(|| {
            for o in &outs {
                dev.backend().binary(BinaryOp::Add, &a, &l, &b, &l, o).expect("add");
            }
            dev.sync().expect("sync");
        })
    });
    g.finish();
}

fn im2col(c: &mut Criterion) {
    let Some(dev) = device() else { return };
    let mut g = c.benchmark_group("im2col");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let s = WindowSpec::new("bench", [64, 16, 28, 28], (3, 3), (1, 1), (1, 1)).expect("window");
    let x = filled(&dev, 64 * 16 * 28 * 28, 1.0);
    let cols = filled(&dev, 64 * s.col_rows() * s.col_len(), 0.0);
    g.throughput(Throughput::Bytes((64 * s.col_rows() * s.col_len() * 4) as u64));
    g.bench_function("64x16x28x28 k3 p1", |bench| {
        bench.iter(|| {
            dev.backend().im2col(&x, &cols, s).expect("im2col");
            dev.sync().expect("sync");
        })
    });
    g.finish();
}

criterion_group!(benches, matmul, matmul_hardware_profile, matmul_candidates, dispatch_overhead, im2col);
criterion_main!(benches);
