//! The planner's calibration: a model's layers and the devices and links of this machine,
//! measured in a few seconds, as the cost model's inputs.
use super::reuse::{self, Calibration, Reuse};
use super::{Cluster, DeviceSpec, LayerCost, Link, Workload};
use crate::nn::{Module, Sequential};
use crate::{Device, Result, Tensor};
use std::time::Instant;

/// Best-of runs of each timing: the minimum discards a preempted run.
const RUNS: usize = 5;

/// Timings run at least this long in all (up to [`MAX_RUNS`] runs): five runs of a layer
/// that takes a fraction of a millisecond fall inside one busy moment of a shared machine,
/// which then skews the whole calibration (calibrations of 0.2 s predicted a seed CNN's step
/// too slow; benches/README.md).
const MIN_TIMED_S: f64 = 0.03;
const MAX_RUNS: usize = 200;

/// Counts the runs of one timing: [`RUNS`] at least, then more until [`MIN_TIMED_S`] have
/// passed, [`MAX_RUNS`] at most.
struct Runs {
    start: Instant,
    done: usize,
}

impl Runs {
    fn new() -> Runs {
        Runs { start: Instant::now(), done: 0 }
    }
    fn more(&mut self) -> bool {
        let more = self.done < RUNS || (self.done < MAX_RUNS && self.start.elapsed().as_secs_f64() < MIN_TIMED_S);
        self.done += 1;
        more
    }
}

/// Each layer of `model` timed on `devices[0]` (the reference, speed 1) at `probe`'s batch and
/// twice it, so that a layer's time splits into a per-sample part (the slope) and a fixed part
/// (the intercept: launches and idle); its parameter, activation (what autograd keeps for the
/// backward) and output bytes per sample; each other device's speed as the ratio of the whole
/// model's time there at its share of `batch` (devices of one [`Device::spec`] name share
/// their mean time); each pair's link as a copy of one value and of 4 MiB
/// ([`Cluster::links`], up to 8 devices; [`Cluster::within`] is the first pair's). All
/// devices are taken to sit in one server. Devices timed one at a time look independent even
/// where they share the host's cores (CPU devices, software adapters), so the whole model is
/// also run on all of them at once, and the worst slowdown is [`Cluster::contention`].
///
/// `batch` is the global batch to plan for; `optimizer_states` the optimizer's state tensors per
/// parameter (SGD with momentum 1, Adam 2). The model's last two layers with parameters count
/// as splittable by tensor parallelism when they are Linears (what `TensorParallel` shards).
///
/// The layers run under the caller's autocast ([`autocast`](crate::autocast)): a run in bf16
/// or f16 is planned from its own times and half activations.
///
/// Each device's memory is its budget where one is set ([`Device::set_memory_budget`],
/// `--memory-limit`), else what it reports (the host's available memory for CPU devices). The
/// calibration itself runs with the budgets lifted (they are put back after it, failed or
/// not), so that a budget too small for training does not stop the planner from finding
/// that out.
pub fn measure(model: &Sequential, probe: &Tensor, devices: &[Device], batch: usize, optimizer_states: usize) -> Result<(Workload, Cluster)> {
    measure_reusing(model, probe, devices, batch, optimizer_states, Reuse::Off).map(|(w, c, _)| (w, c))
}

/// [`measure`], or the same calibration kept on disk by an earlier run where `reuse` allows
/// (see [`Reuse`]: same model, probe shape, batch, optimizer and devices, this tandem, under
/// a week old), and where it came from.
pub fn measure_reusing(
    model: &Sequential,
    probe: &Tensor,
    devices: &[Device],
    batch: usize,
    optimizer_states: usize,
    reuse: Reuse,
) -> Result<(Workload, Cluster, Calibration)> {
    let all = model.layers();
    let with_params: Vec<usize> = (0..all.len()).filter(|&i| !all[i].1.parameters().is_empty()).collect();
    let sharded = &with_params[with_params.len().saturating_sub(2)..];
    let splits = |i: usize, _: &str, layer: &dyn Module| sharded.contains(&i) && layer.describe().starts_with("Linear");
    let key = reuse::key(&model.describe(), probe, devices, batch, optimizer_states);
    measure_built(&|d| model.slice(0..model.len(), d), probe, devices, batch, optimizer_states, &splits, (&key, reuse))
}

