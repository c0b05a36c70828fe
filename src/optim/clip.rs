//! Global-norm gradient clipping (PyTorch's `clip_grad_norm_` with the 2-norm), in two halves
//! that a strategy can put a collective between: the squared norm of the local gradients, then
//! one scale for all of them.
use crate::autograd::no_grad;
use crate::{Device, Error, Result, Tensor};

/// The sum of squares of every gradient in `params` (those without one count 0). Each device
/// sums its own gradients and sends back one number, added here in f64. A strategy adds the
/// results of its shards, stages or replicas (each parameter counted once) and takes the root.
pub fn grad_norm_sq(params: &[(String, Tensor)]) -> Result<f64> {
    grads_norm_sq(params.iter().filter_map(|(_, p)| p.grad()).map(Ok))
}

/// [`grad_norm_sq`] over gradients made one at a time (each dropped once its square is
/// summed): the same operations in the same order, so the same bits, for gradients that are
/// never all on their devices at once (deterministic ZeRO, whose full sums stay on the host).
pub fn grads_norm_sq(grads: impl Iterator<Item = Result<Tensor>>) -> Result<f64> {
    no_grad(|| {
        let mut per_device: Vec<(Device, Tensor)> = Vec::new();
        for g in grads {
            let g = g?;
            // Squared and summed in f32 whatever the gradient's type (a half shard's squares
            // would overflow f16 and lose bf16's low bits).
            let g = if g.dtype() == crate::DType::F32 { g } else { g.to_dtype(crate::DType::F32)? };
            let sq = g.square()?.sum_all()?;
            match per_device.iter_mut().find(|(d, _)| d.same(g.device())) {
                Some((_, acc)) => *acc = acc.add(&sq)?,
                None => per_device.push((g.device().clone(), sq)),
            }
        }
        per_device.iter().try_fold(0.0, |total, (_, acc)| Ok(total + acc.to_scalar()? as f64))
    })
}

/// Multiplies every gradient in `params` by `scale`. Each gradient is replaced, not scaled in
/// place: autograd may hand the same gradient tensor to two parameters (the two inputs of an
/// add), which an in-place scale would scale twice.
pub fn scale_grads(params: &[(String, Tensor)], scale: f32) -> Result<()> {
    no_grad(|| {
        for (_, p) in params {
            if let Some(g) = p.grad() {
                p.set_grad(Some(g.mul_scalar(scale)?));
            }
        }
        Ok(())
    })
}

/// Scales the gradients so that their global 2-norm is at most `max_norm`, and returns the norm
/// before clipping, as PyTorch's `clip_grad_norm_(params, max_norm)`: the scale is
/// `max_norm / (norm + 1e-6)`, applied only when below 1. A NaN norm gives a NaN scale that
/// turns every gradient into NaN, and an infinite norm a scale of 0 (infinite entries become
/// NaN, the others 0), as there (whose default `error_if_nonfinite=False` does the same), so
/// that the optimizer step shows the problem instead of hiding it. `max_norm` = infinity
/// only measures the norm.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f32) -> Result<f32> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::invalid("clip_grad_norm", format!("max_norm must be >= 0, got {max_norm}")));
    }
    let norm = grad_norm_sq(params)?.sqrt() as f32;
    let scale = clip_scale(norm, max_norm);
    if scale.is_nan() || scale < 1.0 {
        scale_grads(params, scale)?;
    }
    Ok(norm)
}

/// The factor `clip_grad_norm` multiplies the gradients by for a total `norm` (1 or more:
/// leave them); exposed for strategies that compute the norm over several devices.
pub fn clip_scale(norm: f32, max_norm: f32) -> f32 {
    max_norm / (norm + 1e-6)
}
