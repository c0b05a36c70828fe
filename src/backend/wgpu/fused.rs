//! The fused transformer kernels of shaders/transformer.wgsl (`FusedOp`): each buffer bound
//! whole, one dispatch per kernel.
use super::context::{Bind, Ctx};
use super::ops::Words;
use crate::backend::{ln_blocks, FusedOp};
use crate::Result;

/// Longest key loop and head size the kernels run: Mesa's software drivers end any shader loop
/// after 65,535 iterations. Longer ones compose.
const MAX_LOOP: usize = 65_535;

/// Invocations of the row kernels, which stride along a row by this many.
const WG: usize = 256;

/// shaders/attention.wgsl's rows per workgroup and largest head size (its workgroup tiles and
/// per-row accumulators are sized for it); larger heads take transformer.wgsl's
/// row-per-invocation kernels, as software adapters always do.
const ATT_BR: usize = 16;
const ATT_DMAX: usize = 64;

/// Runs `op` on `bufs` (its buffers in `FusedOp`'s order); `Ok(false)` where a buffer is larger
/// than one binding, a loop would pass `MAX_LOOP`, or an index 32 bits. With `software`, rows
/// shorter than `MAX_LOOP` take one invocation each instead of a workgroup: CPU rasterizers
/// run a workgroup barrier by switching through every invocation, which makes the workgroup
/// forms many times slower there (benches/README.md).
pub(crate) fn fused(ctx: &Ctx, op: FusedOp, bufs: &[&wgpu::Buffer], software: bool) -> Result<bool> {
    let Some((sizes, _)) = op.operands() else { return Ok(false) };
    if sizes.iter().any(|&s| s >= ctx.max_elems() || s >= u32::MAX as usize) {
        return Ok(false);
    }
    let (rows, cols, d, blocks, eps, scale) = match op {
        FusedOp::LayerNorm { rows, cols, eps } => (rows, cols, 0, 0, eps, 0.0),
        FusedOp::LayerNormBackward { rows, cols } => (rows, cols, 0, ln_blocks(rows), 0.0, 0.0),
        FusedOp::CausalSoftmax { n, t, scale } | FusedOp::CausalSoftmaxBackward { n, t, scale } => (n * t, t, 0, 0, 0.0, scale),
        FusedOp::Attention { n, t, d, scale } | FusedOp::AttentionBackward { n, t, d, scale } => (n * t, t, d, 0, 0.0, scale),
        // Elementwise: the composition's passes are already one dispatch each here.
        FusedOp::GeluTanh { .. } | FusedOp::GeluTanhBackward { .. } => return Ok(false),
    };
    if cols >= MAX_LOOP * WG || (d > 0 && (cols >= MAX_LOOP || d >= MAX_LOOP)) {
        return Ok(false);
    }
    let name = op.name();
    let binds = |order: &[usize]| -> Result<(Vec<Bind>, Vec<u32>)> {
        let mut out = (Vec::new(), Vec::new());
        for &i in order {
            let (b, o) = ctx.span(name, bufs[i], 0, sizes[i])?;
            out.0.push(b);
            out.1.push(o);
        }
        Ok(out)
    };
    let run_in = |shader: &'static str, entry: &'static str, order: &[usize], grid: [u32; 3]| -> Result<()> {
        let (b, offs) = binds(order)?;
        let mut w = Words::default().u(rows).u(cols).u(d).u(blocks).f(eps).f(scale).u(0u32).u(0u32);
        for k in 0..8 {
            w = w.u(offs.get(k).copied().unwrap_or(0));
        }
        ctx.dispatch(shader, entry, &w.0, &b, grid)
    };
    let run = |entry: &'static str, order: &[usize], grid: [u32; 3]| run_in("transformer", entry, order, grid);
    // shaders/attention.wgsl's tiled kernels: one workgroup per block of rows of a matrix.
    let tiled = match op {
        FusedOp::Attention { n, t, d, .. } | FusedOp::AttentionBackward { n, t, d, .. } if !software && d <= ATT_DMAX => {
            Some(ctx.grid(n * t.div_ceil(ATT_BR) * ATT_BR, ATT_BR))
        }
        _ => None,
    };
    let per_thread = ctx.grid(rows, 64);
    let one = software && cols < MAX_LOOP;
    // The row kernels: (workgroup form, one-invocation form) and the grid for the chosen one.
    let row_kernel = |forms: (&'static str, &'static str), order: &[usize]| {
        if one {
            run(forms.1, order, per_thread)
        } else {
            run(forms.0, order, ctx.grid(rows * WG, WG))
        }
    };
    match op {
        FusedOp::LayerNorm { .. } => row_kernel(("layer_norm", "layer_norm_1"), &[0, 1, 2, 3, 4, 5])?,
        FusedOp::LayerNormBackward { .. } => {
            let all = [0, 1, 2, 3, 4, 5, 6, 7];
            row_kernel(("layer_norm_dx", "layer_norm_dx_1"), &all)?;
            run("layer_norm_dwb", &all, ctx.grid(blocks * cols, WG))?;
        }
        FusedOp::CausalSoftmax { .. } => row_kernel(("causal_softmax", "causal_softmax_1"), &[0, 1])?,
        FusedOp::CausalSoftmaxBackward { .. } => row_kernel(("causal_softmax_dx", "causal_softmax_dx_1"), &[0, 1, 2])?,
        FusedOp::Attention { .. } => match tiled {
            Some(grid) => run_in("attention", "tiled_attention", &[0, 1, 2, 3, 4], grid)?,
            None => run("attention", &[0, 1, 2, 3, 4], per_thread)?,
        },
        // [q, k, v, o, lse, g, dq, dk, dv, delta]: dq and delta first, then dk and dv from delta.
        FusedOp::AttentionBackward { .. } => {
            let (dq, dkv) = ([0, 1, 2, 3, 4, 5, 6, 9], [0, 1, 2, 9, 4, 5, 7, 8]);
            match tiled {
                Some(grid) => {
                    run_in("attention", "tiled_attention_dq", &dq, grid)?;
                    run_in("attention", "tiled_attention_dkv", &dkv, grid)?;
                }
                None => {
                    run("attention_dq", &dq, per_thread)?;
                    run("attention_dkv", &dkv, per_thread)?;
                }
            }
        }
        FusedOp::GeluTanh { .. } | FusedOp::GeluTanhBackward { .. } => return Ok(false),
    }
    Ok(true)
}