/// [`measure`] of the model `make` builds on a device (a fresh copy per device, its layers
/// timed one by one on the first), `tensor_parallel(index, name, layer)` saying which layers
/// tensor parallelism splits; the budgets lifted while calibrating and then read as the
/// devices' memory. `cached` is the calibration's key and whether to reuse one kept under it.
pub(super) fn measure_built(
    make: &dyn Fn(&Device) -> Result<Sequential>,
    probe: &Tensor,
    devices: &[Device],
    batch: usize,
    optimizer_states: usize,
    tensor_parallel: &dyn Fn(usize, &str, &dyn Module) -> bool,
    cached: (&str, Reuse),
) -> Result<(Workload, Cluster, Calibration)> {
    let budgets: Vec<Option<u64>> = devices.iter().map(|d| d.memory().budget).collect();
    let (work, mut cluster, how) = reuse::calibrated(
        cached.0,
        cached.1,
        || lifted(devices, || calibrate(make, probe, devices, batch, optimizer_states, tensor_parallel)),
        || lifted(devices, || probe_s(make, probe, devices, batch)),
    )?;
    for ((spec, d), budget) in cluster.devices.iter_mut().zip(devices).zip(budgets) {
        let reported = d.info().memory.or_else(crate::backend::host::available).unwrap_or(u64::MAX);
        spec.memory = budget.map_or(reported, |b| b.min(reported));
    }
    Ok((work, cluster, how))
}

/// `run()` with the devices' memory budgets lifted, put back after it, failed or not.
fn lifted<T>(devices: &[Device], run: impl FnOnce() -> Result<T>) -> Result<T> {
    let budgets: Vec<Option<u64>> = devices.iter().map(|d| d.memory().budget).collect();
    devices.iter().for_each(|d| d.set_memory_budget(None));
    let done = run();
    devices.iter().zip(&budgets).for_each(|(d, b)| d.set_memory_budget(*b));
    done
}

/// The speed probe: each device's seconds on the whole model at its share of `batch`, one
/// at a time ([`alone_s`]), which a calibration's speeds are the ratios of.
fn probe_s(make: &dyn Fn(&Device) -> Result<Sequential>, probe: &Tensor, devices: &[Device], batch: usize) -> Result<Vec<f64>> {
    // A device's pace, and whether it keeps the host's cores busy (the CPU's threaded passes
    // start only on large inputs), depend on its share.
    let k = probe.dims().first().copied().unwrap_or(1).max(1);
    let share = repeated(probe, batch.div_ceil(devices.len()).max(k) / k)?;
    alone_s(&|d| Ok(Box::new(make(d)?)), &share, devices)
}

