//! Scalar definitions of every op on host slices; the CPU backend runs them and tests read them.
//! Large passes are split over threads in fixed chunks of independent outputs: every output is
//! computed by the same operations in the same order whatever the thread count, so the results
//! are bit-identical to a serial run.
use super::gemm_path::GemmPath;
use crate::backend::{BinaryOp, MatmulSpec, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use rayon::prelude::*;

/// `fn $name(args)` running `$plain`, an `#[inline(always)]` loop, compiled also for AVX-512F
/// and AVX2 (whatever the cargo features) and chosen at run time from the CPU's features, so that
/// the loop vectorises as wide as the CPU allows; Rust never fuses a multiply and an add, so
/// every version gives the same bits.
macro_rules! by_isa {
    ($(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),*) => $plain:path) => {
        $(#[$attr])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    $plain($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    $plain($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F, checked just above.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $plain($($arg),*)
        }
    };
}
pub(super) use by_isa;

/// Elements per task of an elementwise pass; below two chunks a pass stays on the calling
/// thread, where handing work to the pool costs more than it saves.
pub(super) const CHUNK: usize = 1 << 15;

// Always inlined: called with a constant op (each elementwise pass, the fused GELU), the
// match folds away; a call per element cost a quarter of the GPT step.
/// The CPU reference of every unary op, from the table in `backend/op_table.rs`.
#[inline(always)]
pub fn unary(op: UnaryOp, x: f32) -> f32 {
    crate::backend::op_table::unary_ops!(cpu op, x)
}

/// tanh in f32 arithmetic, no call and no branch (both halves computed and one selected), so
/// a loop of it vectorises eight lanes wide with AVX2 and sixteen with AVX-512. Below |x| =
/// 0.625 an odd polynomial, `a + a·z·P(z)` with `z = a²` and `P` of degree 4 fitted to
/// `(tanh a - a) / a³` (within 0.08 ulp of tanh before rounding); above, `1 - 2e / (1 + e)` with
/// `e = exp(-2a) = 2^-k · exp(-r)`, `r` reduced by a two-part ln 2 (Cody-Waite) to |r| <= 0.35,
/// `exp(-r)` a Taylor polynomial of degree 7 and `2^-k` built from the bits of a rounding
/// through 1.5·2^23. Checked over every f32 from 0 to 10: within 1 ulp of f64's tanh rounded to
/// f32 everywhere (the correctly rounded value for 99.65% of them; PyTorch's vectorised tanh is
/// a 1-ulp one too, glibc's `tanhf` is off by 2). f32 rather than an f64 tanh, which would be
/// correctly rounded but for rare ties: the f32 one vectorises twice as wide and is the
/// cheaper one (benches/README.md). |x| is capped at 10, where tanh rounds to
/// ±1; -0 stays -0 and NaN stays NaN.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    // Fitted on Chebyshev nodes of [0, 0.625²], weighted to tanh's relative error.
    const ODD: [f32; 5] = [-0.333_332_8, 0.133_313_82, -0.053_735_32, 0.020_626_292, -0.005_691_985_6];
    const ROUND: f32 = 12_582_912.0;
    // ln 2 to 12 bits (so k · LN2_HI is exact for k < 2^12), and the rest.
    const LN2_HI: f32 = f32::from_bits(0x3F31_7200);
    const LN2_LO: f32 = 1.428_606_8e-6;
    const INV_FACT: [f32; 8] = [1.0 / 5_040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];
    let a = x.abs();
    let z = a * a;
    let small = a + a * z * ODD[..4].iter().rev().fold(ODD[4], |p, &c| p * z + c);
    let y = 2.0 * if a < 10.0 { a } else { 10.0 };
    let kb = y * std::f32::consts::LOG2_E + ROUND;
    let k = kb - ROUND;
    let m = -((y - k * LN2_HI) - k * LN2_LO);
    // k is in 0..=29, the low bits of kb.
    let e = INV_FACT[1..].iter().fold(INV_FACT[0], |p, &c| p * m + c) * f32::from_bits((127 - (kb.to_bits() & 0xff)) << 23);
    let large = 1.0 - (e + e) / (1.0 + e);
    let t = if a < 0.625 { small } else { large };
    if x.is_nan() {
        x
    } else {
        t.copysign(x)
    }
}

