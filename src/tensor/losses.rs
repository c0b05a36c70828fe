//! Losses as PyTorch defines them (reduction mean), composed from tensor ops, so that their
//! gradients come from the same table as any loss a user writes.
use super::Tensor;
use crate::autograd;
use crate::backend::BinaryOp;
use crate::{DType, Error, Result, Shape};

/// Options of [`Tensor::cross_entropy_with`], PyTorch's `CrossEntropyLoss` arguments.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropy {
    /// Targets equal to this are skipped (no loss, not counted in the mean); PyTorch's default -100.
    pub ignore_index: Option<i32>,
    /// ε: the target distribution is `1-ε` on the class plus `ε/C` on every class.
    pub label_smoothing: f32,
}

impl Default for CrossEntropy {
    fn default() -> Self {
        CrossEntropy { ignore_index: Some(-100), label_smoothing: 0.0 }
    }
}

impl Tensor {
    /// Cross-entropy of logits `[N, C]` against I32 targets `[N]`, or `[N, C, d1, ..]` against
    /// `[N, d1, ..]` (per-token targets of any shape; logits of shape `[B, T, V]` are reshaped to
    /// `[B·T, V]` first, as in PyTorch), with `ignore_index` and label smoothing. The mean is over
    /// the targets that are not ignored (NaN when all are, as PyTorch's).
    pub fn cross_entropy_with(&self, targets: &Tensor, opts: CrossEntropy) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&opts.label_smoothing) {
            return Err(Error::invalid("cross_entropy", format!("label_smoothing {} is not in [0, 1]", opts.label_smoothing)));
        }
        let (logits, targets) = classes_last("cross_entropy", &self.upcast()?, targets)?;
        let logp = logits.log_softmax(1)?;
        nll_rows("cross_entropy", &logp, &targets, opts)
    }
    /// Negative log-likelihood of log-probabilities (`[N, C]` or `[N, C, d1, ..]`) against
    /// I32 targets, PyTorch's `NLLLoss(ignore_index)` with reduction mean.
    pub fn nll_loss(&self, targets: &Tensor, ignore_index: Option<i32>) -> Result<Tensor> {
        let (logp, targets) = classes_last("nll_loss", &self.upcast()?, targets)?;
        nll_rows("nll_loss", &logp, &targets, CrossEntropy { ignore_index, label_smoothing: 0.0 })
    }
    /// `mean((1 - y) x + m + log(e^(-m) + e^(-x-m)))`, `m = max(-x, 0)`: binary cross-entropy of
    /// logits `x` against probabilities `y` of the same shape, stable for large |x|, in PyTorch's
    /// form (`BCEWithLogitsLoss`, so `x = inf, y = 0` gives inf, not inf · 0 = NaN), and with its
    /// gradients `(sigmoid(x) - y) g / N` and `-x g / N` (finite at `x = -inf`, `1/2 - y` at 0).
    pub fn bce_with_logits(&self, target: &Tensor) -> Result<Tensor> {
        if self.dtype().is_half() || target.dtype().is_half() {
            return self.upcast()?.bce_with_logits(&target.upcast()?);
        }
        same_shape("bce_with_logits", self, target)?;
        let loss = autograd::no_grad(|| {
            let m = self.neg()?.relu()?;
            let soft = m.neg()?.exp()?.add(&self.neg()?.sub(&m)?.exp()?)?.log()?;
            target.affine(-1.0, 1.0)?.mul(self)?.add(&m)?.add(&soft)?.mean_all()
        })?;
        Ok(Tensor::result(loss.buffer().clone(), loss.shape().clone(), self.device(), autograd::GradOp::BceWithLogits, &[self, target]))
    }
    /// Mean absolute error (`L1Loss`).
    pub fn l1_loss(&self, target: &Tensor) -> Result<Tensor> {
        if self.dtype().is_half() || target.dtype().is_half() {
            return self.upcast()?.l1_loss(&target.upcast()?);
        }
        same_shape("l1_loss", self, target)?;
        self.sub(target)?.abs()?.mean_all()
    }
    /// `HuberLoss(delta)`: `0.5 d²` where `|d| < delta`, else `delta (|d| - delta/2)`, averaged.
    pub fn huber_loss(&self, target: &Tensor, delta: f32) -> Result<Tensor> {
        same_shape("huber_loss", self, target)?;
        if delta.is_nan() || delta <= 0.0 {
            return Err(Error::invalid("huber_loss", format!("delta {delta} must be positive")));
        }
        if self.dtype().is_half() || target.dtype().is_half() {
            return self.upcast()?.huber_loss(&target.upcast()?, delta);
        }
        let d = self.sub(target)?;
        let ad = d.abs()?;
        // NaN counts as near: PyTorch's gradient there is g·d = NaN
        let nan = ad.eq_elem(&ad)?.affine(-1.0, 1.0)?;
        let near = Tensor::full(delta, Shape(vec![]), self.device())?.gt(&ad)?.add(&nan)?;
        // the square of d only where chosen: an infinite d's 0 gradient there would meet 2d = inf
        let dn = d.where_(&near, &Tensor::zeros(Shape(vec![]), self.device())?)?;
        dn.square()?.mul_scalar(0.5)?.where_(&near, &ad.affine(delta, -0.5 * delta * delta)?)?.mean_all()
    }
}

