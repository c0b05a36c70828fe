//! What a step computes on a batch: the [`Loss`] of the output against the targets, and the
//! upload of a host batch ([`batch_to_device`]) that every strategy's step starts with.
use crate::data::{Batch, Inputs, Targets};
use crate::{Device, Result, Tensor};
use std::sync::Arc;

/// A loss written by the user: `(output, targets) -> scalar`, both on the output's device.
pub type LossFn = Arc<dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync>;

/// The training loss: a ready-made one or any closure over (output, targets).
///
/// Strategies that split a batch (data-parallel shards, pipeline micro-batches) weight each
/// part's loss by its share of the samples, so the sum is the whole batch's loss exactly when
/// the loss is a mean in which every sample weighs the same: one value per sample, or the same
/// number of values per sample (per-token targets `[B, T]` with no ignored token). A loss that
/// skips some values (`ignore_index`) gives the mean of the parts' means instead.
#[derive(Clone)]
pub enum Loss {
    /// Mean cross-entropy over class indices (PyTorch `CrossEntropyLoss()`): logits `[N, C]`
    /// against `[N]`; per-token logits `[B, T, C]` against targets `[B, T]` (classes last, as a
    /// language model's: flattened to `[B·T, C]` and `[B·T]`, the mean over every token); or
    /// PyTorch's `[N, C, d..]` against `[N, d..]`.
    CrossEntropy,
    /// Mean squared error (PyTorch `MSELoss()`): F32 targets of the prediction's shape. I32
    /// class labels are an [`Error::Invalid`](crate::Error::Invalid) of `Loss::Mse` that points
    /// to [`Loss::CrossEntropy`].
    Mse,
    /// The user's loss.
    Custom(LossFn),
}

impl std::fmt::Debug for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Loss::CrossEntropy => "CrossEntropy",
            Loss::Mse => "Mse",
            Loss::Custom(_) => "Custom",
        })
    }
}

impl Loss {
    /// Any loss from tensor ops, such as `|out, y| out.cross_entropy_with(y, opts)`.
    pub fn custom(f: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static) -> Loss {
        Loss::Custom(Arc::new(f))
    }
    pub fn for_targets(t: &Targets) -> Loss {
        match t {
            Targets::Classes { .. } | Targets::Tokens { .. } => Loss::CrossEntropy,
            Targets::Values { .. } => Loss::Mse,
        }
    }
    /// The loss of `output` against `target` (as made by `batch_to_device`).
    pub fn compute(&self, output: &Tensor, target: &Tensor) -> Result<Tensor> {
        match self {
            Loss::CrossEntropy if output.rank() == 2 => output.cross_entropy(target),
            Loss::CrossEntropy if output.rank() == target.rank() + 1 && output.dims()[..target.rank()] == target.dims()[..] => {
                let classes = output.dims()[target.rank()];
                output.reshape([target.numel(), classes])?.cross_entropy(&target.reshape([target.numel()])?)
            }
            Loss::CrossEntropy => output.cross_entropy_with(target, Default::default()),
            Loss::Mse if target.dtype() != crate::DType::F32 => Err(crate::Error::invalid(
                "Loss::Mse",
                format!(
                    "targets are {:?} {:?}, class labels; MSE needs F32 targets of the prediction's shape {:?}: use Loss::CrossEntropy for class labels",
                    target.dtype(),
                    target.shape(),
                    output.shape()
                ),
            )),
            Loss::Mse => output.mse_loss(target),
            Loss::Custom(f) => f(output, target),
        }
    }
}

/// Uploads a host batch's inputs alone, `[b, ...]`: f32 values, or I32 token ids (as
/// `Tensor::from_labels`): what [`Strategy::predict`](super::Strategy::predict) takes.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// let batch = tandem::data::Batch::tokens(vec![1, 2, 3, 4], vec![2, 3, 4, 0], 2, 5)?;
/// let x = tandem::parallel::inputs_to_device(&batch, &tandem::Device::cpu())?;
/// assert_eq!(x.dims(), &[2, 2]);
/// # Ok(()) }
/// ```
pub fn inputs_to_device(batch: &Batch, device: &Device) -> Result<Tensor> {
    match &batch.x {
        Inputs::F32(v) => Tensor::from_vec(v.clone(), batch.x_shape.clone(), device),
        Inputs::I32(ids) => Tensor::from_labels(ids.clone(), batch.x_shape.clone(), device),
    }
}

/// Uploads a host batch: inputs as f32 values or I32 token ids `[b, ...]`, targets as I32
/// labels `[b]`, I32 ids `[b, ...]` or f32 values `[b, ...]`.
pub fn batch_to_device(batch: &Batch, device: &Device) -> Result<(Tensor, Tensor)> {
    let x = inputs_to_device(batch, device)?;
    let b = batch.x_shape.first().copied().unwrap_or(0);
    let with_batch = |per: &[usize]| [&[b][..], per].concat();
    let y = match &batch.y {
        Targets::Classes { labels, .. } => Tensor::from_labels(labels.clone(), [labels.len()], device)?,
        Targets::Tokens { ids, shape_per_sample, .. } => Tensor::from_labels(ids.clone(), with_batch(shape_per_sample), device)?,
        Targets::Values { data, shape_per_sample } => Tensor::from_vec(data.clone(), with_batch(shape_per_sample), device)?,
    };
    Ok((x, y))
}