/// `exp(z)` in f64 with no call and no branch, so that a loop of it vectorises (a libm call
/// per element does not; the softmax's exponentials are many): `2^k · exp(r)`, `r` reduced by a
/// two-part ln 2 (Cody-Waite) to |r| <= 0.35, `exp(r)` a Taylor polynomial of degree 13
/// (truncation below 1e-17), `2^k` built from the bits of a rounding through 1.5·2^52. Within
/// 2 ulp of the correctly rounded f64 where that is normal (z >= -708); 0 below (an f32
/// after any division by a sum of at least 1, as in a softmax, is 0 there too), and +inf above
/// ln(f64::MAX); NaN stays NaN.
#[inline(always)]
pub fn exp_f64(z: f64) -> f64 {
    const ROUND: f64 = 6_755_399_441_055_744.0;
    // ln 2 to 32 bits (its low 20 bits zero, so k · LN2_HI is exact), and the rest.
    const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    const INV_FACT: [f64; 14] = [
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    // ln(f64::MAX): above it exp overflows.
    const MAX: f64 = 709.782_712_893_384;
    // Clamped into the range where 2^(k-1) is a normal f64; NaN passes through `clamp`.
    let y = z.clamp(-708.0, MAX);
    let kb = y * std::f64::consts::LOG2_E + ROUND;
    let k = kb - ROUND;
    let r = (y - k * LN2_HI) - k * LN2_LO;
    let p = INV_FACT[1..].iter().fold(INV_FACT[0], |p, &c| p * r + c);
    // k is in -1021..=1024, kb's low bits as a two's complement offset from ROUND's; 2^k is
    // 2^(k-1)·2 so that both ends have a normal power.
    let k_bits = kb.to_bits().wrapping_sub(ROUND.to_bits());
    let e = p * f64::from_bits((1022u64.wrapping_add(k_bits) & 0x7ff) << 52) * 2.0;
    if z < -708.0 {
        0.0
    } else if z > MAX {
        f64::INFINITY
    } else {
        e
    }
}

/// PyTorch's `pow(x, p)` for a scalar exponent: C's `pow` (p = 0 gives 1 even for NaN; a
/// negative base needs an integer p, odd p keeps its sign; 0 to a negative p is an infinity),
/// except that p = ±0.5 is `sqrt` / `1/sqrt`, so -0 keeps its sign and -inf gives NaN there,
/// and p = 2 and 3 are products (`x·x`, `x·x·x`), as PyTorch's CPU kernel computes them (the
/// tanh GELU's cube through `powf` was an eighth of the GPT training step).
pub fn powf(x: f32, p: f32) -> f32 {
    if p == 0.5 {
        x.sqrt()
    } else if p == -0.5 {
        1.0 / x.sqrt()
    } else if p == 2.0 {
        x * x
    } else if p == 3.0 {
        x * x * x
    } else {
        x.powf(p)
    }
}

/// The CPU reference of every binary op, from the table in `backend/op_table.rs`.
#[inline(always)]
pub fn binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    crate::backend::op_table::binary_ops!(cpu op, a, b)
}

/// `torch.maximum`: NaN if either is NaN; +0 above -0 (IEEE 754-2019 maximum; PyTorch itself
/// answers either zero, depending on its scalar or vector path).
fn maximum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a == b {
        if a.is_sign_negative() {
            b
        } else {
            a
        }
    } else if a > b {
        a
    } else {
        b
    }
}

