//! Graceful stop on SIGINT and SIGTERM: the first signal sets the trainer's
//! [`StopToken`] to the signal's number, so the run finishes its step, writes a checkpoint and
//! prints the summary; a second one ends the process at once with the usual 128 + signal status.
use signal_hook::consts::signal::{SIGINT, SIGTERM};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tandem::train::StopToken;
use tandem::{Error, Result};

/// The signals a run stops on, with their names.
const SIGNALS: [(i32, &str); 2] = [(SIGINT, "SIGINT"), (SIGTERM, "SIGTERM")];

/// The stop token the signal handlers set.
pub struct StopSignal {
    token: StopToken,
}

/// A signal that asked the run to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub signal: i32,
    pub name: &'static str,
}

impl Stopped {
    /// The stop signal of a trainer's reason code (the signal's number, on any rank).
    pub fn of(code: usize) -> Stopped {
        let signal = i32::try_from(code).unwrap_or(0);
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
        let token = StopToken::new();
        let seen = Arc::new(AtomicBool::new(false));
        let fail = |e: std::io::Error| Error::Msg(format!("cannot install the SIGINT/SIGTERM handlers: {e}"));
        for (sig, _) in SIGNALS {
            // Registered first, so it sees the flag as it was before this signal: armed only
            // by an earlier one.
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, Arc::clone(&seen)).map_err(fail)?;
            signal_hook::flag::register_usize(sig, token.flag(), sig as usize).map_err(fail)?;
            signal_hook::flag::register(sig, Arc::clone(&seen)).map_err(fail)?;
        }
        Ok(StopSignal { token })
    }

    /// The token for [`Trainer::stop_token`](tandem::train::Trainer::stop_token).
    pub fn token(&self) -> StopToken {
        self.token.clone()
    }
}
