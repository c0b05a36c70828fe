//! The stop token: how anything outside the step loop (a signal handler, another thread, a
//! callback) asks a [`Trainer`](super::Trainer) to stop after the step it is running.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A cheap, cloneable request to stop training: the run finishes its current step, writes a
/// checkpoint (when it writes any) and returns with [`Fit::stopped`](super::Fit::stopped) set,
/// so that a resume continues exactly where it stopped.
///
/// The token holds a reason code, 0 while no stop is asked: [`StopToken::stop`] sets 1, a
/// signal handler sets the signal's number through [`StopToken::flag`] (the command line
/// registers SIGINT and SIGTERM this way). Under several processes the ranks agree after every
/// step, so all of them stop after the same one.
///
/// ```
/// let token = tandem::train::StopToken::new();
/// let handle = token.clone();
/// assert_eq!(token.reason(), None);
/// handle.stop();
/// assert_eq!(token.reason(), Some(1));
/// ```
#[derive(Clone, Debug, Default)]
pub struct StopToken {
    code: Arc<AtomicUsize>,
}

impl StopToken {
    /// A token no one has set.
    pub fn new() -> StopToken {
        StopToken::default()
    }
    /// Asks for a stop with reason code 1 (unless a reason is set already).
    pub fn stop(&self) {
        self.stop_with(1);
    }
    /// Asks for a stop with `code` (a signal number, or any non-zero code of the caller's), unless
    /// a reason is set already: the first one wins.
    pub fn stop_with(&self, code: usize) {
        let code = code.max(1);
        let _ = self.code.compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
    }
    /// The reason code of the stop asked for, if any.
    pub fn reason(&self) -> Option<usize> {
        match self.code.load(Ordering::SeqCst) {
            0 => None,
            c => Some(c),
        }
    }
    /// The atomic a signal handler stores its code in (signal-hook's `flag::register_usize`
    /// takes it): any non-zero value asks for a stop. Storing, unlike [`StopToken::stop_with`],
    /// replaces an earlier reason.
    pub fn flag(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.code)
    }
}
