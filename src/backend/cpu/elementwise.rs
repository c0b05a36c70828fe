//! Elementwise passes over strided inputs: the op chosen once per pass (not per element), rows
//! of the last dimension walked as slices where their stride is 1 or 0 (a broadcast bias),
//! and long passes split over threads in groups of whole rows. Every output is the same
//! scalar function of the same inputs whatever the split, so the bits are the serial run's.
use super::kernels::{binary, unary, CHUNK};
use crate::backend::{BinaryOp, UnaryOp};
use crate::Layout;
use rayon::prelude::*;

/// `out = op(x)` with `x` read through `layout`, in row-major order of its shape.
pub fn unary_pass(op: UnaryOp, layout: &Layout, x: &[f32], out: &mut [f32]) {
    crate::backend::op_table::unary_ops!(pass op, layout, x, out)
}

/// `out = op(a, b)` with `a` and `b` read through layouts of the output's shape.
pub fn binary_pass(op: BinaryOp, la: &Layout, a: &[f32], lb: &Layout, b: &[f32], out: &mut [f32]) {
    crate::backend::op_table::binary_ops!(pass op, la, a, lb, b, out)
}

/// The buffer position of the first element of each row (all but the last dimension), row
/// after row like an odometer, from any starting row.
struct Rows<'a> {
    l: &'a Layout,
    idx: Vec<usize>,
    base: usize,
}

impl<'a> Rows<'a> {
    fn at(l: &'a Layout, mut row: usize) -> Self {
        let outer = l.shape.len().saturating_sub(1);
        let mut idx = vec![0; outer];
        let mut base = l.offset;
        for d in (0..outer).rev() {
            idx[d] = row % l.shape[d];
            row /= l.shape[d];
            base += idx[d] * l.strides[d];
        }
        Rows { l, idx, base }
    }
    fn next(&mut self) -> usize {
        let at = self.base;
        for d in (0..self.idx.len()).rev() {
            self.idx[d] += 1;
            self.base += self.l.strides[d];
            if self.idx[d] < self.l.shape[d] {
                break;
            }
            self.base -= self.idx[d] * self.l.strides[d];
            self.idx[d] = 0;
        }
        at
    }
}

/// The last dimension's length and stride (1 and 0 for a scalar).
fn last(l: &Layout) -> (usize, usize) {
    match (l.shape.last(), l.strides.last()) {
        (Some(&n), Some(&s)) => (n, s),
        _ => (1, 0),
    }
}

/// `task(first_row, rows of out)` over groups of whole rows of `width`, on several threads
/// when the pass is long enough.
fn by_rows(out: &mut [f32], width: usize, task: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() < 2 * CHUNK || width == 0 {
        return task(0, out);
    }
    let group = (CHUNK / width).max(1);
    out.par_chunks_mut(group * width).enumerate().for_each(|(i, o)| task(i * group, o));
}

/// `f` over the elements of `x` read through `layout`, in row-major order of its shape.
pub fn strided_map(layout: &Layout, x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32 + Sync) {
    let n = layout.numel();
    let out = &mut out[..n];
    if n == 0 {
        return;
    }
    if layout.is_contiguous() {
        let x = &x[layout.offset..layout.offset + n];
        return by_rows(out, 1, |i, o| o.iter_mut().zip(&x[i..]).for_each(|(o, &a)| *o = f(a)));
    }
    let (w, s) = last(layout);
    by_rows(out, w, |first, o| {
        let mut rows = Rows::at(layout, first);
        for o in o.chunks_mut(w) {
            let at = rows.next();
            match s {
                1 => o.iter_mut().zip(&x[at..at + w]).for_each(|(o, &a)| *o = f(a)),
                0 => o.fill(f(x[at])),
                _ => o.iter_mut().enumerate().for_each(|(j, o)| *o = f(x[at + j * s])),
            }
        }
    });
}

/// `f` over pairs read through two layouts of the same shape.
pub fn strided_zip(la: &Layout, a: &[f32], lb: &Layout, b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32 + Sync) {
    let n = la.numel();
    let out = &mut out[..n];
    if n == 0 {
        return;
    }
    if la.is_contiguous() && lb.is_contiguous() {
        let (a, b) = (&a[la.offset..la.offset + n], &b[lb.offset..lb.offset + n]);
        return by_rows(out, 1, |i, o| o.iter_mut().zip(a[i..].iter().zip(&b[i..])).for_each(|(o, (&x, &y))| *o = f(x, y)));
    }
    let ((w, sa), (_, sb)) = (last(la), last(lb));
    by_rows(out, w, |first, o| {
        let (mut ra, mut rb) = (Rows::at(la, first), Rows::at(lb, first));
        for o in o.chunks_mut(w) {
            let (pa, pb) = (ra.next(), rb.next());
            match (sa, sb) {
                (1, 1) => o.iter_mut().zip(a[pa..pa + w].iter().zip(&b[pb..pb + w])).for_each(|(o, (&x, &y))| *o = f(x, y)),
                (1, 0) => o.iter_mut().zip(&a[pa..pa + w]).for_each(|(o, &x)| *o = f(x, b[pb])),
                (0, 1) => o.iter_mut().zip(&b[pb..pb + w]).for_each(|(o, &y)| *o = f(a[pa], y)),
                _ => o.iter_mut().enumerate().for_each(|(j, o)| *o = f(a[pa + j * sa], b[pb + j * sb])),
            }
        }
    });
}
