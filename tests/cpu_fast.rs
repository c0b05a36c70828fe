//! The CPU backend's fast paths change no bit: the fused convolution epilogue and optimizer
//! updates against the same backend with both fusions declined, the fused tanh GELU against its
//! composition, strided elementwise passes against indexing by division, and every kernel
//! (the CNN's, then a GPT's) run on one thread against several.
#[path = "common/watched.rs"]
mod watched;
use rand::SeedableRng;
use tandem::backend::*;
use tandem::nn::{Conv2d, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential};
use tandem::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use tandem::{DType, Device, Layout, Tensor};

/// A CNN with a linear layer of more parameters than one elementwise chunk (so the updates run
/// on several threads), with padding (so some columns are zero).
fn model(dev: &Device) -> Sequential {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    Sequential::new()
        .push("conv1", Conv2d::new(3, 8, 3, &mut r, dev).unwrap())
        .push("relu1", ReLU)
        .push("pool1", MaxPool2d { kernel: 2, stride: 2 })
        .push("flatten", Flatten)
        .push("fc1", Linear::new(8 * 7 * 7, 300, &mut r, dev).unwrap())
        .push("relu2", ReLU)
        .push("fc2", Linear::new(300, 10, &mut r, dev).unwrap())
}

/// Builds an optimizer over the given parameters.
type MakeOptimizer = Box<dyn Fn(Vec<(String, Tensor)>) -> Box<dyn Optimizer>>;

/// Parameters after three steps of `opt` on fixed data, as bit patterns.
fn train(dev: &Device, opt: &dyn Fn(Vec<(String, Tensor)>) -> Box<dyn Optimizer>) -> Vec<Vec<u32>> {
    let m = model(dev);
    let mut o = opt(m.parameters());
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    let x = Tensor::randn([6, 3, 16, 16], &mut r, dev).unwrap();
    let y = Tensor::from_labels(vec![0, 3, 9, 1, 1, 7], [6], dev).unwrap();
    for _ in 0..3 {
        let loss = m.forward(&x).unwrap().cross_entropy(&y).unwrap();
        o.zero_grad();
        loss.backward().unwrap();
        o.step().unwrap();
    }
    m.parameters().iter().map(|(_, p)| p.to_vec().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn fused_conv_epilogue_and_updates_equal_the_composition_bit_for_bit() {
    let sgd = |c: SgdConfig| move |p| Box::new(Sgd::new(p, c).unwrap()) as Box<dyn Optimizer>;
    let adam = |c: AdamConfig| move |p| Box::new(Adam::new(p, c).unwrap()) as Box<dyn Optimizer>;
    let cases: Vec<(&str, MakeOptimizer)> = vec![
        ("sgd", Box::new(sgd(SgdConfig { lr: 0.1, ..Default::default() }))),
        (
            "sgd momentum dampening decay",
            Box::new(sgd(SgdConfig { lr: 0.05, momentum: 0.9, dampening: 0.3, weight_decay: 0.01, ..Default::default() })),
        ),
        ("sgd nesterov", Box::new(sgd(SgdConfig { lr: 0.05, momentum: 0.8, nesterov: true, ..Default::default() }))),
        ("adam decay", Box::new(adam(AdamConfig { lr: 0.01, weight_decay: 0.1, ..Default::default() }))),
        ("adamw", Box::new(adam(AdamConfig { lr: 0.01, ..AdamConfig::adamw() }))),
    ];
    for (name, opt) in &cases {
        let fused = train(&Device::cpu(), opt.as_ref());
        let composed = train(&watched::watched_cpu(|_| {}, |_| {}), opt.as_ref());
        for (i, (f, c)) in fused.iter().zip(&composed).enumerate() {
            assert!(f == c, "{name}: parameter {i} differs between the fused and composed CPU paths");
        }
    }
}

/// Forward and backward of the model on a rayon pool of `threads`, outputs and gradients as bits.
fn pass(threads: usize, batch: usize) -> Vec<Vec<u32>> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let dev = Device::cpu();
        let m = model(&dev);
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let x = Tensor::randn([batch, 3, 16, 16], &mut r, &dev).unwrap().requires_grad();
        let y = m.forward(&x).unwrap();
        // Sums over long axes of large tensors: the reductions' threaded path.
        let s = x.square().unwrap().sum_all().unwrap();
        y.sum_all().unwrap().add(&s).unwrap().backward().unwrap();
        let mut out = vec![y.to_vec().unwrap(), s.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap()];
        out.extend(m.parameters().iter().map(|(_, p)| p.grad().unwrap().to_vec().unwrap()));
        out.into_iter().map(|v| v.iter().map(|f| f.to_bits()).collect()).collect()
    })
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let one = pass(1, 96);
    for threads in [2, 3] {
        assert!(pass(threads, 96) == one, "{threads} threads give other bits than one");
    }
}

