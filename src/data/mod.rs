//! Host-side datasets: samples as plain `Vec<f32>`, targets, batching and built-in data sources.
//!
//! Everything here lives in host memory; turning a [`Batch`] into device tensors is the
//! caller's job. Sources: [`synthetic`] (random data), [`digits`] (rendered digit glyphs, no
//! download), [`mnist`] (IDX files), [`tensor_file`] (safetensors) and [`text`] (characters,
//! GPT-2's BPE ([`Tokenizer`]) and token ids for language models).
#![doc = include_str!("data.md")]
use crate::{Error, Result};
use std::ops::Range;

pub mod digits;
mod epochs;
mod loader;
pub mod mnist;
mod random_windows;
mod source;
mod split;
mod standardize;
pub mod synthetic;
pub mod tensor_file;
pub mod text;
mod tokenizer;
mod windows;

pub use epochs::Epoch;
pub use loader::{DataLoader, LoaderState};
pub use random_windows::{window_rng, RandomWindows, StartStep, WindowPool};
pub use source::BatchSource;
pub use split::TestSize;
pub use standardize::Standardizer;
pub use tokenizer::{Gpt2Tokenizer, Tokenizer};
pub use windows::WindowLoader;

/// MNIST's pixel mean and standard deviation, used to normalize [`digits`] and [`mnist`] alike.
pub const MNIST_MEAN: f32 = 0.1307;
pub const MNIST_STD: f32 = 0.3081;

/// What a model should predict for each sample.
#[derive(Clone, Debug, PartialEq)]
pub enum Targets {
    /// One class index per sample, each in `0..classes`.
    Classes { labels: Vec<i32>, classes: usize },
    /// A real-valued target of shape `shape_per_sample` per sample, samples concatenated.
    Values { data: Vec<f32>, shape_per_sample: Vec<usize> },
    /// Class indices in `0..classes` with a shape per sample, samples concatenated: per-token
    /// targets (`shape_per_sample = [T]` gives a `[B, T]` I32 tensor per batch, a language
    /// model's next tokens) or per-pixel classes.
    Tokens { ids: Vec<i32>, shape_per_sample: Vec<usize>, classes: usize },
}

impl Targets {
    /// Number of samples these targets describe.
    pub fn len(&self) -> usize {
        match self {
            Targets::Classes { labels, .. } => labels.len(),
            Targets::Values { data, shape_per_sample } => whole(data.len(), shape_per_sample),
            Targets::Tokens { ids, shape_per_sample, .. } => whole(ids.len(), shape_per_sample),
        }
    }

    /// Values per sample: 1 for `Classes`, the product of the per-sample shape otherwise.
    pub fn per_sample(&self) -> usize {
        match self {
            Targets::Classes { .. } => 1,
            Targets::Values { shape_per_sample, .. } | Targets::Tokens { shape_per_sample, .. } => shape_per_sample.iter().product(),
        }
    }

