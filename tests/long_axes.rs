//! Axes longer than 65,535 on every device: Mesa's software drivers end any shader loop after
//! 65,535 iterations, silently, so every kernel whose loop grows with the data is checked past
//! it (reductions, matmul K, softmax and cross-entropy rows, im2col widths, optimizer length),
//! against exact values where they are known and the CPU reference otherwise. Also the NaN rules
//! of max/min/argmax (PyTorch's) and the CPU reference's accuracy on long sums.
mod common;

use common::*;
use tandem::backend::{MatmulSpec, OptimStep, ReduceOp, ReduceSpec, WindowSpec};
use tandem::nn::{Linear, Module};
use tandem::{DType, Device, Result, Tensor};

/// Past the 65,535 iterations a loop may run on lavapipe and llvmpipe.
const LONG: usize = 70_000;

/// `op` over `x` laid out as `s` on `d`: values as f32 (argmax indices converted).
fn reduce_on(d: &Device, op: ReduceOp, x: &[f32], s: ReduceSpec) -> Result<Vec<f32>> {
    let out = d.backend().alloc(s.outer * s.inner, if op == ReduceOp::ArgMax { DType::I32 } else { DType::F32 })?;
    d.backend().reduce(op, &up(d, x), s, &out)?;
    Ok(if op == ReduceOp::ArgMax { down_i32(d, &out).into_iter().map(|i| i as f32).collect() } else { down(d, &out) })
}

#[test]
fn sum_all_of_200704_ones_is_exact() {
    on_each_device(|dev, _| {
        let got = Tensor::ones([200_704], dev)?.sum_all()?.to_scalar()?;
        assert_eq!(got, 200_704.0);
        let cols = Tensor::ones([LONG, 16], dev)?.sum(0, false)?.to_vec()?;
        assert_eq!(cols, vec![LONG as f32; 16]);
        Ok(())
    });
}

#[test]
fn every_reduction_past_65535_along_each_axis() {
    // The long axis last, in the middle and first.
    let specs = [
        ReduceSpec { outer: 3, len: LONG, inner: 1 },
        ReduceSpec { outer: 2, len: LONG, inner: 3 },
        ReduceSpec { outer: 1, len: LONG, inner: 16 },
        ReduceSpec { outer: 1, len: 300_001, inner: 1 },
    ];
    on_each_device(|dev, cpu| {
        for (n, s) in specs.into_iter().enumerate() {
            let mut x = uniform(&mut rng(500 + n as u64), s.outer * s.len * s.inner, 0.0, 1.0);
            // Extremes only past 65,535, each column's twice (argmax takes the first).
            for o in 0..s.outer {
                for i in 0..s.inner {
                    let at = |j: usize| (o * s.len + j) * s.inner + i;
                    let j = 66_000 + 37 * (o * s.inner + i);
                    x[at(j)] = 2.0;
                    x[at(j + 1000)] = 2.0;
                    x[at(j + 500)] = -1.0;
                }
            }
            for op in ReduceOp::ALL {
                let got = reduce_on(dev, op, &x, s)?;
                let want = reduce_on(cpu, op, &x, s)?;
                let what = format!("{op:?} over {s:?}");
                match op {
                    ReduceOp::Sum => assert_close(&what, &got, &want, 1e-3, 1e-5),
                    _ => assert_eq!(got, want, "{what}"),
                }
                let exact: Vec<f32> = (0..s.outer * s.inner)
                    .map(|k| match op {
                        ReduceOp::Sum => want[k],
                        ReduceOp::Max => 2.0,
                        ReduceOp::Min => -1.0,
                        ReduceOp::ArgMax => (66_000 + 37 * k) as f32,
                    })
                    .collect();
                assert_eq!(want, exact, "the CPU reference's {what}");
            }
        }
        Ok(())
    });
}

/// Long rows split over several dispatches by the binding limit (1 MiB: three rows of 70,000),
/// each through the multi-pass reduction.
#[cfg(feature = "wgpu")]
#[test]
fn long_reductions_split_under_a_small_binding_limit() {
    use tandem::backend::wgpu::{open_with, Options};
    let _guard = shared();
    let cpu = Device::cpu();
    let n = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
    for ordinal in 0..n {
        let dev = Device::from_backend(open_with(ordinal, Options { max_binding_bytes: Some(1 << 20), ..Default::default() }).expect("open_with"));
        for (i, s) in [ReduceSpec { outer: 8, len: LONG, inner: 1 }, ReduceSpec { outer: 3, len: LONG, inner: 2 }].into_iter().enumerate() {
            let x = uniform(&mut rng(120 + i as u64), s.outer * s.len * s.inner, -1.0, 1.0);
            for op in ReduceOp::ALL {
                let (got, want) = (reduce_on(&dev, op, &x, s).expect("device"), reduce_on(&cpu, op, &x, s).expect("cpu"));
                assert_close(&format!("{op:?} over {s:?} on {dev}"), &got, &want, 1e-3, 1e-5);
            }
        }
    }
}

