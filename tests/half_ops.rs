//! Ops on Bf16 and F16 tensors compute in f32 and round once: on every device each op of a
//! training step, given half inputs, equals the f32 op on the widened inputs rounded to the
//! half type (within one half ulp off the CPU, where the f32 results themselves differ in the
//! last bits), and so do its gradients; the graph keeps halves, not f32 copies; autocast casts
//! products' operands and leaves parameters and their gradients F32.
mod common;
use common::*;
use tandem::nn::{Linear, Module};
use tandem::{autocast, DType, Device, Result, Tensor};

/// `(dtype, relative tolerance)`: one ulp of each half type's 8 and 11 significant bits.
const HALVES: [(DType, f32); 2] = [(DType::Bf16, 1.0 / 128.0), (DType::F16, 1.0 / 1024.0)];

type Op = fn(&[Tensor]) -> Result<Tensor>;

/// Each op with the shapes of its inputs (odd sizes, rows past one workgroup).
fn ops() -> Vec<(&'static str, Vec<Vec<usize>>, Op)> {
    vec![
        ("exp", vec![vec![7, 33]], |t| t[0].exp()),
        ("tanh", vec![vec![7, 33]], |t| t[0].tanh()),
        ("add broadcast", vec![vec![7, 33], vec![33]], |t| t[0].add(&t[1])),
        ("mul", vec![vec![7, 33], vec![7, 33]], |t| t[0].mul(&t[1])),
        ("div", vec![vec![5, 9], vec![5, 9]], |t| t[0].div(&t[1])),
        ("sum rows", vec![vec![3, 301]], |t| t[0].sum(-1, false)),
        ("sum cols", vec![vec![301, 3]], |t| t[0].sum(0, true)),
        ("max", vec![vec![6, 50]], |t| t[0].max(-1, false)),
        ("softmax", vec![vec![5, 77]], |t| t[0].softmax(-1)),
        ("log_softmax", vec![vec![5, 77]], |t| t[0].log_softmax(-1)),
        ("matmul", vec![vec![2, 17, 40], vec![40, 9]], |t| t[0].matmul(&t[1])),
        ("matmul_t", vec![vec![17, 40], vec![9, 40]], |t| t[0].matmul_t(&t[1], false, true)),
        ("layer_norm", vec![vec![6, 48], vec![48], vec![48]], |t| t[0].layer_norm(&t[1], &t[2], 1e-5)),
        ("gelu_tanh", vec![vec![9, 31]], |t| t[0].gelu_tanh()),
        ("gelu", vec![vec![9, 31]], |t| t[0].gelu()),
        ("silu", vec![vec![9, 31]], |t| t[0].silu()),
        ("causal_softmax", vec![vec![3, 13, 13]], |t| t[0].causal_softmax(0.3)),
        ("causal_attention", vec![vec![4, 11, 8], vec![4, 11, 8], vec![4, 11, 8]], |t| Tensor::causal_attention(&t[0], &t[1], &t[2], 0.35)),
        ("permute", vec![vec![3, 5, 7]], |t| t[0].permute(&[2, 0, 1])),
        ("narrow", vec![vec![5, 7]], |t| t[0].narrow(1, 2, 3)),
        ("cat", vec![vec![3, 5], vec![2, 5]], |t| Tensor::cat(&[t[0].clone(), t[1].clone()], 0)),
        ("conv2d", vec![vec![2, 3, 9, 8], vec![4, 3, 3, 3], vec![4]], |t| t[0].conv2d_bias(&t[1], &t[2], (1, 1), (1, 1))),
        ("max_pool2d", vec![vec![2, 3, 9, 8]], |t| t[0].max_pool2d((2, 2), (2, 2), (0, 0))),
    ]
}

