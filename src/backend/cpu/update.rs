//! The fused optimizer updates of the CPU backend: one pass over parameter, gradient and state
//! with the same f32 operations, in the same order, as the composition in `optim` (so the same
//! bits), where the composition makes a pass and a temporary buffer per operation.
use super::kernels::CHUNK;
use crate::backend::OptimStep;
use rayon::prelude::*;

/// Updates `param` and `state` in place; `false` (nothing written) when `state` does not hold
/// exactly the buffers the step reads.
pub fn optim_step(step: OptimStep, param: &mut [f32], grad: &[f32], state: &mut [&mut [f32]]) -> bool {
    match (step, state) {
        (OptimStep::Sgd { lr, momentum, dampening, nesterov, weight_decay, first }, [buf]) => {
            let one = |p: &mut f32, g: f32, b: &mut f32| {
                let d = if weight_decay != 0.0 { g + *p * weight_decay } else { g };
                let nb = if first { d } else { *b * momentum + d * (1.0 - dampening) };
                *b = nb;
                let d = if nesterov { d + nb * momentum } else { nb };
                *p -= d * lr;
            };
            chunked(param, grad, buf, |p, g, b| p.iter_mut().zip(g).zip(b.iter_mut()).for_each(|((p, &g), b)| one(p, g, b)));
        }
        (OptimStep::Sgd { lr, weight_decay, .. }, []) => {
            let one = |p: &mut f32, g: f32| {
                let d = if weight_decay != 0.0 { g + *p * weight_decay } else { g };
                *p -= d * lr;
            };
            chunked(param, grad, &mut [], |p, g, _| p.iter_mut().zip(g).for_each(|(p, &g)| one(p, g)));
        }
        (OptimStep::Adam { lr, beta1, beta2, eps, weight_decay, decoupled, step }, [m, v]) => {
            let bc1 = 1.0 - beta1.powi(step as i32);
            let bc2 = 1.0 - beta2.powi(step as i32);
            let (scale, rate) = (1.0 / bc2.sqrt(), lr / bc1);
            let one = |p: &mut f32, g: f32, m: &mut f32, v: &mut f32| {
                let (mut g, mut pv) = (g, *p);
                if weight_decay != 0.0 {
                    if decoupled {
                        pv = *p * (1.0 - lr * weight_decay);
                    } else {
                        g += *p * weight_decay;
                    }
                }
                *m = *m * beta1 + g * (1.0 - beta1);
                *v = *v * beta2 + (g * g) * (1.0 - beta2);
                let denom = v.sqrt() * scale + eps;
                *p = pv - (*m / denom) * rate;
            };
            let n = param.len();
            let run = |((p, g), (m, v)): AdamChunk<'_>| {
                p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut())).for_each(|((p, &g), (m, v))| one(p, g, m, v))
            };
            let (m, v) = (&mut m[..n], &mut v[..n]);
            if n >= 2 * CHUNK {
                param.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK)).zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK))).for_each(run);
            } else {
                run(((param, grad), (m, v)));
            }
        }
        _ => return false,
    }
    true
}

/// Matching chunks of parameter and gradient, first and second moment.
type AdamChunk<'a> = ((&'a mut [f32], &'a [f32]), (&'a mut [f32], &'a mut [f32]));

/// `f` over matching chunks of parameter, gradient and (possibly empty) state.
fn chunked(param: &mut [f32], grad: &[f32], state: &mut [f32], f: impl Fn(&mut [f32], &[f32], &mut [f32]) + Sync) {
    let n = param.len();
    if n < 2 * CHUNK {
        let len = state.len().min(n);
        return f(param, &grad[..n], &mut state[..len]);
    }
    let tasks: Vec<_> = if state.is_empty() {
        param.chunks_mut(CHUNK).zip(grad.chunks(CHUNK)).map(|(p, g)| (p, g, &mut [][..])).collect()
    } else {
        param.chunks_mut(CHUNK).zip(grad.chunks(CHUNK)).zip(state[..n].chunks_mut(CHUNK)).map(|((p, g), s)| (p, g, s)).collect()
    };
    tasks.into_par_iter().for_each(|(p, g, s)| f(p, g, s));
}
