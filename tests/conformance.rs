//! Conformance: every op on every device (except the CPU reference) against the CPU reference,
//! on the same seeded inputs.
mod common;

use common::*;
use tandem::backend::{BinaryOp, IndexOp, MatmulSpec, OptimStep, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use tandem::{DType, Device, Layout, Result, Shape};

#[test]
fn round_trip_is_bit_exact() {
    on_each_device(|dev, _| {
        let f = [0.0f32, -0.0, 1.5, f32::MIN_POSITIVE / 4.0, f32::INFINITY, f32::NEG_INFINITY, f32::from_bits(0x7fc0_1234)];
        let b = up(dev, &f);
        let back = down(dev, &b);
        assert_eq!(back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), f.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        let i = [0i32, -1, i32::MIN, i32::MAX, 7];
        assert_eq!(down_i32(dev, &up_i32(dev, &i)), i);
        Ok(())
    });
}

#[test]
fn zero_length_buffers_work() {
    on_each_device(|dev, _| {
        let be = dev.backend();
        let e = be.alloc(0, DType::F32)?;
        assert!(be.download(&e)?.is_empty());
        let u = be.upload(&[], DType::I32)?;
        assert!(be.download(&u)?.is_empty());
        be.fill(&e, 3.0)?;
        be.copy(&e, 0, &u, 0, 0)?;
        be.unary(UnaryOp::Exp, &e, &layout(&[0, 3], &[3, 1], 0), &e)?;
        be.reduce(ReduceOp::Sum, &e, ReduceSpec { outer: 0, len: 4, inner: 1 }, &e)?;
        be.matmul(&e, &e, &e, MatmulSpec::new(1, 0, 0, 5))?;
        be.sync()
    });
}

#[test]
fn unary_every_op_contiguous_and_strided() {
    let mut r = rng(1);
    let signed = uniform(&mut r, 2 * 3 * 5 * 7, -3.0, 3.0);
    let positive = uniform(&mut r, 2 * 3 * 5 * 7, 0.05, 4.0);
    // contiguous; permuted (a transposed view); narrowed with an offset; broadcast (stride 0);
    // contiguous with 4 | numel at an aligned and a misaligned offset (the wgpu backend's
    // four-per-invocation kernel and its scalar fallback).
    let layouts = [
        layout(&[2, 3, 5, 7], &[105, 35, 7, 1], 0),
        layout(&[3, 4, 8], &[32, 8, 1], 4),
        layout(&[2, 4, 8], &[32, 8, 1], 2),
        layout(&[5, 20], &[20, 1], 0),
        layout(&[7, 5, 3, 2], &[1, 7, 35, 105], 0),
        layout(&[2, 4, 7], &[105, 7, 1], 36),
        layout(&[4, 3, 7], &[0, 35, 1], 1),
    ];
    on_each_device(|dev, cpu| {
        for op in UnaryOp::ALL {
            let input = if matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Powf(_)) { &positive } else { &signed };
            for l in &layouts {
                same_f32(dev, cpu, &format!("unary {op:?} {l:?}"), 1e-5, 1e-5, |d| {
                    let x = up(d, input);
                    let out = d.backend().alloc(l.numel(), DType::F32)?;
                    d.backend().unary(op, &x, l, &out)?;
                    Ok(down(d, &out))
                })?;
            }
        }
        Ok(())
    });
}

#[test]
fn unary_in_place() {
    on_each_device(|dev, _| {
        let x = up(dev, &[1.0, -2.0, 3.0]);
        dev.backend().unary(UnaryOp::Neg, &x, &layout(&[3], &[1], 0), &x)?;
        assert_eq!(down(dev, &x), [-1.0, 2.0, -3.0]);
        Ok(())
    });
}