/// Buffer positions of a layout's elements in row-major order, by division: the definition the
/// strided passes must agree with.
fn positions(l: &Layout) -> Vec<usize> {
    let at = |mut i: usize| {
        let mut p = l.offset;
        for d in (0..l.shape.len()).rev() {
            p += (i % l.shape[d]) * l.strides[d];
            i /= l.shape[d];
        }
        p
    };
    (0..l.numel()).map(at).collect()
}

fn lay(shape: &[usize], strides: &[usize], offset: usize) -> Layout {
    Layout { shape: shape.to_vec(), strides: strides.to_vec(), offset }
}

/// Unary and binary passes through permuted, broadcast (last, middle and first axis), offset,
/// transposed, scalar and empty layouts, long enough for the threaded path (whose tasks start
/// mid-row-walk), on 1 and 3 threads: every element as indexing by division gives it.
#[test]
fn strided_passes_read_every_layout_as_indexed() {
    let dev = Device::cpu();
    let be = dev.backend();
    let src: Vec<f32> = (0..160_000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let x = be.upload(bytemuck::cast_slice(&src), DType::F32).unwrap();
    // [B=8, T=50, 3, H=4, D=32] read as [3, B, H, T, D]: the attention's q/k/v split.
    let qkv = lay(&[3, 8, 4, 50, 32], &[128, 19_200, 32, 384, 1], 0);
    let cases = [
        qkv,
        lay(&[1000, 130], &[0, 1], 0),
        lay(&[700, 130], &[1, 0], 3),
        lay(&[20, 30, 130], &[130, 0, 1], 11),
        lay(&[300, 100], &[200, 1], 57),
        lay(&[130, 900], &[1, 130], 0),
        lay(&[7, 1, 9], &[9, 0, 1], 2),
        lay(&[], &[], 5),
        lay(&[0, 4], &[4, 1], 0),
    ];
    for l in &cases {
        let n = l.numel();
        let pos = positions(l);
        let plain = Layout::contiguous(&tandem::Shape(l.shape.clone()));
        let shifted = Layout { offset: 1000, ..plain.clone() };
        let want_neg: Vec<u32> = pos.iter().map(|&p| (-src[p]).to_bits()).collect();
        let want_sub = |pa: &[usize], pb: &[usize]| -> Vec<u32> { pa.iter().zip(pb).map(|(&a, &b)| (src[a] - src[b]).to_bits()).collect() };
        let contiguous: Vec<usize> = (1000..1000 + n).collect();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let out = be.alloc(n.max(1), DType::F32).unwrap();
                let bits = |out: &Buffer| -> Vec<u32> { bytemuck::cast_slice::<u8, u32>(&be.download(out).unwrap())[..n].to_vec() };
                be.unary(UnaryOp::Neg, &x, l, &out).unwrap();
                assert!(bits(&out) == want_neg, "neg through {l:?} on {threads} threads");
                for (la, lb, pa, pb) in [(l, &shifted, &pos, &contiguous), (&shifted, l, &contiguous, &pos), (l, l, &pos, &pos)] {
                    be.binary(BinaryOp::Sub, &x, la, &x, lb, &out).unwrap();
                    assert!(bits(&out) == want_sub(pa, pb), "sub through {la:?} and {lb:?} on {threads} threads");
                }
            });
        }
    }
}

