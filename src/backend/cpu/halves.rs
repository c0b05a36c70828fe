//! Products that read and write Bf16 and F16 buffers without cast passes: the output is cut
//! into fixed tiles, each tile's rows of the left operand are widened to f32 into a scratch
//! panel just before the `gemm` crate packs them, the right operand is widened once per
//! product, the sums run in f32, and each output is rounded once to its half type on its way
//! out of the tile. The result is the f32 product of the exactly widened operands, rounded once,
//! as the composition (cast, f32 product, cast) gives, without its three passes and tensors.
//! Elementwise ops on halves widen, compute and round the same way one group of rows at a time.
use super::kernels::by_isa;
use super::{contract, raw, read, same, write, CpuBackend};
use crate::backend::{host, BinaryOp, Buffer, MatmulSpec, UnaryOp};
use crate::{DType, Error, Result};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows and columns of the output tile one task computes: fixed by the shape alone, never by
/// the thread count, so that every output's sum runs in the same order on any number of
/// threads. 64 × 128 outputs with k = 128 keep the widened panel and the tile (32 KiB each)
/// in a core's L2; a 128-wide product's weight gradient (m = 128) still splits into tasks.
const TILE_ROWS: usize = 64;
const TILE_COLS: usize = 128;

/// Below this many multiply-adds in all a product stays on the calling thread.
const PARALLEL_FROM: usize = 1 << 18;

/// A product's operand as its buffer stores it.
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    F32(&'a [f32]),
    /// Half bits of this dtype (`Bf16` or `F16`).
    Half(&'a [u16], DType),
}

/// A product's output as its buffer stores it.
pub enum Output<'a> {
    F32(&'a mut [f32]),
    Half(&'a mut [u16], DType),
}

/// `dst[i] = src[i]` widened exactly to f32, as `CastOp::from_half` does.
pub fn widen(src: &[u16], dtype: DType, dst: &mut [f32]) {
    match dtype {
        DType::F16 => src.reinterpret_cast::<half::f16>().convert_to_f32_slice(dst),
        _ => widen_bf16(src, dst),
    }
}

by_isa!(
    /// bfloat16 is the high half of an f32: a shift, eight or sixteen lanes wide where the CPU
    /// has AVX2 or AVX-512F.
    fn widen_bf16(src: &[u16], dst: &mut [f32]) => widen_bf16_plain
);

#[inline(always)]
fn widen_bf16_plain(src: &[u16], dst: &mut [f32]) {
    dst.iter_mut().zip(src).for_each(|(d, &h)| *d = f32::from_bits(u32::from(h) << 16));
}

/// `dst[i] = src[i]` rounded to the nearest even `dtype` value, as `CastOp::to_half` does.
pub fn narrow(src: &[f32], dtype: DType, dst: &mut [u16]) {
    match dtype {
        DType::F16 => dst.reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(src),
        _ => narrow_bf16(src, dst),
    }
}

by_isa!(
    /// `dst[i]` = bfloat16 bits of `src[i]` (`bf16_bits`), eight or sixteen lanes wide where
    /// the CPU has AVX2 or AVX-512F: the `half` crate's conversion branches per value.
    fn narrow_bf16(src: &[f32], dst: &mut [u16]) => narrow_bf16_plain
);

#[inline(always)]
fn narrow_bf16_plain(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16_bits(x);
    }
}

/// `half::bf16::from_f32(x)`'s bits without a branch: rounded to nearest even by adding
/// `0x7FFF` plus the kept part's lowest bit (which carries into the kept part exactly when the
/// dropped half is over a tie, or a tie with an odd kept part), and a NaN kept a NaN with its
/// sign and top payload bits, quieted.
#[inline(always)]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let nan = (b >> 16) as u16 | 0x0040;
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }
}

