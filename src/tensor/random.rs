//! Counter-based random numbers (Philox-4x32-10): value `i` of a stream depends only on
//! (seed, i), so masks are reproducible whatever the device, split or order of calls.
//!
//! The numbers are made on the host and uploaded (4 bytes per value, the same cost as a mask
//! made on the device and kept for backward); the same function therefore serves every backend
//! and gives bit-identical masks on all of them.
use super::Tensor;
use crate::{Device, Result, Shape};

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox-4x32 with 10 rounds (Salmon et al., SC'11), as Random123's `philox4x32_10`.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        let (hi0, lo0, hi1, lo1) = ((p0 >> 32) as u32, p0 as u32, (p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// `n` uniform values in [0, 1), values `offset .. offset + n` of the stream keyed by `seed`:
/// value `i` is word `i % 4` of Philox at counter `i / 4`, its top 24 bits scaled by 2⁻²⁴.
/// `OutOfMemory` when the host cannot hold them.
pub fn uniform(seed: u64, offset: u64, n: usize) -> Result<Vec<f32>> {
    let key = [seed as u32, (seed >> 32) as u32];
    let mut out = crate::backend::host::try_vec(n, "host", "Philox uniform values")?;
    let mut i = offset;
    while out.len() < n {
        let block = i / 4;
        let words = philox4x32([block as u32, (block >> 32) as u32, 0, 0], key);
        for &w in &words[(i % 4) as usize..] {
            if out.len() == n {
                break;
            }
            out.push((w >> 8) as f32 * (1.0 / 16_777_216.0));
            i += 1;
        }
    }
    Ok(out)
}

impl Tensor {
    /// Uniform [0, 1) values `offset ..` of the Philox stream keyed by `seed`, on `device`.
    pub fn rand_philox(seed: u64, offset: u64, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        Tensor::from_vec(uniform(seed, offset, shape.numel())?, shape, device)
    }
    /// Dropout's mask: `1/(1-p)` where the stream's value is at least `p`, else 0.
    pub fn dropout_mask(p: f32, seed: u64, offset: u64, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let keep = if p < 1.0 { 1.0 / (1.0 - p) } else { 0.0 };
        let mut mask = uniform(seed, offset, shape.numel())?;
        mask.iter_mut().for_each(|u| *u = if *u >= p { keep } else { 0.0 });
        Tensor::from_vec(mask, shape, device)
    }
}
