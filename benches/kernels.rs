//! Step and conv benchmarks on every device found (CPU reference, each wgpu adapter, each CUDA
//! device): conv2d forward and backward of the seed CNN's conv2, and one seed-CNN training step
//! (forward, cross-entropy, backward, SGD-momentum update) at batch 64 and 1000.
use criterion::{criterion_group, criterion_main, Criterion};
use rand::SeedableRng;
use tandem::nn::{models::SeedModel, Module};
use tandem::optim::{Optimizer, Sgd, SgdConfig};
use tandem::{Device, Tensor};

fn devices() -> Vec<Device> {
    Device::list().into_iter().filter_map(|i| Device::open(i.backend, i.ordinal).ok()).collect()
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

criterion_group!(benches, conv, train_step);
criterion_main!(benches);
