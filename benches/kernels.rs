//! Kernel and step benchmarks on every device found (CPU reference, each wgpu adapter, each CUDA
//! device): square matmuls, one elementwise pass and one reduction over 4M values, an SGD-momentum
//! update of 1M parameters, conv2d forward and backward of the seed CNN's conv2, and one seed-CNN
//! training step (forward, cross-entropy, backward, SGD-momentum update) at batch 64 and 1000.
use criterion::{criterion_group, criterion_main, Criterion};
use rand::SeedableRng;
use tandem::nn::{models::SeedModel, Module};
use tandem::optim::{Optimizer, Sgd, SgdConfig};
use tandem::{Device, Tensor};

fn devices() -> Vec<Device> {
    Device::list().into_iter().filter_map(|i| Device::open(i.backend, i.ordinal).ok()).collect()
}

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernels");
    g.sample_size(10);
    for dev in devices() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        for n in [256usize, 1024] {
            let a = Tensor::randn([n, n], &mut rng, &dev).unwrap();
            let b = Tensor::randn([n, n], &mut rng, &dev).unwrap();
            g.bench_function(format!("matmul{n}/{}", dev.spec()), |bench| {
                bench.iter(|| {
                    let y = tandem::autograd::no_grad(|| a.matmul(&b).unwrap());
                    dev.sync().unwrap();
                    y
                })
            });
        }
        let x = Tensor::randn([1024, 4096], &mut rng, &dev).unwrap();
        g.bench_function(format!("add-4M/{}", dev.spec()), |bench| {
            bench.iter(|| {
                let y = tandem::autograd::no_grad(|| x.add(&x).unwrap());
                dev.sync().unwrap();
                y
            })
        });
        g.bench_function(format!("sum-rows-4M/{}", dev.spec()), |bench| {
            bench.iter(|| {
                let y = tandem::autograd::no_grad(|| x.sum_to(&tandem::Shape(vec![1, 4096])).unwrap());
                dev.sync().unwrap();
                y
            })
        });
        let p = Tensor::randn([1 << 20], &mut rng, &dev).unwrap().requires_grad();
        p.set_grad(Some(Tensor::randn([1 << 20], &mut rng, &dev).unwrap()));
        let mut opt = Sgd::new(vec![("p".into(), p.clone())], SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() }).unwrap();
        g.bench_function(format!("sgd-momentum-1M/{}", dev.spec()), |bench| {
            bench.iter(|| {
                opt.step().unwrap();
                dev.sync().unwrap();
            })
        });
    }
}

fn conv(c: &mut Criterion) {
    let mut g = c.benchmark_group("conv2d");
    g.sample_size(10);
    for dev in devices() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let x = Tensor::randn([64, 10, 12, 12], &mut rng, &dev).unwrap().requires_grad();
        let w = Tensor::randn([20, 10, 5, 5], &mut rng, &dev).unwrap().requires_grad();
        g.bench_function(format!("forward/{}", dev.spec()), |b| {
            b.iter(|| {
                let y = tandem::autograd::no_grad(|| x.conv2d(&w, (1, 1), (0, 0)).unwrap());
                dev.sync().unwrap();
                y
            })
        });
        g.bench_function(format!("forward+backward/{}", dev.spec()), |b| {
            b.iter(|| {
                x.conv2d(&w, (1, 1), (0, 0)).unwrap().sum_all().unwrap().backward().unwrap();
                dev.sync().unwrap();
            })
        });
    }
}

fn train_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("seed-cnn-step");
    g.sample_size(10);
    for dev in devices() {
        for batch in [64usize, 1000] {
            let model = SeedModel::Cnn.build(0, &dev).unwrap();
            let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() }).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
            let x = Tensor::randn([batch, 1, 28, 28], &mut rng, &dev).unwrap();
            let y = Tensor::from_labels((0..batch as i32).map(|i| i % 10).collect(), [batch], &dev).unwrap();
            g.bench_function(format!("batch{batch}/{}", dev.spec()), |b| {
                b.iter(|| {
                    let loss = model.forward(&x).unwrap().cross_entropy(&y).unwrap();
                    opt.zero_grad();
                    loss.backward().unwrap();
                    opt.step().unwrap();
                    loss.to_scalar().unwrap()
                })
            });
        }
    }
}

criterion_group!(benches, kernels, conv, train_step);
criterion_main!(benches);
