//! What `train` prints while it runs: a progress bar on a terminal, periodic plain lines
//! otherwise, or one JSON object per step and a final summary with `--log-format json`.
use super::LogFormat;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::Instant;

/// Plain-text mode prints about this many progress lines per run.
const TEXT_LINES: u64 = 20;

/// The end-of-run figures, printed as text or as the final JSON object.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub summary: bool,
    /// Steps this process ran (fewer than `steps` after a resume).
    pub steps_run: u64,
    /// The last step's number, counting from 1 over the whole run.
    pub steps: u64,
    pub final_loss: Option<f32>,
    /// The last validation loss (`--model gpt` with `--eval-every`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_samples: Option<usize>,
    /// Training samples per second over this process's steps (evaluation excluded).
    pub samples_per_sec: f64,
    /// Seconds in the training loop.
    pub train_s: f64,
    /// Seconds for the whole command: data, training, evaluation and writing outputs.
    pub wall_s: f64,
    /// The signal that stopped the run early ("SIGINT", "SIGTERM").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<&'static str>,
}

/// One `--log-format json` line per step; fields in this order.
#[derive(serde::Serialize)]
struct StepLine {
    step: u64,
    /// The step's forward loss, before its update.
    loss: f32,
    step_s: f64,
    samples_per_sec: f64,
}

/// A `--log-format json` line of `--eval-every`.
#[derive(serde::Serialize)]
struct ValLine {
    step: u64,
    val_loss: f32,
}

pub struct Reporter {
    format: LogFormat,
    bar: Option<ProgressBar>,
    total: u64,
    every: u64,
    batch: usize,
    started: Instant,
    first_step: u64,
    /// Prints nothing: a rank other than 0 under mpirun, whose lines would repeat rank 0's.
    quiet: bool,
}

impl Reporter {
    /// A reporter for steps `first_step..=total` of `batch` samples each.
    pub fn new(format: LogFormat, first_step: u64, total: u64, batch: usize) -> Reporter {
        let bar = (format == LogFormat::Text && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template("{bar:30.cyan/blue} step {pos}/{len}  {msg}  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_position(first_step.saturating_sub(1));
            bar
        });
        let every = (total / TEXT_LINES).max(1);
        Reporter { format, bar, total, every, batch, started: Instant::now(), first_step, quiet: false }
    }

    /// A reporter that prints nothing.
    pub fn quiet(format: LogFormat, first_step: u64, total: u64, batch: usize) -> Reporter {
        Reporter { format, bar: None, total, every: 1, batch, started: Instant::now(), first_step, quiet: true }
    }

    /// Training samples per second since this reporter started.
    pub fn samples_per_sec(&self, step: u64) -> f64 {
        let done = (step + 1).saturating_sub(self.first_step) as f64 * self.batch as f64;
        done / self.started.elapsed().as_secs_f64().max(1e-9)
    }

    pub fn step(&self, step: u64, loss: f32, step_s: f64) {
        if self.quiet {
            return;
        }
        let rate = self.samples_per_sec(step);
        match (self.format, &self.bar) {
            (LogFormat::Json, _) => {
                let line = StepLine { step, loss, step_s, samples_per_sec: rate };
                out!("{}", serde_json::to_string(&line).unwrap_or_default());
            }
            (LogFormat::Text, Some(bar)) => {
                bar.set_position(step);
                bar.set_message(format!("loss {loss:.4}  {rate:.0} samples/s"));
            }
            (LogFormat::Text, None) => {
                if step.is_multiple_of(self.every) || step == self.total || step == self.first_step {
                    let left = (self.total - step) as f64 * self.batch as f64 / rate.max(1e-9);
                    out!("step {step}/{}  loss {loss:.4}  {rate:.0} samples/s  eta {left:.0}s", self.total);
                }
            }
        }
        // A reader piping JSON wants each line as it happens; a full pipe is not our error.
        let _ = std::io::stdout().flush();
    }

    /// A validation loss after `step`: a `{"step","val_loss"}` line in JSON, a line of text
    /// otherwise.
    pub fn val_loss(&self, step: u64, val_loss: f32) {
        if self.quiet {
            return;
        }
        match self.format {
            LogFormat::Json => out!("{}", serde_json::to_string(&ValLine { step, val_loss }).unwrap_or_default()),
            LogFormat::Text => {
                let line = format!("step {step}  val_loss {val_loss:.4}");
                match &self.bar {
                    Some(bar) => bar.println(line),
                    None => out!("{line}"),
                }
            }
        }
        let _ = std::io::stdout().flush();
    }

    /// Info for a human (checkpoints written, evaluation): stderr, above the bar if any.
    pub fn note(&self, msg: &str) {
        match &self.bar {
            _ if self.quiet => {}
            Some(bar) => bar.println(msg),
            None if self.format == LogFormat::Text => eprintln!("{msg}"),
            None => {}
        }
    }

    pub fn finish(self, s: &Summary) {
        if self.quiet {
            return;
        }
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        match self.format {
            LogFormat::Json => out!("{}", serde_json::to_string(s).unwrap_or_default()),
            LogFormat::Text => {
                let loss = s.final_loss.map_or_else(|| "-".to_string(), |l| format!("{l:.4}"));
                let stopped = s.stopped_by.map_or_else(String::new, |sig| format!(", stopped by {sig}"));
                out!(
                    "trained {} steps ({} in this run{stopped}) in {:.1}s, {:.0} samples/s; final loss {loss}",
                    s.steps, s.steps_run, s.train_s, s.samples_per_sec
                );
                if let Some(v) = s.val_loss {
                    out!("validation loss {v:.4}");
                }
                if let (Some(a), Some(n)) = (s.test_accuracy, s.test_samples) {
                    out!("test accuracy {:.2}% on {n} samples; total {:.1}s", a * 100.0, s.wall_s);
                }
            }
        }
    }
}
