//! The batch sources a `--model gpt` run trains and validates on besides a
//! [`WindowLoader`](tandem::data::WindowLoader) (`--order shuffle`, `sequential`): random
//! training windows keyed by the seed and the step (`--order random`), and the validation
//! windows served a batch at a time.
use super::gpt::{batch_rng, Draws, Tokens};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tandem::data::{Batch, BatchSource, LoaderState};
use tandem::train::{Observer, RunStart};
use tandem::{Error, Result};

/// `--order random`: `batch` training windows a step, drawn from (`--seed`, the step) alone, so
/// that a resumed run draws the windows the uninterrupted one would have. The step is where the
/// trainer starts (told by [`WindowStep`]) plus the batches drawn since; there is no loader
/// position to keep (its state is always epoch 0, position 0, as checkpoints have recorded).
pub(super) struct RandomWindows<'a> {
    pub data: &'a Tokens,
    /// The rows of a token file the windows come from (see `Draws`).
    pub rows: Range<usize>,
    pub seed: u64,
    pub batch: usize,
    pub block: usize,
    /// The 0-based step of the next batch.
    pub step: Arc<AtomicU64>,
}

impl BatchSource for RandomWindows<'_> {
    fn next_batch(&mut self) -> Result<Batch> {
        let step = self.step.fetch_add(1, Ordering::SeqCst);
        Draws::random(self.data, &self.rows, self.batch, self.block, &mut batch_rng(self.seed, step))
    }
    fn state(&self) -> LoaderState {
        LoaderState { epoch: 0, position: 0 }
    }
    fn set_state(&mut self, _: LoaderState) -> Result<()> {
        Ok(())
    }
    fn batch_size(&self) -> usize {
        self.batch
    }
    /// Windows drawn with replacement have no epochs: the stream does not end.
    fn batches_per_epoch(&self) -> usize {
        usize::MAX
    }
}

/// Tells [`RandomWindows`] the step the run starts after (0, or the resumed checkpoint's).
pub(super) struct WindowStep(pub Arc<AtomicU64>);

impl Observer for WindowStep {
    fn started(&mut self, start: &RunStart<'_>) {
        self.0.store(start.step, Ordering::SeqCst);
    }
}

/// The validation windows, the same ones at every evaluation (so that losses compare across
/// steps), `chunk` of them a batch, the last batch short.
pub(super) struct ValWindows {
    val: Batch,
    chunk: usize,
    position: usize,
}

impl ValWindows {
    pub fn new(val: Batch, chunk: usize) -> ValWindows {
        ValWindows { val, chunk: chunk.max(1), position: 0 }
    }
}

impl BatchSource for ValWindows {
    fn next_batch(&mut self) -> Result<Batch> {
        let end = (self.position + self.chunk).min(self.val.len());
        let part = self.val.slice(self.position..end)?;
        self.position = if end == self.val.len() { 0 } else { end };
        Ok(part)
    }
    fn state(&self) -> LoaderState {
        LoaderState { epoch: 0, position: self.position }
    }
    fn set_state(&mut self, state: LoaderState) -> Result<()> {
        if state.position > self.val.len() {
            return Err(Error::invalid("ValWindows::set_state", format!("position {} is past the {} windows", state.position, self.val.len())));
        }
        self.position = state.position;
        Ok(())
    }
    fn batch_size(&self) -> usize {
        self.chunk
    }
    fn batches_per_epoch(&self) -> usize {
        self.val.len().div_ceil(self.chunk)
    }
    fn smallest_batch(&self) -> usize {
        match self.val.len() % self.chunk {
            0 => self.chunk,
            rem => rem,
        }
    }
}