    /// The targets of samples `r` (a data-parallel shard or a pipeline micro-batch). `r` must
    /// lie within `0..len()`.
    pub fn slice(&self, r: Range<usize>) -> Targets {
        let per = self.per_sample();
        let (a, b) = (r.start * per, r.end * per);
        match self {
            Targets::Classes { labels, classes } => Targets::Classes { labels: labels[a..b].to_vec(), classes: *classes },
            Targets::Values { data, shape_per_sample } => Targets::Values { data: data[a..b].to_vec(), shape_per_sample: shape_per_sample.clone() },
            Targets::Tokens { ids, shape_per_sample, classes } => {
                Targets::Tokens { ids: ids[a..b].to_vec(), shape_per_sample: shape_per_sample.clone(), classes: *classes }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The targets of the samples at `indices`, in that order. Indices must be in range.
    fn gather(&self, indices: &[usize]) -> Targets {
        match self {
            Targets::Classes { labels, classes } => Targets::Classes { labels: indices.iter().map(|&i| labels[i]).collect(), classes: *classes },
            Targets::Values { data, shape_per_sample } => {
                Targets::Values { data: rows(data, indices, self.per_sample()), shape_per_sample: shape_per_sample.clone() }
            }
            Targets::Tokens { ids, shape_per_sample, classes } => {
                Targets::Tokens { ids: rows(ids, indices, self.per_sample()), shape_per_sample: shape_per_sample.clone(), classes: *classes }
            }
        }
    }
}

/// Whole samples of `per_sample` values in `n` values (0 for an empty sample shape).
fn whole(n: usize, shape_per_sample: &[usize]) -> usize {
    match shape_per_sample.iter().product::<usize>() {
        0 => 0,
        per => n / per,
    }
}

/// Samples `indices` (each `per` consecutive values of `data`), concatenated.
fn rows<T: Copy>(data: &[T], indices: &[usize], per: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(indices.len() * per);
    for &i in indices {
        out.extend_from_slice(&data[i * per..(i + 1) * per]);
    }
    out
}

/// A whole dataset in host memory: `x` holds `len()` samples of `sample_shape`, concatenated.
///
/// ```
/// use tandem::data::{Dataset, Targets};
/// let ds = Dataset {
///     x: vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
///     sample_shape: vec![2],
///     y: Targets::Classes { labels: vec![0, 1, 1], classes: 2 },
/// };
/// ds.validate()?;
/// assert_eq!(ds.len(), 3);
/// assert_eq!(ds.subset(1..3)?.x, [2.0, 3.0, 4.0, 5.0]);
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub x: Vec<f32>,
    pub sample_shape: Vec<usize>,
    pub y: Targets,
}

impl Dataset {
    /// Number of samples (counted from the targets; [`Dataset::validate`] checks `x` agrees).
    pub fn len(&self) -> usize {
        self.y.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements in one input sample.
    pub fn sample_numel(&self) -> usize {
        self.sample_shape.iter().product()
    }

    /// Checks that `x` and `y` describe the same number of samples and that every label lies in
    /// `0..classes`; the error names the first bad label and its index.
    pub fn validate(&self) -> Result<()> {
        let per = self.sample_numel();
        if per == 0 {
            return Err(Error::shape("Dataset", format!("sample shape {:?} has no elements", self.sample_shape)));
        }
        if !self.x.len().is_multiple_of(per) {
            return Err(Error::shape("Dataset", format!("x has {} elements, not a multiple of sample shape {:?}", self.x.len(), self.sample_shape)));
        }
        let n_x = self.x.len() / per;
        match &self.y {
            Targets::Classes { labels: ids, classes } | Targets::Tokens { ids, classes, .. } => {
                if let Some((i, &l)) = ids.iter().enumerate().find(|&(_, &l)| l < 0 || l as usize >= *classes) {
                    return Err(Error::invalid("Dataset", format!("label {l} at index {i} is outside 0..{classes}")));
                }
            }
            Targets::Values { .. } => {}
        }
        let whole_targets = |n: usize, shape: &[usize]| {
            let per_y = shape.iter().product::<usize>();
            if per_y == 0 || !n.is_multiple_of(per_y) {
                return Err(Error::shape("Dataset", format!("y has {n} elements, not a whole number of {shape:?} targets")));
            }
            Ok(())
        };
        match &self.y {
            Targets::Values { data, shape_per_sample } => whole_targets(data.len(), shape_per_sample)?,
            Targets::Tokens { ids, shape_per_sample, .. } => whole_targets(ids.len(), shape_per_sample)?,
            Targets::Classes { .. } => {}
        }
        if n_x != self.y.len() {
            return Err(Error::shape("Dataset", format!("x holds {n_x} samples of {:?} but y holds {} targets", self.sample_shape, self.y.len())));
        }
        Ok(())
    }

    /// A copy of the samples in `range`.
    pub fn subset(&self, range: Range<usize>) -> Result<Dataset> {
        self.validate()?;
        if range.start > range.end || range.end > self.len() {
            return Err(Error::invalid("Dataset::subset", format!("range {range:?} is outside the {} samples", self.len())));
        }
        let indices: Vec<usize> = range.collect();
        Ok(self.gather(&indices))
    }

    /// Removes the last `fraction` of the samples (rounded to whole samples) and returns them as
    /// a test set. The split is by position, so shuffle first if the order is meaningful.
    pub fn split_off_test(&mut self, fraction: f32) -> Result<Dataset> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::invalid("Dataset::split_off_test", format!("fraction {fraction} is outside [0, 1]")));
        }
        let n = self.len();
        let n_test = ((n as f64) * fraction as f64).round() as usize;
        let test = self.subset(n - n_test..n)?;
        *self = self.subset(0..n - n_test)?;
        Ok(test)
    }

    /// The samples at `indices` as a batch; errors on an index out of range.
    pub fn batch(&self, indices: &[usize]) -> Result<Batch> {
        self.validate()?;
        self.batch_of_valid(indices)
    }

