//! wgpu-specific limits: operands past the storage binding limit are split into sub-range
//! dispatches, the hardware matmul kernel is checked on any adapter, and memory budgets hold.
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use tandem::backend::wgpu::{has_subgroups_of_8, open_with, Options};
use tandem::backend::{BinaryOp, IndexOp, MatmulSpec, OptimStep, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use tandem::{DType, Device, Result};

/// Every wgpu adapter opened with `options`.
fn devices(options: Options) -> Vec<Device> {
    let n = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
    (0..n).map(|i| Device::from_backend(open_with(i, options.clone()).expect("open_with"))).collect()
}

#[test]
fn every_op_splits_under_a_small_binding_limit() {
    let _guard = shared();
    let cpu = Device::cpu();
    let mut r = rng(50);
    let x = uniform(&mut r, 5000, 0.1, 2.0);
    for dev in devices(Options { max_binding_bytes: Some(4096), ..Default::default() }) {
        let check = |op: &str, f: &dyn Fn(&Device) -> Result<Vec<f32>>| {
            let (got, want) = (f(&dev).unwrap_or_else(|e| panic!("{op} on {dev}: {e}")), f(&cpu).expect("cpu"));
            assert_close(op, &got, &want, 1e-5, 1e-5);
        };
        check("unary contiguous", &|d| {
            let (xb, out) = (up(d, &x), d.backend().alloc(4990, DType::F32)?);
            d.backend().unary(UnaryOp::Exp, &xb, &layout(&[4990], &[1], 7), &out)?;
            Ok(down(d, &out))
        });
        check("binary broadcast", &|d| {
            let (xb, out) = (up(d, &x), d.backend().alloc(4000, DType::F32)?);
            d.backend().binary(BinaryOp::Mul, &xb, &layout(&[100, 40], &[40, 1], 3), &xb, &layout(&[100, 40], &[0, 1], 0), &out)?;
            Ok(down(d, &out))
        });
        check("fill", &|d| {
            let b = d.backend().alloc(5000, DType::F32)?;
            d.backend().fill(&b, 1.25)?;
            Ok(down(d, &b))
        });
        check("reduce", &|d| {
            let out = d.backend().alloc(1000, DType::F32)?;
            d.backend().reduce(ReduceOp::Sum, &up(d, &x), ReduceSpec { outer: 500, len: 5, inner: 2 }, &out)?;
            Ok(down(d, &out))
        });
        check("matmul batches", &|d| {
            let mut s = MatmulSpec::new(30, 8, 8, 8);
            s.a_offset = 5;
            s.b_batch_stride = 0;
            let out = d.backend().alloc(30 * 64, DType::F32)?;
            d.backend().matmul(&up(d, &x), &up(d, &x), &out, s)?;
            Ok(down(d, &out))
        });
        check("im2col", &|d| {
            let s = WindowSpec::new("t", [12, 2, 6, 6], (3, 3), (1, 1), (1, 1))?;
            let cols = d.backend().alloc(12 * 18 * 36, DType::F32)?;
            d.backend().im2col(&up(d, &x), &cols, s)?;
            let back = d.backend().alloc(12 * 72, DType::F32)?;
            d.backend().col2im(&cols, &back, s)?;
            Ok(down(d, &back))
        });
        check("max_pool", &|d| {
            let s = WindowSpec::new("t", [10, 3, 8, 8], (2, 2), (2, 2), (0, 0))?;
            let (out, arg) = (d.backend().alloc(480, DType::F32)?, d.backend().alloc(480, DType::I32)?);
            d.backend().max_pool2d(&up(d, &x), &out, &arg, s)?;
            let gx = d.backend().alloc(1920, DType::F32)?;
            d.backend().max_pool2d_backward(&out, &arg, &gx, s)?;
            Ok(down(d, &gx))
        });
        check("index", &|d| {
            let labels: Vec<i32> = (0..1500).map(|i| i % 4 - 1).collect();
            let out = d.backend().alloc(1500, DType::F32)?;
            d.backend().index(IndexOp::Gather, &up(d, &x), &up_i32(d, &labels), &out, 1500, 3)?;
            let sc = d.backend().alloc(4500, DType::F32)?;
            d.backend().index(IndexOp::Scatter, &out, &up_i32(d, &labels), &sc, 1500, 3)?;
            Ok(down(d, &sc))
        });
        check("gather_rows", &|d| {
            // a 6,000-byte table in two chunks, 1,500 ids (some outside) in several
            let ids: Vec<i32> = (0..1500).map(|i| (i * 7) % 520 - 10).collect();
            let out = d.backend().alloc(4500, DType::F32)?;
            d.backend().index(IndexOp::GatherRows { table_rows: 500 }, &up(d, &x[..1500]), &up_i32(d, &ids), &out, 1500, 3)?;
            Ok(down(d, &out))
        });
        check("optim", &|d| {
            let p = up(d, &x);
            let step = OptimStep::Sgd { lr: 0.5, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0, first: true };
            if !d.backend().optim_step(step, &p, &p, &[])? {
                d.backend().binary(BinaryOp::Mul, &p, &layout(&[5000], &[1], 0), &up(d, &[0.5]), &layout(&[5000], &[0], 0), &p)?;
            }
            Ok(down(d, &p))
        });
        let big = MatmulSpec::new(1, 64, 64, 64);
        let e = dev.backend().matmul(&up(&dev, &x), &up(&dev, &x), &dev.backend().alloc(4096, DType::F32).expect("alloc"), big);
        assert!(matches!(e, Err(tandem::Error::Invalid { op: "matmul", .. })), "an operand past the limit is a clear error: {e:?}");
        let strided = dev.backend().unary(UnaryOp::Neg, &up(&dev, &x), &layout(&[2, 2000], &[1, 2], 0), &up(&dev, &x));
        assert!(matches!(strided, Err(tandem::Error::Invalid { .. })), "a strided operand past the limit: {strided:?}");
    }
}

#[test]
fn elementwise_past_the_real_binding_limit() {
    let n = 40_000_000;
    let _guard = exclusive();
    for dev in devices(Options::default()) {
        let be = dev.backend();
        let b = be.alloc(n, DType::F32).expect("alloc 160 MB");
        be.fill(&b, 3.0).expect("fill");
        let x: Vec<f32> = (0..n).map(|i| (i % 4099) as f32).collect();
        let xb = up(&dev, &x);
        be.binary(BinaryOp::Add, &xb, &layout(&[n], &[1], 0), &b, &layout(&[n], &[1], 0), &b).expect("binary");
        be.unary(UnaryOp::Affine { mul: 2.0, add: 0.5 }, &b, &layout(&[n], &[1], 0), &b).expect("unary");
        let got = down(&dev, &b);
        let bad = (0..n).find(|&i| got[i] != (x[i] + 3.0) * 2.0 + 0.5);
        assert_eq!(bad, None, "first wrong element on {dev}");
    }
}

/// Under the forced hardware profile every product takes a `tiled_*` kernel: each transpose
/// combination, aligned (vec4 tile loads) and odd M, N, K and offsets (scalar loads, partial
/// tiles), batches with a shared B, one element, several 64×64 tiles.
#[test]
fn tiled_matmul_covers_every_transpose_and_edge() {
    let _guard = shared();
    let cpu = Device::cpu();
    for dev in devices(Options { hardware_profile: true, ..Default::default() }) {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            // The last two: one operand aligned for vec4 loads and the other not.
            let cases = [
                (1, 64, 64, 64, 0, 0),
                (2, 68, 132, 36, 4, 8),
                (3, 5, 7, 13, 3, 6),
                (2, 67, 33, 19, 1, 2),
                (1, 1, 1, 1, 0, 0),
                (1, 130, 4, 260, 8, 16),
                (2, 3, 70, 17, 0, 0),
                (1, 36, 44, 20, 2, 4),
                (1, 36, 44, 20, 4, 3),
            ];
            for (batch, m, n, k, a_off, b_off) in cases {
                let mut s = MatmulSpec::new(batch, m, n, k);
                (s.trans_a, s.trans_b) = (trans_a, trans_b);
                s.a_offset = a_off;
                s.b_offset = b_off;
                if batch == 2 {
                    s.b_batch_stride = 0;
                }
                matmul_case(&dev, &cpu, s, 60).unwrap_or_else(|e| panic!("{s:?} on {dev}: {e}"));
            }
        }
    }
}

