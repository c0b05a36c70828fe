//! The caching device allocator: freed buffers go back to a per-device pool keyed by size class
//! and are reused, because cuMemAlloc/cuMemFree synchronize and cost far more than a kernel.
//!
//! Reuse is safe without events because every op of a logical device runs on its one stream:
//! work that still reads a dropped buffer is ordered before any op that gets it back. Work on
//! another stream (peer copies) makes this stream wait for it before the buffer can drop.
use super::backend_error;
use crate::backend::budget::Budget;
use crate::backend::MemoryStats;
use crate::{Error, Result};
use cudarc::driver::{result, sys, CudaStream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Device memory of one buffer; returns itself to its pool on drop. `Backend::release` gives
/// the memory back early (ZeRO-3 between uses of a parameter) while the handle lives on, and
/// `Backend::restore` takes memory of the same class again: the pointer can change, so it is
/// read through [`CudaBuf::ptr`] at each use.
pub(crate) struct CudaBuf {
    /// The device address; 0 while released (and for an empty buffer, which holds no memory).
    ptr: AtomicU64,
    class: usize,
    pub(crate) pool: Arc<Pool>,
}

impl CudaBuf {
    /// The device address (0 for an empty buffer). Callers check [`CudaBuf::is_released`]
    /// first: a released buffer's address belongs to the pool.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr.load(Ordering::Acquire)
    }

    pub(crate) fn is_released(&self) -> bool {
        self.class > 0 && self.ptr() == 0
    }

    /// Gives the memory back to the pool, where the next allocation of its class takes it;
    /// nothing for a released buffer. Work queued on the stream that still reads it runs
    /// before any later op that is handed the memory (one stream per logical device).
    pub(crate) fn release(&self) {
        let ptr = self.ptr.swap(0, Ordering::AcqRel);
        if ptr != 0 {
            self.pool.give_back(ptr, self.class);
        }
    }

    /// Memory of the buffer's class again (contents unspecified), within the device's budget;
    /// does nothing to a buffer that holds memory.
    pub(crate) fn restore(&self) -> Result<()> {
        if !self.is_released() {
            return Ok(());
        }
        let ptr = self.pool.take(self.class, self.class)?;
        if self.ptr.compare_exchange(0, ptr, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // Another thread restored it first.
            self.pool.give_back(ptr, self.class);
        }
        Ok(())
    }
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        let ptr = *self.ptr.get_mut();
        if ptr != 0 {
            self.pool.give_back(ptr, self.class);
        }
    }
}

/// Per logical device: the free lists and the statistics `Backend::memory` reports.
pub(crate) struct Pool {
    stream: Arc<CudaStream>,
    /// `cuda:N (name)`, for error messages.
    pub(crate) label: String,
    free: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
    in_use: AtomicU64,
    peak: AtomicU64,
    pooled: AtomicU64,
    budget: Budget,
}

/// Bytes actually allocated for a request: powers of two up to 1 MiB (at most 2x waste on small
/// tensors), whole MiB above, so a training loop's repeated shapes hit the same class.
fn size_class(bytes: usize) -> usize {
    const MIB: usize = 1 << 20;
    match bytes {
        0 => 0,
        b if b <= MIB => b.next_power_of_two().max(256),
        b => b.div_ceil(MIB) * MIB,
    }
}

impl Pool {
    pub(crate) fn new(stream: Arc<CudaStream>, label: String) -> Self {
        Pool {
            stream,
            label,
            free: Mutex::default(),
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            pooled: AtomicU64::new(0),
            budget: Budget::default(),
        }
    }

    /// A buffer of at least `bytes`, from the pool when one of its class is free. On
    /// out-of-memory the pool is emptied and the allocation retried once.
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<CudaBuf> {
        let class = size_class(bytes);
        let ptr = self.take(bytes, class)?;
        Ok(CudaBuf { ptr: AtomicU64::new(ptr), class, pool: self.clone() })
    }

