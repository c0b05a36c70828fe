//! Kernel and step benchmarks on every device found (CPU reference, each wgpu adapter, each CUDA
//! device): square matmuls, one elementwise pass and one reduction over 4M values, an SGD-momentum
//! update of 1M parameters, conv2d forward and backward of the seed CNN's conv2, one seed-CNN
//! training step (forward, cross-entropy, backward, SGD-momentum update) at batch 64 and 1000,
//! and the kernels of `tandem bench --model gpt`'s step at its sizes (LayerNorm, causal softmax,
//! tanh GELU, the q/k/v permute, a bias broadcast, the per-head products; each forward +
//! backward) and that step itself (AdamW); and the CPU's products in each layout at the sizes of
//! the speed table (`cpu-gemm`, named by the `gemm` kernels this CPU runs).
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

/// `f`'s output times a fixed upstream gradient, summed and back-propagated: one kernel's forward
/// and backward.
fn fwd_bwd(dev: &Device, f: &dyn Fn() -> Tensor) {
    let y = f();
    y.sum_all().unwrap().backward().unwrap();
    dev.sync().unwrap();
}

/// A named kernel call of the GPT step.
type Kernel<'a> = Box<dyn Fn() -> Tensor + 'a>;

fn gpt_kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("gpt-kernels");
    g.sample_size(10);
    for dev in devices() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let mut randn = |shape: &[usize]| Tensor::randn(shape.to_vec(), &mut rng, &dev).unwrap().requires_grad();
        let (x, w, b) = (randn(&[1024, 128]), randn(&[128]), randn(&[128]));
        let (scores, hidden, qkv, bias) = (randn(&[64, 64, 64]), randn(&[1024, 512]), randn(&[16, 64, 3, 4, 32]), randn(&[512]));
        let (q, k) = (randn(&[64, 64, 32]), randn(&[64, 64, 32]));
        let cases: Vec<(&str, Kernel<'_>)> = vec![
            ("layer_norm-1024x128", Box::new(|| x.layer_norm(&w, &b, 1e-5).unwrap())),
            ("causal_softmax-64x64x64", Box::new(|| scores.causal_softmax(0.17).unwrap())),
            ("gelu_tanh-1024x512", Box::new(|| hidden.gelu_tanh().unwrap())),
            ("qkv-permute-16x64x3x4x32", Box::new(|| qkv.permute(&[2, 0, 3, 1, 4]).unwrap())),
            ("bias-add-1024x512", Box::new(|| hidden.add(&bias).unwrap())),
            ("heads-qkT-64x64x32", Box::new(|| q.matmul_t(&k, false, true).unwrap())),
        ];
        for (name, f) in &cases {
            g.bench_function(format!("{name}/{}", dev.spec()), |bench| bench.iter(|| fwd_bwd(&dev, f.as_ref())));
        }
    }
}

fn gpt_step(c: &mut Criterion) {
    use tandem::data::text::{Split, TextCorpus};
    use tandem::data::Batch;
    use tandem::nn::models::{Gpt, GptConfig};
    use tandem::parallel::{Loss, OptimConfig, Single, Strategy};
    let mut g = c.benchmark_group("gpt-step");
    g.sample_size(10);
    let corpus = TextCorpus::builtin(0);
    let cfg = GptConfig { n_layer: 4, n_head: 4, n_embd: 128, block_size: 64, vocab_size: corpus.vocab.len(), dropout: 0.0, bias: true };
    let tb = corpus.batch(Split::Train, 16, 64, &mut rand_chacha::ChaCha8Rng::seed_from_u64(0)).unwrap();
    let batch = Batch::tokens(tb.x, tb.y, tb.block, cfg.vocab_size).unwrap();
    for dev in devices() {
        let optim = OptimConfig::adam(tandem::optim::AdamConfig { lr: 1e-3, ..tandem::optim::AdamConfig::adamw() });
        let mut s = Single::new(Gpt::new(cfg, 0, &dev).unwrap(), &optim, Loss::CrossEntropy, &dev).unwrap();
        g.bench_function(format!("batch16-block64/{}", dev.spec()), |b| b.iter(|| s.step(&batch).unwrap()));
    }
}

/// The CPU backend's products as `gemm` runs them here (AVX-512 or AVX2+FMA, chosen at run time;
/// build without the `avx512` feature to time the AVX2 path on an AVX-512 CPU) and, built with
/// the `openblas` feature where the library loads, as OpenBLAS runs them (`OPENBLAS_CORETYPE=
/// Haswell` times its AVX2 kernels), with A and B as stored (`nn`) and transposed by stride
/// (`tn`, `nt`: the layouts backward uses).
fn cpu_gemm(c: &mut Criterion) {
    use tandem::backend::cpu::{CpuBackend, GemmChoice};
    #[allow(unused_mut)] // pushed to only with the `openblas` feature
    let mut paths = vec![(format!("gemm {}", tandem::backend::cpu::gemm_kernels()), GemmChoice::Gemm)];
    #[cfg(feature = "openblas")]
    if let Ok(lib) = tandem::backend::cpu::openblas::library() {
        paths.push((format!("openblas {}", lib.core), GemmChoice::OpenBlas));
    }
    for (label, choice) in paths {
        let mut g = c.benchmark_group(format!("cpu-gemm {label}"));
        g.sample_size(10);
        let dev = Device::from_backend(std::sync::Arc::new(CpuBackend::with_gemm(choice)));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        for n in [64usize, 128, 256, 512, 1024, 2048] {
            let a = Tensor::randn([n, n], &mut rng, &dev).unwrap();
            let b = Tensor::randn([n, n], &mut rng, &dev).unwrap();
            for (layout, ta, tb) in [("nn", false, false), ("tn", true, false), ("nt", false, true)] {
                if n == 2048 && layout != "nn" {
                    continue;
                }
                g.throughput(criterion::Throughput::Elements((2 * n * n * n) as u64));
                g.bench_function(format!("{layout}/{n}"), |bench| bench.iter(|| tandem::autograd::no_grad(|| a.matmul_t(&b, ta, tb).unwrap())));
            }
        }
        g.finish();
    }
}

criterion_group!(benches, kernels, conv, train_step, gpt_kernels, gpt_step, cpu_gemm);
criterion_main!(benches);
