//! The ops the layers need: sin/cos/erf, where/masked_fill, clamp, var/std, unsqueeze/squeeze/
//! stack, arange, one_hot, triu/tril, index_select; hand values, finite differences, the CPU
//! on every device (lengths past 65,535 included), and errors.
mod common;
mod fd;
use common::{assert_close, on_each_device};
use rand::SeedableRng;
use tandem::{Error, Result, Tensor};

#[test]
fn erf_is_accurate_to_a_millionth_on_every_device() {
    on_each_device(|dev, _| {
        let x = Tensor::from_vec(vec![0.5, 1.0, 2.0, 1e-3, -3.0, 0.25, 0.0, f32::INFINITY, f32::NAN], [9], dev)?;
        let want = [0.5204999, 0.8427008, 0.9953223, 0.0011283788, -0.9999779, 0.2763264, 0.0, 1.0, f32::NAN];
        assert_close("erf", &x.erf()?.to_vec()?, &want, 0.0, 1e-6);
        let t = Tensor::from_vec(vec![0.0, 1.0, -2.0], [3], dev)?;
        assert_close("sin", &t.sin()?.to_vec()?, &[0.0, 0.84147096, -0.9092974], 1e-6, 1e-6);
        assert_close("cos", &t.cos()?.to_vec()?, &[1.0, 0.54030231, -0.41614684], 1e-6, 1e-6);
        Ok(())
    });
}

/// Each composed op on a 70,000-long axis equals the CPU's.
#[test]
fn composed_ops_match_the_cpu_past_65535() {
    let n = 70_000;
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let data: Vec<f32> = Tensor::randn([n], &mut r, &tandem::Device::cpu()).unwrap().to_vec().unwrap();
    let ids: Vec<i32> = (0..n as i32).map(|i| (i * 7) % 5).collect();
    on_each_device(|dev, cpu| {
        let run = |d: &tandem::Device| -> Result<Vec<Vec<f32>>> {
            let x = Tensor::from_vec(data.clone(), [n], d)?;
            let m = x.gt(&Tensor::zeros([1], d)?)?;
            let table = Tensor::from_vec((0..10).map(|v| v as f32).collect(), [5, 2], d)?;
            let idx = Tensor::from_labels(ids.clone(), [n], d)?;
            Ok(vec![
                x.where_(&m, &x.neg()?)?.to_vec()?,
                x.clamp(Some(-0.5), Some(0.5))?.to_vec()?,
                x.var(0, 1, false)?.to_vec()?,
                x.erf()?.to_vec()?,
                x.sin()?.to_vec()?,
                table.index_select(&idx)?.to_vec()?,
                idx.one_hot(5)?.sum(0, false)?.to_vec()?,
            ])
        };
        let (got, want) = (run(dev)?, run(cpu)?);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("composed op {i}"), g, w, 1e-5, 1e-4);
        }
        Ok(())
    });
}

#[test]
fn hand_computed_values() {
    on_each_device(|dev, _| {
        let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], [4], dev)?;
        assert_close("var", &x.var(0, 1, false)?.to_vec()?, &[1.6666666], 1e-6, 1e-6);
        assert_close("var biased", &x.var(0, 0, false)?.to_vec()?, &[1.25], 1e-6, 1e-6);
        assert_close("std", &x.std(0, 1, false)?.to_vec()?, &[1.2909944], 1e-6, 1e-6);
        // the side not chosen may be NaN or inf without leaking
        let a = Tensor::from_vec(vec![1.0, f32::NAN, f32::INFINITY], [3], dev)?;
        let b = Tensor::from_vec(vec![f32::NAN, 2.0, 3.0], [3], dev)?;
        let c = Tensor::from_vec(vec![1.0, 0.0, 0.0], [3], dev)?;
        assert_eq!(a.where_(&c, &b)?.to_vec()?, [1.0, 2.0, 3.0]);
        assert_eq!(a.masked_fill(&c, -5.0)?.to_vec()?[0], -5.0);
        let y = Tensor::from_vec(vec![-2.0, 0.3, 7.0, f32::NAN], [4], dev)?.clamp(Some(0.0), Some(1.0))?.to_vec()?;
        assert_eq!(&y[..3], [0.0, 0.3, 1.0]);
        assert!(y[3].is_nan(), "clamp keeps NaN");
        let m = Tensor::from_vec(vec![1.0, 2.0, 3.0, f32::NAN, 5.0, 6.0], [2, 3], dev)?;
        assert_eq!(m.triu(1)?.to_vec()?, [0.0, 2.0, 3.0, 0.0, 0.0, 6.0], "a NaN outside the triangle is zeroed");
        let lower: Vec<f32> = m.tril(0)?.to_vec()?.iter().map(|v| if v.is_nan() { -1.0 } else { *v }).collect();
        assert_eq!(lower, [1.0, 0.0, 0.0, -1.0, 5.0, 0.0], "a NaN inside the triangle is kept");
        assert_eq!(Tensor::arange(0.0, 1.0, 0.25, dev)?.to_vec()?, [0.0, 0.25, 0.5, 0.75]);
        let oh = Tensor::from_labels(vec![2, 0], [2], dev)?.one_hot(3)?;
        assert_eq!(oh.to_vec()?, [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        let s = Tensor::stack(&[x.clone(), x.mul_scalar(2.0)?], 1)?;
        assert_eq!(s.dims(), [4, 2]);
        assert_eq!(s.to_vec()?, [1.0, 2.0, 2.0, 4.0, 3.0, 6.0, 4.0, 8.0]);
        assert_eq!(x.unsqueeze(-1)?.dims(), [4, 1]);
        assert_eq!(x.unsqueeze(0)?.squeeze(0)?.dims(), [4]);
        Ok(())
    });
}

