//! Plans as JSON files: [`Plan::save`] writes one atomically, [`Plan::load`] reads one back
//! and refuses, naming the file and the field, one that is malformed, of another version, or
//! made for other devices.
use super::{Estimate, Layout, Plan, MAX_CLUSTER_DEVICES};
use crate::{Device, Error, Result};
use std::path::Path;

/// The plan file format's version, its `"version"` field. Version 2 added each layout's
/// `shard` and the plan's `model`, version 3 each layout's `bucket` (a tandem that ignored it
/// could build a layout planned with small buckets with the default ones, which may not fit);
/// [`Plan::load`] reads versions 1 (whose layouts are unsharded and whose model is
/// unrecorded) to 3.
pub const PLAN_VERSION: u64 = 3;

impl Plan {
    /// Writes the plan as JSON to `path` (temp file and rename, as checkpoints are). Costs are
    /// written as the shortest decimals that read back to the same `f64`, so a loaded plan
    /// equals the saved one.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        #[derive(serde::Serialize)]
        struct File<'a> {
            version: u64,
            plan: &'a Plan,
        }
        let text = serde_json::to_string_pretty(&File { version: PLAN_VERSION, plan: self })
            .map_err(|e| Error::format(path, format!("cannot encode the plan: {e}")))?;
        crate::checkpoint::write_atomic(path, format!("{text}\n").as_bytes())
    }

    /// Reads a plan [`Plan::save`] wrote, for `devices`: the file must hold this
    /// [`PLAN_VERSION`], a consistent plan (degrees, cuts and shares that fit together), and
    /// be made for the same devices (names as [`Device::spec`], in any order).
    pub fn load(path: impl AsRef<Path>, devices: &[Device]) -> Result<Plan> {
        let path = path.as_ref();
        let plan = Plan::read(path)?;
        plan.placed(devices).map_err(|_| {
            let given: Vec<String> = devices.iter().map(Device::spec).collect();
            Error::format(path, format!("field plan.devices: the plan is for {}, the devices given are {}", plan.devices.join(","), given.join(",")))
        })?;
        Ok(plan)
    }

    /// [`Plan::load`] on rank `rank` of a job of several processes: the file must be a plan of
    /// such a job ([`measure_job`](super::measure_job)) that gives this rank `devices`
    /// ([`Plan::check_rank_devices`]).
    pub fn load_for_rank(path: impl AsRef<Path>, rank: usize, devices: &[Device]) -> Result<Plan> {
        let path = path.as_ref();
        let plan = Plan::read(path)?;
        plan.check_rank_devices(rank, devices).map_err(|e| Error::format(path, format!("field plan.processes: {e}")))?;
        Ok(plan)
    }

    /// A plan file, checked for consistency but not against any devices.
    fn read(path: &Path) -> Result<Plan> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::format(path, format!("not JSON: {e}")))?;
        match doc.get("version").and_then(serde_json::Value::as_u64) {
            Some(1..=PLAN_VERSION) => {}
            Some(v) => return Err(Error::format(path, format!("plan version {v}; this tandem reads versions 1 to {PLAN_VERSION}"))),
            None => return Err(Error::format(path, "no \"version\" field: not a tandem plan")),
        }
        let body = doc.get("plan").cloned().ok_or_else(|| Error::format(path, "no \"plan\" field"))?;
        let plan: Plan = serde_json::from_value(body).map_err(|e| Error::format(path, format!("field plan: {e}")))?;
        plan.check().map_err(|why| Error::format(path, why))?;
        Ok(plan)
    }

    /// What a plan must satisfy to be built, as the field at fault and why: every count
    /// bounded (devices by [`MAX_CLUSTER_DEVICES`], micro-batches by the batch) before it sizes
    /// anything, sums checked, each replica's share at least one sample per micro-batch.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if self.batch == 0 {
            return Err("field plan.batch: must be at least 1".into());
        }
        if self.devices.is_empty() || self.devices.len() > MAX_CLUSTER_DEVICES {
            return Err(format!("field plan.devices: {} devices; a plan has 1 to {MAX_CLUSTER_DEVICES}", self.devices.len()));
        }
        check_estimate("plan.best", &self.best, self.devices.len(), self.batch)?;
        for (i, e) in self.alternatives.iter().enumerate() {
            check_estimate(&format!("plan.alternatives[{i}]"), e, self.devices.len(), self.batch)?;
        }
        let l = &self.best.layout;
        let sum = self.shares.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if self.shares.len() != l.data || sum != Some(self.batch) {
            return Err(format!("field plan.shares: {:?} are not {} replicas' shares of the batch of {}", self.shares, l.data, self.batch));
        }
        if let Some((r, s)) = self.shares.iter().enumerate().find(|(_, s)| **s < l.micro_batches) {
            let why = format!("replica {r}'s share of {s} samples does not fill {} micro-batches of at least one sample", l.micro_batches);
            return Err(format!("field plan.shares: {why}"));
        }
        // As the planner has it: equal pipelines take equal micro-batches of the batch.
        let equal = self.shares.windows(2).all(|w| w[0] == w[1]);
        if equal && l.pipeline > 1 && l.data.checked_mul(l.micro_batches).is_none_or(|n| !self.batch.is_multiple_of(n)) {
            let why = format!("{} micro-batches of {} replicas do not divide the batch of {}", l.micro_batches, l.data, self.batch);
            return Err(format!("field plan.best.layout.micro_batches: {why}"));
        }
        if !self.processes.is_empty() {
            let mut seen = self.processes.clone();
            seen.sort();
            seen.dedup();
            if self.processes.len() != self.devices.len() || seen.len() != self.devices.len() {
                return Err(format!("field plan.processes: {} distinct (rank, index) pairs for {} devices", seen.len(), self.devices.len()));
            }
            // Each rank holds a device: no rank or index reaches the device count.
            if let Some((r, i)) = self.processes.iter().find(|(r, i)| *r >= self.devices.len() || *i >= self.devices.len()) {
                return Err(format!("field plan.processes: rank {r}, device {i} of a job of {} devices", self.devices.len()));
            }
            if let Some(why) = super::job_unbuildable(&self.best.layout, self.devices.len()) {
                return Err(format!("field plan.best.layout: {why}"));
            }
        }
        Ok(())
    }
}

