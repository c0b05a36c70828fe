//! Token windows served in epochs: a language model's [`BatchSource`], shuffled without
//! replacement per epoch or in order, over a chosen range of rows.
use super::epochs::{Epoch, Epochs};
use super::text::TokenWindows;
use super::{Batch, BatchSource, Inputs, LoaderState, Targets};
use crate::{Error, Result};
use std::ops::Range;
use std::sync::Arc;

/// Serves rows `rows` of some [`TokenWindows`] as language-model batches (`x` an `[B, T]` I32
/// input, `y` its next tokens as [`Targets::Tokens`]), epoch after epoch, as a
/// [`DataLoader`](super::DataLoader) serves a dataset: every row once per epoch, in a
/// permutation drawn from `(seed, epoch)` alone with `shuffle`, in row order without; resumable
/// from its [`LoaderState`].
///
/// A validation source is another `WindowLoader`: over a second file's windows, or over a
/// range of rows the training loader does not serve ([`TokenWindows::rows_of`] gives the
/// 90/10 split by position).
///
/// ```
/// use std::sync::Arc;
/// use tandem::data::text::{Split, TokenWindows};
/// use tandem::data::{Inputs, WindowLoader};
/// // 20 windows of 3 tokens over a vocabulary of 50: row r starts at token 2r.
/// let tokens: Vec<i32> = (0..50).collect();
/// let all = Arc::new(TokenWindows::from_tokens(&tokens[..41], 2, 50, "counting")?);
/// let mut train = WindowLoader::new(all.clone(), all.rows_of(Split::Train), 4, true, 7)?;
/// let mut val = WindowLoader::new(all.clone(), all.rows_of(Split::Val), 4, false, 0)?;
/// assert_eq!((train.batches_per_epoch(), val.batches_per_epoch()), (5, 1));
/// let b = train.next_batch();
/// assert_eq!(b.x_shape, [4, 2]);
/// // In order, the validation rows 18 and 19: tokens 36, 37 and 38, 39.
/// assert_eq!(val.next_batch().x, Inputs::I32(vec![36, 37, 38, 39]));
/// // Saved and restored, the stream goes on as it would have.
/// let saved = train.state();
/// let next = train.next_batch();
/// train.set_state(saved)?;
/// assert_eq!(train.next_batch(), next);
/// # Ok::<(), tandem::Error>(())
/// ```
///
/// It iterates as a `DataLoader` does: [`WindowLoader::epoch`] is one epoch's batches, the
/// loader itself the endless stream.
#[derive(Clone, Debug)]
pub struct WindowLoader {
    windows: Arc<TokenWindows>,
    rows: Range<usize>,
    epochs: Epochs,
}

impl WindowLoader {
    /// A loader of `rows` at epoch 0, position 0. Errors when `rows` is empty or outside the
    /// windows, `batch_size` is 0, or the windows' `x` and `y` are not `rows × block` ids each
    /// in `0..vocab_size`.
    pub fn new(windows: Arc<TokenWindows>, rows: Range<usize>, batch_size: usize, shuffle: bool, seed: u64) -> Result<WindowLoader> {
        const OP: &str = "WindowLoader::new";
        let w = &*windows;
        if rows.is_empty() || rows.end > w.rows {
            return Err(Error::invalid(OP, format!("{}: rows {rows:?} of the {} rows; give a non-empty range within them", w.source(), w.rows)));
        }
        let numel = w.rows.checked_mul(w.block);
        if w.block == 0 || numel != Some(w.x.len()) || numel != Some(w.y.len()) {
            return Err(Error::shape(
                OP,
                format!("{}: x holds {} and y {} ids, not {} rows of {}", w.source(), w.x.len(), w.y.len(), w.rows, w.block),
            ));
        }
        // Checked once here: the loader then builds batches without looking at the ids again.
        let (a, b) = (rows.start * w.block, rows.end * w.block);
        for (name, ids) in [("x", &w.x[a..b]), ("y", &w.y[a..b])] {
            if let Some((i, &id)) = ids.iter().enumerate().find(|&(_, &id)| id < 0 || id as usize >= w.vocab_size) {
                let at = (a + i) / w.block;
                return Err(Error::invalid(OP, format!("{}: {name} row {at} holds token id {id}, outside 0..{}", w.source(), w.vocab_size)));
            }
        }
        let epochs = Epochs::new(OP, rows.len(), batch_size, shuffle, seed)?;
        Ok(WindowLoader { windows, rows, epochs })
    }

    /// Whether to skip each epoch's last batch when it is smaller than the batch size (a
    /// strategy that splits batches evenly needs full ones). Errors when no full batch exists.
    pub fn drop_last(mut self, drop_last: bool) -> Result<WindowLoader> {
        self.epochs.set_drop_last("WindowLoader::drop_last", drop_last)?;
        Ok(self)
    }

    pub fn windows(&self) -> &Arc<TokenWindows> {
        &self.windows
    }

    /// The rows served.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    pub fn batch_size(&self) -> usize {
        self.epochs.batch_size()
    }

    /// Batches served per epoch (the short last one counts unless `drop_last`).
    pub fn batches_per_epoch(&self) -> usize {
        self.epochs.batches_per_epoch()
    }

    /// The fewest windows a batch can hold.
    pub fn smallest_batch(&self) -> usize {
        self.epochs.smallest_batch()
    }

    /// The next batch; after an epoch's last batch the loader moves on to the next epoch.
    pub fn next_batch(&mut self) -> Batch {
        let w = &*self.windows;
        let t = w.block;
        let picked = self.epochs.next_indices();
        let (mut x, mut y) = (Vec::with_capacity(picked.len() * t), Vec::with_capacity(picked.len() * t));
        for i in &picked {
            let r = self.rows.start + i;
            x.extend_from_slice(&w.x[r * t..(r + 1) * t]);
            y.extend_from_slice(&w.y[r * t..(r + 1) * t]);
        }
        Batch { x: Inputs::I32(x), x_shape: vec![picked.len(), t], y: Targets::Tokens { ids: y, shape_per_sample: vec![t], classes: w.vocab_size } }
    }

    /// The batches left in the current epoch (all of them at an epoch's start), in order.
    pub fn epoch(&mut self) -> Epoch<'_> {
        Epoch::new(self.epochs.batches_left(), move || self.next_batch())
    }

    /// Where the loader stands: the epoch and the windows of it already served.
    pub fn state(&self) -> LoaderState {
        self.epochs.state()
    }

    /// Resumes at `state`, as saved by [`WindowLoader::state`] from a loader of the same
    /// windows, rows, batch size, shuffle flag and seed.
    pub fn set_state(&mut self, state: LoaderState) -> Result<()> {
        self.epochs.set_state("WindowLoader::set_state", state)
    }
}

/// The endless stream of batches, epoch after epoch: `next()` is always `Some`.
impl Iterator for WindowLoader {
    type Item = Batch;
    fn next(&mut self) -> Option<Batch> {
        Some(self.next_batch())
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

impl BatchSource for WindowLoader {
    fn next_batch(&mut self) -> Result<Batch> {
        Ok(WindowLoader::next_batch(self))
    }
    fn state(&self) -> LoaderState {
        WindowLoader::state(self)
    }
    fn set_state(&mut self, state: LoaderState) -> Result<()> {
        WindowLoader::set_state(self, state)
    }
    fn batch_size(&self) -> usize {
        WindowLoader::batch_size(self)
    }
    fn batches_per_epoch(&self) -> usize {
        WindowLoader::batches_per_epoch(self)
    }
    fn smallest_batch(&self) -> usize {
        WindowLoader::smallest_batch(self)
    }
}
