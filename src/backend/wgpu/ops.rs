//! Elementwise ops, fill and matmul: parameter packing and splitting into dispatches
//! that respect the device's binding and workgroup-count limits.
use super::context::{Bind, Ctx};
use super::tiled::{self, Tile};
use super::MatmulKernel;
use crate::backend::MatmulSpec;
use crate::{Error, Layout, Result};

/// Elements of the buffer a layout reaches: one past its furthest element (0 when empty).
pub(crate) fn extent(l: &Layout) -> usize {
    if l.numel() == 0 {
        return 0;
    }
    l.offset + l.shape.iter().zip(&l.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
}

/// 32-bit words of a kernel's `Params`, in declaration order.
#[derive(Default)]
pub(crate) struct Words(pub Vec<u32>);

impl Words {
    pub fn u(mut self, v: impl TryInto<u32>) -> Self {
        // Every caller passes a value already bounded by a binding size or a u32 limit.
        self.0.push(v.try_into().unwrap_or(u32::MAX));
        self
    }
    pub fn f(mut self, v: f32) -> Self {
        self.0.push(v.to_bits());
        self
    }
    /// Six dims or strides padded to two vec4 (eight words).
    pub fn dims(mut self, d: [u32; 6]) -> Self {
        self.0.extend_from_slice(&d);
        self.0.extend_from_slice(&[0, 0]);
        self
    }
}

/// Merges adjacent dimensions that every operand walks as one (the outer stride equals the
/// inner stride times the inner size) and drops size-1 ones, so that the strided kernels divide
/// once per remaining dimension but the outermost (a bias broadcast over [N, C, H, W] becomes
/// rank 3, a row broadcast rank 2). Returns the padded shape, the operands' padded strides and
/// the rank (at least 1).
fn coalesce<const K: usize>(shape: [u32; 6], strides: [[u32; 6]; K]) -> ([u32; 6], [[u32; 6]; K], u32) {
    let mut dims: Vec<(u32, [u32; K])> = Vec::with_capacity(6);
    for d in 0..6 {
        if shape[d] == 1 {
            continue;
        }
        let st: [u32; K] = std::array::from_fn(|j| strides[j][d]);
        if let Some(last) = dims.last_mut() {
            if (0..K).all(|j| u64::from(last.1[j]) == u64::from(st[j]) * u64::from(shape[d])) {
                last.0 *= shape[d];
                last.1 = st;
                continue;
            }
        }
        dims.push((shape[d], st));
    }
    let mut out_shape = [1u32; 6];
    let mut out_strides = [[0u32; 6]; K];
    let pad = 6 - dims.len();
    for (i, (n, st)) in dims.iter().enumerate() {
        out_shape[pad + i] = *n;
        for j in 0..K {
            out_strides[j][pad + i] = st[j];
        }
    }
    (out_shape, out_strides, dims.len().max(1) as u32)
}

/// Binds an elementwise operand for output elements `s..e`: a contiguous one only over the
/// chunk (offset relative to the chunk's global index), a strided one over its whole extent.
fn operand<'a>(ctx: &Ctx, op: &'static str, buf: &'a wgpu::Buffer, l: &Layout, s: usize, e: usize) -> Result<(Bind<'a>, u32)> {
    if l.is_contiguous() {
        let (b, off) = ctx.span(op, buf, l.offset + s, e - s)?;
        Ok((b, off.wrapping_sub(s as u32)))
    } else {
        ctx.span(op, buf, l.offset, extent(l) - l.offset)
    }
}

/// Whether a chunk of `len` elementwise outputs can go four per invocation: `len` a multiple
/// of 4, and each operand's first element at a multiple of 4 in its bound range (`starts`), so
/// that vec4 views of the bindings line up.
fn vec4_chunk(len: usize, starts: &[u32]) -> bool {
    len.is_multiple_of(4) && starts.iter().all(|o| o.is_multiple_of(4))
}

pub(crate) fn fill(ctx: &Ctx, buf: &wgpu::Buffer, len: usize, bits: u32) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    if bits == 0 {
        ctx.encode(|e| e.clear_buffer(buf, 0, Some(len as u64 * 4)));
        return Ok(());
    }
    for (s, e) in ctx.chunks("fill", len, &[1])? {
        let (b, off) = ctx.span("fill", buf, s, e - s)?;
        let w = Words::default().u(e - s).u(off).u(bits);
        ctx.dispatch("util", "fill", &w.0, &[b], ctx.grid(e - s, 256))?;
    }
    Ok(())
}

