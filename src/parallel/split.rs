//! Cutting a global batch into per-device shards and micro-batches: even parts, or parts in
//! proportion to weights (the data-parallel split by measured device speed).
use crate::data::Batch;
use crate::shape::even_ranges;
use crate::{Error, Result};
use std::ops::Range;

/// A data-parallel batch needs one sample; it may have fewer than the devices, which then
/// take none (they still take part in every collective, with zero gradients).
pub(crate) fn check_samples(n: usize, devices: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid(
            "DataParallel::step",
            format!("an empty batch (0 samples) for {devices} devices; a batch needs at least one sample"),
        ));
    }
    Ok(())
}

/// Checks that `batch` is well formed and has at least one sample.
pub(crate) fn check_batch(batch: &Batch, devices: usize) -> Result<()> {
    let n = batch.len();
    check_samples(n, devices)?;
    if !batch.x.len().is_multiple_of(n) || batch.x.len() != batch.x_shape.iter().product::<usize>() {
        return Err(Error::shape("DataParallel::step", format!("{} input values for shape {:?}", batch.x.len(), batch.x_shape)));
    }
    if batch.y.len() != n {
        return Err(Error::shape("DataParallel::step", format!("{} targets for {n} inputs", batch.y.len())));
    }
    Ok(())
}

/// Contiguous ranges of `n` items, sized in proportion to `weights` (equal without).
pub(crate) fn ranges(n: usize, parts: usize, weights: Option<&[f64]>) -> Result<Vec<Range<usize>>> {
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
pub(crate) fn micro_ranges(len: usize, micro: usize) -> Vec<Range<usize>> {
    match micro.min(len) {
        0 => Vec::new(),
        m => even_ranges(len, m),
    }
}

/// Splits `n` samples into parts proportional to `weights` (largest remainders), every part
/// as close to its share as integers allow; errors when a weight is not positive.
pub fn proportional_split(n: usize, weights: &[f64]) -> Result<Vec<usize>> {
    if weights.is_empty() || weights.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return Err(Error::invalid("split", format!("weights must be positive, got {weights:?}")));
    }
    let total: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| n as f64 * w / total).collect();
    let mut parts: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    let short = n - parts.iter().sum::<usize>();
    for &i in order.iter().take(short) {
        parts[i] += 1;
    }
    Ok(parts)
}

/// Samples of a global batch that one forward computes: part `index` of the split, starting at
/// sample `first` of the global batch.
pub(crate) struct Part {
    pub index: usize,
    pub first: usize,
    pub batch: Batch,
}

/// How a data-parallel step cuts the global batch for this process's `local` replicas, which
/// are devices `first..first + local` of `world` across processes.
pub(crate) struct ReplicaSplit<'a> {
    pub first: usize,
    pub world: usize,
    pub local: usize,
    /// This process's devices' share in proportion to these (equal without); across processes,
    /// one weight per device of the job (`world` of them) cuts the whole batch instead.
    pub weights: Option<&'a [f64]>,
    /// Micro-batches per replica shard (overlapped), or the batch cut into this many fixed
    /// micro-shards whatever the devices (deterministic).
    pub mode: PartsOf,
}

/// See [`ReplicaSplit::mode`].
pub(crate) enum PartsOf {
    MicroBatches(usize),
    FixedShards(usize),
}

impl ReplicaSplit<'_> {
    /// Checks `batch` and cuts it, once, into each replica's parts in order: the only place a
    /// data-parallel step slices its batch.
    pub fn parts(&self, batch: &Batch) -> Result<Vec<Vec<Part>>> {
        let (first, world, local) = (self.first, self.world, self.local);
        check_batch(batch, world)?;
        let n = batch.len();
        // Each part with its index among all processes' parts (the key of its gradient in a
        // deterministic sum).
        let per_replica: Vec<Vec<(usize, Range<usize>)>> = match self.mode {
            PartsOf::FixedShards(shards) => {
                let shards = ranges(n, shards.min(n), None)?;
                // Across processes, micro-shards go to every process's devices in equal shares.
                let owned = if world == local {
                    ranges(shards.len(), local, self.weights)?
                } else {
                    ranges(shards.len(), world, None)?[first..first + local].to_vec()
                };
                owned.into_iter().map(|ks| ks.map(|k| (k, shards[k].clone())).collect()).collect()
            }
            PartsOf::MicroBatches(micro) => {
                // Across processes, weights for every device of the job cut the whole batch
                // (every process the same cut); otherwise this process takes its devices'
                // equal share of the batch, which its own devices' weights divide.
                let (offset, shards) = match self.weights {
                    Some(w) if world != local && w.len() == world => (0, ranges(n, world, Some(w))?[first..first + local].to_vec()),
                    _ => {
                        let share = ranges(n, world, None)?;
                        let mine = share[first].start..share[first + local - 1].end;
                        (mine.start, ranges(mine.len(), local, self.weights)?)
                    }
                };
                let at = |r: &Range<usize>, m: Range<usize>| offset + r.start + m.start..offset + r.start + m.end;
                let mut index = 0;
                shards
                    .iter()
                    .map(|r| {
                        micro_ranges(r.len(), micro)
                            .into_iter()
                            .map(|m| {
                                index += 1;
                                (index - 1, at(r, m))
                            })
                            .collect()
                    })
                    .collect()
            }
        };
        per_replica
            .into_iter()
            .map(|rs| rs.into_iter().map(|(index, r)| Ok(Part { index, first: r.start, batch: batch.slice(r)? })).collect())
            .collect()
    }
}
