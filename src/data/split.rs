//! Seeded shuffles and random train/test splits of a [`Dataset`] (scikit-learn's
//! `shuffle` and `train_test_split`).
use super::epochs::{permutation, SHUFFLE_STREAM};
use super::Dataset;
use crate::{Error, Result};

/// How much of a dataset [`Dataset::split`] holds out for testing (scikit-learn's
/// `test_size`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TestSize {
    /// This share of the samples, in (0, 1), rounded up to whole samples.
    Fraction(f64),
    /// Exactly this many samples.
    Count(usize),
}

impl TestSize {
    /// The test samples of `n`, checked to leave at least one sample on each side.
    fn of(self, n: usize) -> Result<usize> {
        let n_test = match self {
            TestSize::Fraction(f) if f > 0.0 && f < 1.0 => (f * n as f64).ceil() as usize,
            TestSize::Fraction(f) => return Err(Error::invalid("Dataset::split", format!("test fraction {f} is outside (0, 1)"))),
            TestSize::Count(c) => c,
        };
        if n_test == 0 || n_test >= n {
            let what =
                format!("{self:?} of {n} samples gives {n_test} test and {} train samples; each side needs at least one", n.saturating_sub(n_test));
            return Err(Error::invalid("Dataset::split", what));
        }
        Ok(n_test)
    }
}

impl Dataset {
    /// The samples in an order drawn from `seed` alone, the same on every machine and every
    /// version of tandem (ChaCha8 and a hand-written Fisher–Yates, as the loader's epochs).
    ///
    /// ```
    /// use tandem::data::{Dataset, Targets};
    /// let ds = Dataset { x: vec![0.0, 1.0, 2.0, 3.0], sample_shape: vec![1], y: Targets::Classes { labels: vec![0, 1, 2, 3], classes: 4 } };
    /// let a = ds.shuffled(5)?;
    /// assert_eq!(a, ds.shuffled(5)?);
    /// let Targets::Classes { labels, .. } = &a.y else { unreachable!() };
    /// // Every sample once, its features still beside its label.
    /// assert_eq!(a.x, labels.iter().map(|&l| l as f32).collect::<Vec<_>>());
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn shuffled(&self, seed: u64) -> Result<Dataset> {
        self.validate()?;
        Ok(self.gather(&permutation(self.len(), true, seed, SHUFFLE_STREAM, 0)))
    }

    /// A random split into `(train, test)`, scikit-learn's `train_test_split(test_size=..,
    /// random_state=seed)`: the samples are shuffled as [`Dataset::shuffled`] would, the first
    /// `test` of them are the test set and the rest train, each in that shuffled order. Errors
    /// when either side would be empty.
    ///
    /// ```
    /// use tandem::data::{synthetic, TestSize};
    /// let ds = synthetic::regression(10, 3, 0)?;
    /// let (train, test) = ds.split(TestSize::Fraction(0.25), 42)?;
    /// assert_eq!((train.len(), test.len()), (7, 3)); // ceil(0.25 * 10) test samples
    /// let (train, test) = ds.split(TestSize::Count(4), 42)?;
    /// assert_eq!((train.len(), test.len()), (6, 4));
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn split(&self, test: TestSize, seed: u64) -> Result<(Dataset, Dataset)> {
        self.validate()?;
        let n_test = test.of(self.len())?;
        let order = permutation(self.len(), true, seed, SHUFFLE_STREAM, 0);
        let (test, train) = order.split_at(n_test);
        Ok((self.gather(train), self.gather(test)))
    }
}
