//! The workgroup tree reductions of the hardware path (shaders/reduce.wgsl `tree`, `tree4`;
//! shaders/reduce_sg.wgsl `tree_sg`, `tree4_sg`) on every wgpu adapter opened with the hardware
//! profile, with and without subgroups (lavapipe's are 8 wide), against the CPU reference: rows
//! shorter and longer than a workgroup, lengths off multiples of 4, of 8 and of 256, past 65,535
//! and 2^20 elements, inner axes, empty axes, and NaN, ±inf and -0 where PyTorch's rules decide.
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use tandem::backend::wgpu::{open_with, qualified_spec, Options};
use tandem::backend::{ReduceOp, ReduceSpec};
use tandem::{DType, Device, Result};

/// Every wgpu adapter with the hardware kernels, with its subgroups and without them (wgpu's GL
/// backend has none: once there).
fn hardware_devices() -> Vec<Device> {
    let n = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
    let mut out = Vec::new();
    for i in 0..n {
        let gl = qualified_spec(i).is_some_and(|s| s.starts_with("gl:"));
        for without_subgroups in if gl { &[true][..] } else { &[false, true][..] } {
            let without_subgroups = *without_subgroups;
            let options = Options { hardware_profile: true, without_subgroups, ..Default::default() };
            let d = Device::from_backend(open_with(i, options).expect("open_with"));
            eprintln!("running the hardware reductions on {d} ({}), without_subgroups: {without_subgroups}", d.info().name);
            out.push(d);
        }
    }
    out
}

/// `op` over `x` laid out as `s` on `d`: values as f32 (argmax indices converted).
fn reduce_on(d: &Device, op: ReduceOp, x: &[f32], s: ReduceSpec) -> Result<Vec<f32>> {
    let out = d.backend().alloc(s.outer * s.inner, if op == ReduceOp::ArgMax { DType::I32 } else { DType::F32 })?;
    d.backend().reduce(op, &up(d, x), s, &out)?;
    Ok(if op == ReduceOp::ArgMax { down_i32(d, &out).into_iter().map(|i| i as f32).collect() } else { down(d, &out) })
}

/// Multiples of 1/4 in [-1/2, 1/2]: every partial sum of up to 2^21 of them is exact in f32,
/// so any summation order gives the CPU's f64 result exactly; and many ties for argmax.
fn quarters(seed: u64, n: usize) -> Vec<f32> {
    uniform(&mut rng(seed), n, -0.5, 0.5).into_iter().map(|v| (v * 4.0).round() / 4.0).collect()
}

/// Every op over `x` as `s`, on `dev` against the CPU, exactly (inputs make sums exact).
fn exact(dev: &Device, x: &[f32], s: ReduceSpec, ops: &[ReduceOp], what: &str) -> Result<()> {
    let cpu = Device::cpu();
    for &op in ops {
        let (got, want) = (reduce_on(dev, op, x, s)?, reduce_on(&cpu, op, x, s)?);
        assert_close(&format!("{op:?} of {what} over {s:?} on {dev}"), &got, &want, 0.0, 0.0);
    }
    Ok(())
}

/// Rows of 1 to 2^20 + 3 elements (short rows many to a workgroup, long rows split into parts
/// and reduced again), inner axes (the invocation-per-partial kernels) and empty axes: sums of
/// quarters, and max, min and argmax of quarters (ties: the first maximum) and of distinct
/// values (the maximum anywhere in the row).
#[test]
fn every_reduce_op_matches_the_cpu_on_the_hardware_path() {
    let _guard = shared();
    let specs = [
        (3000, 1, 1),
        (1000, 5, 1),
        (517, 8, 1),
        (300, 37, 1),
        (64, 255, 1),
        (9, 256, 1),
        (7, 257, 1),
        (5, 1023, 1),
        (3, 4096, 1),
        (3, 8191, 1),
        (2, 8193, 1),
        (2, 70_001, 1),
        (1, 70_000, 1),
        (1, (1 << 20) + 3, 1),
        (2, 300, 3),
        (1, 70_000, 5),
        (3, 1000, 64),
        (3, 0, 1),
        (2, 0, 3),
    ];
    for dev in hardware_devices() {
        for (n, &(outer, len, inner)) in specs.iter().enumerate() {
            let s = ReduceSpec { outer, len, inner };
            let q = quarters(600 + n as u64, outer * len * inner);
            exact(&dev, &q, s, &ReduceOp::ALL, "quarters").expect("quarters");
            let u = uniform(&mut rng(700 + n as u64), outer * len * inner, -1.0, 1.0);
            exact(&dev, &u, s, &[ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax], "distinct values").expect("distinct values");
        }
    }
}