/// Values (Sum/Max/Min) or first-maximum indices (ArgMax) over the middle axis. Walks rows
/// of `inner` contiguous values so memory is read in order.
/// The reference reductions: sums accumulated in f64 (the oracle must be more accurate than the
/// f32 kernels it checks: a 3M-element f32 sum drifts by ~1e-3 relative), and NaN as PyTorch:
/// max and min are NaN when any element is, argmax is the index of the first NaN if any, else
/// of the first maximum.
pub fn reduce(op: ReduceOp, x: &[f32], s: ReduceSpec) -> (Vec<f32>, Vec<i32>) {
    let mut vals = vec![0.0f32; s.outer * s.inner];
    let mut idx = vec![0i32; s.outer * s.inner];
    if s.inner == 0 {
        return (vals, idx);
    }
    // Tasks of whole output columns: each column is accumulated in order over `len`, by one
    // thread, so the threads only decide who computes it, never how.
    let cols = (CHUNK / s.len.max(1)).clamp(64, CHUNK).min(s.inner);
    let task = |(t, (v, i)): (usize, (&mut [f32], &mut [i32]))| {
        let (o, j0) = (t / s.inner.div_ceil(cols), (t % s.inner.div_ceil(cols)) * cols);
        reduce_columns(op, x, s, o, j0, v, i);
    };
    let chunks = vals.chunks_mut(s.inner).flat_map(|v| v.chunks_mut(cols)).zip(idx.chunks_mut(s.inner).flat_map(|i| i.chunks_mut(cols)));
    if s.outer * s.len * s.inner >= 2 * CHUNK {
        chunks.enumerate().collect::<Vec<_>>().into_par_iter().for_each(task);
    } else {
        chunks.enumerate().for_each(task);
    }
    (vals, idx)
}

/// One block of outputs: outer index `o`, columns `j0..j0 + vals.len()`.
fn reduce_columns(op: ReduceOp, x: &[f32], s: ReduceSpec, o: usize, j0: usize, vals: &mut [f32], idx: &mut [i32]) {
    let init = match op {
        ReduceOp::Sum => 0.0,
        ReduceOp::Max | ReduceOp::ArgMax => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    let mut acc = vec![init; vals.len()];
    if op == ReduceOp::Sum {
        // The same adds in the same order as the loop below, without its per-element match,
        // so that they vectorise across the columns.
        for j in 0..s.len {
            add_row(&mut acc, &x[(o * s.len + j) * s.inner + j0..][..vals.len()]);
        }
        vals.iter_mut().zip(&acc).for_each(|(d, &a)| *d = a as f32);
        idx.fill(0);
        return;
    }
    let mut best = vec![-1i64; vals.len()];
    for j in 0..s.len {
        let row = &x[(o * s.len + j) * s.inner + j0..][..vals.len()];
        for ((a, b), &v) in acc.iter_mut().zip(best.iter_mut()).zip(row) {
            let v = f64::from(v);
            let take = match op {
                ReduceOp::Sum => {
                    *a += v;
                    false
                }
                ReduceOp::Max => v.is_nan() || v > *a,
                ReduceOp::Min => v.is_nan() || v < *a,
                // The first element, a first NaN, or a larger number while no NaN was seen.
                ReduceOp::ArgMax => *b < 0 || (!a.is_nan() && (v.is_nan() || v > *a)),
            };
            if take {
                *a = v;
                *b = j as i64;
            }
        }
    }
    vals.iter_mut().zip(&acc).for_each(|(d, &a)| *d = a as f32);
    idx.iter_mut().zip(&best).for_each(|(d, &b)| *d = b.max(0) as i32);
}

by_isa!(
    /// `acc[c] += row[c]` in f64 for every column `c`.
    fn add_row(acc: &mut [f64], row: &[f32]) => add_row_plain
);

#[inline(always)]
fn add_row_plain(acc: &mut [f64], row: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(row) {
        *a += f64::from(v);
    }
}

/// The `gemm` kernels this CPU runs: `gemm` picks them at its first product from the features
/// the CPU reports (never from the build: its AVX-512 kernels are always compiled in on x86-64).
/// The same test here names them in `DeviceInfo::matmul` and in benchmarks.
pub fn gemm_kernels() -> &'static str {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "AVX2+FMA";
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return "NEON";
        }
    }
    "scalar"
}