    /// [`Dataset::batch`] for a dataset already validated (the loader validates once).
    fn batch_of_valid(&self, indices: &[usize]) -> Result<Batch> {
        let n = self.len();
        if let Some((pos, &i)) = indices.iter().enumerate().find(|&(_, &i)| i >= n) {
            return Err(Error::invalid("Dataset::batch", format!("index {i} at position {pos} is outside the {n} samples")));
        }
        let ds = self.gather(indices);
        let mut x_shape = vec![indices.len()];
        x_shape.extend_from_slice(&self.sample_shape);
        Ok(Batch { x: Inputs::F32(ds.x), x_shape, y: ds.y })
    }

    /// The samples at in-range `indices`.
    fn gather(&self, indices: &[usize]) -> Dataset {
        let per = self.sample_numel();
        let mut x = Vec::with_capacity(indices.len() * per);
        for &i in indices {
            x.extend_from_slice(&self.x[i * per..(i + 1) * per]);
        }
        Dataset { x, sample_shape: self.sample_shape.clone(), y: self.y.gather(indices) }
    }
}

/// A batch's input values: real-valued features, or integer token ids (a language model's
/// `[B, T]` input, uploaded as I32).
#[derive(Clone, Debug, PartialEq)]
pub enum Inputs {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

impl Inputs {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Inputs::F32(v) => v.len(),
            Inputs::I32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Values `r` (in range).
    fn slice(&self, r: Range<usize>) -> Inputs {
        match self {
            Inputs::F32(v) => Inputs::F32(v[r].to_vec()),
            Inputs::I32(v) => Inputs::I32(v[r].to_vec()),
        }
    }
    /// The values when they are real-valued features.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Inputs::F32(v) => Some(v),
            Inputs::I32(_) => None,
        }
    }
}

/// A batch of samples ready to upload: `x` has shape `x_shape` = `[b, ...sample_shape]`.
///
/// ```
/// use tandem::data::{Batch, Inputs};
/// // Two windows of three tokens and their next tokens, over a vocabulary of 5.
/// let b = Batch::tokens(vec![0, 1, 2, 3, 4, 0], vec![1, 2, 3, 4, 0, 1], 3, 5)?;
/// assert_eq!((b.len(), b.x_shape.clone()), (2, vec![2, 3]));
/// assert_eq!(b.slice(1..2)?.x, Inputs::I32(vec![3, 4, 0]));
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub x: Inputs,
    pub x_shape: Vec<usize>,
    pub y: Targets,
}

impl Batch {
    /// A language model's batch: windows of `block` token ids `x` and their next tokens `y`
    /// (row-major `[B, block]` each), every id in `0..vocab`.
    pub fn tokens(x: Vec<i32>, y: Vec<i32>, block: usize, vocab: usize) -> Result<Batch> {
        if block == 0 || x.len() != y.len() || !x.len().is_multiple_of(block) {
            return Err(Error::shape("Batch::tokens", format!("{} input and {} target ids in windows of {block}", x.len(), y.len())));
        }
        if let Some((i, &id)) = x.iter().chain(&y).enumerate().find(|&(_, &id)| id < 0 || id as usize >= vocab) {
            return Err(Error::invalid("Batch::tokens", format!("token id {id} at flat index {i} (x, then y) is outside 0..{vocab}")));
        }
        let x_shape = vec![x.len() / block, block];
        Ok(Batch { x: Inputs::I32(x), x_shape, y: Targets::Tokens { ids: y, shape_per_sample: vec![block], classes: vocab } })
    }

    /// Number of samples in the batch.
    pub fn len(&self) -> usize {
        self.x_shape.first().copied().unwrap_or(0)
    }

    /// Samples `r` of the batch; errors when `r` is outside it or `x` and `y` disagree on the
    /// sample count.
    pub fn slice(&self, r: Range<usize>) -> Result<Batch> {
        let n = self.len();
        if r.start > r.end || r.end > n || self.y.len() != n || self.x.len() != self.x_shape.iter().product::<usize>() {
            let what = format!("samples {r:?} of a batch of x {:?} ({} values) and {} targets", self.x_shape, self.x.len(), self.y.len());
            return Err(Error::shape("Batch::slice", what));
        }
        let per = self.x.len().checked_div(n).unwrap_or(0);
        let mut x_shape = self.x_shape.clone();
        x_shape[0] = r.len();
        Ok(Batch { x: self.x.slice(r.start * per..r.end * per), x_shape, y: self.y.slice(r) })
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// MNIST-style normalization of a pixel in [0, 1].
fn normalize(p: f32) -> f32 {
    (p - MNIST_MEAN) / MNIST_STD
}