/// NaN first, last, in several places (the first NaN in a later part of the row than a
/// larger-index one is not), beside ±inf; rows of only -inf, only NaN, only zeros of both signs;
/// at lengths inside one lane, one workgroup, one part, and past 65,535; several NaN past 2^20.
#[test]
fn nan_inf_and_signed_zero_follow_pytorch_on_the_hardware_path() {
    let _guard = shared();
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    for dev in hardware_devices() {
        for (k, n) in [7usize, 8, 300, 4101, 70_001].into_iter().enumerate() {
            let base = uniform(&mut rng(800 + k as u64), n, -1.0, 1.0);
            let with = |at: &[(usize, f32)]| {
                let mut x = base.clone();
                for &(i, v) in at {
                    x[i] = v;
                }
                x
            };
            let cases = [
                ("NaN first", with(&[(0, nan)])),
                ("NaN last", with(&[(n - 1, nan)])),
                ("several NaN", with(&[(n - 1, nan), (n / 2, nan), (n / 3 + 1, nan), (1, inf)])),
                ("+inf twice and -inf", with(&[(n - 2, inf), (n / 2, inf), (0, -inf)])),
                ("+inf after NaN", with(&[(n / 2, nan), (n / 2 + 1, inf)])),
                ("-inf only", vec![-inf; n]),
                ("NaN only", vec![nan; n]),
                ("zeros of both signs", (0..n).map(|i| if i % 3 == 1 { 0.0 } else { -0.0 }).collect()),
            ];
            for (what, x) in cases {
                let s = ReduceSpec { outer: 1, len: n, inner: 1 };
                exact(&dev, &x, s, &ReduceOp::ALL, &format!("{what}, {n} values")).expect("special values");
                // Two rows, so that a row's NaN cannot leak into its neighbour.
                if n > 5000 {
                    continue;
                }
                let two: Vec<f32> = x.iter().copied().chain(base.iter().copied()).collect();
                exact(&dev, &two, ReduceSpec { outer: 2, len: n, inner: 1 }, &[ReduceOp::Max, ReduceOp::ArgMax], what).expect("two rows");
            }
        }
        let n = (1 << 20) + 1;
        let mut x = uniform(&mut rng(810), n, -1.0, 1.0);
        for (i, v) in [(n - 1, nan), (n / 2, nan), (5000, nan), (3000, inf), (4000, -inf)] {
            x[i] = v;
        }
        exact(&dev, &x, ReduceSpec { outer: 1, len: n, inner: 1 }, &ReduceOp::ALL, "several NaN past 2^20").expect("past 2^20");
    }
}

/// The same reduction twice gives the same bits: the combination order is fixed.
#[test]
fn tree_sums_are_deterministic() {
    let _guard = shared();
    let x = uniform(&mut rng(900), (1 << 20) + 5, -1.0, 1.0);
    let s = ReduceSpec { outer: 1, len: x.len(), inner: 1 };
    for dev in hardware_devices() {
        let first = reduce_on(&dev, ReduceOp::Sum, &x, s).expect("sum");
        for _ in 0..3 {
            let again = reduce_on(&dev, ReduceOp::Sum, &x, s).expect("sum");
            assert_eq!(first[0].to_bits(), again[0].to_bits(), "sum of {} values on {dev}", x.len());
        }
        let want = x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
        assert_close(&format!("sum on {dev}"), &first, &[want], 1e-3, 1e-5);
    }
}

/// The subgroup module validates with naga's subgroup capability and not without it (the
/// `Ctx::subgroups` gate is what keeps it off devices without subgroups).
#[test]
fn the_subgroup_reductions_need_subgroups() {
    use tandem::backend::wgpu::shaders::{source, SUBGROUP_MODULES};
    for (name, base) in SUBGROUP_MODULES {
        let src = source(name).expect("a source");
        assert!(src.starts_with(source(base).expect("its base")), "{name} extends {base}");
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
        let flags = naga::valid::ValidationFlags::all();
        let mut v = naga::valid::Validator::new(flags, naga::valid::Capabilities::SUBGROUP);
        v.subgroup_stages(naga::valid::ShaderStages::COMPUTE).subgroup_operations(naga::valid::SubgroupOperationSet::all());
        if let Err(e) = v.validate(&module) {
            panic!("{name} does not validate: {}", e.emit_to_string(src));
        }
        assert!(naga::valid::Validator::new(flags, naga::valid::Capabilities::empty()).validate(&module).is_err(), "{name} needs no gate");
    }
}