#[test]
fn binary_every_op_broadcast_and_strided() {
    let mut r = rng(2);
    // Small integers make Eq and Gt see ties; b stays away from 0 for Div.
    let a: Vec<f32> = uniform(&mut r, 200, -4.0, 4.0).iter().map(|x| x.round()).collect();
    let b: Vec<f32> = uniform(&mut r, 200, 0.5, 4.0).iter().zip(0..).map(|(x, i)| if i % 3 == 0 { -x.round() } else { x.round() }).collect();
    let cases = [
        (layout(&[4, 5, 6], &[30, 6, 1], 0), layout(&[4, 5, 6], &[30, 6, 1], 0)),
        (layout(&[4, 5, 6], &[6, 0, 1], 0), layout(&[4, 5, 6], &[0, 6, 1], 0)),
        (layout(&[4, 5, 6], &[1, 4, 20], 0), layout(&[4, 5, 6], &[30, 6, 1], 50)),
        (layout(&[3, 7], &[9, 1], 11), layout(&[3, 7], &[1, 3], 2)),
        (layout(&[4, 5, 6], &[30, 6, 1], 0), layout(&[4, 5, 6], &[0, 1, 0], 3)),
        (layout(&[4, 5, 6], &[30, 6, 1], 7), layout(&[4, 5, 6], &[5, 0, 20], 1)),
        (layout(&[2, 3, 2, 2, 2, 3], &[72, 24, 12, 6, 3, 1], 0), layout(&[2, 3, 2, 2, 2, 3], &[0, 1, 0, 3, 0, 6], 4)),
        // Innermost size a multiple of 4 (wgpu's four-per-invocation kernels): both contiguous;
        // a bias over the middle dimension; a row broadcast at an aligned offset; a misaligned a.
        (layout(&[4, 5, 8], &[40, 8, 1], 0), layout(&[4, 5, 8], &[40, 8, 1], 0)),
        (layout(&[4, 5, 8], &[40, 8, 1], 0), layout(&[4, 5, 8], &[0, 1, 0], 3)),
        (layout(&[4, 5, 8], &[40, 8, 1], 4), layout(&[4, 5, 8], &[0, 0, 1], 1)),
        (layout(&[4, 5, 8], &[40, 8, 1], 2), layout(&[4, 5, 8], &[0, 1, 0], 0)),
    ];
    on_each_device(|dev, cpu| {
        for op in BinaryOp::ALL {
            for (la, lb) in &cases {
                same_f32(dev, cpu, &format!("binary {op:?} {la:?} {lb:?}"), 1e-6, 1e-6, |d| {
                    let (x, y) = (up(d, &a), up(d, &b));
                    let out = d.backend().alloc(la.numel(), DType::F32)?;
                    d.backend().binary(op, &x, la, &y, lb, &out)?;
                    Ok(down(d, &out))
                })?;
            }
        }
        Ok(())
    });
}

#[test]
fn reduce_every_op_odd_shapes() {
    let specs = [
        ReduceSpec { outer: 3, len: 7, inner: 5 },
        ReduceSpec { outer: 1, len: 1001, inner: 1 },
        ReduceSpec { outer: 13, len: 1, inner: 3 },
        ReduceSpec { outer: 2, len: 0, inner: 3 },
        ReduceSpec { outer: 1, len: 9, inner: 257 },
    ];
    on_each_device(|dev, cpu| {
        for op in ReduceOp::ALL {
            for (j, s) in specs.into_iter().enumerate() {
                let x = uniform(&mut rng(300 + j as u64), s.outer * s.len * s.inner, -2.0, 2.0);
                let run = |d: &Device| -> Result<Vec<u8>> {
                    let xb = up(d, &x);
                    let out = d.backend().alloc(s.outer * s.inner, if op == ReduceOp::ArgMax { DType::I32 } else { DType::F32 })?;
                    d.backend().reduce(op, &xb, s, &out)?;
                    d.backend().download(&out)
                };
                let (got, want) = (run(dev)?, run(cpu)?);
                if op == ReduceOp::ArgMax {
                    assert_eq!(got, want, "argmax {s:?}");
                } else {
                    let f = |v: &[u8]| bytemuck::pod_collect_to_vec::<u8, f32>(v);
                    assert_close(&format!("reduce {op:?} {s:?}"), &f(&got), &f(&want), 1e-4, 1e-5);
                }
            }
        }
        // Ties: the first maximum wins.
        let x = up(dev, &[1.0, 3.0, 2.0, 3.0]);
        let out = dev.backend().alloc(1, DType::I32)?;
        dev.backend().reduce(ReduceOp::ArgMax, &x, ReduceSpec { outer: 1, len: 4, inner: 1 }, &out)?;
        assert_eq!(down_i32(dev, &out), [1]);
        Ok(())
    });
}

