//! How much of a step's all-reduce time each device spent still running backward, measured on
//! the device's own timeline; and each device's measured speed, which weights its shard.
//!
//! A bucket's all-reduce lasts, for one device, from its gradients being complete there to the
//! reduced bucket being back there. Both ends are marks recorded in order with the device's ops
//! (`Backend::mark`: wgpu timestamp queries), as are the start and end of backward, so the
//! figures count what the device did, not when the host recorded it: the host records a wgpu
//! backward far ahead of the device, and a host clock would count the device's backlog as
//! communication hidden behind backward. A CPU device runs its ops on the caller's thread, so
//! there the host clock is the device's; wgpu adapters without timestamp queries fall back to it
//! too, and `Overlap::device_clock` says which clock each device's figures come from.
use crate::data::Batch;
use crate::nn::Module;
use crate::parallel::step::StepCore;
use crate::{Device, Result};
use std::time::Instant;

/// A moment on one device's timeline: its mark, where the device keeps a clock of its own, and
/// the host time at which it was recorded (the fallback).
#[derive(Clone, Copy, Debug)]
pub(super) struct Stamp {
    host: Instant,
    mark: Option<u32>,
}

impl Stamp {
    /// Marks `device`'s timeline after every op recorded on it so far.
    pub(super) fn now(device: &Device) -> Result<Stamp> {
        let mark = device.backend().mark()?;
        Ok(Stamp { host: Instant::now(), mark })
    }
}

/// What one device's timeline recorded in a step: backward of the last micro-batch (the one
/// whose gradients are all-reduced), and each bucket's (gradients packed, reduced values back).
pub(super) struct DeviceStamps {
    pub backward: (Stamp, Stamp),
    pub buckets: Vec<(Stamp, Stamp)>,
    /// ZeRO-3 unit by unit: each wait for a gathered unit (see `Window::demand`).
    pub gather_waits: Vec<(Stamp, Stamp)>,
}

/// One device's step in seconds on one clock (its own, or the host's from an arbitrary origin).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSpans {
    /// Start and end of backward.
    pub backward: (f64, f64),
    /// Per bucket: gradients complete on the device, reduced gradients back on it.
    pub allreduce: Vec<(f64, f64)>,
}

/// The overlap of the last step's all-reduce with backward, per device (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overlap {
    /// Seconds in which some bucket of the device was being all-reduced.
    pub allreduce_s: Vec<f64>,
    /// Those seconds in which the device was still running backward.
    pub hidden_s: Vec<f64>,
    /// Those outside backward: the step waited for them.
    pub exposed_s: Vec<f64>,
    /// Whether a device's figures come from its own clock (timestamp queries) rather than the
    /// host's; on a wgpu device without timestamps the host's include waiting for the device.
    pub device_clock: Vec<bool>,
    /// The spans the figures were computed from.
    pub spans: Vec<DeviceSpans>,
    /// All-reduce and hidden seconds per device on the host clock (when the host recorded each
    /// mark), for comparison with the device's: what a host-timed report would say.
    pub host_allreduce_s: Vec<f64>,
    pub host_hidden_s: Vec<f64>,
    /// ZeRO-3 unit by unit: seconds each device waited for gathered units, on the clock of
    /// `device_clock` (see [`GatherStats::waited_s`](super::GatherStats::waited_s)).
    pub gather_wait_s: Vec<f64>,
}

impl Overlap {
    /// All-reduce time hidden behind backward over all-reduce time, summed over devices; 0
    /// when there was none.
    pub fn hidden_fraction(&self) -> f64 {
        let total: f64 = self.allreduce_s.iter().sum();
        if total > 0.0 {
            self.hidden_s.iter().sum::<f64>() / total
        } else {
            0.0
        }
    }
    /// `hidden_fraction` on the host clock.
    pub fn host_hidden_fraction(&self) -> f64 {
        let total: f64 = self.host_allreduce_s.iter().sum();
        if total > 0.0 {
            self.host_hidden_s.iter().sum::<f64>() / total
        } else {
            0.0
        }
    }
    /// The mean over devices of the all-reduce seconds.
    pub fn mean_allreduce_s(&self) -> f64 {
        self.allreduce_s.iter().sum::<f64>() / self.allreduce_s.len().max(1) as f64
    }
    /// The mean over devices of the exposed seconds.
    pub fn mean_exposed_s(&self) -> f64 {
        self.exposed_s.iter().sum::<f64>() / self.exposed_s.len().max(1) as f64
    }
}

