//! A built-in digits dataset: glyphs 0-9 drawn as strokes and rasterized into 28x28 images with
//! random shift, scale, thickness, rotation, shear, per-vertex wobble and noise. A stand-in for
//! MNIST that needs no download: a small CNN learns it well, a linear model clearly less so.
use super::synthetic::unit;
use super::{normalize, Dataset, Targets};
use crate::Result;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SIDE: usize = 28;
/// Glyph box in pixels at scale 1 (MNIST digits sit in a 20x20 box; ours are a bit narrower).
const GLYPH_W: f32 = 12.0;
const GLYPH_H: f32 = 18.0;
/// Keeps the train and test streams apart, so the test set is a genuinely different draw.
const TRAIN_STREAM: u64 = 0;
const TEST_STREAM: u64 = 1;

/// Generates `n_train` training and `n_test` test images, shape `[1, 28, 28]`, labels `0..10`
/// (balanced: sample `i` shows digit `i % 10`), normalized like MNIST with
/// `(x - 0.1307) / 0.3081`. The same `seed` always gives the same data.
///
/// ```
/// let (train, test) = tandem::data::digits::load(100, 20, 0)?;
/// assert_eq!((train.len(), test.len()), (100, 20));
/// assert_eq!(train.sample_shape, [1, 28, 28]);
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn load(n_train: usize, n_test: usize, seed: u64) -> Result<(Dataset, Dataset)> {
    let train = generate(n_train, seed, TRAIN_STREAM)?;
    let test = generate(n_test, seed, TEST_STREAM)?;
    Ok((train, test))
}

fn generate(n: usize, seed: u64, stream: u64) -> Result<Dataset> {
    let glyphs: Vec<Vec<Vec<(f32, f32)>>> = (0..10).map(glyph).collect();
    let mut x = vec![0.0f32; n * SIDE * SIDE];
    // Each sample has its own RNG keyed by (seed, stream, index), so the images do not depend
    // on how the work is split across threads.
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(16);
    let per_thread = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (chunk_idx, chunk) in x.chunks_mut(per_thread * SIDE * SIDE).enumerate() {
            let glyphs = &glyphs;
            s.spawn(move || {
                for (k, img) in chunk.chunks_mut(SIDE * SIDE).enumerate() {
                    let i = chunk_idx * per_thread + k;
                    let mut key = [0u8; 32];
                    key[..8].copy_from_slice(&seed.to_le_bytes());
                    key[8..16].copy_from_slice(&stream.to_le_bytes());
                    key[16..24].copy_from_slice(&(i as u64).to_le_bytes());
                    let mut rng = ChaCha8Rng::from_seed(key);
                    render(&glyphs[i % 10], &mut rng, img);
                }
            });
        }
    });
    let labels = (0..n).map(|i| (i % 10) as i32).collect();
    let ds = Dataset { x, sample_shape: vec![1, SIDE, SIDE], y: Targets::Classes { labels, classes: 10 } };
    ds.validate()?;
    Ok(ds)
}