fn check_estimate(field: &str, e: &Estimate, devices: usize, batch: usize) -> std::result::Result<(), String> {
    let l: &Layout = &e.layout;
    if [l.data, l.tensor, l.pipeline, l.micro_batches].contains(&0) {
        return Err(format!("field {field}.layout: degrees and micro-batches must be at least 1 ({l})"));
    }
    let needs = l.data.checked_mul(l.tensor).and_then(|n| n.checked_mul(l.pipeline)).filter(|&n| n <= devices);
    if needs.is_none() {
        let (d, t, p) = (l.data, l.tensor, l.pipeline);
        return Err(format!("field {field}.layout: data {d} x tensor {t} x pipeline {p} needs more devices than the {devices} the plan names"));
    }
    if l.micro_batches > batch {
        return Err(format!("field {field}.layout.micro_batches: {} micro-batches of a batch of {batch}; at most one per sample", l.micro_batches));
    }
    let increasing = l.cuts.first().is_none_or(|&c| c > 0) && l.cuts.windows(2).all(|w| w[0] < w[1]);
    if l.cuts.len() + 1 != l.pipeline || !increasing {
        return Err(format!("field {field}.layout.cuts: {:?} are not {} increasing stage starts", l.cuts, l.pipeline - 1));
    }
    if l.shard != crate::parallel::Shard::None && l.data < 2 {
        return Err(format!("field {field}.layout.shard: sharding needs data-parallel replicas, the layout has {}", l.data));
    }
    if let Some(b) = l.bucket.filter(|b| !(1..=super::MAX_BYTES).contains(b)) {
        return Err(format!("field {field}.layout.bucket: {b} bytes; a bucket holds 1 byte to {}", super::bytes(super::MAX_BYTES)));
    }
    if !(e.step_s.is_finite() && e.step_s >= 0.0) || e.memory.len() != l.devices() {
        return Err(format!("field {field}: a step time of {} s and {} memory figures for {} devices", e.step_s, e.memory.len(), l.devices()));
    }
    Ok(())
}
