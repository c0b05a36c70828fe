//! Random training windows keyed by a seed and the step: a language model's [`BatchSource`]
//! that draws with replacement (nanoGPT's `get_batch`) and resumes from the trainer's step
//! alone, with no position of its own to save.
use super::text::{Split, TextCorpus, TokenBatch, TokenWindows};
use super::{Batch, BatchSource, LoaderState};
use crate::{Error, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What [`RandomWindows`] draws its windows from.
#[derive(Clone, Debug)]
pub enum WindowPool {
    /// Whole rows of these token windows, within the range (a token file's training rows,
    /// [`TokenWindows::rows_of`]), each batch's rows drawn with replacement.
    Rows(Arc<TokenWindows>, Range<usize>),
    /// Windows of this many tokens starting at any token of the corpus's training tokens
    /// ([`TextCorpus::batch`] of [`Split::Train`]).
    Text(Arc<TextCorpus>, usize),
}

/// The generator of stream `stream` of `seed`: ChaCha8 seeded with `seed`, on stream `stream`.
/// [`RandomWindows`] draws the batch of step `s` (0-based) from stream `s`, so a program's own
/// draws (its validation windows, say) can use streams no run reaches, such as `u64::MAX`.
///
/// ```
/// use rand::RngCore;
/// let (mut a, mut b) = (tandem::data::window_rng(7, 3), tandem::data::window_rng(7, 3));
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert_ne!(tandem::data::window_rng(7, 4).next_u64(), tandem::data::window_rng(7, 3).next_u64());
/// ```
pub fn window_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// `batch` training windows a step, drawn at random with replacement from a [`WindowPool`]:
/// the batch of step `s` (0-based) is a function of the seed and `s` alone
/// ([`window_rng`]`(seed, s)`), so a run resumed at step `s` draws the windows the
/// uninterrupted one would have, on any number of devices or processes.
///
/// The step is the one the [`Trainer`](crate::train::Trainer) starts after, which the
/// [`observer`](RandomWindows::observer) tells the sampler (0, or the resumed checkpoint's),
/// plus the batches drawn since. There is no position to save: [`BatchSource::state`] is always
/// epoch 0, position 0, and the stream has no epochs (`batches_per_epoch` is `usize::MAX`: train
/// for a number of steps, not epochs).
///
/// ```
/// use std::sync::Arc;
/// use tandem::data::text::TextCorpus;
/// use tandem::data::{BatchSource, RandomWindows, WindowPool};
/// use tandem::nn::models::{Gpt, GptConfig};
/// use tandem::optim::AdamConfig;
/// use tandem::parallel::{Loss, OptimConfig, Parallel};
/// use tandem::train::{Checkpoints, Trainer};
/// use tandem::Device;
/// # fn main() -> tandem::Result<()> {
/// let corpus = Arc::new(TextCorpus::from_text(&"the quick brown fox jumps over the lazy dog. ".repeat(20), "a pangram")?);
/// let cfg = GptConfig { n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, vocab_size: corpus.vocab.len(), dropout: 0.0, bias: true };
/// let (dev, opt) = (Device::cpu(), OptimConfig::adam(AdamConfig::default()));
/// let dir = std::env::temp_dir().join(format!("tandem-doc-random-windows-{}", std::process::id()));
/// # let _ = std::fs::remove_dir_all(&dir);
/// // Trains to `steps` with checkpoints in `dir` (resuming the run there when `resume`).
/// let train = |steps: u64, checkpoints: Checkpoints| -> tandem::Result<Vec<f32>> {
///     let mut windows = RandomWindows::new(WindowPool::Text(corpus.clone(), cfg.block_size), 4, 7)?;
///     let model = Parallel::single(|d| Gpt::new(cfg, 0, d), &dev, &opt, Loss::CrossEntropy).build()?;
///     let mut trainer = Trainer::new(model).steps(steps).checkpoints(checkpoints).observe(windows.observer());
///     trainer.fit(&mut windows)?;
///     trainer.state_dict()?[0].1.to_vec()
/// };
/// let whole = train(6, Checkpoints::new(dir.join("whole")))?;
/// train(3, Checkpoints::new(dir.join("halves")))?;
/// let resumed = train(6, Checkpoints::new(dir.join("halves")).resume())?;
/// assert_eq!(resumed, whole); // the resumed run drew steps 4 to 6's windows, as the whole one did
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
pub struct RandomWindows {
    pool: WindowPool,
    seed: u64,
    batch: usize,
    /// The 0-based step of the next batch, which the observer sets when a run starts.
    step: Arc<AtomicU64>,
}

impl RandomWindows {
    /// A sampler of `batch` windows a step from `pool`, keyed by `seed`, at step 0. Errors
    /// when `batch` is 0 or `pool` holds no window (an empty or out-of-range row range, a text
    /// no longer than the window).
    pub fn new(pool: WindowPool, batch: usize, seed: u64) -> Result<RandomWindows> {
        if batch == 0 {
            return Err(Error::invalid("RandomWindows::new", "a batch must hold at least 1 window"));
        }
        let windows = RandomWindows { pool, seed, batch, step: Arc::new(AtomicU64::new(0)) };
        // One window of step 0's stream: the pool holds a window, found before any step runs.
        windows.draw_from(1, &mut window_rng(seed, 0))?;
        Ok(windows)
    }

    /// The pool the windows come from.
    pub fn pool(&self) -> &WindowPool {
        &self.pool
    }

    /// Tokens per window.
    pub fn block(&self) -> usize {
        match &self.pool {
            WindowPool::Rows(w, _) => w.block,
            WindowPool::Text(_, block) => *block,
        }
    }

    /// The 0-based step whose batch [`next_batch`](BatchSource::next_batch) draws next.
    pub fn step(&self) -> u64 {
        self.step.load(Ordering::SeqCst)
    }

    /// Moves the sampler to `step` (0-based): what the [`observer`](RandomWindows::observer)
    /// does when a run starts, for a loop of one's own.
    pub fn set_step(&self, step: u64) {
        self.step.store(step, Ordering::SeqCst);
    }

    /// The batch of step `step` (0-based), whatever the sampler's own step.
    pub fn batch_at(&self, step: u64) -> Result<Batch> {
        self.draw_from(self.batch, &mut window_rng(self.seed, step))
    }

    /// The observer to give the [`Trainer`](crate::train::Trainer) that draws from this
    /// sampler: it tells the sampler the step each run starts after (0, or a resumed
    /// checkpoint's), which is all a resume must restore.
    pub fn observer(&self) -> StartStep {
        StartStep(Arc::clone(&self.step))
    }

    fn draw_from(&self, batch: usize, rng: &mut ChaCha8Rng) -> Result<Batch> {
        match &self.pool {
            WindowPool::Rows(w, rows) => {
                let TokenBatch { x, y, block, .. } = w.batch_from(rows.clone(), batch, rng)?;
                Batch::tokens(x, y, block, w.vocab_size)
            }
            WindowPool::Text(c, block) => {
                let TokenBatch { x, y, block, .. } = c.batch(Split::Train, batch, *block, rng)?;
                Batch::tokens(x, y, block, c.vocab.len())
            }
        }
    }
}

impl std::fmt::Debug for RandomWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RandomWindows")
            .field("pool", &self.pool)
            .field("seed", &self.seed)
            .field("batch", &self.batch)
            .field("step", &self.step())
            .finish()
    }
}

impl BatchSource for RandomWindows {
    fn next_batch(&mut self) -> Result<Batch> {
        let step = self.step.fetch_add(1, Ordering::SeqCst);
        self.batch_at(step)
    }
    /// Always epoch 0, position 0: the step, which a checkpoint holds anyway, is the whole state.
    fn state(&self) -> LoaderState {
        LoaderState { epoch: 0, position: 0 }
    }
    fn set_state(&mut self, _: LoaderState) -> Result<()> {
        Ok(())
    }
    fn batch_size(&self) -> usize {
        self.batch
    }
    /// Windows drawn with replacement have no epochs: the stream does not end.
    fn batches_per_epoch(&self) -> usize {
        usize::MAX
    }
}

/// Tells a [`RandomWindows`] the step a run starts after (see [`RandomWindows::observer`]).
#[derive(Clone, Debug)]
pub struct StartStep(Arc<AtomicU64>);

impl StartStep {
    /// Sets the step the next run starts after; the `Trainer` calls it through this type's
    /// `Observer` implementation (in `train`, which `data` does not import).
    pub(crate) fn start_after(&self, step: u64) {
        self.0.store(step, Ordering::SeqCst);
    }
}
