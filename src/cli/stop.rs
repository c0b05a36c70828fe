//! Graceful stop on SIGINT and SIGTERM: the first signal is only recorded, so the training
//! loop can finish its step, write a checkpoint and print the summary; a second one ends the
//! process at once with the usual 128 + signal status.
use tandem::{Error, Result};
use signal_hook::consts::signal::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The signals a run stops on, with their names.
const SIGNALS: [(i32, &str); 2] = [(SIGINT, "SIGINT"), (SIGTERM, "SIGTERM")];

/// Which stop signal has arrived, if any.
pub struct StopSignal {
    seen: Arc<AtomicBool>,
    which: Arc<AtomicUsize>,
}

/// A signal that asked the run to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub signal: i32,
    pub name: &'static str,
}

impl Stopped {
    /// The stop signal numbered `signal` (another rank's, under mpirun).
    pub fn of(signal: i32) -> Stopped {
        let name = SIGNALS.iter().find(|(s, _)| *s == signal).map_or("a signal", |s| s.1);
        Stopped { signal, name }
    }
    /// The exit status a shell reports for a process ended by this signal.
    pub fn exit_code(self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

impl StopSignal {
    /// Installs the handlers for the rest of the process.
    pub fn install() -> Result<StopSignal> {
        let seen = Arc::new(AtomicBool::new(false));
        let which = Arc::new(AtomicUsize::new(0));
        let fail = |e: std::io::Error| Error::Msg(format!("cannot install the SIGINT/SIGTERM handlers: {e}"));
        for (sig, _) in SIGNALS {
            // Registered first, so it sees the flag as it was before this signal: armed only
            // by an earlier one.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&seen)).map_err(fail)?;
            signal_hook::flag::register_usize(sig, Arc::clone(&which), sig as usize).map_err(fail)?;
            signal_hook::flag::register(sig, Arc::clone(&seen)).map_err(fail)?;
        }
        Ok(StopSignal { seen, which })
    }

    /// The first stop signal received so far.
    pub fn get(&self) -> Option<Stopped> {
        if !self.seen.load(Ordering::SeqCst) {
            return None;
        }
        let n = self.which.load(Ordering::SeqCst);
        SIGNALS.iter().find(|(s, _)| *s as usize == n).map(|&(signal, name)| Stopped { signal, name })
    }
}
