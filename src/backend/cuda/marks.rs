//! Marks on a CUDA device's own timeline (`Backend::mark`): timing events recorded on the
//! device's one stream, read back as seconds since the first mark.
//!
//! Every op of a device runs on its stream in order, so an event recorded there completes when
//! the work before it has; `cuEventElapsedTime` between two of them is the device's time.
use super::device::CudaBackend;
use crate::Result;
use cudarc::driver::{sys, CudaEvent};
use std::sync::{Mutex, MutexGuard};

/// Marks one step may hold between reads; more return `None` (host clocks then).
const CAPACITY: usize = 1024;

/// The events recorded since the last read, in mark order.
#[derive(Default)]
pub(super) struct Marks(Mutex<Vec<CudaEvent>>);

impl Marks {
    fn lock(&self) -> MutexGuard<'_, Vec<CudaEvent>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the next mark after every op enqueued on `dev`'s stream so far.
    pub(super) fn mark(&self, dev: &CudaBackend) -> Result<Option<u32>> {
        let mut events = self.lock();
        if events.len() >= CAPACITY {
            return Ok(None);
        }
        // Timing events: cudarc's default flag disables timing.
        let e = dev.stream().record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| dev.err("cuEventRecord", e))?;
        events.push(e);
        Ok(Some(events.len() as u32 - 1))
    }

    /// Seconds from the first mark to each mark (waiting for them); then numbering restarts.
    pub(super) fn read(&self, dev: &CudaBackend) -> Result<Vec<f64>> {
        let events = std::mem::take(&mut *self.lock());
        let Some(first) = events.first() else { return Ok(Vec::new()) };
        events.iter().map(|e| first.elapsed_ms(e).map(|ms| f64::from(ms) * 1e-3).map_err(|err| dev.err("cuEventElapsedTime", err))).collect()
    }
}