/// Products of at most this many multiply-adds per batch entry are run one per thread (a
/// convolution's per-image products); larger ones are split inside `gemm`.
pub(super) const SMALL_PRODUCT: usize = 1 << 22;

pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], s: MatmulSpec, path: GemmPath) {
    matmul_then(a, b, c, s, path, |_| {})
}

/// `matmul`, then `epilogue` on each output matrix while it is still in cache (a convolution's
/// bias and ReLU). The `gemm` crate (Candle's choice) measured 1.4-2x faster than
/// `matrixmultiply` on the seed CNN's per-image products and level with it on square ones; it
/// splits work over output blocks only, so each output's sum runs in the same order on any
/// number of threads.
#[cfg_attr(not(feature = "openblas"), allow(unused_variables))]
pub fn matmul_then(a: &[f32], b: &[f32], c: &mut [f32], s: MatmulSpec, path: GemmPath, epilogue: impl Fn(&mut [f32]) + Sync) {
    let (m, n, k) = (s.m, s.n, s.k);
    if m == 0 || n == 0 {
        return;
    }
    // Row/column strides of op(A) (m×k) and op(B) (k×n) as stored.
    let (rsa, csa) = if s.trans_a { (1, m as isize) } else { (k as isize, 1) };
    let (rsb, csb) = if s.trans_b { (1, k as isize) } else { (n as isize, 1) };
    let small = s.batch > 1 && m * n * k <= SMALL_PRODUCT;
    let threads = if small { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(0) };
    let one = |bi: usize, cc: &mut [f32]| {
        if k == 0 {
            cc.fill(0.0);
        } else {
            let ao = s.a_offset + bi * s.a_batch_stride;
            let bo = s.b_offset + bi * s.b_batch_stride;
            #[cfg(feature = "openblas")]
            if let GemmPath::OpenBlas(lib) = path {
                if lib.sgemm(m, n, k, &a[ao..], s.trans_a, &b[bo..], s.trans_b, cc).is_some() {
                    return epilogue(cc);
                }
            }
            // SAFETY: the strides above address exactly the m×k and k×n matrices starting at
            // the offsets, inside `a` and `b` as `contract::matmul` checked before this was
            // called; `cc` is one m×n output, written without being read.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    cc.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a[ao..].as_ptr(),
                    csa,
                    rsa,
                    b[bo..].as_ptr(),
                    csb,
                    rsb,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    threads,
                );
            }
        }
        epilogue(cc);
    };
    let c = &mut c[..s.batch * m * n];
    if small {
        c.par_chunks_mut(m * n).enumerate().for_each(|(bi, cc)| one(bi, cc));
    } else {
        c.chunks_mut(m * n).enumerate().for_each(|(bi, cc)| one(bi, cc));
    }
}

/// `out = out + bias[row]` on one m×n output, then ReLU (as `unary(Relu)`) when `relu`: the
/// same operations as the unfused add and clamp, so the same bits.
pub fn row_bias(out: &mut [f32], bias: &[f32], relu: bool) {
    for (row, &b) in out.chunks_mut(out.len() / bias.len().max(1)).zip(bias) {
        if relu {
            row.iter_mut().for_each(|v| *v = unary(UnaryOp::Relu, *v + b));
        } else {
            row.iter_mut().for_each(|v| *v += b);
        }
    }
}

/// The output columns `ox` whose input column `ox*stride + j - pad` lies inside `0..w`.
fn valid_range(out: usize, stride: usize, j: usize, pad: usize, w: usize) -> std::ops::Range<usize> {
    let lo = pad.saturating_sub(j).div_ceil(stride);
    let hi = if w + pad > j { ((w + pad - j - 1) / stride + 1).min(out) } else { 0 };
    lo..hi.max(lo)
}

