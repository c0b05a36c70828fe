//! The tiled causal attention (`attention_tiled`, the kernel hardware GPUs get) on every wgpu
//! adapter opened with the hardware profile, against the CPU reference's composition: odd T
//! across and around the tile sizes, odd D up to the tiled maximum and past it (the fallback),
//! several matrices, and NaN and ±inf rows.
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use tandem::backend::wgpu::{open_with, Options};
use tandem::tensor::composed;
use tandem::{Device, Result, Tensor};

/// Every wgpu adapter with the hardware kernels (so lavapipe and llvmpipe run them here).
fn hardware_devices() -> Vec<Device> {
    let n = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
    let options = Options { hardware_profile: true, ..Default::default() };
    (0..n).map(|i| Device::from_backend(open_with(i, options.clone()).expect("open_with"))).collect()
}

/// The fused attention's output and gradients on `dev` against the composition on the CPU.
fn check(dev: &Device, n: usize, t: usize, d: usize, q: &[f32], kv: &[f32], seed: u64) -> Result<()> {
    let scale = 1.0 / (d as f32).sqrt();
    let up = uniform(&mut rng(seed), n * t * d, -1.0, 1.0);
    let run = |on: &Device| -> Result<Vec<Vec<f32>>> {
        let q = Tensor::from_vec(q.to_vec(), [n, t, d], on)?.requires_grad();
        let k = Tensor::from_vec(kv.to_vec(), [n, t, d], on)?.requires_grad();
        let v = Tensor::from_vec(kv.iter().map(|x| x * 0.5 - 0.1).collect(), [n, t, d], on)?.requires_grad();
        let y = Tensor::causal_attention(&q, &k, &v, scale)?;
        y.mul(&Tensor::from_vec(up.clone(), [n, t, d], on)?)?.sum_all()?.backward()?;
        let mut out = vec![y.to_vec()?];
        for x in [&q, &k, &v] {
            out.push(x.grad().map(|g| g.to_vec()).transpose()?.unwrap_or_default());
        }
        Ok(out)
    };
    let want = composed(|| run(&Device::cpu()))?;
    for (k, (g, w)) in run(dev)?.iter().zip(&want).enumerate() {
        assert_close(&format!("tiled attention N={n} T={t} D={d} on {dev} output {k}"), g, w, 1e-4, 1e-4);
    }
    Ok(())
}

#[test]
fn tiled_attention_matches_reference_at_odd_sizes() {
    let _guard = shared();
    for dev in hardware_devices() {
        for (i, (t, d)) in [(1, 5), (7, 1), (63, 16), (65, 33), (130, 64), (33, 5), (17, 65)].into_iter().enumerate() {
            let n = 3;
            let mut r = rng(100 + i as u64);
            let (q, kv) = (uniform(&mut r, n * t * d, -2.0, 2.0), uniform(&mut r, n * t * d, -2.0, 2.0));
            check(&dev, n, t, d, &q, &kv, 200 + i as u64).unwrap_or_else(|e| panic!("T={t} D={d} on {dev}: {e}"));
        }
    }
}

/// A NaN or ±inf in one query row poisons that row only, as the composition gives.
#[test]
fn tiled_attention_nan_and_inf_rows() {
    let _guard = shared();
    for dev in hardware_devices() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (n, t, d) = (2, 40, 8);
            let mut q = uniform(&mut rng(9), n * t * d, -1.0, 1.0);
            q[t * d + 35 * d + 1] = bad;
            let kv = uniform(&mut rng(10), n * t * d, -1.0, 1.0);
            let out = |on: &Device| -> Result<Vec<f32>> {
                let (q, k) = (Tensor::from_vec(q.clone(), [n, t, d], on)?, Tensor::from_vec(kv.clone(), [n, t, d], on)?);
                Tensor::causal_attention(&q, &k, &k, 0.5)?.to_vec()
            };
            let want = composed(|| out(&Device::cpu())).expect("cpu");
            assert_close(&format!("{bad} in a query row on {dev}"), &out(&dev).expect("device"), &want, 1e-5, 1e-5);
        }
    }
}
