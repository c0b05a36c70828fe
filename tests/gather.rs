//! The embedding gather (`index_select`) and its deterministic scatter-add backward, the dtype
//! casts, and comparisons of I32 values: hand-computed values, finite differences, every device
//! against the CPU reference (lengths past 65,535, one id repeated 70,000 times), bit-identical
//! backward runs, and the errors.
mod common;
mod fd;
use common::*;
use rand::Rng;
use tandem::backend::{row_plan, CastOp, IndexOp};
use tandem::{DType, Device, Error, Result, Tensor};

/// The forward values and the table's gradient of `sum(index_select(table, ids) · g)`.
fn lookup(d: &Device, table: &[f32], v: usize, ids: &[i32], g: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
    let t = Tensor::from_vec(table.to_vec(), [v, table.len() / v], d)?.requires_grad();
    let ids = Tensor::from_labels(ids.to_vec(), [ids.len()], d)?;
    let y = t.index_select(&ids)?;
    let gt = Tensor::from_vec(g.to_vec(), y.dims().to_vec(), d)?;
    y.mul(&gt)?.sum_all()?.backward()?;
    Ok((y.to_vec()?, t.grad().expect("table gradient").to_vec()?))
}

#[test]
fn index_select_hand_values_and_gradient() {
    // table rows 0..4 of width 2; ids pick rows 3, 0, 3, 1 (row 2 never, row 3 twice)
    let table = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0];
    let ids = Tensor::from_labels(vec![3, 0, 3, 1], [2, 2], &Device::cpu()).unwrap();
    let t = Tensor::from_vec(table.to_vec(), [4, 2], &Device::cpu()).unwrap();
    let y = t.index_select(&ids).unwrap();
    assert_eq!(y.dims(), [2, 2, 2]);
    assert_eq!(y.to_vec().unwrap(), [30.0, 31.0, 0.0, 1.0, 30.0, 31.0, 10.0, 11.0]);
    let g = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let (_, grad) = lookup(&Device::cpu(), &table, 4, &[3, 0, 3, 1], &g).unwrap();
    // row 0 gets g[1], row 1 g[3], row 2 nothing, row 3 g[0] + g[2]
    assert_eq!(grad, [3.0, 4.0, 7.0, 8.0, 0.0, 0.0, 6.0, 8.0]);
    on_each_device(|dev, _| {
        assert_eq!(lookup(dev, &table, 4, &[3, 0, 3, 1], &g)?.1, grad);
        Ok(())
    });
}

#[test]
fn index_select_gradient_matches_finite_differences() {
    let ids = vec![4, 0, 2, 4, 4, 1, 0];
    fd::gradcheck("index_select", &[&[5, 3]], -1.0, 1.0, &|x| {
        let ids = Tensor::from_labels(ids.clone(), [7], x[0].device())?;
        x[0].index_select(&ids)?.tanh()
    });
}

#[test]
fn row_plan_lists_each_rows_ids_in_ascending_order() {
    // ids 2, 0, 2, 9 (out of range, left out), 0 over 3 rows
    assert_eq!(row_plan(&[2, 0, 2, 9, 0], 3), [0, 2, 2, 4, 1, 4, 0, 2]);
}

#[test]
fn index_select_on_every_device_past_65535() {
    let mut r = rng(41);
    // 70,000 ids over 50 rows of width 7; one id 70,000 times (five scatter passes);
    // a width of 70,000 (more outputs per id than one dispatch row of workgroups).
    let many: Vec<i32> = (0..70_000).map(|_| r.random_range(0..50)).collect();
    let cases: [(usize, usize, Vec<i32>); 3] = [(50, 7, many), (3, 5, vec![1; 70_000]), (2, 70_000, vec![1, 0, 1])];
    on_each_device(|dev, cpu| {
        for (v, d, ids) in &cases {
            let mut r = rng(*d as u64);
            let table = uniform(&mut r, v * d, -1.0, 1.0);
            let g = uniform(&mut r, ids.len() * d, -1.0, 1.0);
            let (got, want) = (lookup(dev, &table, *v, ids, &g)?, lookup(cpu, &table, *v, ids, &g)?);
            assert_close(&format!("index_select {v}x{d}"), &got.0, &want.0, 0.0, 0.0);
            assert_close(&format!("index_select backward {v}x{d}"), &got.1, &want.1, 1e-4, 1e-5);
        }
        Ok(())
    });
}

#[test]
fn index_select_backward_is_bit_identical_across_runs_and_devices() {
    let mut r = rng(42);
    let ids: Vec<i32> = (0..40_000).map(|_| r.random_range(0..5)).collect();
    let table = uniform(&mut r, 5 * 3, -1.0, 1.0);
    let g: Vec<f32> = (0..ids.len() * 3).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let want = bits(lookup(&Device::cpu(), &table, 5, &ids, &g).unwrap().1);
    on_each_device(|dev, _| {
        for run in 0..2 {
            // The same additions in the same order as the CPU reference: the same bits.
            assert_eq!(bits(lookup(dev, &table, 5, &ids, &g)?.1), want, "run {run}");
        }
        Ok(())
    });
}

