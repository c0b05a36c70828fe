//! Half-precision buffers on wgpu: two bfloat16 or binary16 values per 32-bit word, so that any
//! adapter stores them (no `shader-f16` needed); copies at odd positions and the casts to and
//! from F32 run `shaders/halves.wgsl`, which never writes a word another invocation writes.
use super::context::Ctx;
use super::ops::Words;
use crate::backend::CastOp;
use crate::Result;

/// Copies `len` halves from element `src_off` of `src` to element `dst_off` of `dst` (distinct
/// buffers). Word-aligned ranges are a plain buffer copy; others go through the kernel, one
/// invocation per destination word, keeping the half of a boundary word outside the range.
pub(crate) fn copy(ctx: &Ctx, src: &wgpu::Buffer, src_off: usize, dst: &wgpu::Buffer, dst_off: usize, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    if src_off.is_multiple_of(2) && dst_off.is_multiple_of(2) && len.is_multiple_of(2) {
        ctx.encode(|e| e.copy_buffer_to_buffer(src, src_off as u64 * 2, dst, dst_off as u64 * 2, len as u64 * 2));
        return Ok(());
    }
    let (first_word, end_word) = (dst_off / 2, (dst_off + len).div_ceil(2));
    // Each chunk's destination words, and the source words its elements come from: at most
    // one word more than its destination words.
    for (s, e) in ctx.chunks("copy", end_word - first_word, &[1, 2])? {
        let base = 2 * (first_word + s);
        let lo = dst_off.max(base);
        let hi = (dst_off + len).min(2 * (first_word + e));
        let src_first = lo - dst_off + src_off;
        let src_words = (src_first + (hi - lo)).div_ceil(2) - src_first / 2;
        let (sb, so) = ctx.span("copy", src, src_first / 2, src_words)?;
        let (db, doff) = ctx.span("copy", dst, first_word + s, e - s)?;
        let w = Words::default().u(e - s).u(so).u(doff).u(lo - base).u(hi - base).u(src_first % 2);
        ctx.dispatch("halves", "copy_halves", &w.0, &[sb, db], ctx.grid(e - s, 256))?;
    }
    Ok(())
}

/// `CastOp` between F32 and a half type over elements `0..n`, in chunks of whole words of
/// halves: one invocation per pair of elements, so each writes one word of halves.
pub(crate) fn cast(ctx: &Ctx, op: CastOp, x: &wgpu::Buffer, out: &wgpu::Buffer, n: usize) -> Result<()> {
    let to_half = op.dtypes().1.is_half();
    let (entry, per_pair) = if to_half { ("to_half", [2, 1]) } else { ("from_half", [1, 2]) };
    for (s, e) in ctx.chunks("cast", n.div_ceil(2), &per_pair)? {
        let count = (2 * e).min(n) - 2 * s;
        let (f32s, halves) = ((2 * s, count), (s, e - s));
        let ((xf, xc), (of, oc)) = if to_half { (f32s, halves) } else { (halves, f32s) };
        let (xb, xo) = ctx.span("cast", x, xf, xc)?;
        let (ob, oo) = ctx.span("cast", out, of, oc)?;
        let w = Words::default().u(count).u(xo).u(oo);
        ctx.dispatch_op("halves", entry, Some(op.code()), &w.0, &[xb, ob], ctx.grid(e - s, 256))?;
    }
    Ok(())
}