#[test]
fn bad_shapes_and_dtypes_are_errors() -> Result<()> {
    let dev = tandem::Device::cpu();
    let x = Tensor::zeros([2, 3], &dev)?;
    let ids = Tensor::from_labels(vec![0, 1], [2], &dev)?;
    assert!(matches!(x.squeeze(0), Err(Error::Shape { .. })));
    assert!(matches!(x.unsqueeze(3), Err(Error::Shape { .. })));
    assert!(matches!(Tensor::stack(&[x.clone(), Tensor::zeros([3, 2], &dev)?], 0), Err(Error::Shape { .. })));
    assert!(matches!(Tensor::arange(0.0, 1.0, 0.0, &dev), Err(Error::Invalid { .. })));
    assert!(matches!(Tensor::arange(1.0, 0.0, 1.0, &dev), Err(Error::Invalid { .. })));
    assert!(matches!(x.one_hot(3), Err(Error::DType { .. })));
    assert!(matches!(Tensor::from_labels(vec![0, 3], [2], &dev)?.one_hot(3), Err(Error::Label { label: 3, index: 1, .. })));
    assert!(matches!(x.index_select(&x), Err(Error::DType { .. })));
    assert!(matches!(Tensor::zeros([4], &dev)?.index_select(&ids), Err(Error::Shape { .. })));
    assert!(matches!(x.where_(&ids, &x), Err(Error::DType { .. })));
    assert!(matches!(x.where_(&Tensor::zeros([4], &dev)?, &x), Err(Error::Shape { .. })));
    assert!(matches!(Tensor::zeros([3], &dev)?.triu(0), Err(Error::Shape { .. })));
    assert!(matches!(x.var(2, 1, false), Err(Error::Shape { .. })));
    Ok(())
}

#[test]
fn finite_difference_gradients() {
    fd::gradcheck("where", &[&[3, 4], &[4]], -1.0, 1.0, &|x| {
        let c = x[0].gt(&Tensor::zeros([1], x[0].device())?)?;
        x[0].where_(&c, &x[1])
    });
    // values away from the bounds, where clamp is differentiable
    fd::gradcheck("clamp", &[&[3, 4]], -1.0, 1.0, &|x| x[0].clamp(Some(-0.5), Some(0.55)));
    fd::gradcheck("var", &[&[3, 4]], -1.0, 1.0, &|x| x[0].var(1, 1, true));
    fd::gradcheck("std", &[&[3, 4]], 0.1, 2.0, &|x| x[0].std(0, 0, false));
    fd::gradcheck("stack", &[&[2, 3], &[2, 3]], -1.0, 1.0, &|x| Tensor::stack(&[x[0].clone(), x[1].clone()], 2));
    fd::gradcheck("tril", &[&[2, 3, 3]], -1.0, 1.0, &|x| x[0].tril(-1));
    fd::gradcheck("index_select", &[&[4, 3]], -1.0, 1.0, &|x| x[0].index_select(&Tensor::from_labels(vec![3, 1, 3, 0], [2, 2], x[0].device())?));
    fd::gradcheck("sin cos erf", &[&[2, 3]], -2.0, 2.0, &|x| x[0].sin()?.add(&x[0].cos()?)?.add(&x[0].erf()?));
}