#[test]
fn matmul_odd_shapes_transposes_offsets_broadcast() {
    on_each_device(|dev, cpu| {
        let shapes = [(1, 1, 1), (7, 13, 9), (33, 65, 17), (64, 64, 64), (5, 8, 12), (70, 132, 36), (3, 4, 0), (130, 4, 260)];
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut s = MatmulSpec::new(1, m, n, k);
                s.trans_a = ta;
                s.trans_b = tb;
                matmul_case(dev, cpu, s, i as u64)?;
            }
        }
        // Batched with offsets, B broadcast (stride 0), aligned and unaligned.
        for (m, n, k, off) in [(9, 12, 8, 4), (9, 11, 7, 3), (16, 16, 16, 0), (10, 24, 7, 4)] {
            let mut s = MatmulSpec::new(3, m, n, k);
            s.a_offset = off;
            s.b_offset = off + 1 - off % 2;
            s.b_batch_stride = 0;
            matmul_case(dev, cpu, s, 7)?;
            s.b_offset = off;
            s.a_batch_stride = 0;
            s.b_batch_stride = k * n + 4;
            matmul_case(dev, cpu, s, 8)?;
        }
        // C = A·Bᵀ with N >= 64 (wgpu's 8×8-per-invocation kernel), edges in M and N.
        let mut s = MatmulSpec::new(2, 19, 70, 12);
        s.trans_b = true;
        matmul_case(dev, cpu, s, 11)?;
        // Large enough for wgpu's 16×4-per-invocation kernel, with edges in M and N, batched
        // with offsets.
        let mut s = MatmulSpec::new(3, 37, 136, 12);
        s.a_offset = 4;
        s.b_offset = 8;
        matmul_case(dev, cpu, s, 10)?;
        // Batches of A larger than wgpu's 64 KiB uniform stage for small A (4000 values per
        // entry: four entries per copy, so five entries take two copies), shared and transposed.
        // wgpu's uniform-A kernels (transposed A; an untransposed one takes the vec4 kernels,
        // K being a multiple of 4) by M and N: 40 and 20 the 24×2 block, 10 the 16×2 one, 6
        // with N = 136 the 8×4 one, 5 the 8×2 one.
        for (ta, a_bs, m, n) in [
            (false, 4000, 40, 8),
            (true, 4000, 40, 8),
            (false, 0, 40, 8),
            (false, 0, 10, 136),
            (true, 1000, 10, 136),
            (false, 0, 9, 8),
            (true, 2000, 20, 12),
            (true, 0, 6, 136),
            (true, 500, 5, 8),
        ] {
            let mut s = MatmulSpec::new(5, m, n, 100);
            s.trans_a = ta;
            s.a_batch_stride = a_bs;
            matmul_case(dev, cpu, s, 9)?;
        }
        Ok(())
    });
}