/// The fused tanh GELU (forward and gradient) against its composition, on values spanning the
/// tanh's saturation, NaN, ±inf, ±0 and subnormals, past the threaded length: the same bits.
#[test]
fn fused_gelu_tanh_equals_its_composition_bit_for_bit() {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut vals: Vec<f32> = (0..70_000).map(|_| rand::Rng::random_range(&mut r, -8.0f32..8.0)).collect();
    vals.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-40, -1e-40, 1e20, -1e20, 3e12, -3e12, 1e-3]);
    let up: Vec<f32> = (0..vals.len()).map(|_| rand::Rng::random_range(&mut r, -1.0f32..1.0)).collect();
    let run = || -> Vec<Vec<u32>> {
        let dev = Device::cpu();
        let x = Tensor::from_vec(vals.clone(), [vals.len()], &dev).unwrap().requires_grad();
        let y = x.gelu_tanh().unwrap();
        y.mul(&Tensor::from_vec(up.clone(), [up.len()], &dev).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
        [y.to_vec().unwrap(), x.grad().unwrap().to_vec().unwrap()].map(|v| v.iter().map(|f| f.to_bits()).collect()).to_vec()
    };
    let (fused, composed) = (run(), tandem::tensor::composed(run));
    for (k, what) in ["output", "gradient"].iter().enumerate() {
        let first = fused[k].iter().zip(&composed[k]).position(|(a, b)| a != b);
        assert!(first.is_none(), "{what} differs at x = {}", vals[first.unwrap_or(0)]);
    }
}

/// Loss and every gradient of a small GPT (LayerNorm, causal softmax or attention, GELU, the
/// q/k/v permutes, bias broadcasts: each past its threaded size) as bits, on a pool of `threads`.
fn gpt_pass(threads: usize, fused_attention: bool) -> Vec<Vec<u32>> {
    use tandem::nn::models::{Gpt, GptConfig};
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let dev = Device::cpu();
        let cfg = GptConfig { n_layer: 1, n_head: 2, n_embd: 96, block_size: 48, vocab_size: 20, dropout: 0.0, bias: true };
        let gpt = Gpt::new(cfg, 4, &dev).unwrap();
        gpt.set_fused_attention(fused_attention);
        let ids: Vec<i32> = (0..4 * 48).map(|i| (i * 7 + i / 5) % 20).collect();
        let x = Tensor::from_labels(ids.clone(), [4, 48], &dev).unwrap();
        let y = Tensor::from_labels(ids.iter().map(|v| (v + 3) % 20).collect(), [4, 48], &dev).unwrap();
        let loss = Gpt::loss(&gpt.forward(&x).unwrap(), &y).unwrap();
        loss.backward().unwrap();
        let mut out = vec![loss.to_vec().unwrap()];
        out.extend(gpt.parameters().iter().map(|(_, p)| p.grad().unwrap().to_vec().unwrap()));
        out.into_iter().map(|v| v.iter().map(|f| f.to_bits()).collect()).collect()
    })
}

#[test]
fn gpt_gradients_do_not_depend_on_the_thread_count() {
    for fused_attention in [false, true] {
        let one = gpt_pass(1, fused_attention);
        for threads in [2, 3] {
            assert!(gpt_pass(threads, fused_attention) == one, "{threads} threads give other bits than one (fused attention {fused_attention})");
        }
    }
}

/// The CPU's tanh (f32 polynomials, no libm call) against f64's tanh rounded to f32, over f32
/// bit patterns up to |x| = 12, every pattern around the switch between its two formulas and
/// around its largest error, and the edges: within 1 ulp everywhere (glibc's `tanhf` is off by
/// 2). Every pattern up to 10 was checked once, outside the suite.
#[test]
fn tanh_is_within_one_ulp_of_the_rounded_f64_tanh() {
    let dev = Device::cpu();
    let mut xs: Vec<f32> = (0..0x4140_0000u32).step_by(2003).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)]).collect();
    for around in [0.625f32, 3.521_117_3e-4] {
        xs.extend((around.to_bits() - 50_000..around.to_bits() + 50_000).map(f32::from_bits));
    }
    xs.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 9.0, 10.0, 10.5]);
    let got = Tensor::from_vec(xs.clone(), [xs.len()], &dev).unwrap().tanh().unwrap().to_vec().unwrap();
    for (&x, &t) in xs.iter().zip(&got) {
        let want = (x as f64).tanh() as f32;
        let ulps = (i64::from(t.to_bits() as i32) - i64::from(want.to_bits() as i32)).abs();
        assert!(ulps <= 1 || (t.is_nan() && want.is_nan()), "tanh({x:e}) = {t:e}, want {want:e}");
        assert!(t.is_sign_negative() == x.is_sign_negative() || x.is_nan(), "tanh({x:e}) has the wrong sign");
    }
}