/// Draws one glyph into `img` (28*28, row-major) and normalizes it.
fn render(strokes: &[Vec<(f32, f32)>], rng: &mut impl RngCore, img: &mut [f32]) {
    let mut uni = |lo: f32, hi: f32| lo + (hi - lo) * unit(rng) as f32;
    let scale = uni(0.8, 1.2);
    let angle = uni(-0.2, 0.2); // radians, about +-11 degrees
    let shear = uni(-0.25, 0.25);
    let cx = SIDE as f32 / 2.0 + uni(-3.0, 3.0);
    let cy = SIDE as f32 / 2.0 + uni(-3.0, 3.0);
    let radius = uni(1.5, 3.0) / 2.0;
    let wobble = 0.05;
    let (sin, cos) = angle.sin_cos();
    let mut segments: Vec<((f32, f32), (f32, f32))> = Vec::with_capacity(64);
    for stroke in strokes {
        let mut prev: Option<(f32, f32)> = None;
        for &(gx, gy) in stroke {
            // Glyph units -> centered pixels, with a little hand-drawn wobble per vertex.
            let u = (gx - 0.5 + uni(-wobble, wobble)) * GLYPH_W * scale;
            let v = (gy - 0.5 + uni(-wobble, wobble)) * GLYPH_H * scale;
            let u = u + shear * v;
            let p = (cx + cos * u - sin * v, cy + sin * u + cos * v);
            if let Some(q) = prev {
                segments.push((q, p));
            }
            prev = Some(p);
        }
    }
    img.fill(0.0);
    for &(a, b) in &segments {
        let reach = radius + 1.0;
        let x0 = (a.0.min(b.0) - reach).floor().max(0.0) as usize;
        let x1 = ((a.0.max(b.0) + reach).ceil().max(0.0) as usize).min(SIDE);
        let y0 = (a.1.min(b.1) - reach).floor().max(0.0) as usize;
        let y1 = ((a.1.max(b.1) + reach).ceil().max(0.0) as usize).min(SIDE);
        for py in y0..y1 {
            for px in x0..x1 {
                let d = dist_to_segment((px as f32 + 0.5, py as f32 + 0.5), a, b);
                // Anti-aliased pen: full ink inside the radius, a one-pixel linear falloff.
                let ink = (radius + 0.5 - d).clamp(0.0, 1.0);
                let cell = &mut img[py * SIDE + px];
                *cell = cell.max(ink);
            }
        }
    }
    // Uniform noise with std 0.1, two 16-bit draws per u32: Gaussian noise looks no different
    // to a classifier and costs several times more, and generation must stay fast.
    const HALF_WIDTH: f32 = 0.1 * 1.732_050_8; // sqrt(3) * std
    for pair in img.chunks_mut(2) {
        let r = rng.next_u32();
        for (p, bits) in pair.iter_mut().zip([r & 0xffff, r >> 16]) {
            let n = (bits as f32 / 65535.0 * 2.0 - 1.0) * HALF_WIDTH;
            *p = normalize((*p + n).clamp(0.0, 1.0));
        }
    }
}

fn dist_to_segment(p: (f32, f32), a: (f32, f32), b: (f32, f32)) -> f32 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    let t = if len2 > 0.0 { (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0) } else { 0.0 };
    let (ex, ey) = (a.0 + t * dx - p.0, a.1 + t * dy - p.1);
    (ex * ex + ey * ey).sqrt()
}

/// An elliptical arc as a polyline, in glyph units (x right, y down, so 270 degrees is the
/// top), from `from` to `to` degrees in steps of at most 20 degrees.
fn arc(cx: f32, cy: f32, rx: f32, ry: f32, from: f32, to: f32) -> Vec<(f32, f32)> {
    let steps = ((to - from).abs() / 20.0).ceil().max(1.0) as usize;
    (0..=steps)
        .map(|k| {
            let t = (from + (to - from) * k as f32 / steps as f32).to_radians();
            (cx + rx * t.cos(), cy + ry * t.sin())
        })
        .collect()
}

/// The strokes of digit `d` in a unit box (x in [0, 1] left to right, y in [0, 1] top down).
fn glyph(d: usize) -> Vec<Vec<(f32, f32)>> {
    match d {
        0 => vec![arc(0.5, 0.5, 0.5, 0.5, 0.0, 360.0)],
        1 => vec![vec![(0.25, 0.2), (0.55, 0.0), (0.55, 1.0)]],
        2 => {
            let mut s = arc(0.5, 0.3, 0.45, 0.3, 200.0, 380.0);
            s.extend([(0.0, 1.0), (1.0, 1.0)]);
            vec![s]
        }
        3 => vec![arc(0.5, 0.27, 0.42, 0.27, 200.0, 450.0), arc(0.5, 0.75, 0.5, 0.25, 270.0, 520.0)],
        4 => vec![vec![(0.7, 1.0), (0.7, 0.0), (0.0, 0.7), (1.0, 0.7)]],
        5 => {
            let mut s = vec![(0.9, 0.0), (0.15, 0.0), (0.12, 0.45)];
            s.extend(arc(0.5, 0.68, 0.45, 0.32, 220.0, 500.0));
            vec![s]
        }
        6 => vec![arc(0.5, 0.7, 0.45, 0.3, 0.0, 360.0), arc(0.75, 0.7, 0.7, 0.67, 265.0, 180.0)],
        7 => vec![vec![(0.0, 0.0), (1.0, 0.0), (0.35, 1.0)]],
        8 => vec![arc(0.5, 0.25, 0.38, 0.25, 0.0, 360.0), arc(0.5, 0.72, 0.48, 0.28, 0.0, 360.0)],
        _ => vec![arc(0.5, 0.32, 0.45, 0.32, 0.0, 360.0), arc(0.25, 0.32, 0.7, 0.68, 0.0, 95.0)],
    }
}