thread_local! {
    /// Each thread's widened panel and output tile, kept between products so that a training
    /// step does not map and fault in fresh pages for every tile.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl CpuBackend {
    /// `Backend::matmul` whose operands and output may each be Bf16 or F16 as well as F32: the
    /// half operands are widened to f32 tile by tile as the product is packed, the sums run in
    /// f32, and a half output is rounded once per element (see `matmul`). Autocast's
    /// products on a CPU device run here instead of casting their operands in passes of their own.
    pub(crate) fn matmul_halves(&self, a: &Buffer, b: &Buffer, out: &Buffer, spec: MatmulSpec) -> Result<()> {
        contract::matmul_halves(&self.info, a, b, out, spec)?;
        let (ga, gb) = (read(raw(a)?), read(raw(b)?));
        let mut go = write(raw(out)?);
        let c = match out.dtype() {
            DType::F32 => Output::F32(bytemuck::cast_slice_mut(&mut go)),
            half => Output::Half(bytemuck::cast_slice_mut(&mut go), half),
        };
        matmul(operand(&ga, a.dtype()), operand(&gb, b.dtype()), c, spec)
    }

    /// `Backend::unary` on a contiguous input whose buffers may hold halves: `out = op(x)`,
    /// computed in f32 and rounded once into a half `out` (see `elementwise`).
    pub(crate) fn unary_halves(&self, op: UnaryOp, x: &Buffer, out: &Buffer) -> Result<()> {
        let width = out.len().max(1);
        self.elementwise_halves("unary", Pass::Unary(op), (x, Spread::Full), None, width, out)
    }

    /// `Backend::binary` whose buffers may hold halves, each input covering the output (rows
    /// of `width`) as its `Spread` says: `out = op(a, b)` in f32, rounded once into a half `out`.
    pub(crate) fn binary_halves(&self, op: BinaryOp, a: (&Buffer, Spread), b: (&Buffer, Spread), width: usize, out: &Buffer) -> Result<()> {
        self.elementwise_halves("binary", Pass::Unary(UnaryOp::Identity), a, Some((op, b)), width, out)
    }

    #[allow(clippy::type_complexity)]
    fn elementwise_halves(
        &self,
        name: &'static str,
        unary: Pass,
        a: (&Buffer, Spread),
        b: Option<(BinaryOp, (&Buffer, Spread))>,
        width: usize,
        out: &Buffer,
    ) -> Result<()> {
        let len = out.len();
        if width == 0 || !len.is_multiple_of(width) {
            return Err(Error::invalid(name, format!("an output of {len} elements is no whole number of rows of {width}")));
        }
        let inputs = std::iter::once(("a", a)).chain(b.map(|(_, b)| ("b", b)));
        for (operand, (buf, spread)) in inputs.clone() {
            if buf.dtype() == DType::I32 || out.dtype() == DType::I32 {
                return Err(Error::DType { op: name, expected: DType::F32, got: DType::I32 });
            }
            let need = spread.len(len, width);
            if buf.len() < need {
                return Err(Error::invalid(name, format!("{operand} is a buffer of {} elements but the op reads {need}", buf.len())));
            }
            if same(buf, out)? {
                return Err(Error::invalid(name, format!("the output must not alias input {operand}")));
            }
        }
        let ga = read(raw(a.0)?);
        let gb = b.map(|(_, (buf, _))| Ok::<_, Error>(read(raw(buf)?))).transpose()?;
        let pass = match (b, &gb) {
            (Some((op, (buf, spread))), Some(g)) => Pass::Binary(op, operand(g, buf.dtype()), spread),
            _ => unary,
        };
        let mut go = write(raw(out)?);
        let c = match out.dtype() {
            DType::F32 => Output::F32(bytemuck::cast_slice_mut(&mut go)),
            half => Output::Half(bytemuck::cast_slice_mut(&mut go), half),
        };
        elementwise(pass, operand(&ga, a.0.dtype()), a.1, len, width, c);
        Ok(())
    }
}

/// The view of a buffer's words as a product's or an elementwise op's input.
fn operand(words: &[u32], dtype: DType) -> Operand<'_> {
    match dtype {
        DType::F32 => Operand::F32(bytemuck::cast_slice(words)),
        half => Operand::Half(bytemuck::cast_slice(words), half),
    }
}

/// A pointer that tasks share; each task writes only its own tile through it.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: tasks write disjoint tiles (see `matmul`), and the slice it points into outlives them.
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// The element `i` past the start (a method, so that closures capture the whole `Shared`).
    ///
    /// # Safety
    /// `i` lies inside the slice the pointer came from.
    unsafe fn at(self, i: usize) -> *mut T {
        self.0.add(i)
    }
}

