//! Batching over a shared dataset with a seeded, resumable per-epoch shuffle.
use super::epochs::{Epoch, Epochs};
use super::{Batch, Dataset};
use crate::Result;
use std::sync::Arc;

/// Where a [`DataLoader`] stands: the epoch of the next batch and how many samples of that
/// epoch's order were already served. Save it with a checkpoint to resume exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderState {
    pub epoch: u64,
    pub position: usize,
}

/// Serves batches from an `Arc<Dataset>`, epoch after epoch.
///
/// With `shuffle`, each epoch visits the samples in a permutation drawn from ChaCha8 seeded by
/// `(seed, epoch)` alone, so any epoch's order can be rebuilt on resume without replaying the
/// ones before it.
///
/// ```
/// use std::sync::Arc;
/// use tandem::data::{synthetic, DataLoader};
/// let ds = Arc::new(synthetic::regression(10, 3, 0)?);
/// let mut loader = DataLoader::new(ds, 4, true, 42)?;
/// assert_eq!(loader.batches_per_epoch(), 3);
/// let b = loader.next_batch();
/// assert_eq!(b.x_shape, [4, 3]);
/// let saved = loader.state();
/// let next = loader.next_batch();
/// loader.set_state(saved)?;
/// assert_eq!(loader.next_batch(), next);
/// # Ok::<(), tandem::Error>(())
/// ```
///
/// # Iterating
///
/// [`DataLoader::epoch`] is PyTorch's `for batch in loader` (and Burn's `loader.iter()`): the
/// batches of one epoch, then `None`; the next call serves the next epoch, in its own order.
/// The loader itself is an endless [`Iterator`], the stream a step-counted run draws from, so
/// `loader.by_ref().take(steps)` is that many steps' batches, across epoch boundaries, and
/// `next()` is [`DataLoader::next_batch`]. Both move the same position, which
/// [`DataLoader::state`] saves.
///
/// ```
/// use std::sync::Arc;
/// use tandem::data::{synthetic, DataLoader};
/// let mut loader = DataLoader::new(Arc::new(synthetic::regression(10, 3, 0)?), 4, true, 7)?;
/// for epoch in 0..2 {
///     let sizes: Vec<usize> = loader.epoch().map(|b| b.len()).collect();
///     assert_eq!(sizes, [4, 4, 2], "epoch {epoch}");
/// }
/// // Five batches of the endless stream: epoch 2's three, then two of epoch 3.
/// assert_eq!(loader.by_ref().take(5).count(), 5);
/// assert_eq!((loader.state().epoch, loader.state().position), (3, 8));
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct DataLoader {
    data: Arc<Dataset>,
    epochs: Epochs,
}

impl DataLoader {
    /// A loader at epoch 0, position 0. Errors if the dataset is invalid or empty, or if
    /// `batch_size` is 0.
    pub fn new(data: Arc<Dataset>, batch_size: usize, shuffle: bool, seed: u64) -> Result<Self> {
        data.validate()?;
        if batch_size > 0 && data.is_empty() {
            return Err(crate::Error::invalid("DataLoader::new", "the dataset has no samples"));
        }
        let epochs = Epochs::new("DataLoader::new", data.len(), batch_size, shuffle, seed)?;
        Ok(DataLoader { data, epochs })
    }

    /// Whether to skip each epoch's last batch when it is smaller than the batch size.
    /// Errors if that would leave no batch at all (batch size above the dataset size).
    pub fn drop_last(mut self, drop_last: bool) -> Result<Self> {
        self.epochs.set_drop_last("DataLoader::drop_last", drop_last)?;
        Ok(self)
    }

    pub fn batch_size(&self) -> usize {
        self.epochs.batch_size()
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.data
    }

    /// Batches served per epoch (the short last one counts unless `drop_last`).
    pub fn batches_per_epoch(&self) -> usize {
        self.epochs.batches_per_epoch()
    }

    /// The fewest samples a batch of this loader can hold: the batch size, or with a short last
    /// batch (no `drop_last`) the remainder.
    pub fn smallest_batch(&self) -> usize {
        self.epochs.smallest_batch()
    }

    /// The next batch; after an epoch's last batch the loader moves on to the next epoch.
    pub fn next_batch(&mut self) -> Batch {
        let indices = self.epochs.next_indices();
        self.data.batch_of_valid(&indices).expect("the loader's permutation only holds indices below the dataset length")
    }

    /// The batches left in the current epoch (all of them at an epoch's start), in order; see
    /// [Iterating](DataLoader#iterating).
    pub fn epoch(&mut self) -> Epoch<'_> {
        Epoch::new(self.epochs.batches_left(), move || self.next_batch())
    }

    /// The samples at `indices` in that order, e.g. for evaluation; errors on an index out of
    /// range.
    pub fn batch_at(&self, indices: &[usize]) -> Result<Batch> {
        self.data.batch_of_valid(indices)
    }

    /// Where the loader stands; pass it to [`DataLoader::set_state`] to resume.
    pub fn state(&self) -> LoaderState {
        self.epochs.state()
    }

    /// Resumes at `state`, as saved by [`DataLoader::state`] from a loader with the same
    /// dataset, batch size, shuffle flag and seed.
    pub fn set_state(&mut self, state: LoaderState) -> Result<()> {
        self.epochs.set_state("DataLoader::set_state", state)
    }
}

/// The endless stream of batches, epoch after epoch: `next()` is always `Some`
/// ([`DataLoader::next_batch`]). See [Iterating](DataLoader#iterating) for one epoch's batches.
impl Iterator for DataLoader {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        Some(self.next_batch())
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}
