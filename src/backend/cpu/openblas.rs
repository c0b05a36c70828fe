//! OpenBLAS's single-precision GEMM for the CPU backend, loaded at run time (feature
//! `openblas`): nothing to build or link against, so the same binary runs where the library is
//! missing (the `gemm` crate then does every product). OpenBLAS built with `DYNAMIC_ARCH`, as
//! the distributions ship it, picks its kernels (SkylakeX, Haswell, ...) from the CPU it finds.
use libloading::Library;
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
                // As many threads as the backend's own pool: more would only contend.
                set(rayon::current_num_threads().clamp(1, c_int::MAX as usize) as c_int);
            }
            match lib.get::<unsafe extern "C" fn() -> *const c_char>(b"openblas_get_corename\0") {
                Ok(name) => {
                    let p = name();
                    if p.is_null() { "unknown".to_string() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
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
        // SAFETY: the lengths checked above cover every element OpenBLAS reads through the
        // leading dimensions (`lda`·rows of the stored A, `ldb`·rows of the stored B) and
        // writes (`n`·m of C); all sizes fit its `int`.
        unsafe { (self.sgemm)(ROW_MAJOR, t(trans_a), t(trans_b), mi, ni, ki, 1.0, a.as_ptr(), lda, b.as_ptr(), ldb, 0.0, c.as_mut_ptr(), ni) };
        Some(())
    }
}
