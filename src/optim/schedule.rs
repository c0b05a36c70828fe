//! Learning-rate schedules: the lr as a pure function of the step (counted from 0), which the
//! training loop hands to `Optimizer::set_lr` before each step. Computed in f64, as PyTorch's
//! schedulers and nanoGPT compute in Python floats.
use crate::{Error, Result};
use std::f64::consts::PI;

/// A learning-rate schedule, described in a run's config as JSON
/// (`{"kind":"warmup_cosine","lr":0.0006,"warmup_steps":100,...}`).
///
/// ```
/// use tandem::optim::LrSchedule;
/// let s = LrSchedule::WarmupCosine { lr: 6e-4, warmup_steps: 10, decay_steps: 100, min_lr: 6e-5 };
/// s.check()?;
/// assert!((s.lr_at(9) - 6e-4 * 10.0 / 11.0).abs() < 1e-9); // the last warmup step
/// assert_eq!(s.lr_at(100), 6e-5);
/// # Ok::<(), tandem::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrSchedule {
    Constant {
        lr: f32,
    },
    /// PyTorch's `StepLR`: `lr * gamma^(step / step_size)` (integer division).
    Step {
        lr: f32,
        step_size: u64,
        gamma: f32,
    },
    /// nanoGPT's `get_lr`: linear warmup to `lr` over `warmup_steps` (`lr * (step + 1) /
    /// (warmup_steps + 1)`), then cosine decay reaching `min_lr` at step `decay_steps` (counted
    /// from 0, warmup included), `min_lr` after.
    WarmupCosine {
        lr: f32,
        warmup_steps: u64,
        decay_steps: u64,
        min_lr: f32,
    },
    /// PyTorch's `OneCycleLR` with cosine annealing, two phases: from `max_lr / div_factor` up
    /// to `max_lr` at step `pct_start * total_steps - 1`, then down to `max_lr / div_factor /
    /// final_div_factor` at step `total_steps - 1`, held there after (PyTorch raises past
    /// `total_steps`). Only the lr cycles: momentum and Adam's beta1 stay as configured,
    /// unlike PyTorch's default `cycle_momentum=True`.
    OneCycle {
        max_lr: f32,
        total_steps: u64,
        pct_start: f32,
        div_factor: f32,
        final_div_factor: f32,
    },
}

impl LrSchedule {
    /// `OneCycle` with PyTorch's defaults: pct_start 0.3, div_factor 25, final_div_factor 1e4.
    pub fn one_cycle(max_lr: f32, total_steps: u64) -> Self {
        LrSchedule::OneCycle { max_lr, total_steps, pct_start: 0.3, div_factor: 25.0, final_div_factor: 1e4 }
    }

    /// The learning rate for step `step` (0 for the first step).
    pub fn lr_at(&self, step: u64) -> f32 {
        let lr = match *self {
            LrSchedule::Constant { lr } => lr as f64,
            LrSchedule::Step { lr, step_size, gamma } => {
                let k = step.checked_div(step_size).unwrap_or(0);
                lr as f64 * (gamma as f64).powf(k as f64)
            }
            LrSchedule::WarmupCosine { lr, warmup_steps, decay_steps, min_lr } => {
                let (lr, min_lr) = (lr as f64, min_lr as f64);
                if step < warmup_steps {
                    lr * (step + 1) as f64 / (warmup_steps + 1) as f64
                } else if step >= decay_steps {
                    min_lr
                } else {
                    let ratio = (step - warmup_steps) as f64 / (decay_steps - warmup_steps) as f64;
                    min_lr + 0.5 * (1.0 + (PI * ratio).cos()) * (lr - min_lr)
                }
            }
            LrSchedule::OneCycle { max_lr, total_steps, pct_start, div_factor, final_div_factor } => {
                let max_lr = max_lr as f64;
                let initial = max_lr / div_factor as f64;
                let min_lr = initial / final_div_factor as f64;
                let peak = pct_start as f64 * total_steps as f64 - 1.0;
                let last = total_steps as f64 - 1.0;
                let s = (step as f64).min(last);
                if s <= peak {
                    cos_anneal(initial, max_lr, fraction(s, 0.0, peak))
                } else {
                    cos_anneal(max_lr, min_lr, fraction(s, peak, last))
                }
            }
        };
        lr as f32
    }

    /// Errors on settings that give no sensible schedule (negative or non-finite rates, a zero
    /// step size, warmup past the end of decay, a one-cycle phase without steps).
    pub fn check(&self) -> Result<()> {
        let bad = |detail: String| Err(Error::invalid("LrSchedule", format!("{detail} in {self:?}")));
        let rate = |x: f32| x.is_finite() && x >= 0.0;
        let factor = |x: f32| x.is_finite() && x > 0.0;
        match *self {
            LrSchedule::Constant { lr } if !rate(lr) => bad(format!("lr must be finite and >= 0, got {lr}")),
            LrSchedule::Step { lr, step_size, gamma } if !rate(lr) || !rate(gamma) || step_size == 0 => {
                bad("lr and gamma must be finite and >= 0, step_size > 0".into())
            }
            LrSchedule::WarmupCosine { lr, warmup_steps, decay_steps, min_lr } if !rate(lr) || !rate(min_lr) || warmup_steps > decay_steps => {
                bad("lr and min_lr must be finite and >= 0, warmup_steps <= decay_steps".into())
            }
            LrSchedule::OneCycle { max_lr, total_steps, pct_start, div_factor, final_div_factor } => {
                let peak = pct_start as f64 * total_steps as f64 - 1.0;
                if !rate(max_lr) || !factor(div_factor) || !factor(final_div_factor) {
                    bad("max_lr must be finite and >= 0, div_factor and final_div_factor finite and > 0".into())
                } else if !(0.0..1.0).contains(&pct_start) || peak <= 0.0 || peak >= total_steps as f64 - 1.0 {
                    bad(format!("pct_start {pct_start} of {total_steps} steps leaves a phase with no steps"))
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }
}

/// How far `s` is from `start` to `end`; a phase of no length counts as done.
fn fraction(s: f64, start: f64, end: f64) -> f64 {
    if end > start {
        (s - start) / (end - start)
    } else {
        1.0
    }
}

/// PyTorch's `_annealing_cos`: from `start` at 0 to `end` at 1 along half a cosine.
fn cos_anneal(start: f64, end: f64, pct: f64) -> f64 {
    end + (start - end) / 2.0 * ((PI * pct).cos() + 1.0)
}