    /// Memory of `class` bytes for a request of `bytes`: a pooled block, or a fresh one within
    /// the budget; counted as in use.
    fn take(&self, bytes: usize, class: usize) -> Result<sys::CUdeviceptr> {
        if class == 0 {
            return Ok(0);
        }
        // The bytes are counted before they are taken, so concurrent requests cannot both
        // squeeze under the budget; a refusal takes them back.
        let before = self.in_use.fetch_add(class as u64, Ordering::Relaxed);
        let undo = |e: Error| {
            self.in_use.fetch_sub(class as u64, Ordering::Relaxed);
            e
        };
        self.budget.check(&self.label, before, class as u64, bytes as u64).map_err(undo)?;
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&class).and_then(Vec::pop);
        let ptr = match reused {
            Some(ptr) => {
                self.pooled.fetch_sub(class as u64, Ordering::Relaxed);
                ptr
            }
            None => self.fresh(bytes, class).map_err(undo)?,
        };
        self.peak.fetch_max(before + class as u64, Ordering::Relaxed);
        Ok(ptr)
    }

    fn fresh(&self, bytes: usize, class: usize) -> Result<sys::CUdeviceptr> {
        let ctx = self.stream.context();
        ctx.bind_to_thread().map_err(|e| backend_error(&self.label, "binding the context", e))?;
        // SAFETY: the context is current; the memory is only handed out as uninitialised floats.
        match unsafe { result::malloc_sync(class) } {
            Ok(ptr) => return Ok(ptr),
            Err(e) if e.0 != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => return Err(backend_error(&self.label, "cuMemAlloc", e)),
            Err(_) => {}
        }
        let released = self.release_cached()?;
        // SAFETY: as above.
        match unsafe { result::malloc_sync(class) } {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory {
                device: self.label.clone(),
                requested: bytes as u64,
                free: ctx.mem_get_info().map(|(free, _)| free as u64).unwrap_or(0),
                detail: format!(
                    "cuMemAlloc of {class} bytes failed after releasing {released} cached bytes; \
                     live tensors hold {} bytes",
                    self.in_use.load(Ordering::Relaxed).saturating_sub(class as u64)
                ),
            }),
            Err(e) => Err(backend_error(&self.label, "cuMemAlloc", e)),
        }
    }

    fn give_back(&self, ptr: sys::CUdeviceptr, class: usize) {
        if class == 0 {
            return;
        }
        self.in_use.fetch_sub(class as u64, Ordering::Relaxed);
        self.pooled.fetch_add(class as u64, Ordering::Relaxed);
        self.free.lock().unwrap_or_else(|e| e.into_inner()).entry(class).or_default().push(ptr);
    }

    /// Frees every pooled buffer back to the driver; returns the bytes released. Waits for the
    /// stream first, since queued work may still read a buffer that was dropped.
    pub(crate) fn release_cached(&self) -> Result<u64> {
        let lists: Vec<(usize, Vec<sys::CUdeviceptr>)> = self.free.lock().unwrap_or_else(|e| e.into_inner()).drain().collect();
        if lists.is_empty() {
            return Ok(0);
        }
        self.stream.synchronize().map_err(|e| backend_error(&self.label, "cuStreamSynchronize", e))?;
        let mut released = 0u64;
        for (class, ptrs) in lists {
            for ptr in ptrs {
                // SAFETY: `ptr` came from cuMemAlloc in this context and no live buffer owns it.
                unsafe { result::free_sync(ptr) }.map_err(|e| backend_error(&self.label, "cuMemFree", e))?;
                released += class as u64;
                self.pooled.fetch_sub(class as u64, Ordering::Relaxed);
            }
        }
        Ok(released)
    }

    pub(crate) fn reset_peak(&self) {
        self.peak.store(self.in_use.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        MemoryStats {
            in_use: self.in_use.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            pooled: self.pooled.load(Ordering::Relaxed),
            budget: self.budget.get(),
        }
    }

    pub(crate) fn set_budget(&self, bytes: Option<u64>) {
        self.budget.set(bytes);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Err(e) = self.release_cached() {
            tracing::warn!("{}: releasing cached device memory: {e}", self.label);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_round_up() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(4), 256);
        assert_eq!(size_class(1000), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class(5 << 20), 5 << 20);
    }
}
