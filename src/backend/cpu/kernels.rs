//! Scalar definitions of every op on host slices; the CPU backend runs them and tests read them.
use crate::backend::{BinaryOp, MatmulSpec, ReduceOp, ReduceSpec, UnaryOp, WindowSpec};

pub fn unary(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Identity => x,
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Step => (x > 0.0) as i32 as f32,
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Square => x * x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Affine { mul, add } => x * mul + add,
        UnaryOp::Powf(p) => x.powf(p),
    }
}

pub fn binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::Gt => (a > b) as i32 as f32,
        BinaryOp::Eq => (a == b) as i32 as f32,
    }
}

/// Values (Sum/Max/Min) or first-maximum indices (ArgMax) over the middle axis.
pub fn reduce(op: ReduceOp, x: &[f32], s: ReduceSpec) -> (Vec<f32>, Vec<i32>) {
    let mut vals = vec![0.0f32; s.outer * s.inner];
    let mut idx = vec![0i32; s.outer * s.inner];
    for o in 0..s.outer {
        for i in 0..s.inner {
            let at = |j: usize| x[(o * s.len + j) * s.inner + i];
            let (mut acc, mut best) = match op {
                ReduceOp::Sum => (0.0, 0),
                ReduceOp::Max | ReduceOp::ArgMax => (f32::NEG_INFINITY, 0),
                ReduceOp::Min => (f32::INFINITY, 0),
            };
            for j in 0..s.len {
                let v = at(j);
                match op {
                    ReduceOp::Sum => acc += v,
                    ReduceOp::Max => acc = acc.max(v),
                    ReduceOp::Min => acc = acc.min(v),
                    ReduceOp::ArgMax => {
                        if v > acc || (j == 0) {
                            acc = v;
                            best = j as i32;
                        }
                    }
                }
            }
            vals[o * s.inner + i] = acc;
            idx[o * s.inner + i] = best;
        }
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
        // offsets, which the caller sized (Tensor checks shapes before calling).
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

pub fn im2col(x: &[f32], s: WindowSpec) -> Vec<f32> {
    let (rows, cl) = (s.col_rows(), s.col_len());
    let mut cols = vec![0.0f32; s.n * rows * cl];
    for n in 0..s.n {
        for r in 0..rows {
            let (ci, i, j) = (r / (s.kh * s.kw), (r / s.kw) % s.kh, r % s.kw);
            for oy in 0..s.oh {
                let y = (oy * s.stride.0 + i) as isize - s.pad.0 as isize;
                if y < 0 || y >= s.h as isize {
                    continue;
                }
                for ox in 0..s.ow {
                    let xx = (ox * s.stride.1 + j) as isize - s.pad.1 as isize;
                    if xx < 0 || xx >= s.w as isize {
                        continue;
                    }
                    cols[(n * rows + r) * cl + oy * s.ow + ox] =
                        x[((n * s.c + ci) * s.h + y as usize) * s.w + xx as usize];
                }
            }
        }
    }
    cols
}

pub fn col2im(cols: &[f32], s: WindowSpec) -> Vec<f32> {
    let (rows, cl) = (s.col_rows(), s.col_len());
    let mut x = vec![0.0f32; s.n * s.c * s.h * s.w];
    for n in 0..s.n {
        for r in 0..rows {
            let (ci, i, j) = (r / (s.kh * s.kw), (r / s.kw) % s.kh, r % s.kw);
            for oy in 0..s.oh {
                let y = (oy * s.stride.0 + i) as isize - s.pad.0 as isize;
                if y < 0 || y >= s.h as isize {
                    continue;
                }
                for ox in 0..s.ow {
                    let xx = (ox * s.stride.1 + j) as isize - s.pad.1 as isize;
                    if xx < 0 || xx >= s.w as isize {
                        continue;
                    }
                    x[((n * s.c + ci) * s.h + y as usize) * s.w + xx as usize] +=
                        cols[(n * rows + r) * cl + oy * s.ow + ox];
                }
            }
        }
    }
    x
}

pub fn max_pool2d(x: &[f32], s: WindowSpec) -> (Vec<f32>, Vec<i32>) {
    let planes = s.n * s.c;
    let mut out = vec![0.0f32; planes * s.oh * s.ow];
    let mut arg = vec![-1i32; planes * s.oh * s.ow];
    for p in 0..planes {
        for oy in 0..s.oh {
            for ox in 0..s.ow {
                let mut best = f32::NEG_INFINITY;
                let mut at = -1i32;
                for i in 0..s.kh {
                    for j in 0..s.kw {
                        let y = (oy * s.stride.0 + i) as isize - s.pad.0 as isize;
                        let xx = (ox * s.stride.1 + j) as isize - s.pad.1 as isize;
                        if y < 0 || xx < 0 || y >= s.h as isize || xx >= s.w as isize {
                            continue;
                        }
                        let pos = y as usize * s.w + xx as usize;
                        let v = x[p * s.h * s.w + pos];
                        if at < 0 || v > best || v.is_nan() {
                            best = v;
                            at = pos as i32;
                        }
                    }
                }
                let o = (p * s.oh + oy) * s.ow + ox;
                out[o] = if at < 0 { 0.0 } else { best };
                arg[o] = at;
            }
        }
    }
    (out, arg)
}

pub fn max_pool2d_backward(gy: &[f32], arg: &[i32], s: WindowSpec) -> Vec<f32> {
    let planes = s.n * s.c;
    let mut gx = vec![0.0f32; planes * s.h * s.w];
    for p in 0..planes {
        for o in 0..s.oh * s.ow {
            let a = arg[p * s.oh * s.ow + o];
            if a >= 0 {
                gx[p * s.h * s.w + a as usize] += gy[p * s.oh * s.ow + o];
            }
        }
    }
    gx
}
