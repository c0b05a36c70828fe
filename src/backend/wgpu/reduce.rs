//! Reductions (sum, max, min, argmax over the middle axis of `[outer, len, inner]`): which
//! kernel of shaders/reduce.wgsl (or reduce_sg.wgsl) each pass runs, its shape, and the passes
//! over partials until one value per output remains.
use super::context::{Bind, Ctx};
use super::ops::Words;
use super::pool::{Pool, WgpuBuffer};
use crate::backend::{ReduceOp, ReduceSpec};
use crate::Result;
use std::sync::Arc;

/// The most elements one reduce invocation folds in one pass: an axis up to this long takes a
/// single pass; a longer one is split into parts of `REDUCE_PART` (and the partials reduced
/// again), which keeps every loop far below the 65,535 iterations Mesa's software drivers allow
/// and gives a long axis L / 256 invocations of parallelism instead of one.
const REDUCE_WALK: usize = 1024;
const REDUCE_PART: usize = 256;

/// Output parts of one reduce pass over an axis of `len` elements.
fn reduce_parts(len: usize) -> usize {
    if len <= REDUCE_WALK {
        1
    } else {
        len.div_ceil(REDUCE_PART)
    }
}

/// The tree kernels' workgroup size; the most items one lane folds in a pass (which keeps their
/// loops at 32 iterations); the fewest a lane folds before a row is split into more parts; and
/// the workgroups a pass aims for, about what fills a large GPU (132 multiprocessors holding a
/// few workgroups of 256 each), so that a sum over few long rows is not left to a handful.
const TREE_WG: usize = 256;
const TREE_LANE: usize = 32;
const TREE_LANE_MIN: usize = 4;
const TREE_GROUPS: usize = 512;

/// Parts of one pass of the invocation-per-partial kernels over an inner axis (`outputs` columns
/// of `len`) on a hardware device: enough invocations to fill it (`TREE_GROUPS` workgroups) where
/// the columns alone do not, each still folding 64 or more (so a pass divides the axis by 64).
fn column_parts(outputs: usize, len: usize) -> usize {
    reduce_parts(len).max((TREE_GROUPS * TREE_WG / outputs.max(1)).min(len / 64))
}

/// `(G, P, C)` of one tree pass over `rows` rows of `len` items: lanes per segment, parts per
/// row and items per part. Short rows take narrow segments (about `TREE_LANE_MIN` items a lane,
/// many rows to a workgroup) so that no lane idles through a whole row; rows split into parts
/// (of more than 512 items) a whole workgroup per part, which the subgroup forms need.
fn tree_shape(rows: usize, len: usize) -> (usize, usize, usize) {
    let fewest = len.div_ceil(TREE_WG * TREE_LANE).max(1);
    let most = len.div_ceil(TREE_WG * TREE_LANE_MIN).max(1);
    let chunk = len.div_ceil(fewest.max(TREE_GROUPS.div_ceil(rows.max(1)).min(most)));
    // Parts recounted from their size, so that none is empty.
    (chunk.div_ceil(TREE_LANE_MIN).next_power_of_two().min(TREE_WG), len.div_ceil(chunk.max(1)).max(1), chunk)
}

