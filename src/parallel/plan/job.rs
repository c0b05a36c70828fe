//! Planning a job of several processes (`mpirun`): each rank calibrates its own devices in
//! turn, the calibrations are exchanged, the link between processes and how much the ranks
//! slow each other are measured, and one cluster of every rank's devices is planned as one.
//!
//! What spans processes is data parallelism (plain or sharded, with micro-batches), so a job's
//! layouts are data parallelism over every device of the job ([`job_unbuildable`]); the search
//! still chooses the sharding mode and the micro-batches within each device's memory, and the
//! batch shares by measured speed, so that a slower process takes fewer samples
//! ([`Plan::job_weights`], given to `DataParallelConfig::weights` on every rank).
use super::{Calibration, Cluster, LayerCost, Layout, Link, Plan, Workload};
use crate::dist::Group;
use crate::nn::Module;
use crate::{Device, Error, Result, Tensor};
use std::time::Instant;

/// One rank's calibration of its own devices, as [`measure_job`] exchanges it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankCalibration {
    pub work: Workload,
    pub cluster: Cluster,
}

/// The per-sample seconds of a model's forward and backward on its reference device, or its
/// fixed seconds when the slopes are too small to measure: what scales one rank's device
/// speeds to another's reference.
fn reference_s(layers: &[LayerCost]) -> f64 {
    let slope: f64 = layers.iter().map(|l| l.forward_s + l.backward_s).sum();
    if slope > 0.0 {
        slope
    } else {
        layers.iter().map(|l| 2.0 * l.fixed_s).sum()
    }
}

/// One cluster of every rank's devices in rank order, each a server of its own linked by
/// `across`, with rank 0's layer costs as the reference (speed 1 is rank 0's first device);
/// within a process the slowest of the ranks' own links; the contention the worst of the
/// ranks' own and `across_contention` (the ranks computing at once against one at a time).
/// Also each device's `(rank, index among its rank's devices)`, in the cluster's order.
#[allow(clippy::type_complexity)]
pub fn combine(parts: &[RankCalibration], across: Link, across_contention: f64) -> Result<(Workload, Cluster, Vec<(usize, usize)>)> {
    let first = parts.first().ok_or_else(|| Error::invalid("plan::combine", "no ranks"))?;
    let reference = reference_s(&first.work.layers);
    let mut devices = Vec::new();
    let mut processes = Vec::new();
    for (rank, part) in parts.iter().enumerate() {
        if part.work.layers.len() != first.work.layers.len() {
            return Err(Error::invalid(
                "plan::combine",
                format!(
                    "rank {rank} calibrated {} layers, rank 0 {}: the ranks plan different models",
                    part.work.layers.len(),
                    first.work.layers.len()
                ),
            ));
        }
        // How much slower this rank's reference device runs the model than rank 0's.
        let slower = reference_s(&part.work.layers) / reference.max(1e-12);
        let slower = if slower.is_finite() && slower > 0.0 { slower } else { 1.0 };
        for (i, d) in part.cluster.devices.iter().enumerate() {
            devices.push(super::DeviceSpec { speed: d.speed / slower, server: rank, ..d.clone() });
            processes.push((rank, i));
        }
    }
    // Devices of one name are one kind of device on every rank, as inside one process: they
    // share their mean speed, so that timing noise does not give alike devices unequal shares.
    let mean_of = |name: &str| {
        let kind: Vec<f64> = devices.iter().filter(|d: &&super::DeviceSpec| d.name == name).map(|d| d.speed).collect();
        kind.iter().sum::<f64>() / kind.len().max(1) as f64
    };
    let means: Vec<f64> = devices.iter().map(|d| mean_of(&d.name)).collect();
    devices.iter_mut().zip(means).for_each(|(d, m)| d.speed = m);
    // A rank with one device measured no link inside itself.
    let within = parts
        .iter()
        .filter(|p| p.cluster.devices.len() > 1)
        .map(|p| p.cluster.within)
        .min_by(|a, b| a.bytes_per_s.total_cmp(&b.bytes_per_s))
        .unwrap_or(first.cluster.within);
    let contention = parts.iter().map(|p| p.cluster.contention).fold(across_contention.max(1.0), f64::max);
    Ok((
        first.work.clone(),
        Cluster { devices, within, across, contention, step_overheads: Vec::new(), links: job_links(parts, &processes, across) },
        processes,
    ))
}

