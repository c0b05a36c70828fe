//! Random datasets, deterministic from a seed, for smoke tests and benchmarks.
use super::{Dataset, Targets};
use crate::Result;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` inputs of shape `[1, 28, 28]` with entries ~ N(0, 1) and labels uniform in `0..10`.
/// There is nothing to learn: it exercises shapes and throughput, not accuracy.
///
/// ```
/// let ds = tandem::data::synthetic::seed_images(8, 1)?;
/// assert_eq!((ds.len(), ds.sample_shape.as_slice()), (8, &[1usize, 28, 28][..]));
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn seed_images(n: usize, seed: u64) -> Result<Dataset> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut x = vec![0.0; n * 28 * 28];
    fill_normal(&mut rng, &mut x);
    let labels = (0..n).map(|_| super::epochs::below(&mut rng, 10) as i32).collect();
    let ds = Dataset { x, sample_shape: vec![1, 28, 28], y: Targets::Classes { labels, classes: 10 } };
    ds.validate()?;
    Ok(ds)
}

/// `n` rows of `features` entries ~ N(0, 1), each with one f32 target ~ N(0, 1) (shape
/// `[n, 1]`).
///
/// ```
/// let ds = tandem::data::synthetic::regression(5, 3, 7)?;
/// assert_eq!(ds.x.len(), 15);
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn regression(n: usize, features: usize, seed: u64) -> Result<Dataset> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut x = vec![0.0; n * features];
    fill_normal(&mut rng, &mut x);
    let mut y = vec![0.0; n];
    fill_normal(&mut rng, &mut y);
    let ds = Dataset { x, sample_shape: vec![features], y: Targets::Values { data: y, shape_per_sample: vec![1] } };
    ds.validate()?;
    Ok(ds)
}

/// Fills `out` with N(0, 1) draws by Box–Muller, two per pair of uniforms (rand_distr is not a
/// dependency, and owning the transform keeps the values stable across rand releases).
pub(crate) fn fill_normal(rng: &mut impl RngCore, out: &mut [f32]) {
    for pair in out.chunks_mut(2) {
        // u1 in (0, 1] so that ln(u1) is finite.
        let u1 = 1.0 - unit(rng);
        let u2 = unit(rng);
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        pair[0] = (r * c) as f32;
        if let Some(second) = pair.get_mut(1) {
            *second = (r * s) as f32;
        }
    }
}

/// A uniform f64 in [0, 1) from the top 53 bits of one draw.
pub(crate) fn unit(rng: &mut impl RngCore) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}
