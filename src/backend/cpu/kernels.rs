//! Scalar definitions of every op on host slices; the CPU backend runs them and tests read them.
use crate::backend::{BinaryOp, MatmulSpec, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};
use crate::Layout;

pub fn unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Identity => x,
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        // NaN and -0 pass through, as in PyTorch (`x < 0` is false for both).
        UnaryOp::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryOp::Step => (x > 0.0) as i32 as f32,
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Square => x * x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Affine { mul, add } => x * mul + add,
        UnaryOp::Powf(p) => powf(x, p),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Erf => crate::backend::erf(x as f64) as f32,
    }
}

/// PyTorch's `pow(x, p)` for a scalar exponent: C's `pow` (p = 0 gives 1 even for NaN; a
/// negative base needs an integer p, odd p keeps its sign; 0 to a negative p is an infinity),
/// except that p = ±0.5 is `sqrt` / `1/sqrt`, so -0 keeps its sign and -inf gives NaN there.
pub fn powf(x: f32, p: f32) -> f32 {
    if p == 0.5 {
        x.sqrt()
    } else if p == -0.5 {
        1.0 / x.sqrt()
    } else {
        x.powf(p)
    }
}

/// `f` over the elements of `x` read through `layout`, in row-major order of its shape.
pub fn strided_map(layout: &Layout, x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
    let n = layout.numel();
    if layout.is_contiguous() {
        out[..n].iter_mut().zip(&x[layout.offset..layout.offset + n]).for_each(|(o, &a)| *o = f(a));
        return;
    }
    let mut i = 0;
    for_each_offset(layout, |p| {
        out[i] = f(x[p]);
        i += 1;
    });
}

/// `f` over pairs read through two layouts of the same shape.
pub fn strided_zip(la: &Layout, a: &[f32], lb: &Layout, b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    let n = la.numel();
    if la.is_contiguous() && lb.is_contiguous() {
        let (a, b) = (&a[la.offset..la.offset + n], &b[lb.offset..lb.offset + n]);
        out[..n].iter_mut().zip(a.iter().zip(b)).for_each(|(o, (&x, &y))| *o = f(x, y));
        return;
    }
    let mut i = 0;
    if la.is_contiguous() {
        let a = &a[la.offset..la.offset + n];
        for_each_offset(lb, |pb| {
            out[i] = f(a[i], b[pb]);
            i += 1;
        });
    } else if lb.is_contiguous() {
        let b = &b[lb.offset..lb.offset + n];
        for_each_offset(la, |pa| {
            out[i] = f(a[pa], b[i]);
            i += 1;
        });
    } else {
        let pa = offsets(la);
        for_each_offset(lb, |pb| {
            out[i] = f(a[pa[i]], b[pb]);
            i += 1;
        });
    }
}

fn offsets(l: &Layout) -> Vec<usize> {
    let mut v = Vec::with_capacity(l.numel());
    for_each_offset(l, |p| v.push(p));
    v
}

/// Calls `f` with the buffer position of each element, row-major, without a division per
/// element: an odometer over the outer dimensions and a strided walk of the last.
fn for_each_offset(l: &Layout, mut f: impl FnMut(usize)) {
    if l.numel() == 0 {
        return;
    }
    let r = l.shape.len();
    if r == 0 {
        f(l.offset);
        return;
    }
    let (last, ls) = (l.shape[r - 1], l.strides[r - 1]);
    let mut idx = vec![0usize; r - 1];
    let mut base = l.offset;
    loop {
        for j in 0..last {
            f(base + j * ls);
        }
        let mut d = r - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            base += l.strides[d];
            if idx[d] < l.shape[d] {
                break;
            }
            base -= idx[d] * l.strides[d];
            idx[d] = 0;
        }
    }
}