fn windows() -> Vec<WindowSpec> {
    [
        ([2, 3, 7, 6], (3, 3), (1, 1), (1, 1)),
        ([1, 2, 9, 8], (2, 3), (2, 2), (0, 1)),
        ([3, 4, 5, 5], (1, 1), (1, 1), (0, 0)),
        ([2, 2, 7, 7], (3, 3), (2, 2), (1, 1)),
        ([1, 1, 3, 3], (2, 2), (1, 1), (2, 2)),
        ([2, 3, 8, 6], (2, 2), (2, 2), (0, 0)),
        // 2×2 tiles over rows of whole vec4s: wgpu's two-outputs-per-invocation pooling.
        ([2, 3, 6, 8], (2, 2), (2, 2), (0, 0)), // Horizontal stride 1 over rows of whole vec4s (wgpu's `im2col_s1`): padding rows and
        // columns, a window starting left of the row (x0 = -2), vertical stride 2.
        ([2, 3, 6, 8], (3, 3), (1, 1), (1, 1)),
        ([1, 2, 5, 12], (3, 5), (2, 1), (0, 2)),
        ([2, 1, 4, 4], (1, 1), (1, 1), (0, 0)),
    ]
    .iter()
    .map(|&(s, k, st, p)| WindowSpec::new("test", s, k, st, p).expect("valid window"))
    .collect()
}

#[test]
fn im2col_and_col2im() {
    on_each_device(|dev, cpu| {
        for (i, s) in windows().into_iter().enumerate() {
            im2col_and_col2im_against_cpu(dev, cpu, s, 10 + i as u64)?;
        }
        Ok(())
    });
}

#[test]
fn max_pool_forward_and_backward() {
    on_each_device(|dev, cpu| {
        for (i, s) in windows().into_iter().enumerate() {
            let mut r = rng(20 + i as u64);
            let mut x = uniform(&mut r, s.n * s.c * s.h * s.w, -1.0, 1.0);
            if i % 2 == 0 {
                // Values in {-1, 0, 1}: ties in most windows, so the first maximum must win.
                x.iter_mut().for_each(|v| *v = v.round());
            }
            let outs = s.n * s.c * s.oh * s.ow;
            let g = uniform(&mut r, outs, -1.0, 1.0);
            let run = |d: &Device| -> Result<(Vec<f32>, Vec<i32>, Vec<f32>)> {
                let be = d.backend();
                let (xb, out, arg) = (up(d, &x), be.alloc(outs, DType::F32)?, be.alloc(outs, DType::I32)?);
                be.max_pool2d(&xb, &out, &arg, s)?;
                let gx = up(d, &x);
                be.max_pool2d_backward(&up(d, &g), &arg, &gx, s)?;
                Ok((down(d, &out), down_i32(d, &arg), down(d, &gx)))
            };
            let (got, want) = (run(dev)?, run(cpu)?);
            assert_close(&format!("max_pool2d {s:?}"), &got.0, &want.0, 0.0, 0.0);
            assert_eq!(got.1, want.1, "max_pool2d argmax {s:?}");
            assert_close(&format!("max_pool2d_backward {s:?}"), &got.2, &want.2, 1e-6, 1e-6);
        }
        Ok(())
    });
}

#[test]
fn index_gather_scatter_ignore_out_of_range_labels() {
    let (rows, cols) = (9, 5);
    let labels = [0i32, 4, -1, 5, 2, 100, 3, 1, i32::MIN];
    let x = uniform(&mut rng(30), rows * cols, -1.0, 1.0);
    on_each_device(|dev, cpu| {
        for (op, xn, on) in [(IndexOp::Gather, rows * cols, rows), (IndexOp::Scatter, rows, rows * cols)] {
            same_f32(dev, cpu, &format!("index {op:?}"), 0.0, 0.0, |d| {
                let (xb, ib) = (up(d, &x[..xn]), up_i32(d, &labels));
                let out = up(d, &vec![7.0; on]);
                d.backend().index(op, &xb, &ib, &out, rows, cols)?;
                Ok(down(d, &out))
            })?;
        }
        Ok(())
    });
}