/// The calibration of [`measure_built`], the devices' memory left to it, and each device's
/// seconds on the speed probe ([`probe_s`]).
fn calibrate(
    make: &dyn Fn(&Device) -> Result<Sequential>,
    probe: &Tensor,
    devices: &[Device],
    batch: usize,
    optimizer_states: usize,
    tensor_parallel: &dyn Fn(usize, &str, &dyn Module) -> bool,
) -> Result<(Workload, Cluster, Vec<f64>)> {
    let first = devices.first().ok_or_else(|| crate::Error::invalid("plan::measure", "no devices"))?;
    let k = probe.dims().first().copied().unwrap_or(1).max(1);
    let small = probe.to(first)?;
    let large = Tensor::cat(&[small.clone(), small.clone()], 0)?;
    let (mut x1, mut x2) = (small, large);
    let mut layers = Vec::new();
    let built = make(first)?;
    // Which layer holds each parameter (by full name), for the tied copies the model declares.
    let holder: std::collections::HashMap<String, usize> = built
        .layers()
        .iter()
        .enumerate()
        .flat_map(|(i, (name, m))| m.parameters().into_iter().map(move |(p, _)| (format!("{name}.{p}"), i)))
        .collect();
    let ties = built.tied_parameters();
    for (i, (name, here)) in built.layers().iter().enumerate() {
        let here: &dyn Module = &**here;
        let (f1, b1, y1, act1) = time_layer(here, &x1, first)?;
        let (f2, b2, y2, _) = time_layer(here, &x2, first)?;
        let slope = |t1: f64, t2: f64| ((t2 - t1) / k as f64).max(0.0);
        let (forward_s, backward_s) = (slope(f1, f2), slope(b1, b2));
        let fixed_s = ((f1 - forward_s * k as f64).max(0.0) + (b1 - backward_s * k as f64).max(0.0)) / 2.0;
        let param_bytes = here.parameters().iter().map(|(_, p)| (p.numel() * 4) as u64).sum();
        let largest_param_bytes = here.parameters().iter().map(|(_, p)| (p.numel() * 4) as u64).max().unwrap_or(0);
        // A copy of an earlier layer's parameter (GPT's head of its embedding): its bytes and
        // that layer (one layer ties to one other in the models tandem plans).
        let tied = here
            .parameters()
            .iter()
            .filter_map(|(p, t)| {
                let own = format!("{name}.{p}");
                let primary = ties.iter().find(|(o, _)| *o == own).map(|(_, pr)| pr)?;
                holder.get(primary).filter(|&&j| j < i).map(|&j| (j, (t.numel() * 4) as u64))
            })
            .reduce(|(j, a), (_, b)| (j, a + b));
        layers.push(LayerCost {
            name: name.clone(),
            forward_s,
            backward_s,
            fixed_s,
            param_bytes,
            largest_param_bytes,
            activation_bytes: act1 / k as u64,
            output_bytes: (y1.numel() * y1.dtype().size() / k) as u64,
            tensor_parallel: tensor_parallel(i, name, here),
            tied,
            update_s: update_s(here, optimizer_states, first)?,
        });
        (x1, x2) = (y1, y2);
    }
    // Speeds and contention at each device's share of the batch.
    let share = repeated(probe, batch.div_ceil(devices.len()).max(k) / k)?;
    let alone = probe_s(make, probe, devices, batch)?;
    let mut specs = Vec::new();
    let names: Vec<String> = devices.iter().map(Device::spec).collect();
    for (d, speed) in devices.iter().zip(speeds(&names, &alone)) {
        specs.push(DeviceSpec { name: d.spec(), speed, memory: u64::MAX, server: 0 });
    }
    let contention = if devices.len() > 1 {
        // Long enough for the slowest device to run its pass three times.
        let window = (3.0 * alone.iter().copied().fold(0.0, f64::max)).clamp(0.01, 10.0);
        let together = all_at_once_s(make, &share, devices, window)?;
        together.iter().zip(&alone).map(|(t, a)| t / a.max(1e-9)).fold(1.0, f64::max)
    } else {
        1.0
    };
    let links = measure_links(devices)?;
    let link = match devices.len() {
        0 | 1 => Link { latency_s: 0.0, bytes_per_s: f64::INFINITY },
        _ => links.first().and_then(|row| row.get(1)).copied().map_or_else(|| measure_link(first, &devices[1]), Ok)?,
    };
    let state_per_param_byte = 2 + optimizer_states as u64;
    let work = Workload { layers, batch, state_per_param_byte, grad_dtype: crate::DType::F32, offloaded_states: 0 };
    Ok((work, Cluster { devices: specs, within: link, across: link, contention, step_overheads: Vec::new(), links }, alone))
}

/// A layer's forward and backward seconds on `x` (best of [`Runs`]), its output, and the bytes
/// its forward keeps for the backward.
fn time_layer(layer: &dyn Module, x: &Tensor, dev: &Device) -> Result<(f64, f64, Tensor, u64)> {
    let (mut fwd, mut bwd) = (f64::INFINITY, f64::INFINITY);
    let mut kept = (x.clone(), 0);
    let mut runs = Runs::new();
    while runs.more() {
        // Token ids (the GPT's embeddings) take no gradient; f32 and (under autocast) half
        // activations do.
        let input = if x.dtype() != crate::DType::I32 { x.detach().requires_grad() } else { x.clone() };
        let t0 = Instant::now();
        let y = layer.forward(&input)?;
        dev.sync()?;
        fwd = fwd.min(t0.elapsed().as_secs_f64());
        let root = y.sum_all()?;
        let bytes = crate::autograd::activation_bytes(&root).saturating_sub((x.numel() * x.dtype().size()) as u64);
        let t1 = Instant::now();
        if root.needs_grad() {
            root.backward()?;
        }
        dev.sync()?;
        bwd = bwd.min(t1.elapsed().as_secs_f64());
        kept = (y.detach(), bytes);
    }
    Ok((fwd, bwd, kept.0, kept.1))
}

