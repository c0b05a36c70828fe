//! Tensor ops on the CPU reference against values computed by hand.
use tandem::tolerance::assert_close;
use tandem::{Device, Tensor};

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), &Device::cpu()).unwrap()
}
fn close(what: &str, x: &Tensor, want: &[f32]) {
    assert_close(what, &x.to_vec().unwrap(), want, 1e-6, 1e-6);
}

#[test]
fn elementwise_by_hand() {
    let x = t(&[-1.0, 0.0, 2.0, 4.0], &[2, 2]);
    close("relu", &x.relu().unwrap(), &[0.0, 0.0, 2.0, 4.0]);
    close("neg", &x.neg().unwrap(), &[1.0, -0.0, -2.0, -4.0]);
    close("square", &x.square().unwrap(), &[1.0, 0.0, 4.0, 16.0]);
    close("affine", &x.affine(2.0, 1.0).unwrap(), &[-1.0, 1.0, 5.0, 9.0]);
    close("exp", &x.exp().unwrap(), &[(-1f32).exp(), 1.0, 2f32.exp(), 4f32.exp()]);
    let p = t(&[1.0, 4.0, 9.0], &[3]);
    close("sqrt", &p.sqrt().unwrap(), &[1.0, 2.0, 3.0]);
    close("log", &p.log().unwrap(), &[0.0, 4f32.ln(), 9f32.ln()]);
    close("recip", &p.recip().unwrap(), &[1.0, 0.25, 1.0 / 9.0]);
    close("powf", &p.powf(1.5).unwrap(), &[1.0, 8.0, 27.0]);
    close("sigmoid", &t(&[0.0], &[1]).sigmoid().unwrap(), &[0.5]);
    close("tanh", &t(&[0.5], &[1]).tanh().unwrap(), &[0.5f32.tanh()]);
    // PyTorch's threshold: x itself above 20
    close("softplus", &t(&[0.0, -1.0, 25.0], &[3]).softplus().unwrap(), &[2f32.ln(), (-1f32).exp().ln_1p(), 25.0]);
}

#[test]
fn broadcasting_binary_by_hand() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let row = t(&[10.0, 20.0, 30.0], &[3]);
    let col = t(&[100.0, 200.0], &[2, 1]);
    close("add row", &a.add(&row).unwrap(), &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    close("sub col", &a.sub(&col).unwrap(), &[-99.0, -98.0, -97.0, -196.0, -195.0, -194.0]);
    close("mul", &a.mul(&row).unwrap(), &[10.0, 40.0, 90.0, 40.0, 100.0, 180.0]);
    close("div", &a.div(&col).unwrap(), &[0.01, 0.02, 0.03, 0.02, 0.025, 0.03]);
    close("outer", &col.add(&row).unwrap(), &[110.0, 120.0, 130.0, 210.0, 220.0, 230.0]);
    close("max", &a.maximum(&t(&[3.5], &[1])).unwrap(), &[3.5, 3.5, 3.5, 4.0, 5.0, 6.0]);
}

#[test]
fn reductions_by_hand() {
    let a = t(&[1.0, 5.0, 3.0, 4.0, 2.0, 6.0], &[2, 3]);
    close("sum0", &a.sum(0, false).unwrap(), &[5.0, 7.0, 9.0]);
    close("sum1", &a.sum(-1, true).unwrap(), &[9.0, 12.0]);
    close("mean", &a.mean_all().unwrap(), &[3.5]);
    close("max1", &a.max(1, false).unwrap(), &[5.0, 6.0]);
    close("min0", &a.min(0, false).unwrap(), &[1.0, 2.0, 3.0]);
    assert_eq!(a.argmax(1).unwrap().to_vec_i32().unwrap(), vec![1, 2]);
    // first maximum wins on ties, as in PyTorch
    assert_eq!(t(&[2.0, 7.0, 7.0], &[1, 3]).argmax(1).unwrap().to_vec_i32().unwrap(), vec![1]);
}

#[test]
fn matmul_and_transposes_by_hand() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
    close("ab", &a.matmul(&b).unwrap(), &[4.0, 5.0, 10.0, 11.0]);
    close("a aT", &a.matmul_t(&a, false, true).unwrap(), &[14.0, 32.0, 32.0, 77.0]);
    close("aT a", &a.matmul_t(&a, true, false).unwrap(), &[17.0, 22.0, 27.0, 22.0, 29.0, 36.0, 27.0, 36.0, 45.0]);
    close("t()", &a.t().unwrap(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let batched = Tensor::cat(&[a.reshape([1, 2, 3]).unwrap(), a.affine(2.0, 0.0).unwrap().reshape([1, 2, 3]).unwrap()], 0).unwrap();
    close("batch x shared", &batched.matmul(&b).unwrap(), &[4.0, 5.0, 10.0, 11.0, 8.0, 10.0, 20.0, 22.0]);
}

#[test]
fn conv_and_pool_by_hand() {
    // 1x1x3x3 input, 2x2 kernel of ones: each output sums a 2x2 window.
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[1, 1, 3, 3]);
    let w = t(&[1.0, 1.0, 1.0, 1.0], &[1, 1, 2, 2]);
    close("conv", &x.conv2d(&w, (1, 1), (0, 0)).unwrap(), &[12.0, 16.0, 24.0, 28.0]);
    close("conv pad", &x.conv2d(&w, (2, 2), (1, 1)).unwrap(), &[1.0, 5.0, 11.0, 28.0]);
    close("pool", &x.max_pool2d((2, 2), (1, 1), (0, 0)).unwrap(), &[5.0, 6.0, 8.0, 9.0]);
    close("pool floor", &x.max_pool2d((2, 2), (2, 2), (0, 0)).unwrap(), &[5.0]);
}

