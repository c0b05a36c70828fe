//! The fused transformer kernels (LayerNorm, causal softmax, causal attention) against their
//! compositions and the CPU reference on every device: odd sizes, a LayerNorm row past 65,535,
//! NaN and inf rows, finite-difference gradients, bit-identical backward, and errors.
mod common;
mod fd;

use common::*;
use tandem::backend::FusedOp;
use tandem::tensor::composed;
use tandem::{Device, Result, Tensor};

const TS: [usize; 4] = [1, 7, 33, 129];

/// `f` on `dev` fused and composed, and on the CPU fused: the output and every input's gradient
/// (for a random upstream gradient) agree within `tol`.
fn agree(dev: &Device, cpu: &Device, what: &str, shapes: &[Vec<usize>], seed: u64, tol: f32, f: &dyn Fn(&[Tensor]) -> Result<Tensor>) -> Result<()> {
    let mut r = rng(seed);
    let vals: Vec<Vec<f32>> = shapes.iter().map(|s| uniform(&mut r, s.iter().product(), -2.0, 2.0)).collect();
    let run = |d: &Device, fused: bool| -> Result<Vec<Vec<f32>>> {
        let xs: Vec<Tensor> =
            vals.iter().zip(shapes).map(|(v, s)| Ok(Tensor::from_vec(v.clone(), s.clone(), d)?.requires_grad())).collect::<Result<_>>()?;
        let body = || -> Result<Vec<Vec<f32>>> {
            let y = f(&xs)?;
            let up = Tensor::from_vec(uniform(&mut rng(seed + 1), y.numel(), -1.0, 1.0), y.dims().to_vec(), d)?;
            y.mul(&up)?.sum_all()?.backward()?;
            let mut out = vec![y.to_vec()?];
            for x in &xs {
                out.push(x.grad().map(|g| g.to_vec()).transpose()?.unwrap_or_default());
            }
            Ok(out)
        };
        if fused {
            body()
        } else {
            composed(body)
        }
    };
    let want = run(cpu, false)?;
    for (d, fused) in [(cpu, true), (dev, true), (dev, false)] {
        let got = run(d, fused)?;
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("{what} on {d} (fused {fused}) output {k}"), g, w, tol, tol);
        }
    }
    Ok(())
}

#[test]
fn layer_norm_matches_composition_at_odd_sizes() {
    on_each_device(|dev, cpu| {
        for (i, (rows, c)) in [(1, 5), (7, 48), (33, 129), (300, 5), (3, 1)].into_iter().enumerate() {
            agree(dev, cpu, &format!("layer_norm [{rows}, {c}]"), &[vec![rows, c], vec![c], vec![c]], 10 + i as u64, 2e-4, &|x| {
                x[0].layer_norm(&x[1], &x[2], 1e-5)
            })?;
        }
        Ok(())
    });
}

#[test]
fn layer_norm_row_longer_than_a_shader_loop() {
    on_each_device(|dev, cpu| {
        let c = 70_001;
        agree(dev, cpu, "layer_norm [2, 70001]", &[vec![2, c], vec![c], vec![c]], 3, 1e-3, &|x| x[0].layer_norm(&x[1], &x[2], 1e-5))
    });
}

#[test]
fn causal_softmax_matches_composition() {
    on_each_device(|dev, cpu| {
        for (i, t) in TS.into_iter().enumerate() {
            agree(dev, cpu, &format!("causal_softmax T={t}"), &[vec![3, t, t]], 20 + i as u64, 1e-5, &|x| x[0].causal_softmax(0.7))?;
        }
        Ok(())
    });
}

#[test]
fn causal_attention_matches_composition() {
    on_each_device(|dev, cpu| {
        for (i, (t, d)) in TS.into_iter().zip([3, 16, 24, 16]).chain([(7, 3), (33, 24)]).enumerate() {
            let s = vec![2, t, d];
            let scale = 1.0 / (d as f32).sqrt();
            agree(dev, cpu, &format!("causal_attention T={t} D={d}"), &[s.clone(), s.clone(), s], 30 + i as u64, 1e-4, &|x| {
                Tensor::causal_attention(&x[0], &x[1], &x[2], scale)
            })?;
        }
        Ok(())
    });
}

#[test]
fn fused_gradients_match_finite_differences() {
    fd::gradcheck("layer_norm", &[&[4, 6], &[6], &[6]], -2.0, 2.0, &|x| x[0].layer_norm(&x[1], &x[2], 1e-5));
    fd::gradcheck("causal_softmax", &[&[2, 5, 5]], -2.0, 2.0, &|x| x[0].causal_softmax(0.8));
    fd::gradcheck("causal_attention", &[&[2, 5, 3], &[2, 5, 3], &[2, 5, 3]], -1.0, 1.0, &|x| Tensor::causal_attention(&x[0], &x[1], &x[2], 0.6));
}