fn same_shape(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    a.same_device(op, b)?;
    if a.shape() != b.shape() {
        return Err(Error::shape(op, format!("input {:?} vs target {:?}", a.shape(), b.shape())));
    }
    Ok(())
}

/// `[N, C, d..]` and `[N, d..]` as `[M, C]` rows and `[M]` targets.
fn classes_last(op: &'static str, x: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    x.same_device(op, targets)?;
    targets.expect_dtype(op, DType::I32)?;
    let d = x.dims();
    let ok = d.len() >= 2 && targets.rank() == d.len() - 1 && targets.dims()[0] == d[0] && targets.dims()[1..] == d[2..];
    if !ok {
        return Err(Error::shape(op, format!("input {:?} with targets {:?}: need [N, C, d..] and [N, d..]", x.shape(), targets.shape())));
    }
    let c = d[1];
    let rows = if d.len() == 2 {
        x.clone()
    } else {
        let mut perm: Vec<usize> = (0..d.len()).filter(|&a| a != 1).collect();
        perm.push(1);
        x.permute(&perm)?.reshape([x.numel() / c.max(1), c])?
    };
    Ok((rows, targets.reshape([targets.numel()])?))
}

/// The mean NLL (and smoothing term) of `[M, C]` log-probabilities; ignored targets select
/// nothing, so a -inf log-probability they would point at does not leak into the loss.
fn nll_rows(op: &'static str, logp: &Tensor, targets: &Tensor, opts: CrossEntropy) -> Result<Tensor> {
    let c = logp.dims()[1];
    check_targets(op, targets, c, opts.ignore_index)?;
    let mut hot = targets.one_hot_unchecked(c)?;
    if let Some(ig) = opts.ignore_index.filter(|&i| i >= 0 && (i as usize) < c) {
        let keep: Vec<f32> = (0..c).map(|k| (k != ig as usize) as i32 as f32).collect();
        hot = hot.mul(&Tensor::from_vec(keep, [c], logp.device())?)?;
    }
    let valid = hot.sum(1, false)?;
    let count = valid.sum_all()?;
    let nll = logp.binary(BinaryOp::ReluBackward, &hot)?.sum(1, false)?.neg()?.sum_all()?.div(&count)?;
    if opts.label_smoothing == 0.0 {
        return Ok(nll);
    }
    let eps = opts.label_smoothing;
    let smooth = logp.sum(1, false)?.neg()?.binary(BinaryOp::ReluBackward, &valid)?.sum_all()?.div(&count)?;
    nll.mul_scalar(1.0 - eps)?.add(&smooth.mul_scalar(eps / c as f32)?)
}

/// Every target a class in `0..classes` or the ignored value; free when the targets' range is
/// known to fit, else one download (only then), naming the first bad target.
fn check_targets(op: &'static str, targets: &Tensor, classes: usize, ignore: Option<i32>) -> Result<()> {
    let Some(ig) = ignore else { return targets.check_labels(op, classes) };
    let fits = |v: i32| (v >= 0 && (v as i64) < classes as i64) || v == ig;
    if targets.buffer().label_bound().is_some_and(|(lo, hi)| lo >= 0 && (hi as i64) < classes as i64) {
        return Ok(());
    }
    let values = targets.to_vec_i32()?;
    match values.iter().position(|&v| !fits(v)) {
        Some(index) => Err(Error::Label { op, label: values[index], index, classes }),
        None => Ok(()),
    }
}