#[test]
fn index_select_errors_name_the_problem() {
    let dev = Device::cpu();
    let table = Tensor::zeros([4, 2], &dev).unwrap();
    let f32_ids = Tensor::from_vec(vec![1.0], [1], &dev).unwrap();
    assert!(matches!(table.index_select(&f32_ids), Err(Error::DType { op: "index_select", .. })));
    let ids = Tensor::from_labels(vec![0, 1], [2], &dev).unwrap();
    let flat = Tensor::zeros([8], &dev).unwrap();
    assert!(matches!(flat.index_select(&ids), Err(Error::Shape { .. })), "a rank-1 table");
    let bad = Tensor::from_labels(vec![0, 3, 4, -1], [4], &dev).unwrap();
    match table.index_select(&bad) {
        Err(Error::Label { op: "index_select", label: 4, index: 2, classes: 4 }) => {}
        other => panic!("expected the id 4 at index 2 of 4 rows, got {other:?}"),
    }
    on_each_device(|dev, _| {
        // ids computed on the device carry no host bounds: checked there.
        let table = Tensor::zeros([4, 2], dev)?;
        let ids = Tensor::from_vec(vec![0.5, 3.9, 4.2], [3], dev)?.to_dtype(DType::I32)?;
        match table.index_select(&ids) {
            Err(Error::Label { label: 4, index: 2, classes: 4, .. }) => Ok(()),
            other => panic!("expected the id 4 at index 2, got {other:?}"),
        }
    });
}

#[test]
fn backends_called_directly_stay_in_bounds() {
    // A gather id and plan entries outside their ranges read 0, never out of bounds.
    let table: Vec<f32> = (0..6).map(|i| i as f32).collect();
    on_each_device(|dev, cpu| {
        same_f32(dev, cpu, "gather_rows out of range", 0.0, 0.0, |d| {
            let out = up(d, &[9.0; 8]);
            d.backend().index(IndexOp::GatherRows { table_rows: 3 }, &up(d, &table), &up_i32(d, &[2, -1, 3, 0]), &out, 4, 2)?;
            Ok(down(d, &out))
        })?;
        same_f32(dev, cpu, "gather_rows from an empty table", 0.0, 0.0, |d| {
            let out = up(d, &[9.0; 4]);
            d.backend().index(IndexOp::GatherRows { table_rows: 0 }, &up(d, &[]), &up_i32(d, &[0, 1]), &out, 2, 2)?;
            Ok(down(d, &out))
        })?;
        same_f32(dev, cpu, "scatter_add_rows bad plan", 0.0, 0.0, |d| {
            let out = up(d, &[9.0; 6]);
            let plan = [0, 5, -3, 2, 1, 7, -1];
            d.backend().index(IndexOp::ScatterAddRows { table_rows: 3 }, &up(d, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), &up_i32(d, &plan), &out, 3, 2)?;
            Ok(down(d, &out))
        })
    });
}

#[test]
fn casts_truncate_saturate_and_map_nan_to_zero() {
    let x = [1.7, -1.7, 2.5, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 3e9, -3e9, 16_777_217.0, -2_147_483_648.0];
    let want = [1, -1, 2, 0, 0, i32::MAX, i32::MIN, i32::MAX, i32::MIN, 16_777_216, i32::MIN];
    let ints = [i32::MAX, i32::MIN, 16_777_217, -5, 0, 65_535, -65_536, -1];
    on_each_device(|dev, cpu| {
        for d in [dev, cpu] {
            let t = Tensor::from_vec(x.to_vec(), [x.len()], d)?.to_dtype(DType::I32)?;
            assert_eq!(t.to_vec_i32()?, want, "F32 -> I32 on {d}");
            let f = Tensor::from_labels(ints.to_vec(), [ints.len()], d)?.to_dtype(DType::F32)?.to_vec()?;
            assert_eq!(f, [2_147_483_648.0, -2_147_483_648.0, 16_777_216.0, -5.0, 0.0, 65_535.0, -65_536.0, -1.0], "I32 -> F32 on {d}");
            for op in [CastOp::I32High, CastOp::I32Low] {
                let out = d.backend().alloc(ints.len(), DType::F32)?;
                d.backend().cast(op, &up_i32(d, &ints), &out, ints.len())?;
                let want: Vec<f32> = ints.iter().map(|&i| f32::from_bits(op.word(i as u32))).collect();
                assert_eq!(down(d, &out), want, "{op:?} on {d}");
            }
        }
        Ok(())
    });
    assert_eq!(f32::from_bits(CastOp::I32High.word(-65_537i32 as u32)), -2.0, "floor(-65537 / 65536)");
    assert_eq!(f32::from_bits(CastOp::I32Low.word(-65_537i32 as u32)), 65_535.0);
}

