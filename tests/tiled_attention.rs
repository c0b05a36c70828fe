//! The tiled causal attention (`tiled_attention`, the kernel hardware GPUs get) on every wgpu
//! adapter opened with the hardware profile, forward and backward against the CPU reference:
//! odd T across and around the tile sizes, odd D up to the tiled maximum and past it (the
//! fallback), several matrices, and NaN and ±inf rows.
#![cfg(feature = "wgpu")]
mod common;

use common::*;
use tandem::backend::wgpu::{open_with, Options};
use tandem::backend::FusedOp;
use tandem::{DType, Device, Result};

/// Every wgpu adapter with the hardware kernels (so lavapipe and llvmpipe run them here).
fn hardware_devices() -> Vec<Device> {
    let n = Device::list().iter().filter(|i| i.backend == tandem::BackendKind::Wgpu).count();
    let options = Options { hardware_profile: true, ..Default::default() };
    let out: Vec<Device> = (0..n).map(|i| Device::from_backend(open_with(i, options.clone()).expect("open_with"))).collect();
    for d in &out {
        eprintln!("running the hardware kernels on {d} ({})", d.info().name);
    }
    out
}

/// `Attention` then `AttentionBackward` straight on the backend of `dev` (so that only the
/// attention kernels are compiled: whole shader sets take minutes with Mesa's cache off): o,
/// lse, dq, dk, dv, delta, against the CPU reference's fused kernels, themselves checked
/// against the composition in tests/transformer_kernels.rs.
fn check(dev: &Device, n: usize, t: usize, d: usize, q: &[f32], kv: &[f32], seed: u64) -> Result<()> {
    let scale = 1.0 / (d as f32).sqrt();
    let g = uniform(&mut rng(seed), n * t * d, -1.0, 1.0);
    let v: Vec<f32> = kv.iter().map(|x| x * 0.5 - 0.1).collect();
    let run = |on: &Device| -> Result<Vec<Vec<f32>>> {
        let b = on.backend();
        let (ntd, nt) = (n * t * d, n * t);
        let ins = [q, kv, &v[..]].map(|x| up(on, x));
        let (o, lse) = (b.alloc(ntd, DType::F32)?, b.alloc(nt, DType::F32)?);
        assert!(b.fused(FusedOp::Attention { n, t, d, scale }, &[&ins[0], &ins[1], &ins[2], &o, &lse])?, "fused on {on}");
        let gb = up(on, &g);
        let outs = [ntd, ntd, ntd, nt].map(|len| b.alloc(len, DType::F32));
        let [dq, dk, dv, delta] = outs.map(|x| x.expect("alloc"));
        let bufs = [&ins[0], &ins[1], &ins[2], &o, &lse, &gb, &dq, &dk, &dv, &delta];
        assert!(b.fused(FusedOp::AttentionBackward { n, t, d, scale }, &bufs)?, "fused backward on {on}");
        Ok([&o, &lse, &dq, &dk, &dv, &delta].map(|x| down(on, x)).to_vec())
    };
    let want = run(&Device::cpu())?;
    for (k, (g, w)) in run(dev)?.iter().zip(&want).enumerate() {
        assert_close(&format!("tiled attention N={n} T={t} D={d} on {dev}: {}", ["o", "lse", "dq", "dk", "dv", "delta"][k]), g, w, 1e-4, 1e-4);
    }
    Ok(())
}

/// Odd T below, at and past the tile sizes (16 and 32 rows), odd D up to the tiled maximum
/// (64) and past it (65: the row-per-invocation fallback), several matrices; then a NaN or
/// ±inf in one query row, which poisons that row only (the CPU's kernels follow PyTorch).
#[test]
fn tiled_attention_matches_reference() {
    let _guard = shared();
    for dev in hardware_devices() {
        for (i, (t, d)) in [(1, 5), (7, 1), (63, 16), (65, 33), (130, 64), (33, 5), (17, 65)].into_iter().enumerate() {
            let n = 3;
            let mut r = rng(100 + i as u64);
            let (q, kv) = (uniform(&mut r, n * t * d, -2.0, 2.0), uniform(&mut r, n * t * d, -2.0, 2.0));
            check(&dev, n, t, d, &q, &kv, 200 + i as u64).unwrap_or_else(|e| panic!("T={t} D={d} on {dev}: {e}"));
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (n, t, d) = (2, 40, 8);
            let mut q = uniform(&mut rng(9), n * t * d, -1.0, 1.0);
            q[t * d + 35 * d + 1] = bad;
            let kv = uniform(&mut rng(10), n * t * d, -1.0, 1.0);
            check(&dev, n, t, d, &q, &kv, 11).unwrap_or_else(|e| panic!("{bad} in a query row on {dev}: {e}"));
        }
    }
}