/// `c = op(a) · op(b)` for every batch entry of `s`, with `a`, `b` and `c` in whatever float
/// dtype their buffers hold. `contract::matmul_halves` has checked that the spec's matrices lie
/// inside `a`, `b` and `c`, and that `c` aliases neither.
pub fn matmul(a: Operand, b: Operand, c: Output, s: MatmulSpec) -> Result<()> {
    let (m, n, k, batch) = (s.m, s.n, s.k, s.batch);
    let total = batch * m * n;
    if total == 0 {
        return Ok(());
    }
    if k == 0 {
        match c {
            Output::F32(c) => c[..total].fill(0.0),
            Output::Half(c, _) => c[..total].fill(0),
        }
        return Ok(());
    }
    // The right operand (a layer's weight, or every batch entry's keys) widened once: each of
    // its columns meets every tile of a column of tiles.
    let b_end = s.b_offset + (batch - 1) * s.b_batch_stride + k * n;
    let wide_b;
    let (b, b_base) = match b {
        Operand::F32(b) => (b, 0),
        Operand::Half(h, dtype) => {
            let mut w = host::try_filled(b_end - s.b_offset, 0.0f32, "cpu", "a widened matmul operand")?;
            widen(&h[s.b_offset..b_end], dtype, &mut w);
            wide_b = w;
            (&wide_b[..], s.b_offset)
        }
    };
    let (rsa, csa) = if s.trans_a { (1, m) } else { (k, 1) };
    let (rsb, csb) = if s.trans_b { (1, k) } else { (n, 1) };
    let (row_tiles, col_tiles) = (m.div_ceil(TILE_ROWS), n.div_ceil(TILE_COLS));
    let (c_f32, c_half, c_dtype) = match c {
        Output::F32(c) => (Shared(c.as_mut_ptr()), Shared(std::ptr::null_mut()), DType::F32),
        Output::Half(c, dtype) => (Shared(std::ptr::null_mut()), Shared(c.as_mut_ptr()), dtype),
    };
    let task = |t: usize| {
        let (bi, rest) = (t / (row_tiles * col_tiles), t % (row_tiles * col_tiles));
        let (r0, c0) = ((rest / col_tiles) * TILE_ROWS, (rest % col_tiles) * TILE_COLS);
        let (rows, cols) = (TILE_ROWS.min(m - r0), TILE_COLS.min(n - c0));
        let ao = s.a_offset + bi * s.a_batch_stride;
        let bo = s.b_offset + bi * s.b_batch_stride - b_base + c0 * csb;
        let co = bi * m * n + r0 * n + c0;
        SCRATCH.with_borrow_mut(|(panel, tile)| {
            // Rows r0.. of op(A): as stored when A is F32, else widened into `panel` in A's own
            // order (k rows of `rows` values when A is stored transposed), so reads stay in order.
            let (lhs, lrs, lcs) = match a {
                Operand::F32(a) => (a[ao + r0 * rsa..].as_ptr(), rsa, csa),
                Operand::Half(h, dtype) => {
                    grow(panel, rows * k);
                    if s.trans_a {
                        for p in 0..k {
                            widen(&h[ao + p * m + r0..][..rows], dtype, &mut panel[p * rows..][..rows]);
                        }
                        (panel.as_ptr(), 1, rows)
                    } else {
                        widen(&h[ao + r0 * k..][..rows * k], dtype, &mut panel[..rows * k]);
                        (panel.as_ptr(), k, 1)
                    }
                }
            };
            let (dst, drs) = if c_dtype == DType::F32 {
                // SAFETY: `co` is the tile's first output inside `c` (total outputs).
                (unsafe { c_f32.at(co) }, n)
            } else {
                grow(tile, rows * cols);
                (tile.as_mut_ptr(), cols)
            };
            // SAFETY: the strides address op(A)'s rows r0..r0+rows (in `a` as the contract
            // checked, or in `panel`, rows·k long), op(B)'s columns c0..c0+cols (in `b` or its
            // widened copy) and a rows×cols tile written without being read, which is either
            // `tile` or this task's own outputs of `c`: no two tasks share an output.
            unsafe {
                gemm::gemm(
                    rows,
                    cols,
                    k,
                    dst,
                    1,
                    drs as isize,
                    false,
                    lhs,
                    lcs as isize,
                    lrs as isize,
                    b[bo..].as_ptr(),
                    csb as isize,
                    rsb as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            if c_dtype != DType::F32 {
                for (i, row) in tile[..rows * cols].chunks(cols).enumerate() {
                    // SAFETY: row r0+i, columns c0..c0+cols of this task's tile, inside `c`.
                    let out = unsafe { std::slice::from_raw_parts_mut(c_half.at(co + i * n), cols) };
                    narrow(row, c_dtype, out);
                }
            }
        });
    };
    let tasks = batch * row_tiles * col_tiles;
    if total.saturating_mul(k) >= PARALLEL_FROM && tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    Ok(())
}

/// `v` at least `len` long.
fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}

/// How an input of an elementwise op on halves covers the output, seen as rows of its last
/// dimension: element for element, one row repeated (a bias), or one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    Full,
    Row,
    Scalar,
}

impl Spread {
    /// Elements of the input this reads, for an output of `len` values in rows of `width`.
    pub fn len(self, len: usize, width: usize) -> usize {
        match self {
            Spread::Full => len,
            Spread::Row => width,
            Spread::Scalar => 1,
        }
    }
}