#[test]
fn max_min_argmax_propagate_nan_as_pytorch() {
    let nan = f32::NAN;
    // (values, max, min, argmax): NaN wins max and min; argmax is the first NaN's index.
    let mut cases: Vec<(Vec<f32>, f32, f32, i32)> = vec![
        (vec![1.0, nan, 3.0], nan, nan, 1),
        (vec![nan, 5.0, nan], nan, nan, 0),
        (vec![-2.0, 7.0, nan], nan, nan, 2),
        (vec![f32::NEG_INFINITY, f32::NEG_INFINITY], f32::NEG_INFINITY, f32::NEG_INFINITY, 0),
        // Lengths that are multiples of 4 (read four at a time on wgpu): ties and NaN in a quad.
        (vec![4.0, 1.0, 4.0, 3.0], 4.0, 1.0, 0),
        (vec![2.0, 9.0, 0.0, 1.0, 5.0, 9.0, nan, nan], nan, nan, 6),
    ];
    // Long rows: the first NaN after the partition points of the multi-pass kernels, a larger
    // index NaN in an earlier part, and a 9.0 before either.
    let mut long = uniform(&mut rng(51), LONG, -1.0, 1.0);
    long[100] = 9.0;
    long[LONG - 3] = nan;
    long[LONG - 2] = 9.0;
    cases.push((long.clone(), nan, nan, (LONG - 3) as i32));
    long[66_000 + 1] = nan;
    cases.push((long.clone(), nan, nan, 66_001));
    long[256 * 7 + 3] = nan;
    cases.push((long, nan, nan, 256 * 7 + 3));
    let cpu = Device::cpu();
    let check = |d: &Device| -> Result<()> {
        for (x, max, min, arg) in &cases {
            let s = ReduceSpec { outer: 1, len: x.len(), inner: 1 };
            let what = format!("on {d}, {} values", x.len());
            assert_close(&format!("max {what}"), &reduce_on(d, ReduceOp::Max, x, s)?, &[*max], 0.0, 0.0);
            assert_close(&format!("min {what}"), &reduce_on(d, ReduceOp::Min, x, s)?, &[*min], 0.0, 0.0);
            assert_eq!(reduce_on(d, ReduceOp::ArgMax, x, s)?, [*arg as f32], "argmax {what}");
            // The same column along a middle axis.
            let wide: Vec<f32> = x.iter().flat_map(|&v| [0.5, v]).collect();
            let s2 = ReduceSpec { outer: 1, len: x.len(), inner: 2 };
            assert_eq!(reduce_on(d, ReduceOp::ArgMax, &wide, s2)?[1], *arg as f32, "argmax of a column {what}");
            assert_close(&format!("max of a column {what}"), &reduce_on(d, ReduceOp::Max, &wide, s2)?[1..], &[*max], 0.0, 0.0);
        }
        // Through the tensor API, whose min is -max(-x).
        let t = Tensor::from_vec(vec![1.0, nan, 3.0, 4.0, 5.0, 6.0], [2, 3], d)?;
        assert_close("tensor max", &t.max(1, false)?.to_vec()?, &[nan, 6.0], 0.0, 0.0);
        assert_close("tensor min", &t.min(1, false)?.to_vec()?, &[nan, 4.0], 0.0, 0.0);
        assert_eq!(t.argmax(1)?.to_vec_i32()?, [1, 2]);
        Ok(())
    };
    check(&cpu).expect("the CPU reference");
    on_each_device(|dev, _| check(dev));
}

/// Multiples of 1/4 in [-1/2, 1/2]: every product is a multiple of 1/16 and every partial sum
/// of up to 2^18 of them is exact in f32, so any summation order gives the same bits.
fn quarters(seed: u64, n: usize) -> Vec<f32> {
    use rand::Rng;
    let mut r = rng(seed);
    (0..n).map(|_| r.random_range(-2i32..=2) as f32 / 4.0).collect()
}

