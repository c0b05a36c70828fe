//! Cutting a global batch into per-device shards and micro-batches, and measuring devices'
//! throughput to choose the split.
use crate::data::Batch;
use crate::nn::Module;
use crate::parallel::comm::even_ranges;
use crate::parallel::proportional_split;
use crate::parallel::step::StepLoop;
use crate::{Device, Error, Result};
use std::ops::Range;
use std::time::Instant;

/// Checks that `batch` is well formed and has at least one sample per device.
pub(super) fn check_batch(batch: &Batch, devices: usize) -> Result<()> {
    let n = batch.len();
    if n < devices {
        return Err(Error::invalid(
            "DataParallel::step",
            format!("a batch of {n} samples cannot give each of the {devices} devices at least one; use a batch of at least {devices}"),
        ));
    }
    if !batch.x.len().is_multiple_of(n) || batch.x.len() != batch.x_shape.iter().product::<usize>() {
        return Err(Error::shape("DataParallel::step", format!("{} input values for shape {:?}", batch.x.len(), batch.x_shape)));
    }
    if batch.y.len() != n {
        return Err(Error::shape("DataParallel::step", format!("{} targets for {n} inputs", batch.y.len())));
    }
    Ok(())
}

/// Contiguous ranges of `n` items, sized in proportion to `weights` (equal without).
pub(in crate::parallel) fn ranges(n: usize, parts: usize, weights: Option<&[f64]>) -> Result<Vec<Range<usize>>> {
    let sizes = match weights {
        Some(w) => proportional_split(n, w)?,
        None => even_ranges(n, parts).iter().map(Range::len).collect(),
    };
    let mut start = 0;
    Ok(sizes
        .into_iter()
        .map(|s| {
            start += s;
            start - s..start
        })
        .collect())
}

/// `len` samples cut into at most `micro` non-empty near-equal micro-batches.
pub(super) fn micro_ranges(len: usize, micro: usize) -> Vec<Range<usize>> {
    match micro.min(len) {
        0 => Vec::new(),
        m => even_ranges(len, m),
    }
}

/// Split weights from measured speed: each device runs forward + backward on the same probe
/// (the batch's first few samples) twice, and the second run's time counts, so one-time
/// costs (kernel compilation, allocator growth) do not. Devices are timed one after the other
/// because running them together would measure the shared host, not the devices.
pub(super) fn calibrate(models: &[(&dyn Module, &Device)], batch: &Batch, run: &StepLoop) -> Result<Vec<f64>> {
    let probe = batch.slice(0..batch.len().min(8))?;
    models
        .iter()
        .map(|(model, device)| {
            let mut seconds = 0.0;
            for _ in 0..2 {
                let t0 = Instant::now();
                run.part_loss(*model, &probe, 0, probe.len(), device)?.backward()?;
                device.sync()?;
                seconds = t0.elapsed().as_secs_f64();
            }
            model.zero_grad();
            Ok(1.0 / seconds.max(1e-9))
        })
        .collect()
}
