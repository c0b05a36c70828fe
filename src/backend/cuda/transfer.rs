//! Host <-> device copies through one pinned (page-locked) staging buffer per logical device:
//! DMA from pinned memory runs at full bus speed and lets an upload return before it finishes.
use super::backend_error;
use crate::Result;
use cudarc::driver::{result, sys, CudaEvent, CudaStream};
use std::sync::{Arc, Mutex};

/// The most bytes staged at once; larger transfers go through in chunks.
const CHUNK: usize = 16 << 20;

struct Pinned {
    ptr: *mut u8,
    cap: usize,
    /// Recorded after the last copy that reads the staging buffer; wait before overwriting it.
    pending: Option<CudaEvent>,
}

// SAFETY: the pointer is page-locked host memory owned by this struct and only touched while
// the surrounding mutex is held.
unsafe impl Send for Pinned {}

pub(crate) struct Staging {
    stream: Arc<CudaStream>,
    label: String,
    pinned: Mutex<Pinned>,
}

impl Staging {
    pub(crate) fn new(stream: Arc<CudaStream>, label: String) -> Self {
        Staging { stream, label, pinned: Mutex::new(Pinned { ptr: std::ptr::null_mut(), cap: 0, pending: None }) }
    }

    fn err(&self, what: &str, e: impl std::fmt::Debug) -> crate::Error {
        backend_error(&self.label, what, e)
    }

    /// Makes the device's context current: raw driver copies act on the calling thread's context.
    fn bind(&self) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(|e| self.err("binding the context", e))
    }

    /// A pinned buffer of at least `len` bytes, or `None` if page-locked memory is refused (the
    /// copy then goes from pageable memory, which the driver stages itself).
    fn ensure(&self, p: &mut Pinned, len: usize) -> Result<bool> {
        if let Some(ev) = p.pending.take() {
            ev.synchronize().map_err(|e| self.err("waiting for a staged copy", e))?;
        }
        if p.cap >= len {
            return Ok(true);
        }
        if !p.ptr.is_null() {
            // SAFETY: allocated by cuMemHostAlloc below; no copy reads it (waited above).
            unsafe { result::free_host(p.ptr as _) }.map_err(|e| self.err("cuMemFreeHost", e))?;
            p.ptr = std::ptr::null_mut();
            p.cap = 0;
        }
        let want = len.next_power_of_two().min(CHUNK);
        // SAFETY: plain allocation; the memory is written before it is read.
        match unsafe { result::malloc_host(want, 0) } {
            Ok(ptr) => {
                p.ptr = ptr as *mut u8;
                p.cap = want;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// Queues a copy of `bytes` to device address `dst`; returns before it completes.
    pub(crate) fn upload(&self, bytes: &[u8], dst: sys::CUdeviceptr) -> Result<()> {
        let mut p = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        self.bind()?;
        let stream = self.stream.cu_stream();
        for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
            let at = dst + (i * CHUNK) as u64;
            if self.ensure(&mut p, chunk.len())? {
                // SAFETY: `p.ptr` holds at least `chunk.len()` bytes and no copy is reading it.
                let staged = unsafe {
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), p.ptr, chunk.len());
                    std::slice::from_raw_parts(p.ptr, chunk.len())
                };
                // SAFETY: `at` addresses a device buffer of at least bytes.len() bytes.
                unsafe { result::memcpy_htod_async(at, staged, stream) }.map_err(|e| self.err("cuMemcpyHtoDAsync", e))?;
                p.pending = Some(self.stream.record_event(None).map_err(|e| self.err("cuEventRecord", e))?);
            } else {
                // SAFETY: as above; from pageable memory the call returns once `chunk` is read.
                unsafe { result::memcpy_htod_async(at, chunk, stream) }.map_err(|e| self.err("cuMemcpyHtoDAsync", e))?;
            }
        }
        Ok(())
    }

    /// Copies `len` bytes from device address `src` after all queued work; waits for them.
    pub(crate) fn download(&self, src: sys::CUdeviceptr, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        let mut p = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        self.bind()?;
        let stream = self.stream.cu_stream();
        for (i, chunk) in out.chunks_mut(CHUNK).enumerate() {
            let at = src + (i * CHUNK) as u64;
            if self.ensure(&mut p, chunk.len())? {
                // SAFETY: `p.ptr` holds at least `chunk.len()` bytes, not in use by another copy.
                let staged = unsafe { std::slice::from_raw_parts_mut(p.ptr, chunk.len()) };
                // SAFETY: `at` addresses a device buffer of at least `len` bytes.
                unsafe { result::memcpy_dtoh_async(staged, at, stream) }.map_err(|e| self.err("cuMemcpyDtoHAsync", e))?;
                self.stream.synchronize().map_err(|e| self.err("cuStreamSynchronize", e))?;
                chunk.copy_from_slice(staged);
            } else {
                // SAFETY: as above; the synchronize below completes the copy before `out` is read.
                unsafe { result::memcpy_dtoh_async(chunk, at, stream) }.map_err(|e| self.err("cuMemcpyDtoHAsync", e))?;
                self.stream.synchronize().map_err(|e| self.err("cuStreamSynchronize", e))?;
            }
        }
        Ok(out)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let p = self.pinned.get_mut().unwrap_or_else(|e| e.into_inner());
        if p.ptr.is_null() {
            return;
        }
        let freed = self.stream.synchronize().and_then(|_| {
            // SAFETY: allocated by cuMemHostAlloc; the stream has finished every copy using it.
            unsafe { result::free_host(p.ptr as _) }
        });
        if let Err(e) = freed {
            tracing::warn!("{}: freeing pinned staging memory: {e:?}", self.label);
        }
    }
}