#[test]
fn fill_and_copy_with_offsets() {
    on_each_device(|dev, cpu| {
        same_f32(dev, cpu, "fill/copy", 0.0, 0.0, |d| {
            let be = d.backend();
            let a = up(d, &(0..100).map(|i| i as f32).collect::<Vec<_>>());
            let b = be.alloc(70, DType::F32)?;
            be.fill(&b, 0.0)?;
            be.fill(&b, -2.5)?;
            be.copy(&a, 3, &b, 5, 61)?;
            // Overlapping copies within one buffer behave like memmove, forwards and backwards
            // (CUDA stages them through a temporary, wgpu through a scratch buffer).
            be.copy(&b, 5, &b, 9, 30)?;
            be.copy(&b, 20, &b, 13, 40)?;
            be.copy(&b, 7, &b, 7, 10)?;
            Ok(down(d, &b))
        })?;
        let i = dev.backend().alloc(5, DType::I32)?;
        dev.backend().fill(&i, 7.9)?;
        assert_eq!(down_i32(dev, &i), [7; 5]);
        Ok(())
    });
}

#[test]
fn optim_step_matches_composed_update() {
    let n = 1000;
    let mut r = rng(40);
    let p0 = uniform(&mut r, n, -1.0, 1.0);
    let grads: Vec<Vec<f32>> = (0..3).map(|_| uniform(&mut r, n, -1.0, 1.0)).collect();
    let sgd = |momentum, nesterov, first| OptimStep::Sgd { lr: 0.1, momentum, dampening: 0.1, nesterov, weight_decay: 0.01, first };
    let adam = |decoupled, step| OptimStep::Adam { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.05, decoupled, step };
    let runs: Vec<Vec<OptimStep>> = vec![
        (0..3).map(|_| sgd(0.0, false, false)).collect(),
        (0..3).map(|i| sgd(0.9, false, i == 0)).collect(),
        (0..3).map(|i| sgd(0.9, true, i == 0)).collect(),
        (1..4).map(|t| adam(false, t)).collect(),
        (1..4).map(|t| adam(true, t)).collect(),
    ];
    on_each_device(|dev, _| {
        let be = dev.backend();
        for steps in &runs {
            let (mut p, mut s0, mut s1) = (p0.clone(), vec![0.0; n], vec![0.0; n]);
            let (pb, s0b, s1b) = (up(dev, &p0), up(dev, &s0), up(dev, &s1));
            for (step, g) in steps.iter().zip(&grads) {
                host_step(*step, &mut p, g, &mut s0, &mut s1);
                assert!(be.optim_step(*step, &pb, &up(dev, g), &[&s0b, &s1b])?, "the fused path is taken");
            }
            assert_close(&format!("optim {:?}", steps[0]), &down(dev, &pb), &p, 1e-6, 1e-5);
            assert_close(&format!("optim state {:?}", steps[0]), &down(dev, &s0b), &s0, 1e-6, 1e-5);
        }
        let missing = be.optim_step(adam(false, 1), &up(dev, &p0), &up(dev, &p0), &[]);
        assert!(matches!(missing, Err(tandem::Error::Invalid { .. })), "Adam without state is an error");
        Ok(())
    });
}

#[test]
fn dispatches_past_the_workgroup_count_limit() {
    // More 256-wide workgroups than the 65535 a grid dimension allows.
    let n = 65_535 * 256 + 1000;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    on_each_device(|dev, _| {
        let be = dev.backend();
        let xb = up(dev, &x);
        be.unary(UnaryOp::Affine { mul: 2.0, add: 1.0 }, &xb, &layout(&[n], &[1], 0), &xb)?;
        let got = down(dev, &xb);
        let bad = (0..n).find(|&i| got[i] != (i % 1000) as f32 * 2.0 + 1.0);
        assert_eq!(bad, None, "first wrong element");
        // Reduce launches 64-wide workgroups, one output each.
        let outer = 65_535 * 64 + 7;
        let out = be.alloc(outer, DType::F32)?;
        be.reduce(ReduceOp::Max, &xb, ReduceSpec { outer, len: 2, inner: 1 }, &out)?;
        let got = down(dev, &out);
        let want = |o: usize| ((2 * o) % 1000).max((2 * o + 1) % 1000) as f32 * 2.0 + 1.0;
        assert_eq!((0..outer).find(|&o| got[o] != want(o)), None, "first wrong reduction");
        Ok(())
    });
}