/// The unary kernel of op code `code` (`UnaryOp::code`) with parameters `[p0, p1]`.
pub(crate) fn unary(ctx: &Ctx, code: u32, [p0, p1]: [f32; 2], x: &wgpu::Buffer, l: &Layout, out: &wgpu::Buffer) -> Result<()> {
    let n = l.numel();
    let (shape, strides) = l.padded("unary")?;
    let (shape, [strides], rank) = coalesce(shape, [strides]);
    let entry = if l.is_contiguous() { "contig" } else { "strided" };
    for (s, e) in ctx.chunks("unary", n, &[1, 1])? {
        let (xb, xo) = operand(ctx, "unary", x, l, s, e)?;
        let (ob, oo) = ctx.span("unary", out, s, e - s)?;
        let w = Words::default().dims(shape).dims(strides).u(e - s).u(s).u(xo).u(oo).f(p0).f(p1).u(rank);
        if entry == "contig" && vec4_chunk(e - s, &[xo.wrapping_add(s as u32), oo]) {
            ctx.dispatch_op("unary", "contig4", Some(code), &w.0, &[xb, ob], ctx.grid((e - s) / 4, 256))?;
            continue;
        }
        ctx.dispatch_op("unary", entry, Some(code), &w.0, &[xb, ob], ctx.grid(e - s, 256))?;
    }
    Ok(())
}

/// The binary kernel of op code `code` (`BinaryOp::code`).
pub(crate) fn binary(ctx: &Ctx, code: u32, a: &wgpu::Buffer, la: &Layout, b: &wgpu::Buffer, lb: &Layout, out: &wgpu::Buffer) -> Result<()> {
    let n = la.numel();
    let (shape, sa) = la.padded("binary")?;
    let (_, sb) = lb.padded("binary")?;
    let (shape, [sa, sb], rank) = coalesce(shape, [sa, sb]);
    let entry = match (la.is_contiguous(), lb.is_contiguous(), rank <= 3) {
        (true, true, _) => "contig",
        (true, false, true) => "bcast3",
        (false, _, true) => "strided3",
        (_, _, false) => "strided",
    };
    for (s, e) in ctx.chunks("binary", n, &[1, 1, 1])? {
        let (ab, ao) = operand(ctx, "binary", a, la, s, e)?;
        let (bb, bo) = operand(ctx, "binary", b, lb, s, e)?;
        let (ob, oo) = ctx.span("binary", out, s, e - s)?;
        let w = Words::default().dims(shape).dims(sa).dims(sb).u(e - s).u(s).u(ao).u(bo).u(oo).u(rank);
        let (a0, b0) = (ao.wrapping_add(s as u32), bo.wrapping_add(s as u32));
        let wide = match entry {
            "contig" if vec4_chunk(e - s, &[a0, b0, oo]) => Some("contig4"),
            "bcast3" if shape[5] % 4 == 0 && vec4_chunk(e - s, &[s as u32, a0, oo]) => Some("bcast4"),
            _ => None,
        };
        if let Some(wide) = wide {
            ctx.dispatch_op("binary", wide, Some(code), &w.0, &[ab, bb, ob], ctx.grid((e - s) / 4, 256))?;
            continue;
        }
        ctx.dispatch_op("binary", entry, Some(code), &w.0, &[ab, bb, ob], ctx.grid(e - s, 256))?;
    }
    Ok(())
}

/// Batch entries per dispatch so that each operand's range fits one binding: an operand spans
/// `(count-1)*stride + size` elements.
pub(crate) fn batches_per_dispatch(ctx: &Ctx, operands: &[(usize, usize)]) -> Result<usize> {
    let cap = ctx.max_elems();
    let mut most = ctx.limits.max_groups as usize;
    for &(stride, size) in operands {
        if size > cap {
            return Err(Error::invalid(
                "matmul",
                format!(
                    "one operand matrix of {} bytes exceeds the storage binding limit of {} bytes on {}",
                    size * 4,
                    ctx.limits.max_binding,
                    ctx.name
                ),
            ));
        }
        if let Some(q) = (cap - size).checked_div(stride) {
            most = most.min(q + 1);
        }
    }
    Ok(most.max(1))
}

