//! Max pooling on the CPU: the output and argmax of each window (the last NaN, else the first
//! maximum in row-major order, as PyTorch), and the gradient sent back to each argmax.
//!
//! Shape letters: `n` images of `c` planes of `h x w`, windows of `kh x kw` every `stride`
//! after `pad`, giving `oh x ow` outputs a plane; `arg` holds each output's index in its plane
//! (`-1` for a window wholly in the padding, whose output is 0).
use super::WindowSpec;
use rayon::prelude::*;

/// `out` and `arg` of every window, a plane per task; 2x2 windows every 2 without padding (the
/// CNNs' usual pooling) take a path that reads each window's four values directly, the same
/// values and indices as the general one.
pub fn max_pool2d(x: &[f32], s: WindowSpec, out: &mut [f32], arg: &mut [i32]) {
    let (planes, po) = (s.n * s.c, s.oh * s.ow);
    if po == 0 {
        return;
    }
    let pool: fn(&[f32], WindowSpec, &mut [f32], &mut [i32]) =
        if (s.kh, s.kw, s.stride, s.pad) == (2, 2, (2, 2), (0, 0)) { halving } else { any_window };
    let one = |(p, (out, arg)): (usize, (&mut [f32], &mut [i32]))| pool(&x[p * s.h * s.w..][..s.h * s.w], s, out, arg);
    out[..planes * po].par_chunks_mut(po).zip(arg[..planes * po].par_chunks_mut(po)).enumerate().for_each(one);
}

/// One plane's 2x2 windows every 2, no padding: each window lies inside the plane and has four
/// values.
fn halving(plane: &[f32], s: WindowSpec, out: &mut [f32], arg: &mut [i32]) {
    for oy in 0..s.oh {
        let (y0, y1) = (2 * oy * s.w, (2 * oy + 1) * s.w);
        let (top, bottom) = (&plane[y0..y0 + 2 * s.ow], &plane[y1..y1 + 2 * s.ow]);
        let (out, arg) = (&mut out[oy * s.ow..][..s.ow], &mut arg[oy * s.ow..][..s.ow]);
        for ox in 0..s.ow {
            let i = 2 * ox;
            let (mut best, mut at) = (top[i], (y0 + i) as i32);
            for (v, a) in [(top[i + 1], y0 + i + 1), (bottom[i], y1 + i), (bottom[i + 1], y1 + i + 1)] {
                // Selects, not branches: the same choice as the general loop's test.
                let take = v > best || v.is_nan();
                best = if take { v } else { best };
                at = if take { a as i32 } else { at };
            }
            out[ox] = best;
            arg[ox] = at;
        }
    }
}

/// One plane's windows of any size, stride and padding.
fn any_window(plane: &[f32], s: WindowSpec, out: &mut [f32], arg: &mut [i32]) {
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
            let o = oy * s.ow + ox;
            out[o] = if at < 0 { 0.0 } else { best };
            arg[o] = at;
        }
    }
}

pub fn max_pool2d_backward(gy: &[f32], arg: &[i32], s: WindowSpec, gx: &mut [f32]) {
    let (planes, pi, po) = (s.n * s.c, s.h * s.w, s.oh * s.ow);
    if pi == 0 {
        return;
    }
    gx[..planes * pi].par_chunks_mut(pi).enumerate().for_each(|(p, gx)| {
        gx.fill(0.0);
        for o in 0..po {
            let a = arg[p * po + o];
            if a >= 0 {
                gx[a as usize] += gy[p * po + o];
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2x2 path against the general one on odd and even planes, with ties (values in
    /// {-1, 0, 1}), NaNs (one and two in a window), infinities and -0: the same bits and indices.
    #[test]
    fn halving_windows_equal_the_general_path() {
        for (h, w) in [(2, 2), (5, 7), (28, 28), (9, 4), (3, 6)] {
            let spec = WindowSpec::new("test", [3, 2, h, w], (2, 2), (2, 2), (0, 0)).unwrap();
            let specials = [f32::NAN, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1.0, -1.0];
            let x: Vec<f32> =
                (0..3 * 2 * h * w)
                    .map(|i: usize| {
                        if i % 11 == 3 {
                            specials[(i / 11) % specials.len()]
                        } else {
                            ((i * 7919 % 13) as f32 - 6.0).signum() * ((i * 31 % 3) as f32)
                        }
                    })
                    .collect();
            let outs = 3 * 2 * spec.oh * spec.ow;
            let (mut fast, mut fast_arg, mut general, mut general_arg) = (vec![7.0; outs], vec![9; outs], vec![7.0; outs], vec![9; outs]);
            max_pool2d(&x, spec, &mut fast, &mut fast_arg);
            let (plane, po) = (h * w, spec.oh * spec.ow);
            for p in 0..3 * 2 {
                any_window(&x[p * plane..][..plane], spec, &mut general[p * po..][..po], &mut general_arg[p * po..][..po]);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&general), "{h}x{w}");
            assert_eq!(fast_arg, general_arg, "{h}x{w}");
            assert!(fast.iter().any(|v| v.is_nan()), "{h}x{w}: no NaN window tested");
        }
    }
}