/// The tiled kernels add the bias and apply the ReLU in their epilogue (never declining), over
/// transposes, edges and batches, and on the last slice of a K cut on the host.
#[test]
fn tiled_matmul_fuses_bias_and_relu() {
    let _guard = shared();
    let cpu = Device::cpu();
    for dev in devices(Options { hardware_profile: true, ..Default::default() }) {
        for case in [(2, 10, 25, 27, false), (1, 20, 64, 250, true), (3, 67, 9, 8, false), (1, 5, 6, 16_421, false)] {
            bias_relu_epilogue_case(&dev, &cpu, case, 63, "the tiled family");
        }
    }
}

#[test]
fn memory_budget_is_enforced() {
    let _guard = shared();
    for dev in devices(Options { memory_budget: Some(1 << 20), ..Default::default() }) {
        let a = dev.backend().alloc(200_000, DType::F32).expect("fits the budget");
        let e = dev.backend().alloc(100_000, DType::F32);
        assert!(matches!(e, Err(tandem::Error::OutOfMemory { .. })), "{e:?}");
        drop(a);
        dev.backend().alloc(200_000, DType::F32).expect("memory came back");
    }
}

#[test]
fn register_matmul_kernels_with_and_without_subgroups() {
    let _guard = shared();
    let cpu = Device::cpu();
    let n = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    // CI's lavapipe has 8-wide subgroups; losing them (a wgpu or Mesa change) loses the fast
    // matmul silently, so CI says so.
    assert!(!ci || (0..n).any(has_subgroups_of_8), "CI=true but no wgpu adapter offers subgroups of 8");
    for without_subgroups in [false, true] {
        for dev in devices(Options { without_subgroups, ..Default::default() }) {
            // Edges in M and N, batches with offsets, and a size with whole blocks: on an adapter
            // with subgroups of 8 these take `regs_sg32x2`, without them `regs16x4` and `regs`.
            for (batch, m, n, k, off) in [(3, 37, 136, 12, 4), (1, 64, 64, 64, 0), (2, 33, 68, 20, 8), (1, 100, 200, 36, 0), (1, 8, 64, 8, 0)] {
                let mut s = MatmulSpec::new(batch, m, n, k);
                s.a_offset = off;
                s.b_offset = 2 * off;
                matmul_case(&dev, &cpu, s, 61).unwrap_or_else(|e| panic!("{m}x{n}x{k} on {dev} (without_subgroups: {without_subgroups}): {e}"));
            }
            // C = A·Bᵀ (convolution weight gradients): with subgroups of 8, `tb_sg{8,16,24}x4`
            // by M, with edges in M and N; without, `tb8x8` and `generic_tb`.
            for (m, n) in [(5, 25), (10, 25), (20, 250), (16, 33), (37, 70), (24, 64)] {
                let mut s = MatmulSpec::new(2, m, n, 36);
                s.trans_b = true;
                s.a_offset = 4;
                s.b_offset = 8;
                matmul_case(&dev, &cpu, s, 62).unwrap_or_else(|e| panic!("{m}x{n} A·Bᵀ on {dev} (without_subgroups: {without_subgroups}): {e}"));
            }
        }
    }
}