/// Seconds of one optimizer update of `layer`'s parameters on `dev` (their gradients are
/// `time_layer`'s), best of [`Runs`]: SGD, SGD with momentum or Adam for 0, 1 or 2 states a
/// parameter, at learning rate 0, which leaves the weights as they are (the layer may be the
/// user's own) and costs what any rate costs.
fn update_s(layer: &dyn Module, optimizer_states: usize, dev: &Device) -> Result<f64> {
    use crate::optim::{AdamConfig, SgdConfig};
    let params = layer.parameters();
    if params.is_empty() {
        return Ok(0.0);
    }
    for (_, p) in &params {
        if p.grad().is_none() {
            p.set_grad(Some(Tensor::zeros(p.shape().clone(), dev)?));
        }
    }
    let opt = match optimizer_states {
        0 => crate::parallel::OptimConfig::sgd(SgdConfig { lr: 0.0, ..Default::default() }),
        1 => crate::parallel::OptimConfig::sgd(SgdConfig { lr: 0.0, momentum: 0.9, ..Default::default() }),
        _ => crate::parallel::OptimConfig::adam(AdamConfig { lr: 0.0, ..AdamConfig::adamw() }),
    };
    let mut opt = opt.build(params)?;
    let mut best = f64::INFINITY;
    let mut runs = Runs::new();
    while runs.more() {
        let t = Instant::now();
        opt.step()?;
        dev.sync()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    opt.zero_grad();
    Ok(best)
}

/// Forward and backward of `model` on `x` (both on `dev`), best of [`Runs`].
fn timed_runs(model: &dyn Module, x: &Tensor, dev: &Device) -> Result<f64> {
    let mut best = f64::INFINITY;
    let mut failed = None;
    let mut runs = Runs::new();
    while runs.more() {
        let t0 = Instant::now();
        let run = || -> Result<()> {
            let root = model.forward(x)?.sum_all()?;
            if root.needs_grad() {
                root.backward()?;
            }
            dev.sync()
        };
        match run() {
            Ok(()) => best = best.min(t0.elapsed().as_secs_f64()),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    failed.map_or(Ok(best), Err)
}

/// `x` stacked `times` times along the batch.
fn repeated(x: &Tensor, times: usize) -> Result<Tensor> {
    let copies: Vec<Tensor> = (0..times.max(1)).map(|_| x.clone()).collect();
    Tensor::cat(&copies, 0)
}

/// Each device's speed on the whole of `model` (forward and backward on `probe`) relative to
/// the first's, timed one at a time: the weights of a data-parallel batch split by speed
/// (`--balance measured`).
pub fn measure_speeds(model: &Sequential, probe: &Tensor, devices: &[Device]) -> Result<Vec<f64>> {
    measure_speeds_of(&|d| Ok(Box::new(model.slice(0..model.len(), d)?)), probe, devices)
}

/// [`measure_speeds`] of any model `make` builds on a device (a [`Gpt`](crate::nn::models::Gpt)
/// on token windows, say), timed on `probe`.
pub fn measure_speeds_of(make: &dyn Fn(&Device) -> Result<Box<dyn Module>>, probe: &Tensor, devices: &[Device]) -> Result<Vec<f64>> {
    let names: Vec<String> = devices.iter().map(Device::spec).collect();
    Ok(speeds(&names, &alone_s(make, probe, devices)?))
}

/// The seconds of forward and backward on `probe` of the model `make` builds, on each of
/// `devices`, one at a time.
pub(super) fn alone_s(make: &dyn Fn(&Device) -> Result<Box<dyn Module>>, probe: &Tensor, devices: &[Device]) -> Result<Vec<f64>> {
    devices.iter().map(|d| timed_runs(&*make(d)?, &probe.to(d)?, d)).collect()
}

/// Each device's speed from its time `alone`, relative to the first, devices named as
/// [`Device::spec`]. Devices of one name are one kind of device and share their mean time, so
/// that timing noise does not give alike devices unequal shares.
pub(super) fn speeds(names: &[String], alone: &[f64]) -> Vec<f64> {
    let mean = |name: &str| {
        let kind: Vec<f64> = names.iter().zip(alone).filter(|(n, _)| *n == name).map(|(_, t)| *t).collect();
        kind.iter().sum::<f64>() / kind.len().max(1) as f64
    };
    let reference = names.first().map_or(1.0, |n| mean(n));
    names.iter().map(|n| reference / mean(n).max(1e-9)).collect()
}

/// The mean seconds of the whole model's forward and backward on `probe` on every device at
/// once, one thread each (after runs each alone, so that first-use compilation is not timed),
/// each repeating it for the same `window_s` of wall time: a faster device keeps running while
/// a slower one finishes, as under a data-parallel split by speed, so that no device's timing
/// includes stretches it ran alone (the tail of its last run aside).
fn all_at_once_s(make: &dyn Fn(&Device) -> Result<Sequential>, probe: &Tensor, devices: &[Device], window_s: f64) -> Result<Vec<f64>> {
    let copies = devices.iter().map(|d| Ok((make(d)?, probe.to(d)?))).collect::<Result<Vec<_>>>()?;
    let start = std::sync::Barrier::new(devices.len());
    // The caller's autocast is this thread's: each device's thread runs under it too.
    let cast = crate::tensor::autocast_dtype();
    std::thread::scope(|scope| {
        let runs: Vec<_> = copies
            .iter()
            .zip(devices)
            .map(|((m, x), d)| {
                let start = &start;
                scope.spawn(move || -> Result<f64> {
                    crate::tensor::autocast(cast, || {
                        start.wait();
                        let t0 = Instant::now();
                        let mut runs = 0u32;
                        while runs == 0 || t0.elapsed().as_secs_f64() < window_s {
                            let root = m.forward(x)?.sum_all()?;
                            if root.needs_grad() {
                                root.backward()?;
                            }
                            d.sync()?;
                            runs += 1;
                        }
                        Ok(t0.elapsed().as_secs_f64() / f64::from(runs))
                    })
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().map_err(|_| crate::Error::Panicked("plan::measure: a calibration thread panicked".into()))?).collect()
    })
}

/// Latency (a 4-byte copy) and bandwidth (a 4 MiB copy) from `a` to `b`, best of [`RUNS`].
/// At most this many devices have every pair's link timed (28 pairs); more share the first
/// pair's as [`Cluster::within`].
const PAIRS_UP_TO: usize = 8;

/// The link of every pair of `devices`, each timed one way (copies cost alike both ways over
/// PCIe and host staging); empty for one device or more than [`PAIRS_UP_TO`].
fn measure_links(devices: &[Device]) -> Result<Vec<Vec<Link>>> {
    let n = devices.len();
    if !(2..=PAIRS_UP_TO).contains(&n) {
        return Ok(Vec::new());
    }
    let mut links = vec![vec![Link { latency_s: 0.0, bytes_per_s: f64::INFINITY }; n]; n];
    for a in 0..n {
        for b in a + 1..n {
            let l = measure_link(&devices[a], &devices[b])?;
            (links[a][b], links[b][a]) = (l, l);
        }
    }
    Ok(links)
}

fn measure_link(a: &Device, b: &Device) -> Result<Link> {
    let time = |n: usize| -> Result<f64> {
        let t = Tensor::zeros([n], a)?;
        let mut best = f64::INFINITY;
        for _ in 0..RUNS {
            let t0 = Instant::now();
            let moved = t.to(b)?;
            b.sync()?;
            best = best.min(t0.elapsed().as_secs_f64());
            drop(moved);
        }
        Ok(best)
    };
    let latency_s = time(1)?;
    let n = 1 << 20;
    let big = time(n)?;
    Ok(Link { latency_s, bytes_per_s: (n * 4) as f64 / (big - latency_s).max(1e-9) })
}
