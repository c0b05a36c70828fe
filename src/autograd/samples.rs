//! The sample context of the forward running on this thread: which samples of the global batch
//! it computes, so that Dropout keys its masks by sample and a recomputed forward replays them.
//! It lives beside the tape because gradient checkpointing reruns a forward under it.
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which samples the forward running on this thread computes: set by the strategies' step loop
/// (see [`with_samples`]) so that Dropout draws each sample's mask from (seed, step, global
/// sample index), the same whether the batch runs whole, in data-parallel shards or in
/// pipeline micro-batches, and again when a pipeline recomputes a forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleContext {
    /// The optimizer step (0 for the first).
    pub step: u64,
    /// Index within the global batch of the first sample of this forward's input.
    pub first_sample: u64,
    /// Samples in this forward's input.
    pub samples: usize,
}

thread_local! {
    /// The context of the forward in progress and its generation (unique per `with_samples`).
    static CONTEXT: Cell<Option<(SampleContext, u64)>> = const { Cell::new(None) };
}
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Runs `f` (a forward) with `ctx` as this thread's sample context, then restores the previous
/// one. Every Dropout reached in `f` keys its masks by `ctx`, counting its own calls from 0, so
/// running the same forward again under the same context replays the same masks.
pub fn with_samples<T>(ctx: SampleContext, f: impl FnOnce() -> T) -> T {
    /// Puts the previous context back even when `f` panics.
    struct Restore(Option<(SampleContext, u64)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CONTEXT.with(|c| c.set(self.0));
        }
    }
    let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
    let _restore = Restore(CONTEXT.with(|c| c.replace(Some((ctx, generation)))));
    f()
}

/// Sets this thread's sample context and generation as they are, returning the previous ones
/// (for [`on_cpu_pool`](crate::on_cpu_pool)).
pub(crate) fn replace_samples(samples: Option<(SampleContext, u64)>) -> Option<(SampleContext, u64)> {
    CONTEXT.with(|c| c.replace(samples))
}

/// This thread's sample context, if a forward under [`with_samples`] is running: what a
/// recomputed forward ([`checkpoint`](super::checkpoint)) runs under again to replay its Dropout masks.
pub fn current_samples() -> Option<SampleContext> {
    CONTEXT.with(Cell::get).map(|(ctx, _)| ctx)
}

/// The context of the forward in progress and its generation (one per [`with_samples`] call):
/// what Dropout keys its masks by.
pub(crate) fn samples_in_progress() -> Option<(SampleContext, u64)> {
    CONTEXT.with(Cell::get)
}
