//! The thread-local settings that decide what ops do (history, fused kernels, autocast, the
//! sample context, deferred building), and [`on_cpu_pool`], which carries them to the CPU pool.
use crate::autograd::{self, SampleContext};
use crate::{DType, Device};

/// Every setting an op reads from its thread, as it stood on one thread, to be set on another.
struct ThreadSettings {
    grad: bool,
    fused: bool,
    autocast: Option<DType>,
    samples: Option<(SampleContext, u64)>,
    deferred: Option<Device>,
}

impl ThreadSettings {
    /// This thread's settings; `None` while it runs work between ops (ZeRO-3's releases),
    /// which holds thread-bound state and so cannot move.
    fn here() -> Option<ThreadSettings> {
        if super::runs_between_ops() {
            return None;
        }
        Some(ThreadSettings {
            grad: autograd::is_enabled(),
            fused: super::fused::fused_on(),
            autocast: super::halves::autocast_dtype(),
            samples: autograd::samples_in_progress(),
            deferred: super::deferred::deferring(),
        })
    }

    /// Sets these settings on this thread until the returned guard drops, which puts back the
    /// ones it found (also when the work in between panics).
    fn install(self) -> Installed {
        Installed(ThreadSettings {
            grad: autograd::replace_enabled(self.grad),
            fused: super::fused::replace_fused(self.fused),
            autocast: super::halves::replace_autocast(self.autocast),
            samples: autograd::replace_samples(self.samples),
            deferred: super::deferred::replace_deferred(self.deferred),
        })
    }
}

/// The settings a thread had before [`ThreadSettings::install`].
struct Installed(ThreadSettings);

impl Drop for Installed {
    fn drop(&mut self) {
        autograd::replace_enabled(self.0.grad);
        super::fused::replace_fused(self.0.fused);
        super::halves::replace_autocast(self.0.autocast);
        autograd::replace_samples(self.0.samples);
        super::deferred::replace_deferred(self.0.deferred.take());
    }
}

/// Runs `f` on a thread of the CPU backend's pool, under this thread's settings, and returns
/// what it returns: the way to run CPU training code of your own fast.
///
/// Every large CPU op splits its work over rayon's threads. Called from a thread outside the
/// pool, each op hands its work to the pool and sleeps until it is done: a wake-up and a
/// hand-off for every one of the hundreds of ops in a step. Called from one of the pool's own
/// threads, the caller works on its share and the others steal theirs. On a 2-core host that
/// took a 4-layer, 128-wide GPT's CPU step from a median of 67 ms to 58 (benches/README.md).
/// [`Trainer`](crate::train::Trainer) runs the steps and predictions of a strategy with a CPU
/// device this way, and the `tandem` command runs every command this way.
///
/// What `f` computes does not change: the settings ops read from their thread (`no_grad`,
/// [`composed`](super::composed), [`autocast`](super::autocast), the sample context that keys
/// Dropout, [`build_deferred`](super::build_deferred)) are set on the pool's thread as they
/// stand here while `f` runs, and put back after. `f` runs right here when this thread already
/// belongs to a rayon pool, when no pool can be built, and inside ZeRO-3's step (whose
/// between-ops work is bound to its thread). The pool has rayon's default number of threads
/// (`RAYON_NUM_THREADS`, or one per CPU), built at the first call.
///
/// ```
/// let sum = tandem::on_cpu_pool(|| {
///     let x = tandem::Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &tandem::Device::cpu())?;
///     x.sum_all()?.to_scalar()
/// })?;
/// assert_eq!(sum, 6.0);
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn on_cpu_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match ThreadSettings::here() {
        Some(settings) => crate::backend::cpu::on_pool(move || {
            let _back = settings.install();
            f()
        }),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autograd::{no_grad, with_samples};
    use crate::tensor::{autocast, build_deferred, composed};

    /// Every setting as this thread has it, and the name of the thread.
    fn seen() -> (Option<String>, bool, bool, Option<DType>, Option<SampleContext>, bool) {
        let name = std::thread::current().name().map(str::to_string);
        let (fused, defers) = (crate::tensor::fused::fused_on(), crate::tensor::deferred::deferring().is_some());
        (name, autograd::is_enabled(), fused, crate::autocast_dtype(), autograd::current_samples(), defers)
    }

    #[test]
    fn the_pool_thread_runs_under_the_callers_settings_and_gets_its_own_back() {
        let ctx = SampleContext { step: 7, first_sample: 3, samples: 5 };
        let dev = Device::cpu();
        let inside = build_deferred(&dev, || with_samples(ctx, || autocast(Some(DType::Bf16), || composed(|| no_grad(|| on_cpu_pool(seen))))));
        let (name, grad, fused, cast, samples, defers) = inside;
        assert!(name.as_deref().is_some_and(|n| n.starts_with("tandem-cpu-")), "ran on {name:?}");
        assert_eq!((grad, fused, cast, samples, defers), (false, false, Some(DType::Bf16), Some(ctx), true));
        // The pool's threads have their own settings back once the work is done: the raw door,
        // which carries nothing, finds the defaults on whichever thread it lands.
        for _ in 0..8 {
            let (_, grad, fused, cast, samples, defers) = crate::backend::cpu::on_pool(seen);
            assert_eq!((grad, fused, cast, samples, defers), (true, true, None, None, false));
        }
    }
}
