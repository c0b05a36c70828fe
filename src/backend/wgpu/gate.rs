//! One lock per GL adapter, held around every wgpu call (and every drop of a wgpu object) of
//! the logical devices opened on it.
//!
//! wgpu-hal's GL backend drives all devices of an adapter through one shared GL context behind
//! a mutex that gives up after 6 s and panics ("Could not lock adapter context"); the unwinding
//! then drops buffers, which lock it again, and the process aborts. llvmpipe JIT-compiles a
//! kernel at its first dispatch and runs compute synchronously, both inside `Queue::submit`, so
//! with a cold shader cache one submit holds that context for many seconds. Our threads queue
//! here instead, without a timeout, and wgpu-hal's mutex is never contended. The gate is
//! reentrant because a drop that holds it can release the last buffer of a pool that holds it.
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

/// The gate of one adapter; empty (free of cost) on backends without a shared context.
#[derive(Clone, Default)]
pub(crate) struct Gate(Option<Arc<Inner>>);

#[derive(Default)]
struct Inner {
    /// The holding thread and how many times it holds the gate.
    owner: Mutex<(Option<ThreadId>, usize)>,
    freed: Condvar,
}

/// Proof of holding a gate; releases it when dropped. Owns its gate, so a struct can keep one
/// in a field while its other fields drop.
pub(crate) struct Held(Option<Arc<Inner>>);

fn lock(m: &Mutex<(Option<ThreadId>, usize)>) -> MutexGuard<'_, (Option<ThreadId>, usize)> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gate {
    /// A gate that serializes (`shared`), or one that lets everything through.
    pub(crate) fn new(shared: bool) -> Self {
        Gate(shared.then(Arc::default))
    }

    /// Waits, without a timeout, until no other thread holds the gate, then holds it.
    pub(crate) fn hold(&self) -> Held {
        let Some(inner) = &self.0 else { return Held(None) };
        let me = std::thread::current().id();
        let mut s = lock(&inner.owner);
        while s.0.is_some_and(|t| t != me) {
            s = inner.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.0 = Some(me);
        s.1 += 1;
        Held(Some(inner.clone()))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(inner) = &self.0 {
            let mut s = lock(&inner.owner);
            s.1 -= 1;
            if s.1 == 0 {
                s.0 = None;
                inner.freed.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Gate;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn one_thread_at_a_time_and_reentrant() {
        let gate = Gate::new(true);
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (gate, inside) = (gate.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _outer = gate.hold();
                        let _inner = gate.hold();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two threads inside the gate");
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no thread failed");
        }
        let _open = Gate::new(false).hold();
        let _twice = Gate::new(false).hold();
    }
}
