//! The workgroup-tiled matmul family (hardware GPUs, `MatmulKernel::Tiled*`) and split-K
//! (`MatmulKernel::SplitK`): which `tiled_*` entry serves a product, how a long K is cut, and
//! the dispatches with explicit strides that both share.
use super::context::Ctx;
use super::ops::{batches_per_dispatch, matmul_words, K_SLICE};
use super::pool::Pool;
use super::shaders;
use crate::backend::MatmulSpec;
use crate::{Error, Result};
use std::sync::Arc;

/// Which tile the tiled kernels take: by size (`wide_tiles`, the untuned rule), or one of them
/// for every product (a tuned choice, or a test reaching a kernel's edges on small shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tile {
    BySize,
    Small,
    Wide,
}

/// One product as the tiled kernels see it: `batch` entries of an M×N output, each the sum of
/// K products; the operands' first elements, batch strides and strides along M and K (A) and
/// K and N (B), in elements; where C's first entry starts; which operands are transposed.
#[derive(Clone, Copy, Debug)]
struct Strided {
    trans: (bool, bool),
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    a_first: usize,
    b_first: usize,
    c_first: usize,
    a_bs: usize,
    b_bs: usize,
    a_rs: usize,
    a_cs: usize,
    b_rs: usize,
    b_cs: usize,
}

impl Strided {
    fn of(s: &MatmulSpec) -> Strided {
        let (m, n, k) = (s.m, s.n, s.k);
        let (a_rs, a_cs) = if s.trans_a { (1, m) } else { (k, 1) };
        let (b_rs, b_cs) = if s.trans_b { (1, k) } else { (n, 1) };
        let (a_bs, b_bs) = if s.batch == 1 { (0, 0) } else { (s.a_batch_stride, s.b_batch_stride) };
        Strided {
            trans: (s.trans_a, s.trans_b),
            m,
            n,
            k,
            batch: s.batch,
            a_first: s.a_offset,
            b_first: s.b_offset,
            c_first: 0,
            a_bs,
            b_bs,
            a_rs,
            a_cs,
            b_rs,
            b_cs,
        }
    }

    /// K values `k0..k0 + kc` of this product.
    fn k_range(self, k0: usize, kc: usize) -> Strided {
        Strided { k: kc, a_first: self.a_first + k0 * self.a_cs, b_first: self.b_first + k0 * self.b_rs, ..self }
    }
}

/// `matmul` on the tiled kernels: a `tiled_*` kernel for every product (`shaders::TILED`),
/// chosen by how each operand's tile loads coalesce (along K for untransposed A and transposed
/// B, else along M or N) and whether they can be vec4 (that dimension's length, the offset and
/// the batch stride multiples of 4). A K past `K_SLICE` is cut into slices, dispatched in
/// order: the first writes C, each later one adds to it, and the last adds the bias and
/// applies the ReLU.
pub(crate) fn matmul(
    ctx: &Ctx,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    bias: Option<(&wgpu::Buffer, bool)>,
    c: &wgpu::Buffer,
    s: MatmulSpec,
    tile: Tile,
) -> Result<bool> {
    let wide = match tile {
        Tile::BySize => wide_tiles(s.m, s.n, s.batch),
        Tile::Small => false,
        Tile::Wide => true,
    };
    let whole = Strided::of(&s);
    let slices = s.k.div_ceil(K_SLICE).max(1);
    for slice in 0..slices {
        let k0 = slice * K_SLICE;
        let last_bias = bias.filter(|_| slice + 1 == slices).map(|(x, relu)| (x, 1 + u32::from(relu)));
        let epi = if slice == 0 { 0 } else { 3 } + last_bias.map_or(0, |(_, e)| e);
        pass(ctx, a, b, last_bias.map(|(x, _)| x), c, whole.k_range(k0, K_SLICE.min(s.k - k0)), wide, epi)?;
    }
    Ok(true)
}

