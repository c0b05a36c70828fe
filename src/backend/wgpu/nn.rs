//! Network-specific kernels: im2col/col2im, max pooling, label and id indexing, casts and fused
//! optimizers, each split over images, planes or rows so that every binding fits the device's limit.
use super::context::Ctx;
use super::ops::Words;
use crate::backend::{CastOp, IndexOp, OptimStep, WindowSpec};
use crate::{Error, Result};

/// The window geometry words shared by conv.wgsl and pool.wgsl after the leading count.
fn window(w: Words, s: &WindowSpec) -> Words {
    w.u(s.kh).u(s.kw).u(s.stride.0).u(s.stride.1).u(s.pad.0).u(s.pad.1).u(s.oh).u(s.ow)
}

/// Output columns one im2col invocation writes per window column at most (a multiple of 4):
/// wider outputs are cut into slices along `workgroup_id.z`, since Mesa's software drivers end
/// a loop after 65,535 iterations.
const IM2COL_SLICE: usize = 8192;

/// `forward`: im2col from `x` into `cols`; otherwise col2im from `cols` into `x`.
pub(crate) fn im2col(ctx: &Ctx, x: &wgpu::Buffer, cols: &wgpu::Buffer, s: WindowSpec, forward: bool) -> Result<()> {
    let op = if forward { "im2col" } else { "col2im" };
    // conv.wgsl divides by these with `udiv`, exact below 2^20.
    let divisors = [s.oh, s.c * s.kh, s.kh, s.w, s.h, s.c];
    if divisors.iter().any(|&d| d >= 1 << 20) {
        return Err(Error::invalid(op, format!("{s:?} has a dimension of 2^20 or more, beyond what {} supports", ctx.name)));
    }
    let img = s.c * s.h * s.w;
    let col = s.col_rows() * s.col_len();
    for (n0, n1) in ctx.chunks(op, s.n, &[img, col])? {
        let cnt = n1 - n0;
        let (xb, xo) = ctx.span(op, x, n0 * img, cnt * img)?;
        let (cb, co) = ctx.span(op, cols, n0 * col, cnt * col)?;
        let w = window(Words::default().u(cnt).u(s.c).u(s.h).u(s.w), &s).u(xo).u(co).u(IM2COL_SLICE);
        let grid = if forward {
            let [x, y, _] = ctx.grid(cnt * s.c * s.kh * s.oh, 64);
            [x, y, s.ow.div_ceil(IM2COL_SLICE) as u32]
        } else {
            ctx.grid(cnt * img, 256)
        };
        let vec_out = forward && s.ow.is_multiple_of(4) && co.is_multiple_of(4);
        // Whole input rows as vec4 quads: stride 1 along W, W and the row starts multiples of 4.
        let quads = vec_out && s.stride.1 == 1 && s.w.is_multiple_of(4) && xo.is_multiple_of(4);
        let entry = match (quads, vec_out) {
            (true, _) => "im2col_s1",
            (false, true) => "im2col4",
            _ => op,
        };
        ctx.dispatch("conv", entry, &w.0, &[xb, cb], grid)?;
    }
    Ok(())
}