#[test]
fn losses_by_hand() {
    let logits = t(&[1.0, 2.0, 3.0, 1.0, 1.0, 1.0], &[2, 3]);
    let labels = Tensor::from_labels(vec![2, 0], [2], &Device::cpu()).unwrap();
    let lse0 = (1f32.exp() + 2f32.exp() + 3f32.exp()).ln();
    let want = ((lse0 - 3.0) + 3f32.ln()) / 2.0;
    close("cross_entropy", &logits.cross_entropy(&labels).unwrap(), &[want]);
    let sm = logits.softmax(1).unwrap().to_vec().unwrap();
    assert_close("softmax rows sum to 1", &[sm[0] + sm[1] + sm[2], sm[3] + sm[4] + sm[5]], &[1.0, 1.0], 1e-6, 0.0);
    let p = t(&[1.0, 2.0, 3.0], &[3, 1]);
    let y = t(&[0.0, 2.0, 5.0], &[3, 1]);
    close("mse", &p.mse_loss(&y).unwrap(), &[5.0 / 3.0]);
    // large logits stay finite
    let big = t(&[1000.0, 0.0], &[1, 2]);
    let l = big.cross_entropy(&Tensor::from_labels(vec![1], [1], &Device::cpu()).unwrap()).unwrap();
    close("stable", &l, &[1000.0]);
}

#[test]
fn shape_ops_by_hand() {
    let a = t(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    close("narrow1", &a.narrow(1, 1, 2).unwrap(), &[1.0, 2.0, 4.0, 5.0]);
    close("narrow0", &a.narrow(0, 1, 1).unwrap(), &[3.0, 4.0, 5.0]);
    close("cat1", &Tensor::cat(&[a.clone(), a.narrow(1, 0, 1).unwrap()], 1).unwrap(), &[0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 5.0, 3.0]);
    close("permute", &a.reshape([1, 2, 3]).unwrap().permute(&[2, 0, 1]).unwrap(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    close("broadcast", &t(&[1.0, 2.0], &[2, 1]).broadcast_to([2, 2]).unwrap(), &[1.0, 1.0, 2.0, 2.0]);
    assert_eq!(a.reshape([3, usize::MAX]).unwrap().dims(), &[3, 2]);
    let parts = a.split(&[1, 1]).unwrap();
    close("split", &parts[1], &[3.0, 4.0, 5.0]);
}

#[test]
fn gradients_accumulate_and_no_grad_records_nothing() {
    let w = t(&[1.0, 2.0], &[2]).requires_grad();
    w.square().unwrap().sum_all().unwrap().backward().unwrap();
    w.square().unwrap().sum_all().unwrap().backward().unwrap();
    close("accumulated", &w.grad().unwrap(), &[4.0, 8.0]);
    let y = tandem::autograd::no_grad(|| w.square().unwrap());
    assert!(!y.needs_grad());
    assert!(y.sum_all().unwrap().backward().is_err());
}

#[test]
fn autograd_works_from_several_threads() {
    let handles: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let w = t(&[i as f32, 1.0], &[2]).requires_grad();
                let y = tandem::autograd::no_grad(|| w.square().unwrap());
                assert!(!y.needs_grad());
                w.square().unwrap().sum_all().unwrap().backward().unwrap();
                w.grad().unwrap().to_vec().unwrap()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), vec![2.0 * i as f32, 2.0]);
    }
}

mod common;

/// `got` equals `want` as PyTorch compares edge values: NaN for NaN, the same infinity, the
/// same sign of zero, else within 1e-6 relative.
#[track_caller]
fn exactly(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() || g.is_nan() || w.is_infinite() || w == 0.0 {
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
        } else {
            (g - w).abs() <= 1e-6 * w.abs()
        };
        assert!(ok, "{what}[{i}]: got {g:?} ({:#010x}), PyTorch gives {w:?}", g.to_bits());
    }
}

