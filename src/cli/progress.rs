//! What `train` prints while it runs, as observers of the [`Trainer`](tandem::train::Trainer):
//! [`TextProgress`] (a progress bar on a terminal, periodic plain lines otherwise) or
//! [`JsonLines`] (one JSON object per step with `--log-format json`), and the [`Console`] for
//! notes on stderr and the final summary.
use super::LogFormat;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::Instant;
use tandem::train::{Observer, RunStart, StepInfo, Trainer};
use tandem::Error;

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

/// Training samples per second since the run's first step began.
struct Rate {
    started: Instant,
    /// The last step taken before this process's first one.
    start: u64,
    batch: usize,
}

impl Rate {
    fn new(batch: usize) -> Rate {
        Rate { started: Instant::now(), start: 0, batch }
    }
    fn begin(&mut self, start: u64) {
        (self.started, self.start) = (Instant::now(), start);
    }
    fn at(&self, step: u64) -> f64 {
        let done = step.saturating_sub(self.start) as f64 * self.batch as f64;
        done / self.started.elapsed().as_secs_f64().max(1e-9)
    }
}

/// The validation loss among a pass's metrics.
fn val_loss(metrics: &[(String, f64)]) -> Option<f32> {
    metrics.iter().find(|(n, _)| n == "val_loss").map(|(_, v)| *v as f32)
}

/// Where a run's notes and summary go: stderr (above the progress bar, when there is one) and
/// standard output. Silent on ranks other than 0, whose lines would repeat rank 0's. As an
/// observer it tells where the run starts and which checkpoints a resume passed over.
#[derive(Clone)]
pub struct Console {
    format: LogFormat,
    bar: Option<ProgressBar>,
    quiet: bool,
    /// The planned layout the run trains with and its predicted seconds per step, for the
    /// JSON summary's `plan` entry.
    plan: Option<(String, f64)>,
}

impl Console {
    /// The console of a run of `total` steps: with text on a terminal, a progress bar.
    pub fn new(format: LogFormat, total: u64, quiet: bool) -> Console {
        let bar = (!quiet && format == LogFormat::Text && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template("{bar:30.cyan/blue} step {pos}/{len}  {msg}  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Console { format, bar, quiet, plan: None }
    }

    /// `trainer` with this console and the observer that prints the steps ([`TextProgress`]
    /// or [`JsonLines`]) of `batch` samples each; unchanged on a quiet console.
    pub fn observe(&self, trainer: Trainer, batch: usize) -> Trainer {
        if self.quiet {
            return trainer;
        }
        let trainer = trainer.observe(self.clone());
        match self.format {
            LogFormat::Text => trainer.observe(TextProgress { bar: self.bar.clone(), every: 1, rate: Rate::new(batch) }),
            LogFormat::Json => trainer.observe(JsonLines { rate: Rate::new(batch) }),
        }
    }

    /// This console with the plan the run trains with (`--strategy auto`, `--plan`): the JSON
    /// summary then has a `plan` entry, its layout, predicted and measured seconds per step.
    pub fn with_plan(mut self, p: Option<&tandem::parallel::plan::Plan>) -> Console {
        self.plan = p.map(|p| (p.best.layout.to_string(), p.best.step_s));
        self
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

    pub fn finish(&self, s: &Summary) {
        if self.quiet {
            return;
        }
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        match self.format {
            LogFormat::Json => {
                // The summary's own fields as serialized (their order, f32 losses as f32), the
                // plan appended as the last field.
                let mut line = serde_json::to_string(s).unwrap_or_default();
                if let (Some((layout, predicted)), Some(open)) = (&self.plan, line.strip_suffix('}')) {
                    let measured = s.train_s / s.steps_run.max(1) as f64;
                    let plan = serde_json::json!({ "layout": layout, "predicted_step_s": predicted, "measured_step_s": measured });
                    line = format!("{open},\"plan\":{plan}}}");
                }
                out!("{line}")
            }
            LogFormat::Text => {
                let loss = s.final_loss.map_or_else(|| "-".to_string(), |l| format!("{l:.4}"));
                let stopped = s.stopped_by.map_or_else(String::new, |sig| format!(", stopped by {sig}"));
                out!(
                    "trained {} steps ({} in this run{stopped}) in {:.1}s, {:.0} samples/s; final loss {loss}",
                    s.steps,
                    s.steps_run,
                    s.train_s,
                    s.samples_per_sec
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

impl Observer for Console {
    fn skipped(&mut self, path: &std::path::Path, why: &Error) {
        if !self.quiet {
            eprintln!("warning: skipping checkpoint {}: {why}", path.display());
        }
    }
    fn started(&mut self, start: &RunStart<'_>) {
        if self.quiet {
            return;
        }
        if let Some(path) = start.resumed_from {
            eprintln!("resuming from {} (step {})", path.display(), start.step);
        }
        if start.step == start.total {
            self.note(&format!("the checkpoint is already at step {}: no steps to run", start.total));
        }
    }
}

/// `--log-format text`: a progress bar on a terminal; otherwise a line at the first step,
/// about [`TEXT_LINES`] in all, and at the last.
pub struct TextProgress {
    bar: Option<ProgressBar>,
    every: u64,
    rate: Rate,
}

impl Observer for TextProgress {
    fn started(&mut self, start: &RunStart<'_>) {
        self.rate.begin(start.step);
        self.every = (start.total / TEXT_LINES).max(1);
        if let Some(bar) = &self.bar {
            bar.set_position(start.step);
        }
    }
    fn step(&mut self, s: &StepInfo<'_>) {
        let (step, loss, rate) = (s.step, s.report.loss, self.rate.at(s.step));
        match &self.bar {
            Some(bar) => {
                bar.set_position(step);
                bar.set_message(format!("loss {loss:.4}  {rate:.0} samples/s"));
            }
            None => {
                if step.is_multiple_of(self.every) || step == s.total || step == self.rate.start + 1 {
                    let left = (s.total - step) as f64 * self.rate.batch as f64 / rate.max(1e-9);
                    out!("step {step}/{}  loss {loss:.4}  {rate:.0} samples/s  eta {left:.0}s", s.total);
                }
            }
        }
        // A reader piping the log wants each line as it happens; a full pipe is not our error.
        let _ = std::io::stdout().flush();
    }
    fn validated(&mut self, step: u64, metrics: &[(String, f64)]) {
        let Some(v) = val_loss(metrics) else { return };
        let line = format!("step {step}  val_loss {v:.4}");
        match &self.bar {
            Some(bar) => bar.println(line),
            None => out!("{line}"),
        }
        let _ = std::io::stdout().flush();
    }
}

/// `--log-format json`: a `{"step","loss","step_s","samples_per_sec"}` line per step and a
/// `{"step","val_loss"}` line per validation.
pub struct JsonLines {
    rate: Rate,
}

impl Observer for JsonLines {
    fn started(&mut self, start: &RunStart<'_>) {
        self.rate.begin(start.step);
    }
    fn step(&mut self, s: &StepInfo<'_>) {
        let line = StepLine { step: s.step, loss: s.report.loss, step_s: s.report.wall_s, samples_per_sec: self.rate.at(s.step) };
        out!("{}", serde_json::to_string(&line).unwrap_or_default());
        let _ = std::io::stdout().flush();
    }
    fn validated(&mut self, step: u64, metrics: &[(String, f64)]) {
        if let Some(val_loss) = val_loss(metrics) {
            out!("{}", serde_json::to_string(&ValLine { step, val_loss }).unwrap_or_default());
            let _ = std::io::stdout().flush();
        }
    }
}