/// Records product `t` on the 64×64 (or with `wide` the 128×128) kernels, with epilogue `epi`
/// (matmul.wgsl's `tile_store`; `bias` is read for 1, 2, 4 and 5), as many batch entries per
/// dispatch as every operand's range fits one binding.
#[allow(clippy::too_many_arguments)] // one launch's buffers and settings, named as matmul.wgsl binds them
fn pass(
    ctx: &Ctx,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    bias: Option<&wgpu::Buffer>,
    c: &wgpu::Buffer,
    t: Strided,
    wide: bool,
    epi: u32,
) -> Result<()> {
    let (m, n, kc) = (t.m, t.n, t.k);
    let (table, tile) = if wide { (&shaders::TILED_WIDE, 128) } else { (&shaders::TILED, 64) };
    let (gx, gy) = (n.div_ceil(tile), m.div_ceil(tile));
    if gx.max(gy) > ctx.limits.max_groups as usize {
        return Err(Error::invalid("matmul", format!("{m}x{n} output needs more workgroups than {} allows", ctx.name)));
    }
    // Index into `TILE_LOADS`: along K or not, then vec4 when the contiguous dimension's stride
    // (the whole K or M of A, K or N of B), the first element and the batch stride are
    // multiples of 4.
    let load = |along_k: bool, len: usize, first: usize, bs: usize| 2 * usize::from(!along_k) + usize::from((len | first | bs).is_multiple_of(4));
    let la = load(!t.trans.0, if t.trans.0 { t.a_cs } else { t.a_rs }, t.a_first, t.a_bs);
    let lb = load(t.trans.1, if t.trans.1 { t.b_cs } else { t.b_rs }, t.b_first, t.b_bs);
    let entry = table[la][lb];
    // Elements from each operand's first one to its last, per batch entry.
    let a_size = if kc == 0 { 0 } else { (m - 1) * t.a_rs + (kc - 1) * t.a_cs + 1 };
    let b_size = if kc == 0 { 0 } else { (kc - 1) * t.b_rs + (n - 1) * t.b_cs + 1 };
    let per = batches_per_dispatch(ctx, &[(t.a_bs, a_size), (t.b_bs, b_size), (m * n, m * n)])?;
    let mut b0 = 0;
    while b0 < t.batch {
        let cnt = per.min(t.batch - b0);
        let (ab, ao) = ctx.span("matmul", a, t.a_first + b0 * t.a_bs, (cnt - 1) * t.a_bs + a_size)?;
        let (bb, bo) = ctx.span("matmul", b, t.b_first + b0 * t.b_bs, (cnt - 1) * t.b_bs + b_size)?;
        let (cb, co) = ctx.span("matmul", c, t.c_first + b0 * m * n, cnt * m * n)?;
        // Without a bias the kernel never reads binding 4: C serves as a placeholder.
        let (xb, xo) = match bias {
            Some(x) => ctx.span("matmul", x, 0, m)?,
            None => ctx.span("matmul", c, t.c_first + b0 * m * n, cnt * m * n)?,
        };
        let w = matmul_words([m, n, kc], [ao, bo, co], [t.a_bs, t.b_bs], [t.a_rs, t.a_cs, t.b_rs, t.b_cs], xo as usize, epi);
        ctx.dispatch("matmul", entry, &w.0, &[ab, bb, cb, xb], [gx as u32, gy as u32, cnt as u32])?;
        b0 += cnt;
    }
    Ok(())
}

/// Whether a product of `batch` M×N outputs takes the 128×128 tile untuned. Per compute unit it
/// should do about twice the work of the 64×64 one in the same time (16 FMAs per
/// workgroup-memory read against 2; an estimate that autotuning replaces by measurement), but
/// makes a quarter as many workgroups: with U units, a grid of W wide tiles takes about
/// ceil(W/U)·4 time units and the 64×64 grid ceil(4W/U)·2 (in 64×64-tile times at full speed).
/// So the small tile wins while its grid fits in one wave (W = 8: 2 against 4), they tie at two
/// waves and the wide tile wins past that. 64 wide tiles (256 small ones) are two waves on a GPU
/// of 128 units and more on smaller ones: 1024×1024 and up, or a batch of smaller products. M
/// and N of at least 128 also bound the area past the edge that the wide tile computes in vain
/// to a third more than the small tile's (M = 129: 256 rows against 192), less than it gains.
fn wide_tiles(m: usize, n: usize, batch: usize) -> bool {
    m >= 128 && n >= 128 && m.div_ceil(128) * n.div_ceil(128) * batch >= 64
}