/// `forward`: pooling from `x` into `out` and `arg`; otherwise the gradient from `out`
/// (grad_out) and `arg` into `x` (grad_x).
pub(crate) fn max_pool(ctx: &Ctx, x: &wgpu::Buffer, out: &wgpu::Buffer, arg: &wgpu::Buffer, s: WindowSpec, forward: bool) -> Result<()> {
    let op = if forward { "max_pool2d" } else { "max_pool2d_backward" };
    let (hw, ohw) = (s.h * s.w, s.oh * s.ow);
    for (p0, p1) in ctx.chunks(op, s.n * s.c, &[hw, ohw, ohw])? {
        let cnt = p1 - p0;
        let (xb, xo) = ctx.span(op, x, p0 * hw, cnt * hw)?;
        let (ob, oo) = ctx.span(op, out, p0 * ohw, cnt * ohw)?;
        let (ab, ao) = ctx.span(op, arg, p0 * ohw, cnt * ohw)?;
        let w = window(Words::default().u(cnt).u(s.h).u(s.w), &s).u(xo).u(oo).u(ao);
        let tiles = s.stride == (s.kh, s.kw) && s.pad == (0, 0) && s.h == s.oh * s.kh && s.w == s.ow * s.kw;
        // Two outputs per invocation through vector views: 2×2 tiles, rows of whole vec4s.
        let pairs = tiles && (s.kh, s.kw) == (2, 2) && s.w.is_multiple_of(4) && xo.is_multiple_of(4) && (oo | ao).is_multiple_of(2);
        let (entry, work) = match (forward, tiles, pairs) {
            (true, _, true) => ("forward_2x2", cnt * ohw / 2),
            (false, _, true) => ("backward_2x2", cnt * ohw / 2),
            (true, _, false) => ("forward", cnt * ohw),
            (false, true, false) => ("backward_tiled", cnt * ohw),
            (false, false, false) => ("backward", cnt * hw),
        };
        ctx.dispatch("pool", entry, &w.0, &[xb, ob, ab], ctx.grid(work, 256))?;
    }
    Ok(())
}

pub(crate) fn index(ctx: &Ctx, op: IndexOp, x: &wgpu::Buffer, idx: &wgpu::Buffer, out: &wgpu::Buffer, rows: usize, cols: usize) -> Result<()> {
    let (name, x_per, out_per, entry, wg) = match op {
        IndexOp::Gather => ("index gather", cols, 1, "gather", 64),
        IndexOp::Scatter => ("index scatter", 1, cols, "scatter", 256),
        IndexOp::GatherRows { table_rows } => return gather_rows(ctx, x, idx, out, rows, cols, table_rows),
        IndexOp::ScatterAddRows { table_rows } => return scatter_add_rows(ctx, x, idx, out, rows, cols, table_rows),
    };
    for (r0, r1) in ctx.chunks(name, rows, &[x_per, 1, out_per])? {
        let cnt = r1 - r0;
        let (xb, xo) = ctx.span(name, x, r0 * x_per, cnt * x_per)?;
        let (ib, io) = ctx.span(name, idx, r0, cnt)?;
        let (ob, oo) = ctx.span(name, out, r0 * out_per, cnt * out_per)?;
        let w = Words::default().u(cnt).u(cols).u(xo).u(io).u(oo);
        ctx.dispatch("index", entry, &w.0, &[xb, ib, ob], ctx.grid(cnt * out_per, wg))?;
    }
    Ok(())
}

/// The embedding lookup in chunks of ids, and of table rows when the table is larger than one
/// binding (GPT-2's 50,257 × 768 table is past WebGPU's default 128 MiB): each table chunk
/// writes the outputs whose ids it holds, and the first also those of ids outside the table.
fn gather_rows(ctx: &Ctx, table: &wgpu::Buffer, ids: &wgpu::Buffer, out: &wgpu::Buffer, rows: usize, cols: usize, table_rows: usize) -> Result<()> {
    const OP: &str = "index_select";
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    // An empty table still takes one pass: it writes the zeros of every (outside) id.
    for (v0, v1) in ctx.chunks(OP, table_rows.max(1), &[cols])? {
        let (tb, to) = ctx.span(OP, table, v0 * cols, (v1 - v0) * cols)?;
        for (r0, r1) in ctx.chunks(OP, rows, &[1, cols])? {
            let cnt = r1 - r0;
            let (ib, io) = ctx.span(OP, ids, r0, cnt)?;
            let (ob, oo) = ctx.span(OP, out, r0 * cols, cnt * cols)?;
            let w = Words::default().u(cnt).u(cols).u(to).u(io).u(oo).u(table_rows).u(rows).u(v0).u(0).u(v1.min(table_rows) - v0);
            ctx.dispatch("index", "gather_rows", &w.0, &[tb, ib, ob], ctx.grid(cnt * cols, 256))?;
        }
    }
    Ok(())
}

/// Plan entries one `scatter_add_rows` pass adds per table row: `SPAN` in shaders/index.wgsl.
const SCATTER_SPAN: usize = 16384;

