//! What the planner's inputs may hold: a [`Workload`] and a [`Cluster`] whose times are
//! finite and whose sizes are bounded, so that no figure from a calibration file or a caller
//! turns into a wrapped size, an infinite step or an allocation the machine cannot make.
//! [`plan`](super::plan) refuses inputs outside these bounds; a kept calibration outside them
//! is a damaged file and is measured again.
use super::{Cluster, Link, Workload, MAX_CLUSTER_DEVICES};

/// The most layers (or blocks) a workload holds: each is a few hundred bytes of calibration
/// and a column of the pipeline search.
pub const MAX_LAYERS: usize = 100_000;

/// The most seconds a layer's pass takes per sample (or its update per step): an hour. A
/// calibration that timed more measured a stalled machine.
pub const MAX_LAYER_S: f64 = 3600.0;

/// The most bytes any one figure of a workload holds, and its layers' parameters in all: a
/// pebibyte, far past any device's memory, small enough that the estimate's sums of it stay
/// exact in a `u64`.
pub const MAX_BYTES: u64 = 1 << 50;

/// The most training-state bytes per parameter byte (weights, gradients and optimizer states)
/// and optimizer state tensors kept in host memory: optimizers keep two states at most.
const MAX_STATES: u64 = 16;

/// Why `work` on `cluster` cannot be planned, naming the figure and its value; `None` where
/// every figure is within bounds.
pub(super) fn out_of_bounds(work: &Workload, cluster: &Cluster) -> Option<String> {
    workload(work).or_else(|| devices(cluster))
}

fn workload(work: &Workload) -> Option<String> {
    if work.layers.is_empty() || work.layers.len() > MAX_LAYERS {
        return Some(format!("{} layers; a plan needs 1 to {MAX_LAYERS}", work.layers.len()));
    }
    if work.batch == 0 {
        return Some("a batch of 0; a plan needs at least 1 sample".into());
    }
    if work.state_per_param_byte > MAX_STATES || work.offloaded_states > MAX_STATES {
        let (s, o) = (work.state_per_param_byte, work.offloaded_states);
        return Some(format!("{s} state bytes per parameter byte and {o} offloaded states; at most {MAX_STATES} each"));
    }
    let mut total = 0u64;
    for (i, l) in work.layers.iter().enumerate() {
        let layer = format!("layer {i} ({})", l.name);
        for (what, s) in [("forward_s", l.forward_s), ("backward_s", l.backward_s), ("fixed_s", l.fixed_s), ("update_s", l.update_s)] {
            if !(s.is_finite() && (0.0..=MAX_LAYER_S).contains(&s)) {
                return Some(format!("{layer}: {what} is {s}; times are 0 to {MAX_LAYER_S} s"));
            }
        }
        let sizes = [
            ("param_bytes", l.param_bytes),
            ("largest_param_bytes", l.largest_param_bytes),
            ("activation_bytes", l.activation_bytes),
            ("output_bytes", l.output_bytes),
        ];
        if let Some((what, b)) = sizes.iter().find(|(_, b)| *b > MAX_BYTES) {
            return Some(format!("{layer}: {what} is {b}; at most {MAX_BYTES} bytes"));
        }
        if let Some((j, b)) = l.tied.filter(|&(_, b)| b > MAX_BYTES) {
            return Some(format!("{layer}: tied to layer {j} by {b} bytes; at most {MAX_BYTES}"));
        }
        total = total.saturating_add(l.param_bytes);
    }
    (total > MAX_BYTES).then(|| format!("{total} bytes of parameters in all; at most {MAX_BYTES}"))
}

fn devices(cluster: &Cluster) -> Option<String> {
    let n = cluster.devices.len();
    if n == 0 || n > MAX_CLUSTER_DEVICES {
        return Some(format!("{n} devices; a plan needs 1 to {MAX_CLUSTER_DEVICES}"));
    }
    if let Some(d) = cluster.devices.iter().find(|d| !(d.speed.is_finite() && d.speed > 0.0)) {
        return Some(format!("device {} has speed {}; speeds must be finite and positive", d.name, d.speed));
    }
    if !(cluster.contention.is_finite() && cluster.contention >= 0.0) {
        return Some(format!("contention {}; it must be finite and not negative", cluster.contention));
    }
    if !cluster.links.is_empty() && (cluster.links.len() != n || cluster.links.iter().any(|row| row.len() != n)) {
        return Some(format!("links: {} rows for {n} devices; one row of {n} links a device", cluster.links.len()));
    }
    let all = [("within", &cluster.within), ("across", &cluster.across)].into_iter().chain(cluster.links.iter().flatten().map(|l| ("links", l)));
    all.filter_map(|(what, l)| bad_link(l).map(|why| format!("{what}: {why}"))).next()
}

/// Why `l` is no link: a latency that is not finite and non-negative, or a bandwidth that is
/// not positive (infinite is no link to cross: one device).
fn bad_link(l: &Link) -> Option<String> {
    let fine = l.latency_s.is_finite() && l.latency_s >= 0.0 && l.bytes_per_s > 0.0;
    (!fine).then(|| format!("a latency of {} s and {} bytes/s; latencies are finite, bandwidths positive", l.latency_s, l.bytes_per_s))
}