#[test]
fn cast_of_70000_values_and_its_errors() {
    let x: Vec<f32> = (0..70_000).map(|i| (i as f32 - 35_000.0) * 1.37).collect();
    on_each_device(|dev, cpu| {
        let run = |d: &Device| Tensor::from_vec(x.clone(), [70_000], d)?.to_dtype(DType::I32)?.to_vec_i32();
        assert_eq!(run(dev)?, run(cpu)?);
        Ok(())
    });
    let cpu = Device::cpu();
    let f = up(&cpu, &[1.0]);
    let err = cpu.backend().cast(CastOp::I32ToF32, &f, &f.clone(), 1).unwrap_err();
    assert!(matches!(err, Error::DType { op: "cast", .. }), "{err}");
    let i = up_i32(&cpu, &[1]);
    let err = cpu.backend().cast(CastOp::I32ToF32, &i, &up(&cpu, &[0.0]), 2).unwrap_err();
    assert!(err.to_string().contains("addresses 2"), "{err}");
}

/// `[gt, eq, lt, ge, le, ne]` of `a` against `b`, as F32 masks.
fn compare_all(a: &Tensor, b: &Tensor) -> Result<Vec<Vec<f32>>> {
    [a.gt(b)?, a.eq_elem(b)?, a.lt(b)?, a.ge(b)?, a.le(b)?, a.ne(b)?].iter().map(Tensor::to_vec).collect()
}

#[test]
fn i32_comparisons_are_exact_past_2_pow_24() {
    // Pairs that compare equal through F32 (16777217 rounds to 16777216).
    let a = [16_777_217, i32::MIN, i32::MAX, 5, -70_000, 16_777_216];
    let b = [16_777_216, i32::MAX, i32::MAX, -5, -69_999, 16_777_217];
    let host = |f: fn(&i32, &i32) -> bool| -> Vec<f32> { a.iter().zip(&b).map(|(x, y)| f(x, y) as i32 as f32).collect() };
    let want = vec![host(i32::gt), host(i32::eq), host(i32::lt), host(i32::ge), host(i32::le), host(i32::ne)];
    let cpu = Device::cpu();
    let ta = Tensor::from_labels(a.to_vec(), [6], &cpu).unwrap();
    let tb = Tensor::from_labels(b.to_vec(), [6], &cpu).unwrap();
    assert_eq!(compare_all(&ta, &tb).unwrap(), want);
    on_each_device(|dev, _| {
        // bounds past ±2^24: the exact path of 16-bit halves
        let ta = Tensor::from_labels(a.to_vec(), [6], dev)?;
        let tb = Tensor::from_labels(b.to_vec(), [6], dev)?;
        assert_eq!(compare_all(&ta, &tb)?, want);
        Ok(())
    });
}

#[test]
fn i32_comparisons_broadcast_and_mix_with_f32() {
    on_each_device(|dev, cpu| {
        for d in [dev, cpu] {
            // small labels (the cast path) broadcast [3, 1] against [4]
            let a = Tensor::from_labels(vec![0, 2, 5], [3, 1], d)?;
            let b = Tensor::from_labels(vec![1, 2, 3, 4], [4], d)?;
            let gt = a.gt(&b)?;
            assert_eq!(gt.dims(), [3, 4]);
            assert_eq!(gt.to_vec()?, [0., 0., 0., 0., 1., 0., 0., 0., 1., 1., 1., 1.]);
            // the exact path broadcast the same way
            let big = Tensor::from_labels(vec![0, 2, 1 << 30], [3, 1], d)?;
            assert_eq!(big.eq_elem(&b)?.to_vec()?, [0., 0., 0., 0., 0., 1., 0., 0., 0., 0., 0., 0.]);
            let f = Tensor::from_vec(vec![1.5, 2.0, f32::NAN, 0.0], [4], d)?;
            assert_eq!(a.ge(&f)?.to_vec()?, [0., 0., 0., 1., 1., 1., 0., 1., 1., 1., 0., 1.]);
        }
        let x = Tensor::from_labels(vec![1], [1], dev)?;
        assert!(matches!(x.add(&x), Err(Error::DType { .. })), "arithmetic stays F32-only");
        Ok(())
    });
}

#[test]
fn backward_plans_from_the_ids_the_buffer_holds_now() {
    on_each_device(|dev, cpu| {
        let g = [1.0, 2.0, 3.0, 4.0];
        let grad = |ids: &Tensor| -> Result<Vec<f32>> {
            let t = Tensor::from_vec(vec![0.0; 6], [3, 2], ids.device())?.requires_grad();
            t.index_select(ids)?.mul(&Tensor::from_vec(g.to_vec(), [2, 2], ids.device())?)?.sum_all()?.backward()?;
            t.grad().expect("table gradient").to_vec()
        };
        let want = [0.0, 0.0, 1.0, 2.0, 3.0, 4.0];
        // ids made on the device (read back once for the plan)
        assert_eq!(grad(&Tensor::from_vec(vec![1.0, 2.0], [2], dev)?.to_dtype(DType::I32)?)?, want);
        // ids uploaded, then overwritten in place: the host copy must not outlive them
        for d in [dev, cpu] {
            let ids = Tensor::from_labels(vec![0, 0], [2], d)?;
            ids.assign(&Tensor::from_labels(vec![1, 2], [2], d)?)?;
            assert_eq!(grad(&ids)?, want, "on {d}");
        }
        Ok(())
    });
}
