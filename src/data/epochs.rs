//! The visiting order of `n` samples, epoch after epoch: what [`DataLoader`](super::DataLoader)
//! and [`WindowLoader`](super::WindowLoader) share (batching, the seeded per-epoch shuffle, the
//! short or dropped last batch, the resumable position), and the seeded permutation behind
//! [`Dataset::shuffled`](super::Dataset::shuffled) and [`Dataset::split`](super::Dataset::split).
use super::{Batch, LoaderState};
use crate::{Error, Result};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Which stream a permutation's key belongs to, in its bytes 16..24: a loader's epoch orders
/// (0, the key of every checkpoint written so far) or a dataset's shuffle (1).
pub(crate) const LOADER_STREAM: u64 = 0;
pub(crate) const SHUFFLE_STREAM: u64 = 1;

/// Batches of indices into `0..n`, epoch after epoch, from a position that can be saved and
/// restored.
#[derive(Clone, Debug)]
pub(crate) struct Epochs {
    n: usize,
    batch_size: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    state: LoaderState,
    /// The visiting order of `state.epoch`.
    order: Vec<usize>,
}

impl Epochs {
    /// Epoch 0, position 0, over `n >= 1` samples; `op` names the constructor in errors.
    pub(crate) fn new(op: &'static str, n: usize, batch_size: usize, shuffle: bool, seed: u64) -> Result<Epochs> {
        if batch_size == 0 {
            return Err(Error::invalid(op, "batch size must be at least 1"));
        }
        if n == 0 {
            return Err(Error::invalid(op, "there are no samples to serve"));
        }
        let order = permutation(n, shuffle, seed, LOADER_STREAM, 0);
        Ok(Epochs { n, batch_size, shuffle, seed, drop_last: false, state: LoaderState { epoch: 0, position: 0 }, order })
    }

    /// Skips (or keeps) each epoch's last batch when it is short; errors when no full batch
    /// exists.
    pub(crate) fn set_drop_last(&mut self, op: &'static str, drop_last: bool) -> Result<()> {
        if drop_last && self.batch_size > self.n {
            return Err(Error::invalid(op, format!("batch size {} exceeds the {} samples: no full batch exists", self.batch_size, self.n)));
        }
        self.drop_last = drop_last;
        // A position valid before may now sit inside the dropped tail.
        if self.epoch_done() {
            self.start_epoch(self.state.epoch + 1);
        }
        Ok(())
    }

    pub(crate) fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub(crate) fn batches_per_epoch(&self) -> usize {
        if self.drop_last {
            self.n / self.batch_size
        } else {
            self.n.div_ceil(self.batch_size)
        }
    }

    /// Batches still to come in the current epoch (at least 1: a finished epoch has moved on).
    pub(crate) fn batches_left(&self) -> usize {
        let left = self.n - self.state.position;
        if self.drop_last {
            left / self.batch_size
        } else {
            left.div_ceil(self.batch_size)
        }
    }

    pub(crate) fn smallest_batch(&self) -> usize {
        let rem = self.n % self.batch_size;
        if self.drop_last || rem == 0 || self.n < self.batch_size {
            self.batch_size.min(self.n)
        } else {
            rem
        }
    }

    /// The indices of the next batch; after an epoch's last batch the order moves on to the
    /// next epoch.
    pub(crate) fn next_indices(&mut self) -> Vec<usize> {
        let start = self.state.position;
        let end = (start + self.batch_size).min(self.n);
        let indices = self.order[start..end].to_vec();
        self.state.position = end;
        if self.epoch_done() {
            self.start_epoch(self.state.epoch + 1);
        }
        indices
    }

    pub(crate) fn state(&self) -> LoaderState {
        self.state
    }

    pub(crate) fn set_state(&mut self, op: &'static str, state: LoaderState) -> Result<()> {
        if state.position > self.n {
            return Err(Error::invalid(op, format!("position {} is past the {} samples", state.position, self.n)));
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
        let left = self.n - self.state.position;
        left == 0 || (self.drop_last && left < self.batch_size)
    }

    fn start_epoch(&mut self, epoch: u64) {
        self.order = permutation(self.n, self.shuffle, self.seed, LOADER_STREAM, epoch);
        self.state = LoaderState { epoch, position: 0 };
    }
}

/// The rest of one epoch of a loader, batch by batch: what
/// [`DataLoader::epoch`](super::DataLoader::epoch) and
/// [`WindowLoader::epoch`](super::WindowLoader::epoch) return, PyTorch's `for batch in loader`.
/// It knows its length; dropping it part-way leaves the loader where it stopped.
pub struct Epoch<'a> {
    left: usize,
    next: Box<dyn FnMut() -> Batch + 'a>,
}

impl<'a> Epoch<'a> {
    pub(crate) fn new(left: usize, next: impl FnMut() -> Batch + 'a) -> Epoch<'a> {
        Epoch { left, next: Box::new(next) }
    }
}

impl Iterator for Epoch<'_> {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some((self.next)())
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Epoch<'_> {}
impl std::iter::FusedIterator for Epoch<'_> {}

/// A visiting order of `0..n`: the identity without `shuffle`, else a Fisher–Yates permutation
/// drawn from ChaCha8 keyed by `(seed, stream, epoch)` alone, so any epoch's order can be
/// rebuilt on resume without replaying the ones before it.
pub(crate) fn permutation(n: usize, shuffle: bool, seed: u64, stream: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&epoch.to_le_bytes());
        key[16..24].copy_from_slice(&stream.to_le_bytes());
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