thread_local! {
    /// Each thread's widened inputs and output of one group of rows of an elementwise op.
    static ROWS: RefCell<[Vec<f32>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// Output rows per task of an elementwise op: about `CHUNK` values, whole rows.
fn row_group(width: usize) -> usize {
    (super::kernels::CHUNK / width.max(1)).max(1)
}

/// The f32 values `spread` reads for rows `r0..r0 + rows` of `width`: `x` itself where it is
/// F32, else widened into `scratch` (a `Row` or `Scalar` input is widened whole each time: it
/// is one row at most).
fn rows_of<'s>(x: Operand<'s>, spread: Spread, r0: usize, rows: usize, width: usize, scratch: &'s mut Vec<f32>) -> &'s [f32] {
    let range = match spread {
        Spread::Full => r0 * width..(r0 + rows) * width,
        Spread::Row => 0..width,
        Spread::Scalar => 0..1,
    };
    match x {
        Operand::F32(v) => &v[range],
        Operand::Half(h, dtype) => {
            grow(scratch, range.len());
            widen(&h[range.clone()], dtype, &mut scratch[..range.len()]);
            &scratch[..range.len()]
        }
    }
}

/// The layout of a group of `rows` rows of `width` that `spread` reads.
fn rows_layout(spread: Spread, rows: usize, width: usize) -> crate::Layout {
    let strides = match spread {
        Spread::Full => vec![width, 1],
        Spread::Row => vec![0, 1],
        Spread::Scalar => vec![0, 0],
    };
    crate::Layout { shape: vec![rows, width], strides, offset: 0 }
}

/// What an elementwise op on halves computes from its first input (and second).
#[derive(Clone, Copy)]
pub enum Pass<'a> {
    Unary(UnaryOp),
    Binary(BinaryOp, Operand<'a>, Spread),
}

/// `out = op(a)` or `op(a, b)` over `len` outputs in rows of `width`, each input read as its
/// `Spread` says, in whatever float dtype each buffer holds: every group of rows is widened,
/// computed by the f32 pass (`elementwise`, so the same scalar function as on F32 tensors) and
/// rounded once into a half output, group by group while it is in cache.
pub fn elementwise(pass: Pass, a: Operand, spread: Spread, len: usize, width: usize, out: Output) {
    if len == 0 || width == 0 {
        return;
    }
    let (rows_total, group) = (len / width, row_group(width));
    let (out_f32, out_half, out_dtype) = match out {
        Output::F32(c) => (Shared(c.as_mut_ptr()), Shared(std::ptr::null_mut()), DType::F32),
        Output::Half(c, dtype) => (Shared(std::ptr::null_mut()), Shared(c.as_mut_ptr()), dtype),
    };
    let task = |g: usize| {
        let (r0, rows) = (g * group, group.min(rows_total - g * group));
        // Taken out of the cell, not borrowed: a long row's pass may run on several threads,
        // and this thread may meanwhile run another op's group, which then finds it empty.
        let [mut sa, mut sb, mut so] = ROWS.with_borrow_mut(std::mem::take);
        let av = rows_of(a, spread, r0, rows, width, &mut sa);
        let o: &mut [f32] = if out_dtype == DType::F32 {
            // SAFETY: rows r0..r0+rows of the output, this task's alone.
            unsafe { std::slice::from_raw_parts_mut(out_f32.at(r0 * width), rows * width) }
        } else {
            grow(&mut so, rows * width);
            &mut so[..rows * width]
        };
        let la = rows_layout(spread, rows, width);
        match pass {
            Pass::Unary(op) => super::elementwise::unary_pass(op, &la, av, o),
            Pass::Binary(op, b, bs) => {
                let bv = rows_of(b, bs, r0, rows, width, &mut sb);
                super::elementwise::binary_pass(op, &la, av, &rows_layout(bs, rows, width), bv, o);
            }
        }
        if out_dtype != DType::F32 {
            // SAFETY: as above, the half output's rows r0..r0+rows.
            let dst = unsafe { std::slice::from_raw_parts_mut(out_half.at(r0 * width), rows * width) };
            narrow(&so[..rows * width], out_dtype, dst);
        }
        ROWS.with_borrow_mut(|r| *r = [sa, sb, so]);
    };
    let groups = rows_total.div_ceil(group);
    if len >= 2 * super::kernels::CHUNK {
        (0..groups).into_par_iter().for_each(task);
    } else {
        (0..groups).for_each(task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branchless bfloat16 rounding gives the `half` crate's bits for every high half with
    /// the low halves around a tie, zero, all ones, infinities and NaNs of both signs included.
    #[test]
    fn narrow_rounds_as_the_half_crate() {
        let lows = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF];
        let xs: Vec<f32> = (0..=0xFFFFu32).flat_map(|hi| lows.map(|lo| f32::from_bits(hi << 16 | lo))).collect();
        let mut got = vec![0u16; xs.len()];
        narrow(&xs, DType::Bf16, &mut got);
        for (x, g) in xs.iter().zip(&got) {
            assert_eq!(*g, half::bf16::from_f32(*x).to_bits(), "{:#010x}", x.to_bits());
        }
    }
}
