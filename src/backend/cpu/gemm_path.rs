//! Which library runs each of the CPU backend's products (see [`GemmChoice`]).
use super::kernels::SMALL_PRODUCT;
use crate::backend::MatmulSpec;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The smallest product (m·n·k multiply-adds, 512³) `auto` gives OpenBLAS, on a CPU where the
/// `gemm` crate has no AVX-512 kernels. Measured on a 2-core AVX-512 machine held to AVX2
/// (benches/README.md): OpenBLAS's Haswell kernels were 3-10% faster than `gemm`'s AVX2+FMA ones
/// at 512 to 2048 and level with them at 256; with AVX-512, `gemm` was as fast or faster at
/// every size (at 256, 156-180 GFLOP/s against OpenBLAS's 127), so `auto` keeps it there.
pub const OPENBLAS_FROM: usize = 1 << 27;

/// Which library runs the CPU backend's products: the `gemm` crate (always there), or OpenBLAS
/// where the `openblas` feature is built and the library loads at run time.
///
/// `TANDEM_CPU_GEMM` chooses, read when a CPU device is created ([`super::CpuBackend::with_gemm`]
/// ignores it): `auto` (the default: OpenBLAS for products of at least [`OPENBLAS_FROM`]
/// multiply-adds on CPUs where the `gemm` crate has no AVX-512 kernels, the `gemm` crate for
/// everything else and wherever OpenBLAS is missing), `gemm`
/// (always the `gemm` crate) or `openblas` (every product OpenBLAS can take). A device whose
/// kernels are pinned (`Backend::pin_kernels`, which deterministic data parallelism calls) uses
/// the `gemm` crate only: its sums run in the same order whatever the thread count and the
/// shape's other sizes, which OpenBLAS does not promise. The rule is fixed per shape, not timed
/// at run time, so a run and its resume take the same path on one machine.
///
/// Per-image products of a batch (a convolution's) stay with the `gemm` crate, one per thread:
/// OpenBLAS called from every thread at once would start its own threads under each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmChoice {
    Auto,
    Gemm,
    OpenBlas,
}

impl GemmChoice {
    /// From `TANDEM_CPU_GEMM` (unset or unknown: `auto`, the latter with a warning).
    pub fn from_env() -> GemmChoice {
        match std::env::var("TANDEM_CPU_GEMM").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("auto") => GemmChoice::Auto,
            Ok("gemm") => GemmChoice::Gemm,
            Ok("openblas") => GemmChoice::OpenBlas,
            Ok(other) => {
                tracing::warn!("TANDEM_CPU_GEMM={other:?} is not auto, gemm or openblas: using auto");
                GemmChoice::Auto
            }
        }
    }
}

/// Whether the `gemm` crate runs its AVX-512 kernels on this CPU.
#[cfg(feature = "openblas")]
fn gemm_has_avx512() -> bool {
    super::kernels::gemm_kernels() == "AVX-512"
}

/// The library one product runs in.
#[derive(Clone, Copy)]
pub enum GemmPath {
    Gemm,
    #[cfg(feature = "openblas")]
    OpenBlas(&'static super::openblas::OpenBlas),
}

/// A CPU device's rule: its choice, and whether its kernels are pinned.
pub struct GemmRule {
    // Only the `openblas` feature has a choice to make.
    #[cfg_attr(not(feature = "openblas"), allow(dead_code))]
    choice: GemmChoice,
    pinned: AtomicBool,
    /// Products (a batch counts once) given to OpenBLAS.
    openblas_products: AtomicU64,
}

impl GemmRule {
    pub fn new(choice: GemmChoice) -> GemmRule {
        GemmRule { choice, pinned: AtomicBool::new(false), openblas_products: AtomicU64::new(0) }
    }

    pub fn pin(&self) {
        self.pinned.store(true, Ordering::Relaxed);
    }

    /// The path for a product of `s`'s shape.
    pub fn path(&self, s: &MatmulSpec) -> GemmPath {
        let per_image = s.batch > 1 && s.m * s.n * s.k <= SMALL_PRODUCT;
        if per_image || self.pinned.load(Ordering::Relaxed) {
            return GemmPath::Gemm;
        }
        #[cfg(feature = "openblas")]
        {
            let big = s.m.saturating_mul(s.n).saturating_mul(s.k) >= OPENBLAS_FROM;
            let wanted = match self.choice {
                GemmChoice::Auto => big && !gemm_has_avx512(),
                GemmChoice::OpenBlas => true,
                GemmChoice::Gemm => false,
            };
            if let (true, Ok(lib)) = (wanted, super::openblas::library()) {
                self.openblas_products.fetch_add(1, Ordering::Relaxed);
                return GemmPath::OpenBlas(lib);
            }
        }
        GemmPath::Gemm
    }

    pub fn openblas_products(&self) -> u64 {
        self.openblas_products.load(Ordering::Relaxed)
    }

    /// What `DeviceInfo::matmul` says of this rule.
    pub fn describe(&self) -> String {
        let gemm = format!("gemm crate, {} kernels", super::kernels::gemm_kernels());
        #[cfg(feature = "openblas")]
        match (self.choice, super::openblas::library()) {
            (GemmChoice::Gemm, _) => format!("{gemm} (TANDEM_CPU_GEMM=gemm)"),
            (_, Err(why)) => format!("{gemm} ({why})"),
            (GemmChoice::Auto, Ok(_)) if gemm_has_avx512() => {
                format!("{gemm} (f32, host threads; faster here than OpenBLAS, which TANDEM_CPU_GEMM=openblas forces)")
            }
            (GemmChoice::Auto, Ok(lib)) => format!(
                "OpenBLAS ({} kernels, {}) from 2^{} multiply-adds, {gemm} below (f32, host threads)",
                lib.core,
                lib.path,
                OPENBLAS_FROM.ilog2()
            ),
            (GemmChoice::OpenBlas, Ok(lib)) => {
                format!("OpenBLAS ({} kernels, {}; TANDEM_CPU_GEMM=openblas), {gemm} for per-image products", lib.core, lib.path)
            }
        }
        #[cfg(not(feature = "openblas"))]
        format!("{gemm} (f32, host threads)")
    }
}