/// `c = op(a)·op(b)` per `s`, plus `bias[row]` when given, then `max(0, ·)` when its flag is
/// set (a convolution's bias and ReLU); `Ok(false)` (nothing recorded) when
/// a bias is given but this product cannot add it in its epilogue (of the register family only
/// the uniform-A kernels do, with A shared across the batch; the tiled family always does).
pub(crate) fn matmul(
    ctx: &Ctx,
    kernel: MatmulKernel,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    bias: Option<(&wgpu::Buffer, bool)>,
    c: &wgpu::Buffer,
    s: MatmulSpec,
) -> Result<bool> {
    let (m, n, k) = (s.m, s.n, s.k);
    if s.batch == 0 || m == 0 || n == 0 {
        return Ok(bias.is_none());
    }
    let tile = match kernel {
        MatmulKernel::Registers => None,
        MatmulKernel::Tiled => Some(Tile::BySize),
        MatmulKernel::Tiled64 | MatmulKernel::SplitK => Some(Tile::Small),
        MatmulKernel::Tiled128 => Some(Tile::Wide),
    };
    if let Some(tile) = tile {
        return tiled::matmul(ctx, a, b, bias, c, s, tile);
    }
    if k > K_SLICE {
        // The epilogue would add the bias once per slice: the caller composes instead.
        if bias.is_some() {
            return Ok(false);
        }
        matmul_split_k(ctx, a, b, c, s)?;
        return Ok(true);
    }
    let (a_rs, a_cs) = if s.trans_a { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if s.trans_b { (1, k) } else { (n, 1) };
    let (a_bs, b_bs) = if s.batch == 1 { (0, 0) } else { (s.a_batch_stride, s.b_batch_stride) };
    let plain = !s.trans_a && !s.trans_b;
    let vec4 = plain && n.is_multiple_of(4) && k.is_multiple_of(4) && (s.a_offset | s.b_offset | a_bs | b_bs).is_multiple_of(4);
    // Register blocking also when only B qualifies for vec4 loads along N (any K, any op(A)):
    // the small batched GEMMs of convolutions, whose K = C·kh·kw is rarely a multiple of 4.
    let b_vec_n = !s.trans_b && n.is_multiple_of(4) && (s.b_offset | b_bs).is_multiple_of(4);
    let ab_vec_k = !s.trans_a && s.trans_b && k.is_multiple_of(4) && (s.a_offset | s.b_offset | a_bs | b_bs).is_multiple_of(4);
    // A small A (a convolution's weights) goes through the uniform stage on software adapters,
    // as many batch entries per copy as fit; a bias goes after it, 16-byte aligned.
    let bias_at = (m * k).next_multiple_of(4);
    let room = if bias.is_some() { bias_at + m } else { m * k };
    let stageable = m * k > 0 && ctx.stage_floats() >= room && (bias.is_none() || a_bs == 0);
    let (entry, cols, rows) = match (vec4, kernel) {
        // Subgroup-shared A rows where the device has 8-wide subgroups (the fastest there),
        // else the generated 16×4 block where it is not mostly edge, else 8×8.
        (true, MatmulKernel::Registers) if ctx.subgroup8 && m >= 32 && n >= 64 => ("regs_sg32x2", 64, 32),
        (true, MatmulKernel::Registers) if m >= 16 && n >= 128 => ("regs16x4", 128, 16),
        (true, MatmulKernel::Registers) => ("regs", 64, 8),
        // Generated blocks of as few rows as cover a small M (a convolution's output channels;
        // less waste at the edge). No 16×4 or 32×2: the little they gain costs more llvmpipe
        // compiling in a fresh process's first step than it saves (benches/README.md).
        (false, MatmulKernel::Registers) if b_vec_n && stageable => match (m, n >= 128) {
            (0..=8, true) => ("regs_k1_ua8x4", 128, 8),
            (0..=8, false) => ("regs_k1_ua8x2", 64, 8),
            (9..=16, _) => ("regs_k1_ua16x2", 64, 16),
            _ => ("regs_k1_ua24x2", 64, 24),
        },
        (false, MatmulKernel::Registers) if b_vec_n => ("regs_k1", 64, 8),
        // A·Bᵀ with subgroup-shared rows of A: one block over all of a small M.
        (false, MatmulKernel::Registers) if ab_vec_k && ctx.subgroup8 => match m {
            0..=8 => ("tb_sg8x4", 32, 8),
            9..=16 => ("tb_sg16x4", 32, 16),
            _ => ("tb_sg24x4", 32, 24),
        },
        (false, MatmulKernel::Registers) if ab_vec_k && n >= 64 => ("tb8x8", 64, 8),
        (false, MatmulKernel::Registers) if ab_vec_k => ("generic_tb", 32, 32),
        _ => ("generic", 32, 32),
    };
    let staged = entry.contains("_ua");
    if bias.is_some() && !staged {
        return Ok(false);
    }
    let (mut gx, mut gy) = (n.div_ceil(cols), m.div_ceil(rows));
    if entry.starts_with("regs") {
        // `regs` takes row blocks along X so that consecutive workgroups share a strip of B.
        std::mem::swap(&mut gx, &mut gy);
    }
    if gx.max(gy) > ctx.limits.max_groups as usize {
        return Err(Error::invalid("matmul", format!("{m}x{n} output needs more workgroups than {} allows", ctx.name)));
    }
    let mut per = batches_per_dispatch(ctx, &[(a_bs, m * k), (b_bs, k * n), (m * n, m * n)])?;
    if staged && a_bs > 0 {
        per = per.min((ctx.stage_floats() - m * k) / a_bs + 1);
    }
    let mut b0 = 0;
    while b0 < s.batch {
        let cnt = per.min(s.batch - b0);
        let (a_first, a_len) = (s.a_offset + b0 * a_bs, (cnt - 1) * a_bs + m * k);
        let (ab, ao) = if staged { (ctx.stage_uniform(a, a_first, a_len)?, 0) } else { ctx.span("matmul", a, a_first, a_len)? };
        if let Some((bias, _)) = bias {
            ctx.stage_at(bias, 0, m, bias_at)?;
        }
        let (bb, bo) = ctx.span("matmul", b, s.b_offset + b0 * b_bs, (cnt - 1) * b_bs + k * n)?;
        let (cb, co) = ctx.span("matmul", c, b0 * m * n, cnt * m * n)?;
        // The epilogue: 0 none, 1 bias, 2 bias then ReLU.
        let epi = bias.map_or(0, |(_, relu)| 1 + u32::from(relu));
        let w = matmul_words([m, n, k], [ao, bo, co], [a_bs, b_bs], [a_rs, a_cs, b_rs, b_cs], bias_at, epi);
        let shader = if entry.contains("_sg") { "matmul_sg" } else { "matmul" };
        ctx.dispatch(shader, entry, &w.0, &[ab, bb, cb], [gx as u32, gy as u32, cnt as u32])?;
        b0 += cnt;
    }
    Ok(true)
}

/// The words of matmul.wgsl's `Params`: sizes M, N, K; offsets of A, B, C in their bound
/// ranges; batch strides of A and B; strides of op(A) and op(B); where the bias starts in the
/// uniform stage; the epilogue code.
pub(crate) fn matmul_words(mnk: [usize; 3], offs: [u32; 3], bs: [usize; 2], strides: [usize; 4], bias_at: usize, epi: u32) -> Words {
    let mut w = Words::default();
    for v in mnk.into_iter().chain([offs[0] as usize, offs[1] as usize, offs[2] as usize]).chain(bs).chain(strides) {
        w = w.u(v);
    }
    w.u(bias_at).u(epi)
}

/// K values one matmul dispatch sums at most. Every kernel loops over K, and Mesa's software
/// drivers end a loop after 65,535 iterations; a longer K is cut into slices of this size.
pub(crate) const K_SLICE: usize = 16384;

/// `matmul` for K past `K_SLICE`: the `generic` kernel (which walks both operands through their
/// strides, so a slice is only an offset) once per slice of K, in order; the first slice writes
/// C and each later one adds to it (epilogue 3), so the sum order is fixed.
fn matmul_split_k(ctx: &Ctx, a: &wgpu::Buffer, b: &wgpu::Buffer, c: &wgpu::Buffer, s: MatmulSpec) -> Result<()> {
    let (m, n, k) = (s.m, s.n, s.k);
    let (a_rs, a_cs) = if s.trans_a { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if s.trans_b { (1, k) } else { (n, 1) };
    let (a_bs, b_bs) = if s.batch == 1 { (0, 0) } else { (s.a_batch_stride, s.b_batch_stride) };
    let (gx, gy) = (n.div_ceil(32), m.div_ceil(32));
    if gx.max(gy) > ctx.limits.max_groups as usize {
        return Err(Error::invalid("matmul", format!("{m}x{n} output needs more workgroups than {} allows", ctx.name)));
    }
    for (slice, k0) in (0..k).step_by(K_SLICE).enumerate() {
        let kc = K_SLICE.min(k - k0);
        // Elements from each operand's first one of this slice to its last.
        let a_size = (m - 1) * a_rs + (kc - 1) * a_cs + 1;
        let b_size = (kc - 1) * b_rs + (n - 1) * b_cs + 1;
        let per = batches_per_dispatch(ctx, &[(a_bs, a_size), (b_bs, b_size), (m * n, m * n)])?;
        let mut b0 = 0;
        while b0 < s.batch {
            let cnt = per.min(s.batch - b0);
            let (ab, ao) = ctx.span("matmul", a, s.a_offset + b0 * a_bs + k0 * a_cs, (cnt - 1) * a_bs + a_size)?;
            let (bb, bo) = ctx.span("matmul", b, s.b_offset + b0 * b_bs + k0 * b_rs, (cnt - 1) * b_bs + b_size)?;
            let (cb, co) = ctx.span("matmul", c, b0 * m * n, cnt * m * n)?;
            let epi = if slice == 0 { 0 } else { 3 };
            let w = matmul_words([m, n, kc], [ao, bo, co], [a_bs, b_bs], [a_rs, a_cs, b_rs, b_cs], 0, epi);
            ctx.dispatch("matmul", "generic", &w.0, &[ab, bb, cb], [gx as u32, gy as u32, cnt as u32])?;
            b0 += cnt;
        }
    }
    Ok(())
}
