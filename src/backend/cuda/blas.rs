//! Matmul through cuBLAS `sgemm_strided_batched`, when `libcublas` loads.
//!
//! cuBLAS is column-major, and a row-major matrix read column-major is its transpose. So the
//! row-major product C = op(A)·op(B) is computed as the column-major product
//! Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap places, m and n swap, and each operand's transpose
//! flag stays as the caller gave it.
use crate::backend::MatmulSpec;
use cudarc::cublas::{result, sys, CudaBlas};
use cudarc::driver::{sys::CUdeviceptr, CudaStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// A cuBLAS handle bound to one logical device's stream. The handle is not safe to use from two
/// threads at once, hence the mutex.
pub(crate) struct Blas(Mutex<CudaBlas>);

impl Blas {
    /// A handle on `stream`, or why there is none (libcublas missing or unusable); matmul then
    /// runs the fallback kernel, so a missing cuBLAS costs speed, not the device.
    pub(crate) fn new(stream: Arc<CudaStream>) -> Result<Self, String> {
        // SAFETY: is_culib_present only dlopens candidate names and closes them again.
        let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err("libcublas not found".into());
        }
        match catch_unwind(AssertUnwindSafe(|| CudaBlas::new(stream))) {
            Ok(Ok(blas)) => Ok(Blas(Mutex::new(blas))),
            Ok(Err(e)) => Err(format!("cublasCreate: {e:?}")),
            Err(_) => Err("libcublas lacks a symbol cudarc needs".into()),
        }
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
        let handle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the pointers address device buffers the caller sized for `spec`, in the
        // context of the handle's stream; alpha and beta are host scalars (default pointer mode).
        unsafe {
            result::sgemm_strided_batched(
                *handle.handle(),
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
