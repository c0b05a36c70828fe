//! Peer access between CUDA devices: what the driver allows, enabling it once per ordered pair,
//! and the direct device-to-device copy behind `Backend::copy_from_peer`.
use super::memory::CudaBuf;
use super::{backend_error, CudaBackend};
use crate::Result;
use cudarc::driver::{result, sys};
use std::collections::HashSet;
use std::sync::Mutex;

/// Ordered pairs `(reader, owner)` of device ordinals whose access is already enabled. Peer
/// access belongs to the primary contexts, which every logical device of a GPU shares, so this
/// is process-wide.
static ENABLED: Mutex<Option<HashSet<(usize, usize)>>> = Mutex::new(None);

/// Whether device `reader` can address device `owner`'s memory (cuDeviceCanAccessPeer).
pub(crate) fn can_access(reader: usize, owner: usize) -> bool {
    super::guarded("cuDeviceCanAccessPeer", || {
        let (Ok(a), Ok(b)) = (result::device::get(reader as i32), result::device::get(owner as i32)) else {
            return Ok(false);
        };
        let mut can = 0;
        // SAFETY: both are valid device handles; `can` is a plain out-parameter.
        let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) };
        Ok(r == sys::CUresult::CUDA_SUCCESS && can == 1)
    })
    .unwrap_or(false)
}

/// Makes `reader`'s context able to address `owner`'s memory; true when it can (now or already).
pub(crate) fn enable(reader: &CudaBackend, owner: &CudaBackend) -> bool {
    let (r, o) = (reader.info_ref().ordinal, owner.info_ref().ordinal);
    if r == o {
        return true;
    }
    let mut enabled = ENABLED.lock().unwrap_or_else(|e| e.into_inner());
    let set = enabled.get_or_insert_with(HashSet::new);
    if set.contains(&(r, o)) {
        return true;
    }
    if !can_access(r, o) || reader.context().bind_to_thread().is_err() {
        return false;
    }
    // SAFETY: the reader's context is current and the owner's context is live.
    let status = unsafe { sys::cuCtxEnablePeerAccess(owner.context().cu_ctx(), 0) };
    let ok = matches!(status, sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    if ok {
        set.insert((r, o));
    }
    ok
}

/// Copies `bytes` of `src` (owned by `owner`) into `dst` on `reader`'s stream. The reader's
/// stream first waits for the owner's queued work (which may still write `src`), and the owner's
/// stream then waits for the copy, so `src` cannot be recycled by its pool while being read.
pub(crate) fn copy(reader: &CudaBackend, dst: &CudaBuf, owner: &CudaBackend, src: &CudaBuf, bytes: usize) -> Result<()> {
    let label = &reader.info_ref().name;
    let err = |what: &str, e| backend_error(&format!("cuda:{} ({label})", reader.info_ref().ordinal), what, e);
    let before = owner.stream().record_event(None).map_err(|e| err("cuEventRecord", e))?;
    reader.stream().wait(&before).map_err(|e| err("cuStreamWaitEvent", e))?;
    // SAFETY: both pointers address at least `bytes` bytes in their contexts, kept alive by
    // `dst` and `src`; the stream ordering above covers both sides.
    unsafe {
        result::memcpy_peer_async(reader.context().cu_ctx(), dst.ptr(), owner.context().cu_ctx(), src.ptr(), bytes, reader.stream().cu_stream())
    }
    .map_err(|e| err("cuMemcpyPeerAsync", e))?;
    let after = reader.stream().record_event(None).map_err(|e| err("cuEventRecord", e))?;
    owner.stream().wait(&after).map_err(|e| err("cuStreamWaitEvent", e))?;
    Ok(())
}
