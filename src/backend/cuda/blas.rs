//! Matmul through cuBLAS `sgemm_strided_batched`, on a handle tandem owns.
//!
//! cuBLAS is column-major, and a row-major matrix read column-major is its transpose. So the
//! row-major product C = op(A)·op(B) is computed as the column-major product
//! Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap places, m and n swap, and each operand's transpose
//! flag stays as the caller gave it.
use super::libs;
use crate::backend::MatmulSpec;
use cudarc::cublas::{result, sys};
use cudarc::driver::{sys::CUdeviceptr, CudaStream};
use std::sync::{Arc, Mutex};

/// A library handle destroyed when dropped. The destroy status is logged, never unwrapped:
/// after a sticky device fault every call fails, and a panic in a drop that runs while a test's
/// panic unwinds would abort the whole process (cudarc's `CudaBlas` unwraps it).
pub(crate) struct Owned<H: Copy> {
    raw: H,
    destroy: fn(H) -> Result<(), String>,
}

impl<H: Copy> Owned<H> {
    pub(crate) fn new(raw: H, destroy: fn(H) -> Result<(), String>) -> Self {
        Owned { raw, destroy }
    }
}

impl<H: Copy> Drop for Owned<H> {
    fn drop(&mut self) {
        if let Err(e) = (self.destroy)(self.raw) {
            tracing::warn!("{e}");
        }
    }
}

/// A cuBLAS handle; it is only used under the mutex of [`Blas`].
#[derive(Clone, Copy)]
struct RawHandle(sys::cublasHandle_t);
// SAFETY: a cuBLAS handle may move between threads; `Blas` serialises its use.
unsafe impl Send for RawHandle {}

fn destroy(h: RawHandle) -> Result<(), String> {
    // SAFETY: created by cublasCreate in `Blas::new` and destroyed only here, once.
    unsafe { result::destroy_handle(h.0) }.map_err(|e| format!("cublasDestroy: {e:?}"))
}

/// A cuBLAS handle bound to one logical device's stream. The handle is not safe to use from two
/// threads at once, hence the mutex.
pub(crate) struct Blas {
    handle: Mutex<Owned<RawHandle>>,
}

impl Blas {
    /// A handle on `stream`, or why there is none (libcublas missing or unusable).
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Self, String> {
        libs::load(&libs::CUBLAS)?;
        let made = super::quietly(|| -> Result<Self, String> {
            stream.context().bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
            let raw = result::create_handle().map_err(|e| format!("cublasCreate: {e:?}"))?;
            let handle = Owned::new(RawHandle(raw), destroy);
            // SAFETY: `raw` is live; the stream belongs to the bound context.
            unsafe { result::set_stream(raw, stream.cu_stream() as _) }.map_err(|e| format!("cublasSetStream: {e:?}"))?;
            Ok(Blas { handle: Mutex::new(handle) })
        });
        made.unwrap_or_else(|_| Err("libcublas lacks a symbol cudarc needs".into()))
    }

    /// `c = op(a)·op(b)` per `spec` on the handle's stream; `a`, `b`, `c` are base addresses
    /// (offsets are applied here). The caller checked sizes and that m, n, k, batch > 0.
    pub(crate) fn sgemm(&self, a: CUdeviceptr, b: CUdeviceptr, c: CUdeviceptr, s: &MatmulSpec) -> Result<(), String> {
        let int = |v: usize, what: &str| i32::try_from(v).map_err(|_| format!("{what} = {v} exceeds cuBLAS's 32-bit range"));
        let (m, n, k, batch) = (int(s.m, "m")?, int(s.n, "n")?, int(s.k, "k")?, int(s.batch, "batch")?);
        let op = |t: bool| if t { sys::cublasOperation_t::CUBLAS_OP_T } else { sys::cublasOperation_t::CUBLAS_OP_N };
        // Leading dimensions of the stored row-major matrices: their row lengths.
        let ld_b = if s.trans_b { k } else { n };
        let ld_a = if s.trans_a { m } else { k };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let handle = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the pointers address device buffers the caller sized for `spec`, in the
        // context of the handle's stream; alpha and beta are host scalars (default pointer mode).
        unsafe {
            result::sgemm_strided_batched(
                handle.raw.0,
                op(s.trans_b),
                op(s.trans_a),
                n,
                m,
                k,
                &alpha,
                (b + 4 * s.b_offset as u64) as *const f32,
                ld_b,
                s.b_batch_stride as i64,
                (a + 4 * s.a_offset as u64) as *const f32,
                ld_a,
                s.a_batch_stride as i64,
                &beta,
                c as *mut f32,
                n,
                (s.m * s.n) as i64,
                batch,
            )
        }
        .map_err(|e| format!("cublasSgemmStridedBatched: {e:?}"))
    }
}

/// The version of the cuBLAS library this process loads, as `cuBLAS 13.1.0 (libcublas.so.13)`;
/// needs no device.
pub(crate) fn version() -> Result<String, String> {
    let loaded = libs::load(&libs::CUBLAS)?;
    let part = |t| {
        let mut v = 0;
        // SAFETY: plain out-parameter; cublasGetProperty needs no handle.
        let status = unsafe { sys::cublasGetProperty(t, &mut v) };
        (status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v).ok_or(format!("cublasGetProperty: {status:?}"))
    };
    super::quietly(|| -> Result<String, String> {
        use sys::libraryPropertyType_t as P;
        Ok(format!("cuBLAS {}.{}.{} ({})", part(P::MAJOR_VERSION)?, part(P::MINOR_VERSION)?, part(P::PATCH_LEVEL)?, loaded.file_name()))
    })
    .unwrap_or_else(|_| Err("libcublas lacks cublasGetProperty".into()))
}

#[cfg(test)]
mod tests {
    use super::Owned;
    use std::panic::catch_unwind;

    #[test]
    fn a_failing_destroy_during_unwinding_does_not_abort() {
        // A sticky device fault: the test panics, and the handle's destroy fails as it unwinds.
        // Unwrapping that status would be a panic during a panic, which aborts the process.
        let unwound = catch_unwind(|| {
            let _handle = Owned::new(7u32, |_| Err("cublasDestroy: CUBLAS_STATUS_INTERNAL_ERROR".into()));
            panic!("device fault");
        });
        assert!(unwound.is_err(), "the first panic reaches the caller");
        static DESTROYED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        drop(Owned::new(3u32, |h| {
            DESTROYED.store(h, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }));
        assert_eq!(DESTROYED.load(std::sync::atomic::Ordering::SeqCst), 3, "the handle is destroyed once dropped");
    }
}
