//! Every differentiable op's gradient against central finite differences, on the CPU reference.
mod fd;
use rand::Rng;
use std::sync::Arc;
use tandem::backend::{cpu::CpuBackend, BinaryOp, UnaryOp};
use tandem::{Device, Result, Tensor};

type F = dyn Fn(&[Tensor]) -> Result<Tensor>;

/// Checks d(sum(f(x) * r))/dx for random `r` against (L(x+h) - L(x-h)) / 2h on each input.
fn gradcheck(name: &str, shapes: &[&[usize]], f: &F) {
    gradcheck_with(name, shapes, f, |rng| rng.random_range(-1.0f32..1.0))
}

fn gradcheck_with(name: &str, shapes: &[&[usize]], f: &F, sample: impl Fn(&mut rand_chacha::ChaCha8Rng) -> f32) {
    fd::gradcheck_with(name, shapes, 7, f, sample)
}

#[test]
fn unary_ops() {
    for op in UnaryOp::ALL {
        if op == UnaryOp::Step {
            continue;
        }
        let name = format!("{op:?}");
        // positive and away from relu/abs kinks, where the derivative exists
        gradcheck_with(&name, &[&[3, 5]], &move |x| x[0].unary(op), |rng| {
            let v = rng.random_range(0.2f32..1.5);
            if op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Recip || matches!(op, UnaryOp::Powf(_)) || rng.random::<bool>() {
                v
            } else {
                -v
            }
        });
    }
}

/// Integer powers of negative bases (PyTorch's pow: defined, odd powers keep the sign).
#[test]
fn powf_of_negative_bases() {
    for p in [2.0, 3.0, -1.0, -2.0, -3.0] {
        gradcheck_with(&format!("powf({p})"), &[&[3, 5]], &move |x| x[0].powf(p), |rng| rng.random_range(-1.5f32..-0.4));
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    gradcheck("add", &[&[2, 3, 4], &[3, 1]], &|x| x[0].add(&x[1]));
    gradcheck("sub", &[&[4], &[2, 3, 4]], &|x| x[0].sub(&x[1]));
    gradcheck("mul", &[&[2, 3, 4], &[1, 3, 1]], &|x| x[0].mul(&x[1]));
    gradcheck_with("div", &[&[2, 3], &[3]], &|x| x[0].div(&x[1]), |rng| rng.random_range(0.5f32..2.0));
    gradcheck("maximum", &[&[3, 4], &[3, 4]], &|x| x[0].maximum(&x[1]));
    gradcheck("minimum", &[&[3, 4], &[4]], &|x| x[0].minimum(&x[1]));
    // ReLU's fused gradient, itself differentiable in its first operand; values away from 0.
    gradcheck_with("relu_backward", &[&[3, 4], &[4]], &|x| x[0].binary(BinaryOp::ReluBackward, &x[1]), |rng| {
        let v = rng.random_range(0.2f32..1.5);
        if rng.random::<bool>() {
            v
        } else {
            -v
        }
    });
}

#[test]
fn reductions() {
    gradcheck("sum0", &[&[3, 4, 2]], &|x| x[0].sum(0, false));
    gradcheck("sum1k", &[&[3, 4, 2]], &|x| x[0].sum(1, true));
    gradcheck("mean", &[&[3, 5]], &|x| x[0].mean(-1, false));
    gradcheck("max", &[&[4, 6]], &|x| x[0].max(1, false));
    gradcheck("min", &[&[4, 6]], &|x| x[0].min(0, true));
    gradcheck("sum_all", &[&[7]], &|x| x[0].sum_all());
}

#[test]
fn shape_ops() {
    gradcheck("reshape", &[&[2, 6]], &|x| x[0].reshape([3, 4]));
    gradcheck("permute", &[&[2, 3, 4]], &|x| x[0].permute(&[2, 0, 1]));
    gradcheck("broadcast_to", &[&[3, 1]], &|x| x[0].broadcast_to([2, 3, 4]));
    gradcheck("narrow0", &[&[5, 3]], &|x| x[0].narrow(0, 1, 3));
    gradcheck("narrow1", &[&[3, 5]], &|x| x[0].narrow(1, 2, 2));
    gradcheck("cat0", &[&[2, 3], &[1, 3]], &|x| Tensor::cat(&[x[0].clone(), x[1].clone()], 0));
    gradcheck("cat1", &[&[2, 3], &[2, 2]], &|x| Tensor::cat(&[x[0].clone(), x[1].clone()], 1));
}

#[test]
fn matmul_every_transpose() {
    gradcheck("mm", &[&[3, 4], &[4, 5]], &|x| x[0].matmul(&x[1]));
    gradcheck("mm_ta", &[&[4, 3], &[4, 5]], &|x| x[0].matmul_t(&x[1], true, false));
    gradcheck("mm_tb", &[&[3, 4], &[5, 4]], &|x| x[0].matmul_t(&x[1], false, true));
    gradcheck("mm_tab", &[&[4, 3], &[5, 4]], &|x| x[0].matmul_t(&x[1], true, true));
    gradcheck("bmm", &[&[2, 3, 4], &[2, 4, 2]], &|x| x[0].matmul(&x[1]));
    gradcheck("bmm_shared", &[&[2, 3, 4], &[5, 4]], &|x| x[0].matmul_t(&x[1], false, true));
}

#[test]
fn conv_and_pool() {
    gradcheck("conv", &[&[2, 2, 6, 5], &[3, 2, 3, 2]], &|x| x[0].conv2d(&x[1], (1, 1), (0, 0)));
    gradcheck("conv_stride_pad", &[&[1, 2, 5, 7], &[2, 2, 3, 3]], &|x| x[0].conv2d(&x[1], (2, 1), (1, 2)));
    // distinct values so the maximum is unique and the derivative exists
    gradcheck("max_pool", &[&[2, 2, 6, 7]], &|x| x[0].max_pool2d((2, 2), (2, 2), (0, 0)));
    gradcheck("max_pool_overlap", &[&[1, 2, 5, 5]], &|x| x[0].max_pool2d((3, 3), (1, 1), (1, 1)));
}

#[test]
fn losses_and_softmax() {
    let labels = || Tensor::from_labels(vec![2, 0, 4], [3], &Device::cpu()).unwrap();
    gradcheck("gather_rows", &[&[3, 5]], &move |x| x[0].gather_rows(&labels()));
    gradcheck("cross_entropy", &[&[3, 5]], &move |x| x[0].cross_entropy(&labels()));
    gradcheck("log_softmax", &[&[3, 4]], &|x| x[0].log_softmax(1));
    gradcheck("softmax0", &[&[3, 4]], &|x| x[0].softmax(0));
    gradcheck("mse", &[&[4, 1], &[4, 1]], &|x| x[0].mse_loss(&x[1]));
}

#[test]
fn across_devices() {
    let other = Device::from_backend(Arc::new(CpuBackend::new()));
    gradcheck("to", &[&[3, 2]], &move |x| x[0].to(&other)?.square()?.to(&Device::cpu()));
}