fn inputs(d: &Device, shapes: &[Vec<usize>], dtype: DType, seed: u64) -> Result<Vec<Tensor>> {
    let mut r = rng(seed);
    shapes
        .iter()
        .map(|s| Tensor::from_vec(uniform(&mut r, s.iter().product(), -2.0, 2.0), s.clone(), d)?.to_dtype(dtype).map(Tensor::requires_grad))
        .collect()
}

/// An output's type and values (as f32), and each input's gradient's.
type Outputs = (DType, Vec<f32>, Vec<(DType, Vec<f32>)>);

/// The op's output and each input's gradient (for a fixed upstream gradient), as f32 values.
fn run(op: Op, x: &[Tensor]) -> Result<Outputs> {
    let y = op(x)?;
    let g = Tensor::from_vec((0..y.numel()).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect(), y.dims().to_vec(), y.device())?;
    y.to_dtype(DType::F32)?.mul(&g)?.sum_all()?.backward()?;
    let grads = x.iter().map(|t| t.grad().map(|g| (g.dtype(), g.to_vec().unwrap())).unwrap_or((DType::I32, vec![]))).collect();
    Ok((y.dtype(), y.to_vec()?, grads))
}

/// The f32 op on the widened inputs, its output and gradients rounded to `dtype`.
fn reference(op: Op, shapes: &[Vec<usize>], dtype: DType, seed: u64) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
    let cpu = Device::cpu();
    let wide: Vec<Tensor> =
        inputs(&cpu, shapes, dtype, seed)?.iter().map(|t| t.to_dtype(DType::F32).map(|t| t.detach().requires_grad())).collect::<Result<_>>()?;
    let (_, y, grads) = run(op, &wide)?;
    let round = |v: Vec<f32>| Tensor::from_vec(v.clone(), [v.len()], &cpu)?.to_dtype(dtype)?.to_vec();
    Ok((round(y)?, grads.into_iter().map(|(_, g)| round(g)).collect::<Result<_>>()?))
}

#[test]
fn every_op_on_halves_is_the_f32_op_rounded_once_with_its_gradients() {
    on_each_device(|dev, cpu| {
        for (seed, (name, shapes, op)) in ops().into_iter().enumerate() {
            for (dtype, ulp) in HALVES {
                let (want_y, want_g) = reference(op, &shapes, dtype, seed as u64)?;
                for d in [cpu, dev] {
                    let (ydt, y, grads) = run(op, &inputs(d, &shapes, dtype, seed as u64)?)?;
                    assert_eq!(ydt, dtype, "{name} {dtype:?} on {d}: output dtype");
                    // The CPU is the reference itself: the same bits. Elsewhere the f32 results
                    // may differ in their last bits and round to the neighbouring half.
                    let (atol, rtol) = if d.same(cpu) { (0.0, 0.0) } else { (ulp * 1e-2, ulp) };
                    assert_close(&format!("{name} {dtype:?} on {d}"), &y, &want_y, atol, rtol);
                    for (i, ((gdt, g), want)) in grads.iter().zip(&want_g).enumerate() {
                        assert_eq!(*gdt, dtype, "{name} {dtype:?} on {d}: gradient {i} dtype");
                        // The rules read the rounded output (as PyTorch's, which saves it in the
                        // half type), so a gradient is within a few ulps of its largest term
                        // (tanh's 1 - y² near y = 1 amplifies y's rounding), not of each element.
                        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                        assert_close(&format!("{name} {dtype:?} gradient {i} on {d}"), g, want, 4.0 * ulp * scale, 2.0 * ulp);
                    }
                }
            }
        }
        Ok(())
    });
}