/// Items 3 and 6 of issue 12 on the CPU reference and every device: powf of negative bases and
/// its special cases, NaN through ReLU, maximum/minimum, comparisons and max-pool.
#[test]
fn powf_and_nan_propagation_on_every_device() {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    common::on_every_device(|dev| {
        let on = |v: &[f32]| Tensor::from_vec(v.to_vec(), [v.len()], dev).unwrap();
        let run = |what: &str, y: Tensor, want: &[f32]| exactly(&format!("{what} on {dev}"), &y.to_vec().unwrap(), want);
        let x = on(&[-2.0, 2.0, -0.0, 0.0, nan, -inf, inf, -1.0]);
        run("powf(3)", x.powf(3.0).unwrap(), &[-8.0, 8.0, -0.0, 0.0, nan, -inf, inf, -1.0]);
        run("powf(2)", x.powf(2.0).unwrap(), &[4.0, 4.0, 0.0, 0.0, nan, inf, inf, 1.0]);
        run("powf(0)", x.powf(0.0).unwrap(), &[1.0; 8]);
        run("powf(-1)", x.powf(-1.0).unwrap(), &[-0.5, 0.5, -inf, inf, nan, -0.0, 0.0, -1.0]);
        run("powf(-2)", x.powf(-2.0).unwrap(), &[0.25, 0.25, inf, inf, nan, 0.0, 0.0, 1.0]);
        run("powf(0.5)", x.powf(0.5).unwrap(), &[nan, 2f32.sqrt(), -0.0, 0.0, nan, nan, inf, nan]);
        run("powf(1.5)", x.powf(1.5).unwrap(), &[nan, 8f32.sqrt(), 0.0, 0.0, nan, inf, inf, nan]);
        run("powf(-3)", x.powf(-3.0).unwrap(), &[-0.125, 0.125, -inf, inf, nan, -0.0, 0.0, -1.0]);
        run("powf(4)", x.powf(4.0).unwrap(), &[16.0, 16.0, 0.0, 0.0, nan, inf, inf, 1.0]);
        run("relu", x.relu().unwrap(), &[0.0, 2.0, -0.0, 0.0, nan, 0.0, inf, 0.0]);
        let a = on(&[1.0, nan, 3.0, -0.0, 0.0, 2.0, nan]);
        let b = on(&[0.0, 0.0, nan, 0.0, -0.0, 2.0, nan]);
        run("maximum", a.maximum(&b).unwrap(), &[1.0, nan, nan, 0.0, 0.0, 2.0, nan]);
        run("minimum", a.minimum(&b).unwrap(), &[0.0, nan, nan, -0.0, -0.0, 2.0, nan]);
        run("gt", a.gt(&b).unwrap(), &[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        run("eq", a.eq_elem(&b).unwrap(), &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]);
        // one 2×2 window [1, NaN; 3, 4] and one [5, 6; 7, NaN]: NaN wins and takes the gradient
        let img = Tensor::from_vec(vec![1.0, nan, 5.0, 6.0, 3.0, 4.0, 7.0, nan], [1, 1, 2, 4], dev).unwrap().requires_grad();
        let pooled = img.max_pool2d((2, 2), (2, 2), (0, 0)).unwrap();
        run("max_pool2d", pooled.clone(), &[nan, nan]);
        pooled.sum_all().unwrap().backward().unwrap();
        run("max_pool2d grad", img.grad().unwrap(), &[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        Ok(())
    });
}

/// PyTorch's gradients at the edges: relu passes the gradient at NaN, powf's at 0.
#[test]
fn relu_and_powf_gradients_at_the_edges_on_every_device() {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    common::on_every_device(|dev| {
        let grad = |v: &[f32], f: &dyn Fn(&Tensor) -> Tensor| {
            let x = Tensor::from_vec(v.to_vec(), [v.len()], dev).unwrap().requires_grad();
            f(&x).sum_all().unwrap().backward().unwrap();
            x.grad().unwrap().to_vec().unwrap()
        };
        let w = |what: &str| format!("{what} on {dev}");
        exactly(&w("relu'"), &grad(&[nan, -1.0, -0.0, 0.0, 2.0], &|x| x.relu().unwrap()), &[1.0, 0.0, 0.0, 0.0, 1.0]);
        exactly(&w("powf(1)'"), &grad(&[0.0, -2.0], &|x| x.powf(1.0).unwrap()), &[1.0, 1.0]);
        exactly(&w("powf(0.5)'"), &grad(&[0.0, 4.0], &|x| x.powf(0.5).unwrap()), &[inf, 0.25]);
        exactly(&w("powf(0)'"), &grad(&[0.0, nan, 3.0], &|x| x.powf(0.0).unwrap()), &[0.0, 0.0, 0.0]);
        exactly(&w("powf(3)'"), &grad(&[-2.0, 0.0], &|x| x.powf(3.0).unwrap()), &[12.0, 0.0]);
        let a = Tensor::from_vec(vec![1.0, nan, 2.0, 0.0], [4], dev).unwrap().requires_grad();
        let b = Tensor::from_vec(vec![0.0, 1.0, 2.0, 5.0], [4], dev).unwrap().requires_grad();
        a.maximum(&b).unwrap().sum_all().unwrap().backward().unwrap();
        exactly(&w("maximum' a"), &a.grad().unwrap().to_vec().unwrap(), &[1.0, 1.0, 0.5, 0.0]);
        exactly(&w("maximum' b"), &b.grad().unwrap().to_vec().unwrap(), &[0.0, 1.0, 0.5, 1.0]);
        Ok(())
    });
}
