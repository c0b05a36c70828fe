//! The validation batch source of a `--model gpt` run: the validation windows served a batch at
//! a time. Its training windows come from the library's
//! [`WindowLoader`](tandem::data::WindowLoader) (`--order shuffle`, `sequential`) or
//! [`RandomWindows`](tandem::data::RandomWindows) (`--order random`).
use tandem::data::{Batch, BatchSource, LoaderState};
use tandem::{Error, Result};

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
