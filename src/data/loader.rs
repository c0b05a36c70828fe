//! Batching over a shared dataset with a seeded, resumable per-epoch shuffle.
use super::{Batch, Dataset};
use crate::{Error, Result};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
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
#[derive(Clone, Debug)]
pub struct DataLoader {
    data: Arc<Dataset>,
    batch_size: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    state: LoaderState,
    /// The visiting order of `state.epoch`.
    order: Vec<usize>,
}

impl DataLoader {
    /// A loader at epoch 0, position 0. Errors if the dataset is invalid or empty, or if
    /// `batch_size` is 0.
    pub fn new(data: Arc<Dataset>, batch_size: usize, shuffle: bool, seed: u64) -> Result<Self> {
        data.validate()?;
        if batch_size == 0 {
            return Err(Error::invalid("DataLoader::new", "batch size must be at least 1"));
        }
        if data.is_empty() {
            return Err(Error::invalid("DataLoader::new", "the dataset has no samples"));
        }
        let state = LoaderState { epoch: 0, position: 0 };
        let order = epoch_order(data.len(), shuffle, seed, 0);
        Ok(DataLoader { data, batch_size, shuffle, seed, drop_last: false, state, order })
    }

    /// Whether to skip each epoch's last batch when it is smaller than the batch size.
    /// Errors if that would leave no batch at all (batch size above the dataset size).
    pub fn drop_last(mut self, drop_last: bool) -> Result<Self> {
        if drop_last && self.batch_size > self.data.len() {
            return Err(Error::invalid(
                "DataLoader::drop_last",
                format!("batch size {} exceeds the {} samples: no full batch exists", self.batch_size, self.data.len()),
            ));
        }
        self.drop_last = drop_last;
        // A position valid before may now sit inside the dropped tail.
        if self.epoch_done() {
            self.start_epoch(self.state.epoch + 1);
        }
        Ok(self)
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.data
    }

    /// Batches served per epoch (the short last one counts unless `drop_last`).
    pub fn batches_per_epoch(&self) -> usize {
        let n = self.data.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// The fewest samples a batch of this loader can hold: the batch size, or with a short last
    /// batch (no `drop_last`) the remainder.
    pub fn smallest_batch(&self) -> usize {
        let rem = self.data.len() % self.batch_size;
        if self.drop_last || rem == 0 || self.data.len() < self.batch_size {
            self.batch_size.min(self.data.len())
        } else {
            rem
        }
    }

    /// The next batch; after an epoch's last batch the loader moves on to the next epoch.
    pub fn next_batch(&mut self) -> Batch {
        let start = self.state.position;
        let end = (start + self.batch_size).min(self.order.len());
        let indices = self.order[start..end].to_vec();
        self.state.position = end;
        if self.epoch_done() {
            self.start_epoch(self.state.epoch + 1);
        }
        self.data
            .batch_of_valid(&indices)
            .expect("the loader's permutation only holds indices below the dataset length")
    }

    /// The samples at `indices` in that order, e.g. for evaluation; errors on an index out of
    /// range.
    pub fn batch_at(&self, indices: &[usize]) -> Result<Batch> {
        self.data.batch_of_valid(indices)
    }

    /// Where the loader stands; pass it to [`DataLoader::set_state`] to resume.
    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Resumes at `state`, as saved by [`DataLoader::state`] from a loader with the same
    /// dataset, batch size, shuffle flag and seed.
    pub fn set_state(&mut self, state: LoaderState) -> Result<()> {
        if state.position > self.data.len() {
            return Err(Error::invalid(
                "DataLoader::set_state",
                format!("position {} is past the {} samples", state.position, self.data.len()),
            ));
        }
        self.start_epoch(state.epoch);
        self.state.position = state.position;
        if self.epoch_done() {
            self.start_epoch(state.epoch + 1);
        }
        Ok(())
    }

    /// True when no further batch can be served from the current epoch.
    fn epoch_done(&self) -> bool {
        let left = self.order.len() - self.state.position;
        left == 0 || (self.drop_last && left < self.batch_size)
    }

    fn start_epoch(&mut self, epoch: u64) {
        self.order = epoch_order(self.data.len(), self.shuffle, self.seed, epoch);
        self.state = LoaderState { epoch, position: 0 };
    }
}

/// The visiting order of one epoch: identity without shuffle, else a Fisher–Yates permutation.
fn epoch_order(n: usize, shuffle: bool, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&epoch.to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(key);
        // Hand-written rather than `SliceRandom::shuffle` so the order cannot change with a
        // rand upgrade, which would break resuming old checkpoints.
        for i in (1..n).rev() {
            let j = below(&mut rng, i + 1);
            order.swap(i, j);
        }
    }
    order
}

/// A uniform integer in `0..n` by multiply-shift (Lemire); the bias is below 2^-32 for any
/// dataset size that fits in memory.
pub(crate) fn below(rng: &mut impl RngCore, n: usize) -> usize {
    ((rng.next_u64() as u128 * n as u128) >> 64) as usize
}