#[test]
fn memory_stats_pool_and_out_of_memory() {
    on_each_device(|dev, _| {
        let be = dev.backend();
        let before = be.memory();
        let b = be.alloc(1000, DType::F32)?;
        let during = be.memory();
        assert!(during.in_use >= before.in_use + 4000 && during.peak >= during.in_use);
        drop(b);
        let after = be.memory();
        assert!(after.pooled >= 4000 && after.in_use + 4000 <= during.in_use);
        let huge = be.alloc(1 << 44, DType::F32);
        assert!(matches!(huge, Err(tandem::Error::OutOfMemory { requested, .. }) if requested == 1 << 46), "{huge:?}");
        Ok(())
    });
}

/// `Backend::release` (ZeRO-3 between uses of a parameter) gives a buffer's memory back while
/// its handle lives: ops on it are clear errors, another allocation takes the memory, and
/// `restore` gives the buffer memory of its own again. Every device releases (CPU, wgpu, CUDA).
#[test]
fn release_and_restore() {
    on_each_device(|dev, _| {
        let be = dev.backend();
        let v: Vec<f32> = (0..70_001).map(|i| i as f32 * 0.5).collect();
        let b = up(dev, &v);
        let held = be.memory().in_use;
        assert!(be.release(&b)?, "{} keeps released memory", dev.spec());
        assert!(be.release(&b)?, "releasing twice does nothing");
        assert!(be.memory().in_use + 4 * 70_001 <= held, "released bytes leave in_use");
        let err = be.download(&b).unwrap_err().to_string();
        assert!(err.contains("released"), "{err}");
        let out = be.alloc(70_001, DType::F32)?;
        let wrong = be.unary(UnaryOp::Neg, &b, &Layout::contiguous(&Shape::new([70_001])), &out);
        assert!(matches!(wrong, Err(tandem::Error::Invalid { .. })), "an op on a released buffer: {wrong:?}");
        be.fill(&out, 3.0)?;
        assert!(be.restore(&b)?);
        assert!(be.restore(&b)?, "restoring a buffer that holds memory does nothing");
        be.write_at(&b, 0, &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>())?;
        assert_eq!(down(dev, &b), v);
        assert_eq!(down(dev, &out), vec![3.0; 70_001], "the buffer that took the memory is untouched");
        Ok(())
    });
}

#[test]
fn devices_on_one_adapter_are_independent() {
    let _guard = shared();
    for info in Device::list().into_iter().filter(|i| i.backend == tandem::BackendKind::Wgpu) {
        let a = Device::open(info.backend, info.ordinal).expect("open a");
        let b = Device::open(info.backend, info.ordinal).expect("open b");
        let xa = up(&a, &[1.0, 2.0]);
        let xb = up(&b, &[3.0]);
        assert_eq!(down(&a, &xa), [1.0, 2.0]);
        assert_eq!(down(&b, &xb), [3.0]);
        let wrong = b.backend().unary(UnaryOp::Neg, &xa, &Layout::contiguous(&Shape::new([2])), &xb);
        assert!(matches!(wrong, Err(tandem::Error::Invalid { .. })), "a foreign buffer is rejected");
    }
}

#[test]
fn the_tolerance_helper_rejects_wrong_values() {
    assert_close("ok", &[1.0, f32::NAN, 100.0], &[1.0, f32::NAN, 100.5], 0.0, 0.01);
    for (got, want) in [([1.1f32], [1.0f32]), ([f32::NAN], [1.0]), ([1.0], [f32::INFINITY])] {
        let r = std::panic::catch_unwind(|| assert_close("bad", &got, &want, 1e-3, 1e-3));
        assert!(r.is_err(), "{got:?} passed against {want:?}");
    }
}