/// `op(A)·op(B)` on `d` with `A`, `B` as stored.
fn matmul_on(d: &Device, a: &[f32], b: &[f32], s: MatmulSpec) -> Result<Vec<f32>> {
    let out = d.backend().alloc(s.batch * s.m * s.n, DType::F32)?;
    d.backend().matmul(&up(d, a), &up(d, b), &out, s)?;
    Ok(down(d, &out))
}

#[test]
fn matmul_with_k_past_65535() {
    let spec = |m, n, k, trans_a, trans_b, batch| MatmulSpec {
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
        a_offset: 0,
        b_offset: 0,
        a_batch_stride: if batch > 1 { m * k } else { 0 },
        b_batch_stride: if batch > 1 { k * n } else { 0 },
    };
    let specs = [
        spec(3, 5, LONG, false, false, 1),
        spec(2, 3, 300_000, false, false, 1),
        // A Linear weight gradient over LONG rows: grad_yᵀ · x, A transposed.
        spec(4, 8, LONG, true, false, 1),
        spec(5, 4, LONG, false, true, 1),
        spec(3, 4, LONG, true, true, 2),
    ];
    on_each_device(|dev, cpu| {
        for (i, s) in specs.into_iter().enumerate() {
            let a = quarters(60 + i as u64, s.batch * s.m * s.k);
            let b = quarters(70 + i as u64, s.batch * s.k * s.n);
            let mut exact = vec![0.0f64; s.batch * s.m * s.n];
            for z in 0..s.batch {
                for r in 0..s.m {
                    for c in 0..s.n {
                        exact[(z * s.m + r) * s.n + c] = (0..s.k)
                            .map(|kk| {
                                let av = if s.trans_a { a[z * s.m * s.k + kk * s.m + r] } else { a[z * s.m * s.k + r * s.k + kk] };
                                let bv = if s.trans_b { b[z * s.k * s.n + c * s.k + kk] } else { b[z * s.k * s.n + kk * s.n + c] };
                                f64::from(av) * f64::from(bv)
                            })
                            .sum();
                    }
                }
            }
            let exact: Vec<f32> = exact.into_iter().map(|v| v as f32).collect();
            assert_close(&format!("matmul {s:?} on the CPU"), &matmul_on(cpu, &a, &b, s)?, &exact, 0.0, 0.0);
            assert_close(&format!("matmul {s:?}"), &matmul_on(dev, &a, &b, s)?, &exact, 0.0, 0.0);
        }
        Ok(())
    });
}

#[test]
fn linear_gradients_over_70000_rows() {
    on_each_device(|dev, cpu| {
        let x = quarters(80, LONG * 4);
        let grads = |d: &Device| -> Result<(Vec<f32>, Vec<f32>)> {
            let lin = Linear::new(4, 3, &mut rng(81), d)?;
            lin.forward(&Tensor::from_vec(x.clone(), [LONG, 4], d)?)?.sum_all()?.backward()?;
            let (w, b) = (lin.weight.grad(), lin.bias.as_ref().and_then(Tensor::grad));
            Ok((w.expect("weight grad").to_vec()?, b.expect("bias grad").to_vec()?))
        };
        let (gw, gb) = grads(dev)?;
        // d(sum y)/dW[o, i] = sum over rows of x[r, i]; d/db[o] = the row count.
        let col_sums: Vec<f32> = (0..4).map(|i| (0..LONG).map(|r| f64::from(x[r * 4 + i])).sum::<f64>() as f32).collect();
        let want_w: Vec<f32> = (0..3).flat_map(|_| col_sums.clone()).collect();
        assert_close("weight gradient", &gw, &want_w, 0.0, 0.0);
        assert_eq!(gb, vec![LONG as f32; 3], "bias gradient");
        assert_eq!(grads(cpu)?, (want_w, gb), "the CPU reference");
        Ok(())
    });
}

#[test]
fn softmax_and_cross_entropy_over_70000_rows() {
    let labels: Vec<i32> = (0..LONG).map(|r| (r * 7 % 10) as i32).collect();
    let ln10 = 10f64.ln() as f32;
    let cpu = Device::cpu();
    let uniform_loss = |d: &Device| -> Result<f32> {
        let logits = Tensor::zeros([LONG, 10], d)?;
        logits.cross_entropy(&Tensor::from_labels(labels.clone(), [LONG], d)?)?.to_scalar()
    };
    assert_close("CPU cross-entropy of uniform logits", &[uniform_loss(&cpu).expect("cpu")], &[ln10], 0.0, 1e-6);
    on_each_device(|dev, _| {
        assert_close("cross-entropy of uniform logits", &[uniform_loss(dev)?], &[ln10], 0.0, 1e-5);
        // Softmax along the long axis: every entry is 1 / 70000.
        let p = Tensor::zeros([LONG, 3], dev)?.softmax(0)?.to_vec()?;
        assert_close("softmax over 70000 rows", &p, &vec![1.0 / LONG as f32; LONG * 3], 0.0, 1e-4);
        Ok(())
    });
}

