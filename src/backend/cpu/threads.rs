//! The CPU backend's pool of threads, on which a whole training loop can run.
//!
//! Every large CPU op splits its work over rayon's threads. Called from a thread outside the
//! pool, each op hands its work to the pool and sleeps until it is done; called from one of
//! the pool's own threads, the caller works on its share and the others steal theirs, with no
//! hand-off ([`on_cpu_pool`](crate::on_cpu_pool), the public door, says what that saves).

use std::sync::OnceLock;

/// Stack of each thread of the pool: as a main thread's, since the caller's whole program may
/// run on one of them.
const STACK_BYTES: usize = 8 << 20;

/// Runs `f` on a thread of the CPU backend's pool and returns what it returns; right here when
/// this thread belongs to a rayon pool already, or when no pool can be built. Thread-local
/// settings do not travel: [`on_cpu_pool`](crate::on_cpu_pool) carries them.
pub(crate) fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
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