/// The link of each pair of the job's devices (`processes` their (rank, index)): a rank's
/// own pair as it measured it, `across` between ranks; none where no rank measured its pairs.
fn job_links(parts: &[RankCalibration], processes: &[(usize, usize)], across: Link) -> Vec<Vec<Link>> {
    if parts.iter().all(|p| p.cluster.links.is_empty()) {
        return Vec::new();
    }
    let pair = |&(ra, a): &(usize, usize), &(rb, b): &(usize, usize)| if ra == rb { parts[ra].cluster.link(a, b) } else { across };
    processes.iter().map(|p| processes.iter().map(|q| pair(p, q)).collect()).collect()
}

/// Why a job of several processes cannot run layout `l` on its `devices`: only data
/// parallelism over every device of the job spans processes. `None` when it can.
pub fn job_unbuildable(l: &Layout, devices: usize) -> Option<String> {
    if l.tensor > 1 || l.pipeline > 1 {
        return Some("across processes only data parallelism runs (tensor and pipeline parallelism stay inside one process)".into());
    }
    if l.recompute {
        return Some("recomputation needs pipeline stages".into());
    }
    (l.devices() != devices).then(|| format!("a job of several processes runs on all its {devices} devices, not {}", l.devices()))
}

/// The plan of a job of several processes: each rank calibrates its own devices with
/// `calibrate` in turn (so that no rank's timing shares the host with another's), the
/// calibrations are exchanged, `device` (this rank's first) times a fixed workload alone and
/// with every rank at once for the contention between processes, the link between processes
/// is an all-reduce over the group timed at two sizes, and rank 0 plans the combined cluster
/// with `search` (which should reject what [`job_unbuildable`] names) and sends the plan to
/// every rank. With `run`, the layouts it would choose are tried as in [`tried`](super::tried),
/// every rank running its part of each trial (`run` builds the job's strategy and times its
/// steps) and the slowest rank's time counting; a trial that fails on any rank is an error on
/// every rank. Every rank returns the same plan, with [`Plan::processes`] set, and its own
/// calibration's origin.
pub fn measure_job(
    group: &Group,
    device: &Device,
    calibrate: &dyn Fn() -> Result<(Workload, Cluster, Calibration)>,
    search: &dyn Fn(&Workload, &Cluster) -> Result<Plan>,
    run: Option<&mut super::Trial>,
) -> Result<(Plan, Calibration)> {
    let (own, how) =
        agreed(group, in_turn(group, calibrate)?, "calibrate its devices").map(|(work, cluster, how)| (RankCalibration { work, cluster }, how))?;
    let text = serde_json::to_vec(&own).map_err(|e| Error::Msg(format!("encoding the calibration: {e}")))?;
    let parts = exchange(group, &text)?
        .iter()
        .enumerate()
        .map(|(r, bytes)| {
            serde_json::from_slice::<RankCalibration>(bytes).map_err(|e| Error::Msg(format!("rank {r}'s calibration did not arrive whole: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let contention = contention(group, device)?;
    let across = mpi_link(group)?;
    let (work, mut cluster, processes) = combine(&parts, across, contention)?;
    let order = in_plan_order(&cluster, &processes);
    let started = std::time::Instant::now();
    let mut run = run;
    loop {
        // Rank 0 plans and says whether the trials are over; the others take its plan, so
        // that every rank builds the same layout.
        let (p, done) = if group.rank() == 0 {
            let answer = search(&work, &cluster).and_then(|p| {
                let mut p = Plan { processes: order.clone(), ..p };
                let done = run.is_none() || super::tried::settle(&mut p, &work, &cluster, started)?;
                Ok((p, done))
            });
            let text = match &answer {
                Ok((p, done)) => {
                    [if *done { &b"done:"[..] } else { b"try:" }, &serde_json::to_vec(p).map_err(|e| Error::Msg(format!("encoding the plan: {e}")))?]
                        .concat()
                }
                Err(e) => format!("error:{e}").into_bytes(),
            };
            from_rank(group, &text, 0)?;
            answer?
        } else {
            let sent = from_rank(group, &[], 0)?;
            let (done, json) = match (sent.strip_prefix(b"done:"), sent.strip_prefix(b"try:")) {
                (Some(json), _) => (true, json),
                (_, Some(json)) => (false, json),
                _ => {
                    return Err(Error::invalid(
                        "plan",
                        format!("rank 0 found no plan: {}", String::from_utf8_lossy(sent.strip_prefix(b"error:").unwrap_or(&sent))),
                    ))
                }
            };
            let p = serde_json::from_slice::<Plan>(json).map_err(|e| Error::Msg(format!("rank 0's plan did not arrive whole: {e}")))?;
            (p, done)
        };
        let Some(trial) = run.as_deref_mut().filter(|_| !done) else { return Ok((p, how)) };
        // Every rank runs the trial, a collective; a rank's failure is every rank's error (a
        // failure inside a collective leaves the job to its launcher, as in training).
        let seconds = agreed(group, trial(&p), "run its part of a trial of the plan")?;
        let slowest = group.all_gather_u64(&[seconds.to_bits()])?.iter().filter_map(|v| v.first()).map(|&b| f64::from_bits(b)).fold(0.0, f64::max);
        super::tried::record(&mut cluster, &p, Ok(slowest));
    }
}

/// Each device's data-parallel batch weight over the whole job, in rank order (rank 0's
/// devices first): its speed on the forward and backward on `probe` of the model `make` builds
/// on a device, relative to rank 0's first device, each rank timing its own `devices` in turn
/// so that no timing shares the host with another rank's; devices of one name
/// ([`Device::spec`]) share their mean time, as in [`measure_speeds`](super::measure_speeds)
/// for one process. For `DataParallelConfig::weights` on every rank. Collective: every rank
/// calls it, with the same model and probe.
pub fn measure_job_speeds(group: &Group, make: &dyn Fn(&Device) -> Result<Box<dyn Module>>, probe: &Tensor, devices: &[Device]) -> Result<Vec<f64>> {
    let alone = agreed(group, in_turn(group, || super::measure::alone_s(make, probe, devices))?, "time the model on its devices")?;
    let names: Vec<String> = devices.iter().map(Device::spec).collect();
    let text = serde_json::to_vec(&(names, alone)).map_err(|e| Error::Msg(format!("encoding the timings: {e}")))?;
    let (mut names, mut alone) = (Vec::new(), Vec::new());
    for (r, bytes) in exchange(group, &text)?.iter().enumerate() {
        let (n, t): (Vec<String>, Vec<f64>) =
            serde_json::from_slice(bytes).map_err(|e| Error::Msg(format!("rank {r}'s timings did not arrive whole: {e}")))?;
        if n.len() != t.len() {
            return Err(Error::Msg(format!("rank {r} sent {} timings for {} devices", t.len(), n.len())));
        }
        names.extend(n);
        alone.extend(t);
    }
    Ok(super::measure::speeds(&names, &alone))
}

/// `run` on this rank, in its turn: rank 0 first, each rank after the one before has finished
/// (collective), so that no rank's timings share the host with another's.
fn in_turn<T>(group: &Group, run: impl FnOnce() -> Result<T>) -> Result<Result<T>> {
    let mut run = Some(run);
    let mut mine = None;
    for r in 0..group.size() {
        if r == group.rank() {
            mine = run.take().map(|f| f());
        }
        group.barrier()?;
    }
    Ok(mine.unwrap_or_else(|| Err(Error::Msg(format!("rank {} of {} had no turn", group.rank(), group.size())))))
}

/// `mine` once every rank knows that every rank's succeeded: an error is every rank's, the
/// failed rank's own or one naming it ("rank 1 could not `what`"). Collective.
fn agreed<T>(group: &Group, mine: Result<T>, what: &str) -> Result<T> {
    let failed = group.all_gather_u64(&[u64::from(mine.is_err())])?;
    let value = mine?;
    match failed.iter().position(|f| f.first() == Some(&1)) {
        Some(r) => Err(Error::invalid("plan", format!("rank {r} could not {what}"))),
        None => Ok(value),
    }
}

/// `(rank, index)` of each device in the order [`plan`](super::plan) places them: by speed,
/// fastest first, stable among equals (the search's own sort).
fn in_plan_order(cluster: &Cluster, processes: &[(usize, usize)]) -> Vec<(usize, usize)> {
    cluster.by_speed().into_iter().map(|i| processes[i]).collect()
}

/// Every rank's `bytes`, on every rank, in rank order.
fn exchange(group: &Group, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    (0..group.size()).map(|r| from_rank(group, bytes, r)).collect()
}

/// Rank `root`'s `bytes` (what the other ranks pass is not read) on every rank.
fn from_rank(group: &Group, bytes: &[u8], root: usize) -> Result<Vec<u8>> {
    let len = group.all_gather_u64(&[bytes.len() as u64])?[root].first().copied().unwrap_or(0);
    let len = usize::try_from(len).map_err(|_| Error::Msg(format!("rank {root}'s message of {len} bytes is too long")))?;
    let mut buf = if group.rank() == root { bytes.to_vec() } else { vec![0u8; len] };
    group.broadcast_bytes(&mut buf, root)?;
    Ok(buf)
}

/// The largest of every rank's `value`, on every rank, and at least `floor`.
fn largest(group: &Group, value: f64, floor: f64) -> Result<f64> {
    let all = group.all_gather(&[value as f32])?;
    Ok(all.iter().filter_map(|v| v.first()).map(|&v| f64::from(v)).fold(floor, f64::max))
}

/// How much slower the ranks' first devices compute a fixed workload all at once than each
/// alone (their turns one after another): processes on one host share its cores and memory
/// bus, which no rank's own calibration sees. The worst rank's ratio.
fn contention(group: &Group, device: &Device) -> Result<f64> {
    let a = Tensor::ones([256, 256], device)?;
    let work = || -> Result<f64> {
        let t0 = Instant::now();
        let mut runs = 0u32;
        while runs < 4 || t0.elapsed().as_secs_f64() < 0.05 {
            let c = a.matmul(&a)?;
            device.sync()?;
            drop(c);
            runs += 1;
        }
        Ok(t0.elapsed().as_secs_f64() / f64::from(runs))
    };
    work()?;
    let mut alone = 0.0;
    for r in 0..group.size() {
        if r == group.rank() {
            alone = work()?;
        }
        group.barrier()?;
    }
    let together = work()?;
    let ratio = together / f64::max(alone, 1e-12);
    largest(group, ratio, 1.0)
}

/// The link between processes as a ring: an all-reduce of 4 bytes for the latency and of
/// 4 MiB for the bandwidth, best of five, on host memory (what the host-staged communicator
/// sends between processes; NCCL between GPUs is faster, so this is an upper bound there).
fn mpi_link(group: &Group) -> Result<Link> {
    let n = group.size().max(2) as f64;
    let time = |len: usize| -> Result<f64> {
        let mut v = vec![0f32; len];
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            group.barrier()?;
            let t0 = Instant::now();
            group.all_reduce_sum(&mut v)?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        // Every rank uses the slowest rank's figure, so that all plan from the same link.
        largest(group, best, 0.0)
    };
    // A ring all-reduce is 2(n-1) messages of bytes/n (see `Link::all_reduce_s`).
    let messages = 2.0 * (n - 1.0);
    let latency_s = time(1)? / messages;
    let len = 1 << 20;
    let per_message = time(len)? / messages - latency_s;
    Ok(Link { latency_s, bytes_per_s: (len * 4) as f64 / n / per_message.max(1e-9) })
}

impl Plan {
    /// One batch weight per device of the job, in rank order (rank 0's devices first, each
    /// rank's in its own order): the shares of a plan made by [`measure_job`], for
    /// `DataParallelConfig::weights` on every rank. `None` for a plan of one process.
    pub fn job_weights(&self) -> Option<Vec<f64>> {
        if self.processes.is_empty() {
            return None;
        }
        let mut order: Vec<usize> = (0..self.processes.len()).collect();
        order.sort_by_key(|&i| self.processes[i]);
        Some(order.into_iter().map(|i| self.shares.get(i).copied().unwrap_or(0) as f64).collect())
    }

    /// Errors unless `devices` are the devices of rank `rank` this plan was made for (names as
    /// [`Device::spec`], in the rank's order); for a plan of one process, unless they are its
    /// devices ([`Plan::check_devices`]) and `rank` is 0.
    pub fn check_rank_devices(&self, rank: usize, devices: &[Device]) -> Result<()> {
        if self.processes.is_empty() {
            if rank > 0 {
                return Err(Error::invalid("Plan::build", "the plan is for one process, the job has several: plan again under the launcher"));
            }
            return self.check_devices(devices);
        }
        let mut mine: Vec<(usize, &str)> =
            self.processes.iter().zip(&self.devices).filter(|((r, _), _)| *r == rank).map(|((_, i), n)| (*i, n.as_str())).collect();
        mine.sort();
        let planned: Vec<&str> = mine.into_iter().map(|(_, n)| n).collect();
        let given: Vec<String> = devices.iter().map(Device::spec).collect();
        if planned != given {
            return Err(Error::invalid(
                "Plan::build",
                format!("the plan gives rank {rank} devices {}, it has {}", planned.join(","), given.join(",")),
            ));
        }
        Ok(())
    }
}
