//! [`Trainer::fit`]: where a run starts (fresh, or resumed from its newest checkpoint) and its
//! step loop with validation, checkpoints, the non-finite check and the stop token.
use super::observer::{RunStart, StepInfo};
use super::run_dir::{self, Claim, RunDir};
use super::run_file::{self as runfile, RunCheckpoint, RunState};
use super::{default_changes, evaluate, ranks, record, Checkpoints, Fit, Schedule, Trainer};
use crate::data::BatchSource;
use crate::{Error, Result};
use std::path::PathBuf;
use std::time::Instant;

/// Where a run starts.
struct Start {
    step: u64,
    run: String,
    resumed: Option<PathBuf>,
}

impl<S: crate::parallel::Strategy + ?Sized> Trainer<S> {
    /// Trains on `data` until the run's length (steps or epochs), a stop, or an error. With
    /// checkpoints that [`resume`](super::Checkpoints::resume), the strategy, the optimizer and
    /// `data` are first put back to the newest valid checkpoint's state.
    ///
    /// Calling `fit` again continues from where the strategy and `data` stand (the steps count
    /// from 0 again unless the run resumes from checkpoints).
    pub fn fit(&mut self, data: &mut dyn BatchSource) -> Result<Fit> {
        let total = self.total_steps(data)?;
        // Every batch the source can serve (a short last one too) must suit the strategy: refused
        // here, not at the step that first draws it.
        self.strategy.check_batches(data)?;
        let schedule = match &self.schedule {
            Some(Schedule::Fixed(s)) => Some(*s),
            Some(Schedule::OverRun(make)) => Some(make(total)),
            None => None,
        };
        if let Some(s) = &schedule {
            s.check()?;
        }
        if let Some(clip) = self.clip {
            self.strategy.set_grad_clip(clip)?;
        }
        // What the trajectory depends on besides the caller's settings, recorded in every
        // checkpoint and checked on resume.
        let record = record::record(&*self.strategy, schedule.as_ref());
        let config = record::stored(&self.settings, &record);
        if let Some(t) = &self.trace {
            self.strategy.set_trace(t.clone());
        }
        let leader = self.group.rank() == 0;
        let run_dir = match (&self.checkpoints, leader) {
            (Some(c), true) => Some(match &c.opened {
                Some(dir) => std::sync::Arc::clone(dir),
                None => std::sync::Arc::new(open_run_dir(c)?),
            }),
            _ => None,
        };
        let start = self.start(run_dir.as_deref(), data, total, &config)?;
        for o in &mut self.observers {
            o.started(&RunStart { step: start.step, total, resumed_from: start.resumed.as_deref() });
        }
        let mut fit = Fit { first_step: start.step, step: start.step, total, resumed_from: start.resumed.clone(), ..Default::default() };
        // The newest checkpoint known to hold a finite state: the one resumed from, then each one
        // written (a non-finite state is never written).
        fit.checkpoint = start.resumed;
        let t0 = Instant::now();
        // A stop asked during setup ends the run before its first step.
        let mut stopped = ranks::agree_stop(&self.group, self.stop.reason())?;
        // This epoch's loss summed over its samples, and the samples.
        let (mut epoch, mut epoch_sum, mut epoch_samples) = (data.state().epoch, 0.0f64, 0u64);
        while fit.step < total && stopped.is_none() {
            let lr = schedule.map(|s| s.lr_at(fit.step));
            if let Some(lr) = lr {
                self.strategy.set_lr(lr);
            }
            let batch = data.next_batch()?;
            let position = data.state();
            fit.step += 1;
            let step = fit.step;
            let report =
                crate::parallel::on_step_threads(&mut *self.strategy, |s| s.step(&batch)).map_err(|e| e.at_step(step, fit.checkpoint.as_deref()))?;
            if !report.loss.is_finite() {
                return Err(Error::NonFinite { step, what: format!("loss is {} at step {step}", report.loss), kept: fit.checkpoint });
            }
            fit.losses.push((step, report.loss));
            fit.samples += batch.len() as u64;
            epoch_sum += report.loss as f64 * batch.len() as f64;
            epoch_samples += batch.len() as u64;
            if position.epoch != epoch {
                fit.epoch_losses.push((epoch, epoch_sum / epoch_samples as f64));
                (epoch, epoch_sum, epoch_samples) = (position.epoch, 0.0, 0);
            }
            let info = StepInfo { step, total, lr, samples: batch.len(), report: &report };
            self.observers.iter_mut().for_each(|o| o.step(&info));
            stopped = ranks::agree_stop(&self.group, self.stop.reason())?;
            if let Some(v) = self.validation.as_mut().filter(|v| step.is_multiple_of(v.every) || step == total) {
                let values = evaluate(&mut *self.strategy, &mut *v.source, &mut v.metrics, v.name.as_deref())?;
                self.observers.iter_mut().for_each(|o| o.validated(step, &values));
                fit.validations.push((step, values));
            }
            if let Some(plan) = &self.checkpoints {
                if step.is_multiple_of(plan.every.max(1)) || step == total || stopped.is_some() {
                    if let Some(dir) = &run_dir {
                        let state = |optim_steps| RunState {
                            run: start.run.clone(),
                            step,
                            optim_steps,
                            loader: position,
                            shuffle_seed: self.seed,
                            config: config.clone(),
                        };
                        let path = save(dir, &*self.strategy, step, fit.checkpoint.take(), state)?;
                        self.observers.iter_mut().for_each(|o| o.checkpointed(step, &path));
                        fit.checkpoint = Some(path);
                    } else if self.strategy.state_is_collective() {
                        // Rank 0's snapshot gathers from every rank's shards: take part in it.
                        runfile::snapshot(&*self.strategy)?;
                    }
                    // Nobody goes on (and could read the directory) before rank 0 has written.
                    self.group.barrier()?;
                }
            }
        }
        fit.train_s = t0.elapsed().as_secs_f64();
        fit.stopped = stopped;
        self.observers.iter_mut().for_each(|o| o.finished(&fit));
        Ok(fit)
    }