/// NaN and ±inf in one row poison that row only, as the composition (PyTorch's formulas) does.
#[test]
fn nan_and_inf_rows_as_composition() {
    on_each_device(|dev, cpu| {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let t = 5;
            let mut x = uniform(&mut rng(7), 2 * t * t, -1.0, 1.0);
            x[t * t + 3 * t + 1] = bad;
            let mut ln = uniform(&mut rng(8), 4 * 6, -1.0, 1.0);
            ln[6 + 2] = bad;
            let mut q = uniform(&mut rng(9), 2 * t * 4, -1.0, 1.0);
            q[t * 4 + 2 * 4 + 1] = bad;
            let kv = uniform(&mut rng(10), 2 * t * 4, -1.0, 1.0);
            let each = |d: &Device| -> Result<Vec<Vec<f32>>> {
                let sm = Tensor::from_vec(x.clone(), [2, t, t], d)?.causal_softmax(0.5)?;
                let (w, b) = (Tensor::ones([6], d)?, Tensor::zeros([6], d)?);
                let l = Tensor::from_vec(ln.clone(), [4, 6], d)?.layer_norm(&w, &b, 1e-5)?;
                let (q, k) = (Tensor::from_vec(q.clone(), [2, t, 4], d)?, Tensor::from_vec(kv.clone(), [2, t, 4], d)?);
                let a = Tensor::causal_attention(&q, &k, &k, 0.5)?;
                Ok(vec![sm.to_vec()?, l.to_vec()?, a.to_vec()?])
            };
            let want = composed(|| each(cpu))?;
            for (d, fused) in [(cpu, true), (dev, true)] {
                let got = if fused { each(d)? } else { composed(|| each(d))? };
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_close(&format!("{bad} in output {k} on {d}"), g, w, 1e-5, 1e-5);
                }
            }
        }
        Ok(())
    });
}

/// Two backward passes of the fused kernels give the same bits (no atomics, fixed orders).
#[test]
fn fused_backward_is_bit_identical_across_runs() {
    on_each_device(|dev, cpu| {
        for dev in [cpu, dev] {
            let grads = || -> Result<Vec<u32>> {
                let mut r = rng(5);
                let x = Tensor::from_vec(uniform(&mut r, 600 * 48, -1.0, 1.0), [600, 48], dev)?.requires_grad();
                let w = Tensor::from_vec(uniform(&mut r, 48, 0.5, 1.5), [48], dev)?.requires_grad();
                let b = Tensor::zeros([48], dev)?.requires_grad();
                let qkv = x.reshape([3, 4, 50, 48])?;
                let part = |i| qkv.narrow(0, i, 1)?.reshape([4, 50, 48]);
                let y = Tensor::causal_attention(&part(0)?, &part(1)?, &part(2)?, 0.3)?;
                let y = y.reshape([200, 48])?.layer_norm(&w, &b, 1e-5)?;
                y.reshape([4, 50, 48])?.matmul_t(&y.reshape([4, 50, 48])?, false, true)?.causal_softmax(0.2)?.square()?.sum_all()?.backward()?;
                let mut bits = Vec::new();
                for t in [&x, &w, &b] {
                    bits.extend(t.grad().expect("grad").to_vec()?.iter().map(|v| v.to_bits()));
                }
                Ok(bits)
            };
            assert!(grads()? == grads()?, "two backward passes differ on {dev}");
        }
        Ok(())
    });
}

#[test]
fn bad_shapes_and_buffers_are_errors() {
    let dev = Device::cpu();
    let x = Tensor::zeros([2, 4], &dev).unwrap();
    let msg = |r: Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg(x.layer_norm(&Tensor::ones([3], &dev).unwrap(), &Tensor::zeros([4], &dev).unwrap(), 1e-5)).contains("layer_norm"));
    assert!(msg(x.causal_softmax(1.0)).contains("[.., T, T]"));
    let q = Tensor::zeros([1, 3, 2], &dev).unwrap();
    assert!(msg(Tensor::causal_attention(&q, &Tensor::zeros([1, 3, 3], &dev).unwrap(), &q, 1.0)).contains("causal_attention"));
    // The backend's contract: a short buffer names the op, the buffer and the device.
    let short = dev.backend().alloc(3, tandem::DType::F32).unwrap();
    let ok = dev.backend().alloc(64, tandem::DType::F32).unwrap();
    let e = dev.backend().fused(FusedOp::CausalSoftmax { n: 1, t: 4, scale: 1.0 }, &[&short, &ok]).unwrap_err().to_string();
    assert!(e.contains("causal_softmax") && e.contains("cpu:0") && e.contains("buffer 0"), "{e}");
    let e = dev.backend().fused(FusedOp::CausalSoftmax { n: 1, t: 4, scale: 1.0 }, &[&ok, &ok]).unwrap_err().to_string();
    assert!(e.contains("alias"), "{e}");
    let e = dev.backend().fused(FusedOp::LayerNorm { rows: 1, cols: 2, eps: f32::NAN }, &[&ok; 6]).unwrap_err().to_string();
    assert!(e.contains("eps"), "{e}");
}

/// GPT with the fused attention and with the products around the fused softmax: the same loss
/// and gradients on every device, so either choice of `set_fused_attention` is tested here.
#[test]
fn gpt_attention_kernels_agree() {
    use tandem::nn::models::{Gpt, GptConfig};
    use tandem::nn::Module;
    on_each_device(|dev, cpu| {
        let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 12, block_size: 9, vocab_size: 13, dropout: 0.0, bias: true };
        let step = |d: &Device, fused: bool| -> Result<Vec<f32>> {
            let gpt = Gpt::new(cfg, 3, d)?;
            gpt.set_fused_attention(fused);
            let ids: Vec<i32> = (0..2 * 9).map(|i| i * 5 % 13).collect();
            let x = Tensor::from_labels(ids.clone(), [2, 9], d)?;
            let y = Tensor::from_labels(ids.iter().map(|v| (v + 1) % 13).collect(), [2, 9], d)?;
            let loss = Gpt::loss(&gpt.forward(&x)?, &y)?;
            loss.backward()?;
            let mut out = vec![loss.to_scalar()?];
            for (_, p) in gpt.parameters() {
                out.extend(p.grad().expect("every parameter has a gradient").to_vec()?);
            }
            Ok(out)
        };
        let want = step(cpu, false)?;
        for (d, fused) in [(cpu, true), (dev, true), (dev, false)] {
            assert_close(&format!("GPT loss and gradients on {d}, fused attention {fused}"), &step(d, fused)?, &want, 1e-4, 1e-3);
        }
        Ok(())
    });
}
