//! Fused fast paths (a convolution's bias and ReLU in its product's epilogue) against the
//! unfused composition: on every device against the CPU reference, and fused against
//! layer-by-layer on the same device.
mod common;

use common::*;
use tandem::{Device, Result};

/// A convolution with its bias, and with bias and ReLU, which wgpu adds in the product's
/// epilogue: output and the gradients of input, weight and bias against the CPU reference (which
/// adds and clamps separately), for weights that fit the uniform stage (fused) and a batch too
/// large for one dispatch chunk.
#[test]
fn conv2d_with_bias_forward_and_backward() {
    use tandem::Tensor;
    on_each_device(|dev, cpu| {
        let cases = [([3, 2, 9, 8], [5, 2, 3, 3], (1, 0)), ([2, 3, 12, 12], [20, 3, 5, 5], (0, 0)), ([2, 3, 12, 12], [40, 3, 5, 5], (2, 2))];
        for (i, relu) in (0..cases.len()).flat_map(|i| [(i, false), (i, true)]) {
            let (x_shape, w_shape, pad) = cases[i];
            let mut r = rng(40 + i as u64);
            let xs = uniform(&mut r, x_shape.iter().product(), -1.0, 1.0);
            let ws = uniform(&mut r, w_shape.iter().product(), -1.0, 1.0);
            let bs = uniform(&mut r, w_shape[0], -1.0, 1.0);
            let run = |d: &Device| -> Result<Vec<Vec<f32>>> {
                let x = Tensor::from_vec(xs.clone(), x_shape.to_vec(), d)?.requires_grad();
                let w = Tensor::from_vec(ws.clone(), w_shape.to_vec(), d)?.requires_grad();
                let b = Tensor::from_vec(bs.clone(), vec![w_shape[0]], d)?.requires_grad();
                let y = if relu { x.conv2d_bias_relu(&w, &b, (1, 1), pad)? } else { x.conv2d_bias(&w, &b, (1, 1), pad)? };
                // A non-uniform upstream gradient, nonzero where a ReLU clamped (unlike y²'s):
                // (y·u).sum() for fixed random u.
                let u = Tensor::from_vec(uniform(&mut rng(60 + i as u64), y.numel(), -1.0, 1.0), y.dims().to_vec(), d)?;
                y.mul(&u)?.sum_all()?.backward()?;
                let grad = |t: &Tensor| t.grad().map(|g| g.to_vec()).unwrap_or_else(|| Ok(Vec::new()));
                Ok(vec![y.to_vec()?, grad(&x)?, grad(&w)?, grad(&b)?])
            };
            let (got, want) = (run(dev)?, run(cpu)?);
            for (name, (g, w)) in ["output", "grad x", "grad weight", "grad bias"].iter().zip(got.iter().zip(&want)) {
                assert!(!w.is_empty(), "{name} missing on the CPU");
                tandem::tolerance::assert_close(&format!("conv2d_bias {x_shape:?} relu {relu} {name}"), g, w, 1e-4, 1e-4);
            }
            if relu {
                // The clamp happened: some outputs are exactly 0, none negative.
                assert!(got[0].contains(&0.0) && got[0].iter().all(|&v| v >= 0.0), "relu output on {dev}");
            }
        }
        Ok(())
    });
}

/// `Sequential` runs a convolution followed by a ReLU as one fused op where the backend has it
/// (wgpu's epilogue); output and every parameter gradient equal running the layers one by one.
#[test]
fn sequential_fuses_conv_and_relu_with_the_same_results() {
    use rand::SeedableRng;
    use tandem::nn::{Conv2d, Module, ReLU, Sequential};
    use tandem::Tensor;
    on_each_device(|dev, _| {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let model = Sequential::new()
            .push("conv1", Conv2d::new(2, 6, 3, &mut r, dev)?)
            .push("relu1", ReLU)
            .push("conv2", Conv2d::new(6, 4, 3, &mut r, dev)?)
            .push("relu2", ReLU);
        // 10×10 and 8×8 inputs: output sizes that are multiples of 4, which wgpu's fused kernels need.
        let x = Tensor::randn([3, 2, 10, 10], &mut r, dev)?;
        let run = |fused: bool| -> Vec<Vec<f32>> {
            model.zero_grad();
            let y = if fused {
                model.forward(&x).unwrap()
            } else {
                let mut h = x.clone();
                for (_, layer) in model.layers() {
                    h = layer.forward(&h).unwrap();
                }
                h
            };
            // Nonzero upstream gradient where the ReLU clamped: (y·u).sum() for fixed random u.
            let u = Tensor::from_vec(uniform(&mut rng(61), y.numel(), -1.0, 1.0), y.dims().to_vec(), dev).unwrap();
            y.mul(&u).unwrap().sum_all().unwrap().backward().unwrap();
            let mut out = vec![y.to_vec().unwrap()];
            out.extend(model.parameters().iter().map(|(_, p)| p.grad().expect("grad").to_vec().unwrap()));
            out
        };
        let (fused, separate) = (run(true), run(false));
        for (i, (a, b)) in fused.iter().zip(&separate).enumerate() {
            tandem::tolerance::assert_close(&format!("{dev} fused conv+relu, tensor {i}"), a, b, 1e-5, 1e-5);
        }
        assert!(fused[0].contains(&0.0), "{dev}: the ReLU clamped nothing; the test needs negative pre-activations");
        Ok(())
    });
}
