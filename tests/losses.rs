//! The losses against PyTorch's values (computed by hand and checked with torch), finite
//! differences, every device against the CPU, and errors.
mod common;
mod fd;
use common::{assert_close, on_each_device};
use tandem::{CrossEntropy, Error, Result, Tensor};

#[test]
fn losses_match_pytorch() {
    on_each_device(|dev, _| {
        let logits = Tensor::from_vec(vec![1.0, 2.0, 3.0, 0.0, 5.0, -1.0], [2, 3], dev)?;
        let t = Tensor::from_labels(vec![2, -100], [2], dev)?;
        let ce = logits.cross_entropy_with(&t, CrossEntropy::default())?;
        assert_close("ce ignore", &ce.to_vec()?, &[0.40760595], 1e-6, 1e-6);
        let smooth = logits.cross_entropy_with(&t, CrossEntropy { label_smoothing: 0.1, ..Default::default() })?;
        assert_close("ce smoothing", &smooth.to_vec()?, &[0.5076059], 1e-6, 1e-6);
        // an ignore_index inside the class range
        let t1 = Tensor::from_labels(vec![2, 1], [2], dev)?;
        let ce1 = logits.cross_entropy_with(&t1, CrossEntropy { ignore_index: Some(1), label_smoothing: 0.0 })?;
        assert_close("ce ignore in range", &ce1.to_vec()?, &[0.40760595], 1e-6, 1e-6);
        // every target ignored: 0/0 as PyTorch
        let none = Tensor::from_labels(vec![-100, -100], [2], dev)?;
        assert!(logits.cross_entropy_with(&none, CrossEntropy::default())?.to_scalar()?.is_nan());
        // per-token targets: [N, C, T] with [N, T] equals the flattened rows
        let tok = logits.t()?.reshape([1, 3, 2])?;
        let tt = Tensor::from_labels(vec![1, 0], [1, 2], dev)?;
        let want = logits.cross_entropy_with(&tt.reshape([2])?, CrossEntropy::default())?.to_vec()?;
        assert_close("ce per token", &tok.cross_entropy_with(&tt, CrossEntropy::default())?.to_vec()?, &want, 1e-6, 1e-6);
        assert_close("ce plain", &want, &logits.cross_entropy(&tt.reshape([2])?)?.to_vec()?, 1e-6, 1e-6);
        let logp = Tensor::from_vec(vec![-1.0, -2.0], [1, 2], dev)?;
        assert_eq!(logp.nll_loss(&Tensor::from_labels(vec![1], [1], dev)?, None)?.to_vec()?, [2.0]);
        let x = Tensor::from_vec(vec![0.0, 2.0], [2], dev)?;
        let y = Tensor::from_vec(vec![1.0, 0.0], [2], dev)?;
        assert_close("bce", &x.bce_with_logits(&y)?.to_vec()?, &[1.4100376], 1e-6, 1e-6);
        let big = Tensor::from_vec(vec![100.0, -100.0], [2], dev)?;
        assert_close("bce stable", &big.bce_with_logits(&y.affine(-1.0, 1.0)?)?.to_vec()?, &[100.0], 1e-6, 1e-6);
        let p = Tensor::from_vec(vec![0.5, 3.0], [2], dev)?;
        assert_close("huber", &p.huber_loss(&Tensor::zeros([2], dev)?, 1.0)?.to_vec()?, &[1.3125], 1e-6, 1e-6);
        let a = Tensor::from_vec(vec![1.0, -1.0], [2], dev)?;
        assert_close("l1", &a.l1_loss(&Tensor::from_vec(vec![0.0, 1.0], [2], dev)?)?.to_vec()?, &[1.5], 1e-6, 1e-6);
        // a -inf logit that no target points at does not make the loss NaN
        let inf = Tensor::from_vec(vec![0.0, f32::NEG_INFINITY], [1, 2], dev)?;
        assert_eq!(inf.cross_entropy_with(&Tensor::from_labels(vec![0], [1], dev)?, CrossEntropy::default())?.to_vec()?, [0.0]);
        Ok(())
    });
}

#[test]
fn loss_gradients_by_finite_differences() {
    let dev = tandem::Device::cpu();
    let t = Tensor::from_labels(vec![2, -100, 0, 1], [4], &dev).unwrap();
    fd::gradcheck("cross_entropy", &[&[4, 3]], -2.0, 2.0, &|x| {
        x[0].cross_entropy_with(&t, CrossEntropy { label_smoothing: 0.2, ..Default::default() })
    });
    let tt = Tensor::from_labels(vec![2, 0, 1, 1], [2, 2], &dev).unwrap();
    fd::gradcheck("cross_entropy per token", &[&[2, 3, 2]], -2.0, 2.0, &|x| x[0].cross_entropy_with(&tt, CrossEntropy::default()));
    fd::gradcheck("bce_with_logits", &[&[3, 2], &[3, 2]], -2.0, 2.0, &|x| x[0].bce_with_logits(&x[1].sigmoid()?));
    fd::gradcheck("huber", &[&[3, 2], &[3, 2]], -2.0, 2.0, &|x| x[0].huber_loss(&x[1], 0.7));
    fd::gradcheck("l1", &[&[3, 2], &[3, 2]], -2.0, 2.0, &|x| x[0].l1_loss(&x[1]));
}

#[test]
fn loss_errors_name_the_problem() -> Result<()> {
    let dev = tandem::Device::cpu();
    let logits = Tensor::zeros([2, 3], &dev)?;
    let bad = Tensor::from_labels(vec![0, 5], [2], &dev)?;
    assert!(matches!(logits.cross_entropy_with(&bad, CrossEntropy::default()), Err(Error::Label { label: 5, index: 1, .. })));
    let neg = Tensor::from_labels(vec![-1, 0], [2], &dev)?;
    assert!(matches!(logits.cross_entropy_with(&neg, CrossEntropy::default()), Err(Error::Label { label: -1, .. })));
    assert!(matches!(logits.cross_entropy_with(&Tensor::from_labels(vec![0], [1], &dev)?, CrossEntropy::default()), Err(Error::Shape { .. })));
    assert!(matches!(logits.cross_entropy_with(&logits, CrossEntropy::default()), Err(Error::DType { .. })));
    let opts = CrossEntropy { label_smoothing: 1.5, ..Default::default() };
    assert!(matches!(logits.cross_entropy_with(&neg, opts), Err(Error::Invalid { .. })));
    assert!(matches!(logits.l1_loss(&Tensor::zeros([3, 2], &dev)?), Err(Error::Shape { .. })));
    assert!(matches!(logits.huber_loss(&logits, 0.0), Err(Error::Invalid { .. })));
    Ok(())
}
