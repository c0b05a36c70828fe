//! Layouts tried before they are chosen: a few real steps of the layout the search would pick,
//! and what they cost beyond the layer model (thread hand-offs, host staging, the loss and the
//! optimizer's launches), added to that layout's estimate before the search runs again.
//!
//! The layer model predicts a step from its layers' times; what a strategy spends around them
//! does not scale with the batch and is invisible to a per-layer calibration. It decides small
//! steps, where it can make a layout on two devices slower than one device though the layer
//! model predicts it faster (an example in benches/README.md). So [`tried`] times the layout the
//! search chooses, records the difference as that layout's [`StepOverhead`] (which untried
//! layouts on as many devices borrow), and searches again, until the choice is a layout that
//! was tried: its prediction is then its trial's measurement, and no layout is predicted
//! faster with the corrections in.
use super::{Cluster, Layout, Plan, Workload};
use crate::parallel::{Batch, Strategy};
use crate::Result;
use std::time::Instant;

/// What one layout cost per step beyond its estimate, measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepOverhead {
    /// The layout tried; its cuts are not part of the match, since the search derives them.
    pub layout: Layout,
    /// Its measured seconds per step, and what the layer model alone predicted.
    pub measured_s: f64,
    pub modelled_s: f64,
    /// Why the trial failed (out of memory where the estimate said the layout fits, say):
    /// the search then rejects the layout with this reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl StepOverhead {
    /// What the layer model left out: negative where the step ran faster than predicted, 0
    /// for a failed trial (whose layout is rejected).
    pub fn seconds(&self) -> f64 {
        match self.failed {
            None => self.measured_s - self.modelled_s,
            Some(_) => 0.0,
        }
    }
}

/// At most this many layouts run per plan: the search settles within a few (each trial moves
/// the chosen layout's estimate to its measurement, and a layout is tried once). Failed
/// trials (quick: an allocation refused) count apart, up to twice as many.
pub const MAX_TRIALS: usize = 8;

/// Trials stop being started once they have taken this long in all; the plan then chooses
/// the fastest layout that ran (the search's choice where none did).
pub const TRIALS_BUDGET_S: f64 = 20.0;

/// What [`tried`] runs a layout with: builds `plan.best` as training would and returns its
/// measured seconds per step ([`step_seconds`]).
pub type Trial<'a> = dyn FnMut(&Plan) -> Result<f64> + 'a;

impl Cluster {
    /// The measured step overhead of a layout like `l` (cuts aside), if one was tried.
    pub fn overhead_of(&self, l: &Layout) -> Option<&StepOverhead> {
        self.step_overheads.iter().find(|o| same_layout(&o.layout, l))
    }

    /// The seconds [`estimate`](super::estimate) adds to `l`'s step: its own trial's
    /// overhead, else that of the closest tried layout on as many devices (the same degrees
    /// first, then the same sharding, then the same micro-batches), else 0. What a step
    /// spends around its layers is mostly its devices' hand-offs, so untried layouts on as
    /// many devices as a slow one do not each look fast until tried.
    pub fn overhead_for(&self, l: &Layout) -> f64 {
        if let Some(o) = self.overhead_of(l) {
            return o.seconds();
        }
        let alike = self.step_overheads.iter().filter(|o| o.failed.is_none() && o.layout.devices() == l.devices());
        let closeness = |o: &StepOverhead| {
            ((o.layout.data, o.layout.tensor, o.layout.pipeline) == (l.data, l.tensor, l.pipeline)) as u8 * 4
                + (o.layout.shard == l.shard) as u8 * 2
                + (o.layout.micro_batches == l.micro_batches) as u8
        };
        alike.max_by_key(|o| closeness(o)).map_or(0.0, StepOverhead::seconds)
    }
}

fn same_layout(a: &Layout, b: &Layout) -> bool {
    Layout { cuts: Vec::new(), ..a.clone() } == Layout { cuts: Vec::new(), ..b.clone() }
}

/// The plan `search` makes of `work` on `cluster` once the layout it chooses has been tried:
/// `run(plan)` builds `plan.best` as training would and returns its measured seconds per step
/// ([`step_seconds`]). A layout whose trial fails (out of memory where the estimate said it
/// fits, say) is rejected by the next round with the error as its reason
/// ([`StepOverhead::failed`]). Trials stop after [`MAX_TRIALS`] (that ran) or
/// [`TRIALS_BUDGET_S`], and the fastest layout that ran is then chosen; the returned plan's
/// [`Plan::tried`] lists them.
pub fn tried(work: &Workload, cluster: &Cluster, search: &dyn Fn(&Workload, &Cluster) -> Result<Plan>, run: &mut Trial) -> Result<Plan> {
    let mut cluster = cluster.clone();
    let started = Instant::now();
    loop {
        let mut p = search(work, &cluster)?;
        if settle(&mut p, work, &cluster, started)? {
            return Ok(p);
        }
        record(&mut cluster, &p, run(&p));
    }
}