pub fn im2col(x: &[f32], s: WindowSpec, cols: &mut [f32]) {
    let (rows, cl) = (s.col_rows(), s.col_len());
    // Without padding every window lies inside the image and each column is written.
    let padded = s.pad != (0, 0);
    let image = |(n, cols): (usize, &mut [f32])| {
        if padded {
            cols.fill(0.0);
        }
        for r in 0..rows {
            let (ci, i, j) = (r / (s.kh * s.kw), (r / s.kw) % s.kh, r % s.kw);
            let xr = valid_range(s.ow, s.stride.1, j, s.pad.1, s.w);
            for oy in valid_range(s.oh, s.stride.0, i, s.pad.0, s.h) {
                let y = oy * s.stride.0 + i - s.pad.0;
                let src = &x[((n * s.c + ci) * s.h + y) * s.w..][..s.w];
                let dst = &mut cols[r * cl + oy * s.ow..][..s.ow];
                if s.stride.1 == 1 && !xr.is_empty() {
                    dst[xr.clone()].copy_from_slice(&src[xr.start + j - s.pad.1..xr.end + j - s.pad.1]);
                    continue;
                }
                for ox in xr.clone() {
                    dst[ox] = src[ox * s.stride.1 + j - s.pad.1];
                }
            }
        }
    };
    if rows * cl == 0 {
        return;
    }
    cols[..s.n * rows * cl].par_chunks_mut(rows * cl).enumerate().for_each(image);
}

pub fn col2im(cols: &[f32], s: WindowSpec, x: &mut [f32]) {
    let (rows, cl) = (s.col_rows(), s.col_len());
    let plane = s.c * s.h * s.w;
    // One image per task: overlapping windows of one image sum into it in a fixed order.
    let image = |(n, x): (usize, &mut [f32])| {
        x.fill(0.0);
        for r in 0..rows {
            let (ci, i, j) = (r / (s.kh * s.kw), (r / s.kw) % s.kh, r % s.kw);
            let xr = valid_range(s.ow, s.stride.1, j, s.pad.1, s.w);
            for oy in valid_range(s.oh, s.stride.0, i, s.pad.0, s.h) {
                let y = oy * s.stride.0 + i - s.pad.0;
                let dst = &mut x[(ci * s.h + y) * s.w..][..s.w];
                let src = &cols[(n * rows + r) * cl + oy * s.ow..][..s.ow];
                if s.stride.1 == 1 && !xr.is_empty() {
                    let d = &mut dst[xr.start + j - s.pad.1..xr.end + j - s.pad.1];
                    d.iter_mut().zip(&src[xr.clone()]).for_each(|(d, &v)| *d += v);
                    continue;
                }
                for ox in xr.clone() {
                    dst[ox * s.stride.1 + j - s.pad.1] += src[ox];
                }
            }
        }
    };
    if plane == 0 {
        return;
    }
    x[..s.n * plane].par_chunks_mut(plane).enumerate().for_each(image);
}

#[cfg(test)]
mod tests {
    use super::exp_f64;

    /// Within 2 ulp of libm's (correctly rounded or nearly) exp over the range a softmax uses
    /// and past it, exact at 0, and the edges.
    #[test]
    fn exp_f64_is_within_two_ulp_of_libm() {
        let mut z = -708.0f64;
        while z < 709.78 {
            let (got, want) = (exp_f64(z), z.exp());
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulps <= 2, "exp({z:e}) = {got:e}, want {want:e}");
            z += 0.000_731;
        }
        assert_eq!(exp_f64(0.0), 1.0);
        assert_eq!(exp_f64(-0.0), 1.0);
        for (z, want) in [(-709.0, 0.0), (f64::NEG_INFINITY, 0.0), (710.0, f64::INFINITY), (f64::INFINITY, f64::INFINITY)] {
            assert_eq!(exp_f64(z), want, "exp({z:e})");
        }
        assert!(exp_f64(f64::NAN).is_nan());
    }
}