/// Reduces the middle axis of `x` viewed as `[outer, len, inner]` into `out` (`[outer, inner]`),
/// in passes over partials until one value per output remains. Contiguous rows (inner 1) on
/// hardware devices take the workgroup tree kernels (subgroup forms where the device has
/// subgroups and a whole workgroup serves one part); the rest, and software adapters, the
/// invocation-per-partial kernels, whose neighbouring invocations read neighbouring columns.
pub(crate) fn reduce(ctx: &Ctx, pool: &Arc<Pool>, op: ReduceOp, x: &wgpu::Buffer, r: ReduceSpec, out: &wgpu::Buffer) -> Result<()> {
    if r.outer * r.inner == 0 {
        return Ok(());
    }
    let tree = ctx.hardware && r.inner == 1;
    // Argmax partials carry an index beside each value.
    let words_per = if op == ReduceOp::ArgMax { 2 } else { 1 };
    for (s, e) in ctx.chunks("reduce", r.outer, &[r.len * r.inner, r.inner])? {
        let cnt = e - s;
        // The partials of the previous pass (values, then indices), or None in the first pass.
        let mut prev: Option<WgpuBuffer> = None;
        let mut len = r.len;
        loop {
            let (src, first) = match &prev {
                Some(t) => (&t.raw, 0),
                None => (x, s * r.len * r.inner),
            };
            let n_in = cnt * len * r.inner;
            let (xb, xo) = ctx.span("reduce", src, first, n_in * if prev.is_some() { words_per } else { 1 })?;
            // The indices of argmax partials follow their values in the same range.
            let ib = Bind { buf: xb.buf, offset: xb.offset, size: xb.size };
            // Whole contiguous rows of vec4s: the first pass reads four elements per load.
            let quads = prev.is_none() && r.inner == 1 && len.is_multiple_of(4) && xo.is_multiple_of(4);
            let steps = if quads { len / 4 } else { len };
            let x_at = if quads { xo / 4 } else { xo };
            let (group, parts, chunk) = match (tree, ctx.hardware) {
                (true, _) => tree_shape(cnt, steps),
                (false, true) => (1, column_parts(cnt * r.inner, steps), 0),
                (false, false) => (1, reduce_parts(steps), 0),
            };
            let n_out = cnt * parts * r.inner;
            let next = if parts == 1 { None } else { Some(pool.alloc((n_out * words_per) as u64 * 4)?) };
            let (ob, oo) = match &next {
                Some(t) => ctx.span("reduce", &t.raw, 0, n_out * words_per)?,
                None => ctx.span("reduce", out, s * r.inner, n_out)?,
            };
            let w = Words::default()
                .u(cnt)
                .u(steps)
                .u(r.inner)
                .u(parts)
                .u(x_at)
                .u(xo + n_in as u32)
                .u(oo)
                .u(oo + n_out as u32)
                .u(u32::from(prev.is_some()))
                .u(group)
                .u(chunk);
            let code = Some(op.code());
            if tree {
                let (shader, entry) = match (ctx.subgroups && group == TREE_WG, quads) {
                    (true, true) => ("reduce_sg", "tree4_sg"),
                    (true, false) => ("reduce_sg", "tree_sg"),
                    (false, true) => ("reduce", "tree4"),
                    (false, false) => ("reduce", "tree"),
                };
                let groups = n_out.div_ceil(TREE_WG / group);
                ctx.dispatch_op(shader, entry, code, &w.0, &[xb, ib, ob], ctx.grid(groups * TREE_WG, TREE_WG))?;
            } else {
                let entry = if quads { "reduce4" } else { "reduce" };
                ctx.dispatch_op("reduce", entry, code, &w.0, &[xb, ib, ob], ctx.grid(n_out, 64))?;
            }
            match next {
                Some(t) => {
                    prev = Some(t);
                    len = parts;
                }
                None => break,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{column_parts, tree_shape, TREE_LANE, TREE_WG};

    /// Every tree pass covers its row with non-empty parts, loops at most `TREE_LANE` times a
    /// lane, gives a split row a whole workgroup (the subgroup forms need it) and shortens the
    /// axis, so the passes end; the column passes shorten it too.
    #[test]
    fn pass_shapes_cover_rows_with_bounded_loops_and_terminate() {
        let lens = (0..3000).chain([8191, 8192, 8193, 65_535, 70_001, 1 << 20, (1 << 20) + 3, 1 << 26, (1 << 31) - 1]);
        for len in lens {
            for rows in [1, 2, 3, 7, 100, 511, 512, 513, 100_000] {
                let (g, p, c) = tree_shape(rows, len);
                assert!(g.is_power_of_two() && g <= TREE_WG, "G = {g} for {rows} × {len}");
                assert!(c.div_ceil(g) <= TREE_LANE, "{} steps a lane for {rows} × {len}", c.div_ceil(g));
                assert!(p * c >= len && (p - 1) * c < len.max(1), "parts {p} of {c} for {len}");
                assert!(p == 1 || g == TREE_WG, "a split row of {len} in segments of {g}");
                assert!(len <= 1 || p < len, "{len} items left {p} partials");
                let q = column_parts(rows, len);
                assert!(len <= 1 || q < len, "{len} columns' items left {q} partials");
                assert!(q <= 1 || len.div_ceil(q) <= 1024, "{} steps an invocation", len.div_ceil(q));
            }
        }
    }
}
