//! Integer indexing on host slices: the embedding gather and its deterministic scatter-add
//! through a `row_plan`.
use super::kernels::CHUNK;
use rayon::prelude::*;

/// `out[i, :] = table[ids[i], :]`; an id outside the table gives a row of zeros.
pub fn gather_rows(table: &[f32], ids: &[i32], out: &mut [f32], cols: usize) {
    if cols == 0 {
        return;
    }
    let rows = table.len() / cols;
    let row = |(o, &id): (&mut [f32], &i32)| match usize::try_from(id).ok().filter(|&v| v < rows) {
        Some(v) => o.copy_from_slice(&table[v * cols..(v + 1) * cols]),
        None => o.fill(0.0),
    };
    let per = (CHUNK / cols).max(1);
    if out.len() < 2 * CHUNK {
        out.chunks_mut(cols).zip(ids).for_each(row);
    } else {
        out.par_chunks_mut(per * cols).zip(ids.par_chunks(per)).for_each(|(o, i)| o.chunks_mut(cols).zip(i).for_each(row));
    }
}

/// `out[v, :] = Σ g[i, :]` over the ids `i` the plan lists for row `v`, summed from +0 in the
/// plan's (ascending) order. Each table row is one task, so the bits do not depend on the
/// thread count; plan entries outside `0..rows` are skipped, never read through.
pub fn scatter_add_rows(g: &[f32], plan: &[i32], out: &mut [f32], rows: usize, cols: usize) {
    if cols == 0 {
        return;
    }
    let table_rows = out.len() / cols;
    let (ptr, order) = plan.split_at(table_rows + 1);
    let clamp = |p: i32| (p.max(0) as usize).min(order.len());
    let row = |(v, o): (usize, &mut [f32])| {
        o.fill(0.0);
        let (lo, hi) = (clamp(ptr[v]), clamp(ptr[v + 1]));
        for &i in &order[lo..hi.max(lo)] {
            if let Some(i) = usize::try_from(i).ok().filter(|&i| i < rows) {
                o.iter_mut().zip(&g[i * cols..(i + 1) * cols]).for_each(|(o, &x)| *o += x);
            }
        }
    };
    if out.len() + g.len() < 2 * CHUNK {
        out.chunks_mut(cols).enumerate().for_each(row);
    } else {
        out.par_chunks_mut(cols).enumerate().for_each(row);
    }
}