/// Reads every device's marks (waiting for it) and measures the overlap; `stamps[d]` were
/// recorded on `devices[d]`. A device whose marks are not all there (the device had no room
/// left for one) is measured on the host clock.
pub(super) fn measure(devices: &[Device], stamps: &[DeviceStamps]) -> Result<Overlap> {
    let mut out = Overlap::default();
    for (device, st) in devices.iter().zip(stamps) {
        let marks = device.backend().read_marks()?;
        let all = std::iter::once(&st.backward).chain(&st.buckets).chain(&st.gather_waits).flat_map(|(a, b)| [a, b]);
        let on_device = all.clone().all(|s| s.mark.is_some_and(|m| (m as usize) < marks.len()));
        let origin = all.map(|s| s.host).min().unwrap_or_else(Instant::now);
        let host = |s: &Stamp| s.host.saturating_duration_since(origin).as_secs_f64();
        let device = |s: &Stamp| match s.mark {
            Some(m) if on_device => marks[m as usize],
            _ => host(s),
        };
        out.gather_wait_s.push(st.gather_waits.iter().map(|(a, b)| (device(b) - device(a)).max(0.0)).sum());
        let spans = spans_on(st, device);
        let (total, hidden, exposed) = figures(&spans);
        out.allreduce_s.push(total);
        out.hidden_s.push(hidden);
        out.exposed_s.push(exposed);
        out.device_clock.push(on_device);
        out.spans.push(spans);
        let (total, hidden, _) = figures(&spans_on(st, host));
        out.host_allreduce_s.push(total);
        out.host_hidden_s.push(hidden);
    }
    Ok(out)
}

/// One device's stamps as seconds on the clock `secs` reads.
fn spans_on(st: &DeviceStamps, secs: impl Fn(&Stamp) -> f64) -> DeviceSpans {
    let pair = |(a, b): &(Stamp, Stamp)| {
        let a = secs(a);
        (a, secs(b).max(a))
    };
    DeviceSpans { backward: pair(&st.backward), allreduce: st.buckets.iter().map(pair).collect() }
}

/// All-reduce, hidden and exposed seconds of one device's spans.
fn figures(spans: &DeviceSpans) -> (f64, f64, f64) {
    let busy = union(&spans.allreduce);
    let (b0, b1) = spans.backward;
    let hidden = busy.iter().map(|&(s, e)| (e.min(b1) - s.max(b0)).max(0.0)).sum::<f64>();
    let exposed = busy.iter().map(|&(s, e)| (e.min(b0) - s).max(0.0) + (e - s.max(b1)).max(0.0)).sum::<f64>();
    (busy.iter().map(|(s, e)| e - s).sum(), hidden, exposed)
}

/// The disjoint intervals covering `spans`, in order.
fn union(spans: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut sorted = spans.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
    for (s, e) in sorted {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Split weights from measured speed: each device runs forward + backward on the same probe
/// (the batch's first few samples) twice, and the second run's time counts, so one-time
/// costs (kernel compilation, allocator growth) do not. Devices are timed one after the other
/// because running them together would measure the shared host, not the devices.
pub(super) fn calibrate(models: &[(&dyn Module, &Device)], batch: &Batch, run: &StepCore) -> Result<Vec<f64>> {
    let probe = batch.slice(0..batch.len().min(8))?;
    models
        .iter()
        .map(|(model, device)| {
            let mut seconds = 0.0;
            for _ in 0..2 {
                let t0 = Instant::now();
                run.part_loss(*model, &probe, 0, probe.len(), device)?.backward()?;
                device.sync()?;
                seconds = t0.elapsed().as_secs_f64();
            }
            model.zero_grad();
            Ok(1.0 / seconds.max(1e-9))
        })
        .collect()
}