/// The deterministic embedding gradient in chunks of table rows, each in passes of at most
/// `SCATTER_SPAN` ids per row (a row may own every id); the gradient and plan are bound whole.
fn scatter_add_rows(ctx: &Ctx, g: &wgpu::Buffer, plan: &wgpu::Buffer, out: &wgpu::Buffer, rows: usize, cols: usize, table_rows: usize) -> Result<()> {
    const OP: &str = "index_select backward";
    if table_rows == 0 || cols == 0 {
        return Ok(());
    }
    let (gb, go) = ctx.span(OP, g, 0, rows * cols)?;
    let (pb, po) = ctx.span(OP, plan, 0, table_rows + 1 + rows)?;
    let passes = rows.div_ceil(SCATTER_SPAN).max(1);
    for (v0, v1) in ctx.chunks(OP, table_rows, &[cols])? {
        let cnt = v1 - v0;
        for pass in 0..passes {
            let (ob, oo) = ctx.span(OP, out, v0 * cols, cnt * cols)?;
            let w = Words::default().u(cnt).u(cols).u(go).u(po).u(oo).u(table_rows).u(rows).u(v0).u(pass * SCATTER_SPAN);
            ctx.dispatch("index", "scatter_add_rows", &w.0, &[gb, pb, ob], ctx.grid(cnt * cols, 256))?;
        }
    }
    Ok(())
}

/// `CastOp` over `n` contiguous elements, in chunks that fit a binding.
pub(crate) fn cast(ctx: &Ctx, op: CastOp, x: &wgpu::Buffer, out: &wgpu::Buffer, n: usize) -> Result<()> {
    for (s, e) in ctx.chunks("cast", n, &[1, 1])? {
        let (xb, xo) = ctx.span("cast", x, s, e - s)?;
        let (ob, oo) = ctx.span("cast", out, s, e - s)?;
        let w = Words::default().u(e - s).u(xo).u(oo);
        ctx.dispatch_op("cast", "convert", Some(op.code()), &w.0, &[xb, ob], ctx.grid(e - s, 256))?;
    }
    Ok(())
}

pub(crate) fn optim(ctx: &Ctx, step: OptimStep, param: &wgpu::Buffer, grad: &wgpu::Buffer, state: &[&wgpu::Buffer], n: usize) -> Result<()> {
    let (entry, states, head) = match step {
        OptimStep::Sgd { lr, momentum, dampening, nesterov, weight_decay, first } => {
            let flags = u32::from(nesterov) | u32::from(first) << 1;
            let entry = if momentum == 0.0 { "sgd" } else { "sgd_momentum" };
            let w = Words::default().u(flags).f(lr).f(weight_decay).f(momentum).f(dampening).f(0.0).f(1.0).f(1.0);
            (entry, usize::from(momentum != 0.0), w)
        }
        OptimStep::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, step } => {
            if step == 0 {
                return Err(Error::invalid("optim_step", "Adam's step counts from 1"));
            }
            let t = step.min(i32::MAX as u64) as i32;
            let bc1 = 1.0 - beta1.powi(t);
            let bc2 = 1.0 - beta2.powi(t);
            let w = Words::default().u(u32::from(decoupled)).f(lr).f(weight_decay).f(beta1).f(beta2).f(eps).f(bc1).f(bc2);
            ("adam", 2, w)
        }
    };
    if state.len() < states {
        return Err(Error::invalid("optim_step", format!("{entry} needs {states} state buffers, got {}", state.len())));
    }
    if n == 0 {
        return Ok(());
    }
    let bufs: Vec<&wgpu::Buffer> = [param, grad].into_iter().chain(state[..states].iter().copied()).collect();
    for (s, e) in ctx.chunks("optim_step", n, &vec![1; bufs.len()])? {
        let mut binds = Vec::with_capacity(bufs.len());
        let mut off = 0;
        for b in &bufs {
            let (bind, o) = ctx.span("optim_step", b, s, e - s)?;
            off = o;
            binds.push(bind);
        }
        let mut w = Words::default().u(e - s).u(off);
        w.0.extend_from_slice(&head.0);
        ctx.dispatch("optim", entry, &w.0, &binds, ctx.grid(e - s, 256))?;
    }
    Ok(())
}
