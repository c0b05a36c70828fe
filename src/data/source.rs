//! The one contract between data and training: a resumable stream of host batches.
use super::{Batch, DataLoader, LoaderState};
use crate::Result;

/// A resumable stream of training batches, epoch after epoch: what the
/// `Trainer` draws from, and what any user data source implements to
/// be trained on.
///
/// The stream must be a function of its [`state`](BatchSource::state): a source put back to a
/// saved state serves the same batches again, which is how a resumed run replays the
/// uninterrupted one bit for bit.
pub trait BatchSource: Send {
    /// The next batch; after an epoch's last batch the source moves on to the next epoch.
    fn next_batch(&mut self) -> Result<Batch>;
    /// Where the stream stands (saved with every checkpoint).
    fn state(&self) -> LoaderState;
    /// Puts the stream back at `state`, as saved by [`BatchSource::state`] from a source built
    /// the same way.
    fn set_state(&mut self, state: LoaderState) -> Result<()>;
    /// The samples of a full batch (the last of an epoch may hold fewer unless the source drops
    /// it).
    fn batch_size(&self) -> usize;
    /// Batches served per epoch.
    fn batches_per_epoch(&self) -> usize;
    /// Whether a batch can hold fewer than [`batch_size`](BatchSource::batch_size) samples (an
    /// epoch's short last batch): a strategy that splits batches checks what it could be.
    fn smallest_batch(&self) -> usize {
        self.batch_size()
    }
}

impl BatchSource for DataLoader {
    fn next_batch(&mut self) -> Result<Batch> {
        Ok(DataLoader::next_batch(self))
    }
    fn state(&self) -> LoaderState {
        DataLoader::state(self)
    }
    fn set_state(&mut self, state: LoaderState) -> Result<()> {
        DataLoader::set_state(self, state)
    }
    fn batch_size(&self) -> usize {
        DataLoader::batch_size(self)
    }
    fn batches_per_epoch(&self) -> usize {
        DataLoader::batches_per_epoch(self)
    }
    fn smallest_batch(&self) -> usize {
        DataLoader::smallest_batch(self)
    }
}
