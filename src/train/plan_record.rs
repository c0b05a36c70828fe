//! A run's [`Plan`] kept in its checkpoints and repeated on resume: a planned layout is a
//! measurement of its moment, so a resumed run rebuilds the layout and batch shares its first
//! run trained with instead of planning again (which could choose another layout and change
//! the trajectory).
//!
//! The plan is an entry of the run's settings ([`Trainer::settings`](super::Trainer::settings),
//! under [`PLAN_SETTING`]), which every checkpoint holds and a resume compares:
//!
//! ```no_run
//! # fn main() -> tandem::Result<()> {
//! use tandem::train::plan_record::{plan_setting, recorded_plan, resumed_settings};
//! # let (dir, devices, fresh_plan): (std::path::PathBuf, Vec<tandem::Device>, fn() -> tandem::Result<tandem::parallel::plan::Plan>) = todo!();
//! let resumed = resumed_settings(&dir);
//! // The plan to train with: the checkpoint's where it recorded one, else a new one.
//! let recorded = match &resumed {
//!     Some((path, settings)) => recorded_plan(settings, path, 0, 1, &devices)?,
//!     None => None,
//! };
//! let plan = match recorded {
//!     Some(p) => p,
//!     None => fresh_plan()?,
//! };
//! let mut settings = serde_json::json!({ "batch": plan.batch });
//! if let Some(entry) = plan_setting(resumed.as_ref().map(|(_, s)| s), Some(&plan))? {
//!     settings[tandem::train::plan_record::PLAN_SETTING] = entry;
//! }
//! // ... build plan.best with Plan::build, then Trainer::new(..).settings(settings, seed)
//! # Ok(()) }
//! ```
use crate::parallel::plan::Plan;
use crate::{Device, Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The entry of a run's settings that records its plan.
pub const PLAN_SETTING: &str = "plan";

/// `plan` as a run records it: without its alternatives, rejections and trials, which a
/// resume does not need.
pub fn recorded_form(plan: &Plan) -> Plan {
    Plan { alternatives: Vec::new(), rejected: Vec::new(), tried: Vec::new(), ..plan.clone() }
}

/// The [`PLAN_SETTING`] entry of a run's settings. A resumed run keeps the entry of
/// `resumed` (its checkpoint's settings), present or not, so that a run resumed under another
/// number of processes, which plans again, is still the same run; a new run records `planned`
/// in its [`recorded_form`]; `None` where there is nothing to record.
pub fn plan_setting(resumed: Option<&Value>, planned: Option<&Plan>) -> Result<Option<Value>> {
    if let Some(settings) = resumed {
        return Ok(settings.get(PLAN_SETTING).cloned());
    }
    let entry = |p: &Plan| serde_json::to_value(recorded_form(p)).map_err(|e| Error::Msg(format!("recording the plan: {e}")));
    planned.map(entry).transpose()
}

/// The newest checkpoint in `dir` that reads back whole ([`load_newest`](super::run_file::load_newest)):
/// its path and the run's settings; `None` where there is none.
pub fn resumed_settings(dir: &Path) -> Option<(PathBuf, Value)> {
    let (ckpt, _) = super::run_file::load_newest(dir, |_, _| {}).ok()?;
    Some((ckpt.path, ckpt.state.config))
}

/// The plan a run's `settings` recorded (read from the checkpoint at `checkpoint`), to
/// rebuild on this process's `devices`, it being rank `rank` of `processes`. `None` where no
/// plan is recorded, or where it was made for another number of processes (a job resumed under
/// another rank count, or a run of one process under a launcher): that run plans again.
/// Errors, naming the checkpoint, where the entry is not a consistent plan (as
/// [`Plan::load`] checks a file) or not for these devices.
pub fn recorded_plan(settings: &Value, checkpoint: &Path, rank: usize, processes: usize, devices: &[Device]) -> Result<Option<Plan>> {
    let Some(v) = settings.get(PLAN_SETTING) else { return Ok(None) };
    let bad = |why: String| Error::format(checkpoint, format!("the recorded plan: {why}"));
    let p: Plan = serde_json::from_value(v.clone()).map_err(|e| bad(e.to_string()))?;
    p.check().map_err(bad)?;
    if p.processes.iter().map(|(r, _)| r.saturating_add(1)).max().unwrap_or(1) != processes {
        return Ok(None);
    }
    p.check_rank_devices(rank, devices).map_err(|e| bad(e.to_string()))?;
    Ok(Some(p))
}

/// Errors unless `given` (a plan given again to a resumed run, read from `given_path`) is the
/// plan the run's checkpoint at `checkpoint` recorded, as [`recorded_form`] compares them:
/// a resumed run repeats its recorded plan, so another one would be ignored. The error names
/// both plans.
pub fn check_given_plan(recorded: &Plan, checkpoint: &Path, given: &Plan, given_path: &Path) -> Result<()> {
    if recorded_form(recorded) == recorded_form(given) {
        return Ok(());
    }
    let layout = |p: &Plan| format!("{} on {}, shares {:?}", p.best.layout, p.devices.join(","), p.shares);
    Err(Error::invalid(
        "plan",
        format!(
            "the run's checkpoint {} recorded the plan {}, and a resume repeats it; {} is another plan ({}): give the recorded plan or none",
            checkpoint.display(),
            layout(recorded),
            given_path.display(),
            layout(given)
        ),
    ))
}