/// Workgroups split-K aims for: a grid of fewer 64×64 output tiles leaves most compute units
/// of a GPU idle (two waves of 64 units), so K is cut until tiles × slices reach it.
const SPLIT_K_GROUPS: usize = 128;
/// K values a split-K slice sums at least: below that the partial sums' traffic (a slice's
/// M×N partial written and read again) outweighs the parallelism gained.
const SPLIT_K_MIN: usize = 256;

/// The slices split-K cuts the K of `s` into, or `None` where it does not apply: batched
/// products (their batch already fills the grid), or a product that would not be cut into at
/// least two slices, or partial sums that would not fit one binding.
pub(crate) fn split_k_slices(ctx: &Ctx, s: &MatmulSpec) -> Option<usize> {
    if s.batch != 1 || s.m == 0 || s.n == 0 {
        return None;
    }
    let tiles = s.m.div_ceil(64) * s.n.div_ceil(64);
    // At least enough slices that none passes `K_SLICE` (Mesa's loop limit), else as many as
    // fill the grid without a slice shorter than `SPLIT_K_MIN`.
    let fewest = s.k.div_ceil(K_SLICE);
    let wanted = SPLIT_K_GROUPS.div_ceil(tiles).min(s.k / SPLIT_K_MIN).max(fewest);
    // Recounted so that every slice but the last holds exactly `kc` values.
    let slices = s.k.div_ceil(s.k.div_ceil(wanted.max(1)));
    (slices >= 2 && slices * s.m * s.n <= ctx.max_elems()).then_some(slices)
}

/// `MatmulKernel::SplitK`: K cut into `split_k_slices` slices whose products the 64×64 kernels
/// compute side by side (one batch entry per slice) into partial sums, which `splitk_sum` then
/// adds in slice order (so the result does not depend on timing) with the bias and ReLU. A
/// product it does not apply to runs on the 64×64 kernels as `Tiled64`.
pub(crate) fn split_k(
    ctx: &Ctx,
    pool: &Arc<Pool>,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    bias: Option<(&wgpu::Buffer, bool)>,
    c: &wgpu::Buffer,
    s: MatmulSpec,
) -> Result<bool> {
    let Some(slices) = split_k_slices(ctx, &s) else {
        return matmul(ctx, a, b, bias, c, s, Tile::Small);
    };
    let (m, n, k) = (s.m, s.n, s.k);
    let kc = k.div_ceil(slices);
    let partial = pool.alloc((slices * m * n * 4) as u64)?;
    let whole = Strided::of(&s);
    // The full slices as one batched product (entry z reads K values from z·kc), then the last.
    let full = k / kc;
    let batched = Strided { batch: full, a_bs: kc * whole.a_cs, b_bs: kc * whole.b_rs, ..whole.k_range(0, kc) };
    pass(ctx, a, b, None, &partial.raw, batched, false, 0)?;
    if full < slices {
        let last = Strided { c_first: full * m * n, ..whole.k_range(full * kc, k - full * kc) };
        pass(ctx, a, b, None, &partial.raw, last, false, 0)?;
    }
    // The partial sums are bound as A (binding 1) and, unread, as B.
    let (pb, po) = ctx.span("matmul", &partial.raw, 0, slices * m * n)?;
    let (cb, co) = ctx.span("matmul", c, 0, m * n)?;
    let (xb, xo) = match bias {
        Some((x, _)) => ctx.span("matmul", x, 0, m)?,
        None => ctx.span("matmul", c, 0, m * n)?,
    };
    let epi = bias.map_or(0, |(_, relu)| 1 + u32::from(relu));
    let w = matmul_words([m, n, slices], [po, 0, co], [0, 0], [0, 0, 0, 0], xo as usize, epi);
    ctx.dispatch("matmul", "splitk_sum", &w.0, &[pb, pb, cb, xb], ctx.grid(m * n, 256))?;
    Ok(true)
}