/// Whether the trials end with `p` (the search's answer on `cluster`): its choice ran, or the
/// trials are spent ([`MAX_TRIALS`], [`TRIALS_BUDGET_S`] since `started`), the fastest layout
/// that ran then chosen; `p` then lists the trials.
pub(super) fn settle(p: &mut Plan, work: &Workload, cluster: &Cluster, started: Instant) -> Result<bool> {
    let settled = cluster.overhead_of(&p.best.layout).is_some();
    let failed = cluster.step_overheads.iter().filter(|o| o.failed.is_some()).count();
    let ran = cluster.step_overheads.len() - failed;
    let spent = ran >= MAX_TRIALS || failed >= 2 * MAX_TRIALS || started.elapsed().as_secs_f64() > TRIALS_BUDGET_S;
    if !(settled || spent) {
        return Ok(false);
    }
    if !settled {
        fastest_tried(p, work, cluster)?;
    }
    p.tried = cluster.step_overheads.clone();
    Ok(true)
}

/// The trial of `p.best` and its outcome, on `cluster`.
pub(super) fn record(cluster: &mut Cluster, p: &Plan, outcome: Result<f64>) {
    let (measured_s, failed) = match outcome {
        Ok(s) => (s, None),
        Err(e) => (0.0, Some(format!("tried, and failed: {e}"))),
    };
    cluster.step_overheads.push(StepOverhead { layout: p.best.layout.clone(), measured_s, modelled_s: p.best.step_s, failed });
}

/// Makes the fastest layout of `p` that ran its choice, where the trials ran out before the
/// search settled on one (the search's choice stays where none ran).
fn fastest_tried(p: &mut Plan, work: &Workload, cluster: &Cluster) -> Result<()> {
    let ran = |e: &super::Estimate| cluster.overhead_of(&e.layout).is_some_and(|o| o.failed.is_none());
    if let Some(i) = p.alternatives.iter().position(ran) {
        let chosen = p.alternatives.remove(i);
        let before = std::mem::replace(&mut p.best, chosen);
        let at = p.alternatives.partition_point(|e| e.step_s < before.step_s);
        p.alternatives.insert(at, before);
        p.shares = super::shares_of(work.batch, cluster, &p.best.layout)?;
    }
    Ok(())
}

/// A trial that ran faster than its layer model by more than this share of the model's
/// prediction (a negative overhead beyond timing noise) contradicts its calibration.
pub const NEGATIVE_OVERHEAD_SHARE: f64 = 0.2;

/// Why the calibration `p` was searched on is contradicted by its trials: a layout ran faster
/// than the layer model predicted by more than [`NEGATIVE_OVERHEAD_SHARE`] of it (a negative
/// overhead), so the calibrated layer times are slower than this machine now is, as those of
/// a calibration made under load are. A kept calibration so contradicted is measured again
/// (`tandem plan`, `train --strategy auto`); one just measured stands, its trials'
/// corrections in.
pub fn faster_than_modelled(p: &Plan) -> Option<String> {
    let o = p.tried.iter().find(|o| o.failed.is_none() && o.seconds() < -NEGATIVE_OVERHEAD_SHARE * o.modelled_s)?;
    Some(format!(
        "{} ran in {:.2} ms/step, {:.2} ms faster than the calibration's {:.2} ms: a negative overhead, so its layer times are no longer this machine's",
        o.layout,
        o.measured_s * 1e3,
        -o.seconds() * 1e3,
        o.modelled_s * 1e3
    ))
}

/// Steps before timing: the first allocates, tunes kernels and starts a pipeline's threads.
const WARMUP_STEPS: usize = 2;

/// The median wall seconds of one `strategy.step(batch)`, after two untimed steps: at least
/// three steps, more until 0.05 s have passed (at most 20), so that a short step is not timed
/// inside one busy moment of a shared machine. The steps run where a `Trainer` runs them
/// ([`on_step_threads`](crate::parallel::on_step_threads)).
pub fn step_seconds(strategy: &mut dyn Strategy, batch: &Batch) -> Result<f64> {
    crate::parallel::on_step_threads(strategy, |s| timed_steps(s, batch))
}

fn timed_steps(strategy: &mut dyn Strategy, batch: &Batch) -> Result<f64> {
    for _ in 0..WARMUP_STEPS {
        strategy.step(batch)?;
    }
    let (mut times, started) = (Vec::new(), Instant::now());
    while times.len() < 3 || (times.len() < 20 && started.elapsed().as_secs_f64() < 0.05) {
        let t0 = Instant::now();
        strategy.step(batch)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
