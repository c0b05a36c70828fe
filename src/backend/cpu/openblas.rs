//! OpenBLAS's single-precision GEMM for the CPU backend, loaded at run time (feature
//! `openblas`): nothing to build or link against, so the same binary runs where the library is
//! missing (the `gemm` crate then does every product). OpenBLAS built with `DYNAMIC_ARCH`, as
//! the distributions ship it, picks its kernels (SkylakeX, Haswell, ...) from the CPU it finds.
use libloading::Library;
use rayon::prelude::*;
use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

/// `cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`.
type Sgemm = unsafe extern "C" fn(c_int, c_int, c_int, c_int, c_int, c_int, f32, *const f32, c_int, *const f32, c_int, f32, *mut f32, c_int);

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// A loaded OpenBLAS.
pub struct OpenBlas {
    sgemm: Sgemm,
    /// The file it was loaded from and the kernels it chose (`openblas_get_corename`).
    pub path: String,
    pub core: String,
    _lib: Library,
}

/// Where to look: `TANDEM_OPENBLAS` (a file), then the loader's search path. Only OpenBLAS
/// itself (not a generic `libblas.so.3`), whose thread count tandem sets.
fn candidates() -> Vec<String> {
    let mut out: Vec<String> = std::env::var("TANDEM_OPENBLAS").ok().filter(|p| !p.is_empty()).into_iter().collect();
    out.extend(["libopenblas.so.0", "libopenblas.so", "libopenblas.0.dylib", "libopenblas.dylib", "libopenblas.dll"].map(String::from));
    out
}

fn load() -> Result<OpenBlas, String> {
    let mut tried = Vec::new();
    for path in candidates() {
        // SAFETY: loading OpenBLAS runs its initializers, which only set up its thread pool
        // and detect the CPU; the symbols below are looked up with their C signatures.
        let lib = match unsafe { Library::new(&path) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{path} ({e})"));
                continue;
            }
        };
        // SAFETY: `cblas_sgemm` has the CBLAS signature `Sgemm` in every OpenBLAS.
        let Ok(sgemm) = (unsafe { lib.get::<Sgemm>(b"cblas_sgemm\0") }).map(|s| *s) else {
            tried.push(format!("{path} (no cblas_sgemm)"));
            continue;
        };
        // SAFETY: OpenBLAS's own entry points, `void (int)` and `char *(void)`; optional.
        let core = unsafe {
            if let Ok(set) = lib.get::<unsafe extern "C" fn(c_int)>(b"openblas_set_num_threads\0") {
                // One thread: `sgemm` splits a product over the backend's own pool instead, so
                // that no OpenBLAS worker is left spinning (as they do for a while after each
                // call) beside the elementwise passes between products.
                set(1);
            }
            match lib.get::<unsafe extern "C" fn() -> *const c_char>(b"openblas_get_corename\0") {
                Ok(name) => {
                    let p = name();
                    if p.is_null() {
                        "unknown".to_string()
                    } else {
                        CStr::from_ptr(p).to_string_lossy().into_owned()
                    }
                }
                Err(_) => "unknown".to_string(),
            }
        };
        return Ok(OpenBlas { sgemm, path, core, _lib: lib });
    }
    Err(format!("OpenBLAS not found: tried {}", tried.join(", ")))
}

/// The process's OpenBLAS, loaded at the first call; the reason it is missing otherwise.
pub fn library() -> Result<&'static OpenBlas, &'static str> {
    static LIB: OnceLock<Result<OpenBlas, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(String::as_str)
}

impl OpenBlas {
    /// `c = op(A) · op(B)` for one m×k by k×n product, row-major, A and B stored as
    /// `MatmulSpec` lays them out (transposed by stride where `trans_a`/`trans_b`). `None` when
    /// a size passes OpenBLAS's 32-bit integers (the caller uses the `gemm` crate).
    ///
    /// The caller guarantees that `a` holds the m×k (or k×m) matrix, `b` the k×n (n×k) one and
    /// `c` exactly m×n values.
    pub fn sgemm(&self, m: usize, n: usize, k: usize, a: &[f32], trans_a: bool, b: &[f32], trans_b: bool, c: &mut [f32]) -> Option<()> {
        let fits = |x: usize| c_int::try_from(x).ok();
        let (mi, ni, ki) = (fits(m)?, fits(n)?, fits(k)?);
        fits(m.checked_mul(n)?)?;
        let lda = if trans_a { mi } else { ki };
        let ldb = if trans_b { ki } else { ni };
        if a.len() < m * k || b.len() < k * n || c.len() != m * n {
            return None;
        }
        let t = |x: bool| if x { TRANS } else { NO_TRANS };
        // Blocks of C's rows (or, for a product of few rows, of its columns), one per thread of
        // the backend's pool: each output is still one call's sum over the whole of k.
        let threads = rayon::current_num_threads().max(1);
        let parallel = threads > 1 && m * n * k >= 1 << 18;
        let call = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>, c0: *mut f32| {
            // Row r of op(A) is row r of A as stored, or column r of the stored k×m; column j
            // of op(B) is column j of B as stored, or row j of the stored n×k.
            let a0 = if trans_a { &a[rows.start..] } else { &a[rows.start * k..] };
            let b0 = if trans_b { &b[cols.start * k..] } else { &b[cols.start..] };
            // SAFETY: the lengths checked above cover every element OpenBLAS reads through the
            // leading dimensions from `a0` and `b0` (rows.len() rows of op(A), cols.len()
            // columns of op(B)), and `c0` addresses this block's corner in `c`, whose rows are
            // `n` apart; blocks of concurrent calls do not overlap; all sizes fit its `int`.
            unsafe {
                (self.sgemm)(
                    ROW_MAJOR,
                    t(trans_a),
                    t(trans_b),
                    rows.len() as c_int,
                    cols.len() as c_int,
                    ki,
                    1.0,
                    a0.as_ptr(),
                    lda,
                    b0.as_ptr(),
                    ldb,
                    0.0,
                    c0,
                    ni,
                )
            };
        };
        if parallel && m >= 16 * threads {
            let rows = m.div_ceil(threads);
            c.par_chunks_mut(rows * n).enumerate().for_each(|(i, cb)| call(i * rows..i * rows + cb.len() / n, 0..n, cb.as_mut_ptr()));
        } else if parallel && n >= 16 * threads {
            let cols = n.div_ceil(threads);
            let base = SendPtr(c.as_mut_ptr());
            (0..n.div_ceil(cols)).into_par_iter().for_each(|j| {
                let j0 = j * cols;
                // SAFETY: column block j0.. starts inside row 0 of `c` (j0 < n).
                call(0..m, j0..(j0 + cols).min(n), unsafe { base.get().add(j0) });
            });
        } else {
            call(0..m, 0..n, c.as_mut_ptr());
        }
        Some(())
    }
}

/// C's base pointer, shared by the threads that write its disjoint column blocks.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: each thread writes only its own column block through it (see `OpenBlas::sgemm`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
