//! The CPU backend's threads: running a whole training loop on one of them.
//!
//! Every large CPU op splits its work over rayon's threads. Called from a thread outside the
//! pool, each op hands its work to the pool and sleeps until it is done: a wake-up and a
//! hand-off for every one of the hundreds of ops in a step. Called from one of the pool's own
//! threads, the caller works on its share and the others steal theirs, with no hand-off. On a
//! 2-core host that took a 4-layer, 128-wide GPT's CPU step from a median of 67 ms to 58
//! (eight alternated runs each, release; benches/README.md).

use std::sync::OnceLock;

/// Stack of each thread of the pool: as a main thread's, since the caller's whole program may
/// run on one of them.
const STACK_BYTES: usize = 8 << 20;

/// Runs `f` on a thread of the CPU backend's pool and returns what it returns, so that the CPU
/// ops `f` makes start their parallel passes from inside the pool (see the module's text for
/// why that is faster). From a thread of any rayon pool already, `f` runs right there.
///
/// `f` runs on another thread: thread-local settings made before the call (such as
/// [`no_grad`](crate::autograd::no_grad) or a sample context) do not reach it, so make them
/// inside. The pool has rayon's default number of threads (`RAYON_NUM_THREADS`, or one per
/// CPU); it is built at the first call, and if it cannot be, `f` runs on the calling thread.
/// The `tandem` command runs every command this way.
///
/// ```
/// let sum = tandem::backend::cpu::on_pool(|| {
///     let x = tandem::Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &tandem::Device::cpu())?;
///     x.sum_all()?.to_scalar()
/// })?;
/// assert_eq!(sum, 6.0);
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    if rayon::current_thread_index().is_some() {
        return f();
    }
    let pool = POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().stack_size(STACK_BYTES).thread_name(|i| format!("tandem-cpu-{i}")).build().ok());
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}