/// Item 7 of issue 12: the oracle must be the accurate backend; sums of millions of values
/// and a cross-entropy over 70,000 rows match f64 to 1e-6 relative on the CPU reference (the
/// devices, summing in f32, to 1e-5).
#[test]
fn long_sums_match_f64() {
    let x = uniform(&mut rng(90), 3_000_000, 0.0, 1.0);
    let sum64: f64 = x.iter().map(|&v| f64::from(v)).sum();
    let logits = uniform(&mut rng(91), LONG * 10, -4.0, 4.0);
    let labels: Vec<i32> = (0..LONG).map(|r| (r * 3 % 10) as i32).collect();
    let ce64 = (0..LONG)
        .map(|r| {
            let row: Vec<f64> = logits[r * 10..][..10].iter().map(|&v| f64::from(v)).collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            lse - row[labels[r] as usize]
        })
        .sum::<f64>()
        / LONG as f64;
    // The CPU reference sums in f64; the devices' f32 partial sums of 256 come within 1e-5.
    let check = |d: &Device, rtol: f32| -> Result<()> {
        let s = Tensor::from_vec(x.clone(), [x.len()], d)?.sum_all()?.to_scalar()?;
        assert_close(&format!("3M-element sum on {d}"), &[s], &[sum64 as f32], 0.0, rtol);
        let l = Tensor::from_vec(logits.clone(), [LONG, 10], d)?;
        let ce = l.cross_entropy(&Tensor::from_labels(labels.clone(), [LONG], d)?)?.to_scalar()?;
        assert_close(&format!("cross-entropy over 70000 rows on {d}"), &[ce], &[ce64 as f32], 0.0, rtol);
        Ok(())
    };
    check(&Device::cpu(), 1e-6).expect("the CPU reference");
    on_each_device(|dev, _| check(dev, 1e-5));
}

#[test]
fn im2col_and_col2im_wider_than_65535() {
    // (width, window width, padding): the scalar, vec4 and vec4-quad im2col kernels.
    let shapes = [(LONG, 3, 0), (LONG + 2, 3, 0), (LONG, 3, 1)];
    on_each_device(|dev, cpu| {
        for (i, &(w, kw, pad)) in shapes.iter().enumerate() {
            let s = WindowSpec::new("test", [1, 2, 2, w], (1, kw), (1, 1), (0, pad)).expect("valid window");
            assert!(s.ow > 65_535, "{s:?}");
            im2col_and_col2im_against_cpu(dev, cpu, s, 100 + i as u64)?;
        }
        Ok(())
    });
}

#[test]
fn optimizer_step_past_65535_and_the_dispatch_limit() {
    // More 256-wide workgroups than one grid dimension allows.
    let n = 65_535 * 256 + 1000;
    let mut r = rng(110);
    let (p0, g) = (uniform(&mut r, n, -1.0, 1.0), uniform(&mut r, n, -1.0, 1.0));
    let (lr, momentum, wd) = (0.5, 0.9, 0.25);
    let step = OptimStep::Sgd { lr, momentum, dampening: 0.0, nesterov: true, weight_decay: wd, first: true };
    // PyTorch's first Nesterov step: buf = g + wd·p; p -= lr·(buf + momentum·buf).
    let buf: Vec<f32> = (0..n).map(|i| g[i] + wd * p0[i]).collect();
    let want: Vec<f32> = (0..n).map(|i| p0[i] - lr * (buf[i] + momentum * buf[i])).collect();
    let _heavy = exclusive();
    for dev in devices_under_test() {
        let (p, s0) = (up(&dev, &p0), dev.backend().alloc(n, DType::F32).expect("alloc"));
        assert!(dev.backend().optim_step(step, &p, &up(&dev, &g), &[&s0]).expect("step"), "the fused path is taken");
        assert_close(&format!("sgd parameters on {dev}"), &down(&dev, &p), &want, 1e-6, 1e-6);
        assert_close(&format!("sgd momentum on {dev}"), &down(&dev, &s0), &buf, 1e-6, 1e-6);
    }
}