#[test]
fn mixed_types_promote_to_f32_and_losses_compute_in_f32() {
    let cpu = Device::cpu();
    let h = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], [2, 2], &cpu).unwrap().to_dtype(DType::Bf16).unwrap();
    let f = Tensor::from_vec(vec![0.5; 4], [2, 2], &cpu).unwrap();
    assert_eq!(h.add(&f).unwrap().dtype(), DType::F32);
    assert_eq!(h.add(&h.to_dtype(DType::F32).unwrap().to_dtype(DType::F16).unwrap()).unwrap().dtype(), DType::F32);
    for loss in [h.mse_loss(&f).unwrap(), h.l1_loss(&f).unwrap(), h.huber_loss(&f, 1.0).unwrap(), h.bce_with_logits(&f).unwrap()] {
        assert_eq!(loss.dtype(), DType::F32, "losses compute in F32");
    }
    let labels = Tensor::from_labels(vec![1, 0], [2], &cpu).unwrap();
    let (loss_h, loss_f) = (h.cross_entropy(&labels).unwrap(), h.to_dtype(DType::F32).unwrap().cross_entropy(&labels).unwrap());
    assert_eq!(loss_h.dtype(), DType::F32);
    assert_eq!(loss_h.to_scalar().unwrap(), loss_f.to_scalar().unwrap());
    assert_eq!(h.argmax(1).unwrap().to_vec_i32().unwrap(), [1, 1]);
}

#[test]
fn the_graph_keeps_halves_not_f32_copies() {
    let cpu = Device::cpu();
    let bytes = |dtype: DType| {
        let x = Tensor::from_vec(vec![0.1; 1 << 16], [256, 256], &cpu).unwrap().to_dtype(dtype).unwrap().detach().requires_grad();
        let y = x.tanh().unwrap().exp().unwrap().tanh().unwrap();
        tandem::autograd::activation_bytes(&y)
    };
    let (wide, half) = (bytes(DType::F32), bytes(DType::Bf16));
    assert_eq!(half * 2, wide, "bf16 activations {half} bytes, f32 {wide}");
}

#[test]
fn autocast_runs_products_in_the_half_type_with_f32_master_weights() {
    on_each_device(|dev, cpu| {
        for (dtype, ulp) in HALVES {
            let mut got = Vec::new();
            for d in [cpu, dev] {
                let lin = Linear::new(24, 10, &mut rng(5), d)?;
                let x = Tensor::from_vec(uniform(&mut rng(9), 7 * 24, -1.0, 1.0), [7, 24], d)?;
                let y = autocast(Some(dtype), || lin.forward(&x)?.relu())?;
                assert_eq!(y.dtype(), dtype, "{dtype:?} Linear output on {d}");
                y.to_dtype(DType::F32)?.sum_all()?.backward()?;
                let grads: Vec<(DType, Vec<f32>)> =
                    lin.parameters().iter().map(|(_, p)| p.grad().map(|g| (g.dtype(), g.to_vec().unwrap())).expect("grad")).collect();
                assert!(grads.iter().all(|(t, _)| *t == DType::F32), "master weights' gradients are F32");
                assert!(autocast(None, || lin.forward(&x))?.dtype() == DType::F32, "outside autocast: F32");
                got.push((y.to_vec()?, grads));
            }
            // The same rounding on the CPU and on the device, within one half ulp.
            assert_close(&format!("{dtype:?} autocast Linear on {dev}"), &got[1].0, &got[0].0, ulp * 1e-2, ulp);
            for (a, b) in got[1].1.iter().zip(&got[0].1) {
                assert_close(&format!("{dtype:?} autocast Linear grads on {dev}"), &a.1, &b.1, 4.0 * ulp, 2.0 * ulp);
            }
        }
        Ok(())
    });
    // By hand: bf16 has 8 significant bits, so 1 + 2^-9 rounds to 1 in the weight's cast.
    let cpu = Device::cpu();
    let w = Tensor::from_vec(vec![1.0 + 2f32.powi(-9)], [1, 1], &cpu).unwrap().requires_grad();
    let x = Tensor::from_vec(vec![3.0], [1, 1], &cpu).unwrap();
    let y = autocast(Some(DType::Bf16), || x.matmul(&w)).unwrap();
    assert_eq!(y.to_vec().unwrap(), [3.0]);
}