pub fn binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => maximum(a, b),
        BinaryOp::Min => -maximum(-a, -b),
        BinaryOp::Gt => (a > b) as i32 as f32,
        BinaryOp::Eq => (a == b) as i32 as f32,
        // PyTorch's threshold_backward: the gradient passes unless b <= 0, so a NaN b passes it.
        BinaryOp::ReluBackward => {
            if b <= 0.0 {
                0.0
            } else {
                a
            }
        }
    }
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
    let init = match op {
        ReduceOp::Sum => 0.0,
        ReduceOp::Max | ReduceOp::ArgMax => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    let mut vals = vec![0.0f32; s.outer * s.inner];
    let mut idx = vec![0i32; s.outer * s.inner];
    let mut acc = vec![init; s.inner];
    let mut best = vec![-1i64; s.inner];
    for o in 0..s.outer {
        acc.fill(init);
        best.fill(-1);
        for j in 0..s.len {
            let row = &x[(o * s.len + j) * s.inner..][..s.inner];
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
        vals[o * s.inner..(o + 1) * s.inner].iter_mut().zip(&acc).for_each(|(d, &a)| *d = a as f32);
        idx[o * s.inner..(o + 1) * s.inner].iter_mut().zip(&best).for_each(|(d, &b)| *d = b.max(0) as i32);
    }
    (vals, idx)
}

pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], s: MatmulSpec) {
    let (m, n, k) = (s.m, s.n, s.k);
    // Row/column strides of op(A) (m×k) and op(B) (k×n) as stored.
    let (rsa, csa) = if s.trans_a { (1, m as isize) } else { (k as isize, 1) };
    let (rsb, csb) = if s.trans_b { (1, k as isize) } else { (n as isize, 1) };
    if m == 0 || n == 0 {
        return;
    }
    for bi in 0..s.batch {
        let ao = s.a_offset + bi * s.a_batch_stride;
        let bo = s.b_offset + bi * s.b_batch_stride;
        let cc = &mut c[bi * m * n..(bi + 1) * m * n];
        if k == 0 {
            cc.fill(0.0);
            continue;
        }
        // SAFETY: the strides above address exactly the m×k and k×n matrices starting at the
        // offsets, inside `a` and `b` as `contract::matmul` checked before this was called.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a[ao..].as_ptr(),
                rsa,
                csa,
                b[bo..].as_ptr(),
                rsb,
                csb,
                0.0,
                cc.as_mut_ptr(),
                n as isize,
                1,
            );
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
    cols[..s.n * rows * cl].fill(0.0);
    for n in 0..s.n {
        for r in 0..rows {
            let (ci, i, j) = (r / (s.kh * s.kw), (r / s.kw) % s.kh, r % s.kw);
            let xr = valid_range(s.ow, s.stride.1, j, s.pad.1, s.w);
            for oy in valid_range(s.oh, s.stride.0, i, s.pad.0, s.h) {
                let y = oy * s.stride.0 + i - s.pad.0;
                let src = &x[((n * s.c + ci) * s.h + y) * s.w..][..s.w];
                let dst = &mut cols[(n * rows + r) * cl + oy * s.ow..][..s.ow];
                for ox in xr.clone() {
                    dst[ox] = src[ox * s.stride.1 + j - s.pad.1];
                }
            }
        }
    }
}

pub fn col2im(cols: &[f32], s: WindowSpec, x: &mut [f32]) {
    let (rows, cl) = (s.col_rows(), s.col_len());
    x[..s.n * s.c * s.h * s.w].fill(0.0);
    for n in 0..s.n {
        for r in 0..rows {
            let (ci, i, j) = (r / (s.kh * s.kw), (r / s.kw) % s.kh, r % s.kw);
            let xr = valid_range(s.ow, s.stride.1, j, s.pad.1, s.w);
            for oy in valid_range(s.oh, s.stride.0, i, s.pad.0, s.h) {
                let y = oy * s.stride.0 + i - s.pad.0;
                let dst = &mut x[((n * s.c + ci) * s.h + y) * s.w..][..s.w];
                let src = &cols[(n * rows + r) * cl + oy * s.ow..][..s.ow];
                for ox in xr.clone() {
                    dst[ox * s.stride.1 + j - s.pad.1] += src[ox];
                }
            }
        }
    }
}

pub fn max_pool2d(x: &[f32], s: WindowSpec, out: &mut [f32], arg: &mut [i32]) {
    let planes = s.n * s.c;
    for p in 0..planes {
        let plane = &x[p * s.h * s.w..][..s.h * s.w];
        for oy in 0..s.oh {
            let y0 = (oy * s.stride.0) as isize - s.pad.0 as isize;
            let ys = y0.max(0) as usize..((y0 + s.kh as isize).min(s.h as isize)).max(0) as usize;
            for ox in 0..s.ow {
                let x0 = (ox * s.stride.1) as isize - s.pad.1 as isize;
                let xs = x0.max(0) as usize..((x0 + s.kw as isize).min(s.w as isize)).max(0) as usize;
                let mut best = f32::NEG_INFINITY;
                let mut at = -1i32;
                for y in ys.clone() {
                    for xx in xs.clone() {
                        let v = plane[y * s.w + xx];
                        if at < 0 || v > best || v.is_nan() {
                            best = v;
                            at = (y * s.w + xx) as i32;
                        }
                    }
                }
                let o = (p * s.oh + oy) * s.ow + ox;
                out[o] = if at < 0 { 0.0 } else { best };
                arg[o] = at;
            }
        }
    }
}

pub fn max_pool2d_backward(gy: &[f32], arg: &[i32], s: WindowSpec, gx: &mut [f32]) {
    let planes = s.n * s.c;
    gx[..planes * s.h * s.w].fill(0.0);
    for p in 0..planes {
        for o in 0..s.oh * s.ow {
            let a = arg[p * s.oh * s.ow + o];
            if a >= 0 {
                gx[p * s.h * s.w + a as usize] += gy[p * s.oh * s.ow + o];
            }
        }
    }
}