    /// Step 0 under a new run id, or with [`Claim::Resume`] the newest valid checkpoint's state
    /// loaded into the strategy and `data` on every rank. A fresh run told to overwrite clears the
    /// directory's earlier files first.
    /// `config` is what this run stores: the settings with the trainer's record.
    fn start(&mut self, run_dir: Option<&RunDir>, data: &mut dyn BatchSource, total: u64, config: &serde_json::Value) -> Result<Start> {
        let fresh = Start { step: 0, run: run_dir::new_run_id(), resumed: None };
        let Some(plan) = &self.checkpoints else { return Ok(fresh) };
        if plan.claim != Claim::Resume {
            if let (Claim::Overwrite, Some(dir)) = (plan.claim, run_dir) {
                dir.discard_earlier()?;
            }
            return Ok(fresh);
        }
        let dir = plan.dir.clone();
        let ckpt = self.read_newest(&dir)?;
        let st = &ckpt.state;
        let (settings, recorded) = record::split(&st.config, &self.settings);
        // A checkpoint written before the trainer recorded anything holds the settings alone.
        // The strategy is recorded, not compared: a checkpoint of any layout resumes under any other.
        let same = match &recorded {
            Some(then) => settings == self.settings && record::changes(config.get("trainer").unwrap_or(&serde_json::Value::Null), then).is_empty(),
            None => st.config == self.settings,
        };
        if !same || st.shuffle_seed != self.seed {
            let mut changed = match &self.describe {
                Some(f) => f(&self.settings, &settings),
                None => default_changes(&self.settings, &settings),
            };
            let own_too = self.describe.is_none() || changed.is_empty();
            if let (Some(then), true) = (&recorded, own_too) {
                changed.extend(record::changes(config.get("trainer").unwrap_or(&serde_json::Value::Null), then));
            }
            if st.shuffle_seed != self.seed && own_too {
                changed.push(format!("seed {} (checkpoint: {})", self.seed, st.shuffle_seed));
            }
            return Err(Error::ResumeMismatch { path: ckpt.path.clone(), changed });
        }
        if st.step > total {
            let at = format!("{} is at step {}, past the {total} steps asked for", ckpt.path.display(), st.step);
            return Err(Error::invalid("resume", format!("{at}: nothing to do; ask for more steps to continue it")));
        }
        self.strategy.load_state_dict(&ckpt.weights)?;
        self.strategy.load_optimizer_state(&ckpt.optim, st.optim_steps)?;
        // The precision is part of the recorded configuration, so an f16 run finds its scale.
        if let Some((scale, tracker)) = ckpt.grad_scaler {
            self.strategy.core_mut().load_grad_scaler(scale, tracker)?;
        }
        data.set_state(st.loader)?;
        // Files written before run ids carry none; the continued run takes a new one.
        let run = if st.run.is_empty() { run_dir::new_run_id() } else { st.run.clone() };
        Ok(Start { step: st.step, run, resumed: Some(ckpt.path) })
    }

    /// The newest valid checkpoint in `dir`: rank 0 reads the directory and sends the file to
    /// the other ranks, which need not see it (another machine's disk).
    /// Each file passed over (damaged, unreadable) is told to the observers.
    fn read_newest(&mut self, dir: &std::path::Path) -> Result<RunCheckpoint> {
        let newest = if self.group.rank() == 0 {
            let observers = &mut self.observers;
            let skip = |path: &std::path::Path, e: &Error| {
                tracing::warn!("skipping checkpoint {}: {e}", path.display());
                observers.iter_mut().for_each(|o| o.skipped(path, e));
            };
            Some(runfile::load_newest(dir, skip)?)
        } else {
            None
        };
        let (newest, bytes) = newest.map_or((None, None), |(c, b)| (Some(c), Some(b)));
        let bytes = ranks::share_bytes(&self.group, bytes)?;
        match newest {
            Some(c) => Ok(c),
            None => {
                let mut c = runfile::from_bytes(dir, &bytes)?;
                c.path = dir.join(runfile::file_name(c.state.step));
                Ok(c)
            }
        }
    }
}

fn open_run_dir(plan: &Checkpoints) -> Result<RunDir> {
    RunDir::open(&plan.dir, plan.claim)?.keep(plan.keep)
}

/// Writes the strategy's checkpoint after `step` into `dir`, unless a weight or optimizer value
/// is not finite: then the run stops with an error naming it and `kept`, the newest checkpoint
/// known to be sound. `state` builds the run state from the optimizer's step count.
pub(crate) fn save<S: crate::parallel::Strategy + ?Sized>(
    dir: &RunDir,
    strategy: &S,
    step: u64,
    kept: Option<PathBuf>,
    state: impl FnOnce(u64) -> RunState,
) -> Result<PathBuf> {
    let (tensors, optim_steps) = runfile::snapshot(strategy)?;
    if let Some((name, value)) = runfile::first_non_finite(&tensors) {
        let what = format!("{name} holds {value} after step {step} (its loss was finite)");
        return Err(Error::NonFinite { step, what, kept });
    }
    dir.save(&tensors, &state(optim_steps))
}
