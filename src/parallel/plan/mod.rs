//! Choosing a parallel layout from a cost model: data, tensor and pipeline degrees, the layer
//! cut of each stage, micro-batches and recomputation, within each device's memory, with the
//! predicted step time of each candidate and the reason each rejected one was excluded.
//!
//! The model is analytic over measured or published inputs ([`LayerCost`] per layer,
//! [`DeviceSpec`] and [`Link`] per device and link): a stage's time per micro-batch is its
//! layers' forward and backward (and the recomputed forward) at its slowest device's speed,
//! tensor-split layers divided by the tensor degree plus four ring all-reduces of their output,
//! and a fixed cost per pass however small the micro-batch;
//! a pipeline step is `(m + p - 1)` times the slowest stage including its sends; the gradients'
//! ring all-reduce over the data-parallel replicas follows, not overlapped (an upper bound),
//! then the optimizer's update of the stage's parameters (timed per layer, divided by the
//! tensor degree and, under sharding, by the data degree).
//! Memory per device is its stage's training state (split by the tensor degree, and by the
//! data degree as the sharding mode has it, see [`Shard`]; a tied head counted once where its
//! stage holds the embedding) plus the activations of the
//! micro-batches in flight under 1F1B (`min(m, p - s)` at stage `s`), or with recomputation
//! only the stage inputs plus one layer's activations (without stages, recomputation is the
//! GPT's per block: each block, a layer tensor parallelism splits, keeps only its input, and
//! only the blocks run forward twice); a layout fits when that is within
//! [`MEMORY_USABLE`] of each device's memory (its budget where one is set); ZeRO-2/3's
//! gradient shards count in [`Workload::grad_dtype`]'s bytes. Optimizer state offloaded to host
//! memory ([`Workload::offloaded_states`], or by a layout that [offloads](Layout::offload),
//! which the search tries for each layout that does not fit without it) counts only as its
//! largest tensor's while updated, and adds its bytes over the host link to the update's
//! time. Data parallelism's gradient buckets (ZeRO-3's units of gathered parameters) count
//! at [`Layout::bucket`]'s size, at least the largest parameter's, and each bucket pays its
//! messages' latency; a layout that does not fit with the default buckets is tried with
//! [`SMALL_BUCKETS`], then with the optimizer state offloaded, with each size.
//! Sharding's reduce-scatters and all-gathers replace or add to the all-reduce in the
//! step time. Of the layouts that fit, the
//! fastest is chosen, unless one on fewer devices is predicted within [`MORE_DEVICES_MARGIN`]
//! of it: a near tie is calibration noise, and more devices cost more than their prediction.
//!
//! [`measure`] calibrates the inputs on this machine's devices (and [`Cluster::contention`],
//! how much devices that share the host's cores slow each other) under the caller's autocast,
//! and [`measure_reusing`] keeps the calibration on disk for later runs on the same devices
//! ([`Reuse`]); [`Cluster::dual_m60`] and
//! [`Cluster::h100_nvlink`] describe published clusters; [`measure_gpt`] calibrates the GPT
//! block by block, and [`measure_gpt_scaled`] a GPT too large to time here, from a
//! [`Reduction`] of it (one block, narrower, shorter windows) scaled by counted FLOPs, with
//! the full shape's bytes counted ([`ByteModel`]): GPT-2 XL's shape for a described cluster
//! in seconds and a few hundred megabytes. [`plan`] searches every layout, [`plan_within`] only those a filter allows
//! ([`unbuildable`] for a `Sequential`), [`plan_cut_within`] with stage cuts only where a model
//! allows them ([`gpt_unbuildable`] and [`gpt_cuttable`] for the GPT); [`Plan::build`] makes
//! the chosen strategy of a `Sequential` with the [`Parallel`](crate::parallel::Parallel)
//! builders and [`Plan::build_gpt`] that of the GPT, [`Plan::save`] / [`Plan::load`] keep a
//! plan as JSON, and [`Plan::megatron`] holds a cluster's plan against Megatron-LM's rule.
//! [`measure_job`] plans a job of several processes (`mpirun`): every rank's devices
//! calibrated in turn, the link between processes measured, one plan for all of them.
//! [`tried`] runs the layout the search chooses for a few real steps ([`step_seconds`]), adds
//! what it cost beyond the layer model to its estimate (and to its untried variants'), and
//! searches again until the choice is a layout that ran: the per-step costs no layer timing
//! sees (thread hand-offs, host staging, the loss, the optimizer's launches) decide small
//! steps, and a layout that fails its trial is rejected with the error.
//!
//! ```
//! use tandem::parallel::plan::{plan, Cluster, LayerCost, Workload};
//! // A 24-block model of 1.3 GB of f32 parameters per 6 blocks: too big for one 8 GB M60 with
//! // Adam's state, so it must be split.
//! let block = LayerCost { name: "block".into(), forward_s: 2e-3, backward_s: 4e-3, fixed_s: 50e-6, param_bytes: 220 << 20,
//!     largest_param_bytes: 55 << 20, activation_bytes: 24 << 20, output_bytes: 2 << 20, tensor_parallel: true, tied: None, update_s: 1e-3 };
//! let work = Workload { layers: vec![block; 24], batch: 32, state_per_param_byte: 4, grad_dtype: tandem::DType::F32, offloaded_states: 0 };
//! let p = plan(&work, &Cluster::dual_m60(2))?;
//! // Megatron's rule holds: a tensor-parallel group never spans servers.
//! assert!(p.best.layout.tensor <= 4);
//! println!("{p}");
//! # Ok::<(), tandem::Error>(())
//! ```
mod bounds;
mod build;
mod cost;
mod estimate;
mod file;
mod gpt;
mod job;
mod measure;
mod paper;
mod reuse;
mod rules;
mod shard;
mod show;
mod tried;

pub use bounds::{MAX_BYTES, MAX_LAYERS, MAX_LAYER_S};
pub use build::unbuildable;
pub use cost::{Cluster, DeviceSpec, Estimate, LayerCost, Link, Workload, MAX_CLUSTER_DEVICES, REFERENCE_FLOPS};
pub use estimate::estimate;
use estimate::{best_cuts, micro_batch, replica_speed};
pub use file::PLAN_VERSION;
pub use gpt::{gpt_cuttable, gpt_unbuildable, measure_gpt, measure_gpt_reusing};
pub use job::{combine, job_unbuildable, measure_job, measure_job_speeds, RankCalibration};
pub use measure::{measure, measure_reusing, measure_speeds, measure_speeds_of};
pub use paper::{measure_gpt_scaled, scaled_gpt, ByteModel, Reduction};
pub use reuse::{Calibration, Reuse, MAX_AGE_S, REUSE_ENV, SPEED_DRIFT};
pub use shard::{DEFAULT_BUCKET_BYTES, SMALL_BUCKETS};
pub use tried::{faster_than_modelled, step_seconds, tried, StepOverhead, Trial, MAX_TRIALS, NEGATIVE_OVERHEAD_SHARE, TRIALS_BUDGET_S};

use crate::parallel::{OptimConfig, Shard};
use crate::{Error, Result};
use std::fmt;

/// A parallel layout: `data x tensor x pipeline` devices, Megatron's order (tensor groups of
/// consecutive devices, then pipeline stages, then data-parallel replicas).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    pub data: usize,
    pub tensor: usize,
    pub pipeline: usize,
    pub micro_batches: usize,
    pub recompute: bool,
    /// The first layer of each stage after the first.
    pub cuts: Vec<usize>,
    /// How the data-parallel replicas shard their training state (ZeRO's stages; always
    /// [`Shard::None`] without replicas). Plan files of version 1, before this field, read as
    /// none.
    #[serde(default)]
    pub shard: Shard,
    /// Whether the optimizer's state lives in host memory, copied to each device for its update
    /// and back ([`OptimConfig::offload`](crate::optim::OptimConfig::offload)): the same
    /// results bit for bit, less device memory, more transfers. The search tries it only for
    /// a layout that does not fit without it. Plan files from before it read false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offload: bool,
    /// The gradient bucket of the layout's data parallelism in bytes, which is also ZeRO-3's
    /// unit of parameters gathered at once
    /// ([`DataParallelConfig::bucket_bytes`](crate::parallel::DataParallelConfig::bucket_bytes));
    /// `None`: its default, [`DEFAULT_BUCKET_BYTES`]. Smaller buckets hold less and send more
    /// messages: the search tries [`SMALL_BUCKETS`] only for a layout that does not fit
    /// without. Plan files from before it read `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u64>,
    /// With data and pipeline degrees above 1: the data axis inside the pipeline's stages
    /// (Megatron-LM's rank order, pipeline outermost), so that the replicas of a stage sit on
    /// neighbouring devices, in one server, and each pipeline spans the servers; otherwise each
    /// replica is a row of consecutive devices and the data axis is the outermost. Plan files
    /// from before it read false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub data_inner: bool,
}

impl Layout {
    pub fn devices(&self) -> usize {
        self.data * self.tensor * self.pipeline
    }
    /// The device index (into the cluster) of replica `r`, stage `s`, tensor rank `t`.
    pub fn device(&self, r: usize, s: usize, t: usize) -> usize {
        if self.data_inner {
            (s * self.data + r) * self.tensor + t
        } else {
            (r * self.pipeline + s) * self.tensor + t
        }
    }
    /// `devices` (in the layout's cluster order) replica by replica, each replica's stage by
    /// stage and tensor rank by rank: the rows a grid takes.
    pub fn replica_major<T: Clone>(&self, devices: &[T]) -> Vec<T> {
        (0..self.data)
            .flat_map(|r| (0..self.pipeline).flat_map(move |s| (0..self.tensor).map(move |t| (r, s, t))))
            .map(|(r, s, t)| devices[self.device(r, s, t)].clone())
            .collect()
    }
    /// [`Layout::bucket`], or the default where it is `None`.
    pub fn bucket_bytes(&self) -> u64 {
        self.bucket.unwrap_or(DEFAULT_BUCKET_BYTES)
    }
    /// The layer range of stage `s` of a model of `layers` layers.
    pub fn stage_layers(&self, s: usize, layers: usize) -> std::ops::Range<usize> {
        let start = if s == 0 { 0 } else { self.cuts[s - 1] };
        let end = self.cuts.get(s).copied().unwrap_or(layers);
        start..end
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "data {} x tensor {} x pipeline {}", self.data, self.tensor, self.pipeline)?;
        if self.pipeline > 1 || self.micro_batches > 1 {
            write!(f, ", {} micro-batches", self.micro_batches)?;
        }
        if self.pipeline > 1 {
            write!(f, ", cuts at {:?}", self.cuts)?;
        }
        if self.recompute {
            write!(f, ", recompute")?;
        }
        if self.shard != Shard::None {
            write!(f, ", shard {}", self.shard.name())?;
        }
        if self.data_inner {
            write!(f, ", data inside stages")?;
        }
        if self.offload {
            write!(f, ", offload")?;
        }
        if let Some(b) = self.bucket {
            write!(f, ", buckets of {}", bytes(b))?;
        }
        Ok(())
    }
}

/// A layout the search excluded, and the constraint that excluded it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rejected {
    pub layout: Layout,
    pub why: String,
}

/// The search's answer: the fastest layout that fits, the next best, and what was excluded.
/// [`Plan::build`] makes the strategy it names; [`Plan::save`] and [`Plan::load`] keep it as
/// JSON.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// What the plan is for, as `Module::describe` names it (`Gpt(n_layer=4, ..)`), so that a
    /// plan is not trained on another model; empty in plans written before it was recorded,
    /// and for workloads given by hand.
    #[serde(default)]
    pub model: String,
    /// The cluster's device names in the order the layouts place them: fastest first (stable
    /// among equals), so that the search over "the first `k` devices" leaves out the slowest.
    pub devices: Vec<String>,
    /// The global batch planned for.
    pub batch: usize,
    /// Samples of the batch each data-parallel replica of `best` takes, in proportion to the
    /// replicas' speeds.
    pub shares: Vec<usize>,
    pub best: Estimate,
    /// The other fitting layouts, fastest first (those before `best`'s time are on more
    /// devices and predicted less than [`MORE_DEVICES_MARGIN`] faster).
    pub alternatives: Vec<Estimate>,
    pub rejected: Vec<Rejected>,
    /// The type a sharded layout keeps its gradient shards in ([`Workload::grad_dtype`]);
    /// [`Plan::build`] gives it to ZeRO-2/3 layouts. Plan files from before it read as F32.
    #[serde(default = "f32_grads")]
    pub grad_dtype: crate::DType,
    /// Optimizer state tensors per parameter planned in host memory (the workload's
    /// [`Workload::offloaded_states`], and the devices' states where the best layout
    /// [offloads](Layout::offload) them): the layouts' memory leaves them out, so a run
    /// offloads them too ([`Plan::optim`]). Plan files from before it read 0.
    #[serde(default)]
    pub offloaded_states: u64,
    /// For a plan of a job of several processes ([`measure_job`]): each of [`Plan::devices`]'
    /// `(rank, index among that rank's devices)`. Empty for one process (and in plan files
    /// from before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<(usize, usize)>,
    /// The layouts tried before this one was chosen ([`tried`], [`measure_job`]), in the
    /// order tried; empty where none was (a described cluster, `--no-trials`, older files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<StepOverhead>,
    /// The precision the plan chose where precision was searched ([`fastest_precision`]): a
    /// run of the plan trains in it. `None`: the run's own, as in plans from before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<crate::optim::Precision>,
    /// The precisions searched beside the chosen one, each with its best layout and time or
    /// why none fits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub precisions: Vec<(crate::optim::Precision, String)>,
}

fn f32_grads() -> crate::DType {
    crate::DType::F32
}

impl Plan {
    /// `opt` as a run of this plan needs it: with its state in host memory where the plan keeps
    /// it there ([`Plan::offloaded_states`]), which changes no result.
    pub fn optim(&self, opt: &OptimConfig) -> OptimConfig {
        opt.clone().offloaded(opt.offload || self.offloaded_states > 0)
    }

    /// The gradient shards' type of layout `l`: [`Plan::grad_dtype`] where it shards
    /// gradients (ZeRO-2/3), F32 elsewhere, which has no shards.
    pub fn grad_dtype_of(&self, l: &Layout) -> crate::DType {
        if matches!(l.shard, Shard::Grads | Shard::Full) {
            self.grad_dtype
        } else {
            crate::DType::F32
        }
    }
}

/// Searches every layout of the cluster's `k` fastest devices for each `k` (so a device too slow
/// to help is left out, as is one that helps by less than [`MORE_DEVICES_MARGIN`]): every factorisation `data x tensor x pipeline = k`, micro-batch counts
/// dividing each replica's batch, recomputation on and off, each sharding mode ([`Shard`])
/// where there are replicas, and for each the layer cut that minimises the slowest stage
/// (dynamic programming over the stages' speeds). Each device's memory
/// ([`DeviceSpec::memory`]: its budget where one is set) bounds its peak. Errors when no
/// layout fits, and on inputs out of bounds (more than [`MAX_CLUSTER_DEVICES`] devices or
/// [`MAX_LAYERS`] layers, times not finite or over [`MAX_LAYER_S`], sizes over [`MAX_BYTES`]);
/// the error for no fit sums the rejections of every layout up by reason.
pub fn plan(work: &Workload, cluster: &Cluster) -> Result<Plan> {
    plan_within(work, cluster, &|_, _| None)
}

/// [`plan`] over the layouts `excluded` says nothing against; each it names a reason for is
/// rejected with that reason; it is given the layout and its replicas' batch shares.
/// `|l, shares| unbuildable(l, shares, &model)` keeps to what [`Plan::build`] can
/// make of a `Sequential`.
pub fn plan_within(work: &Workload, cluster: &Cluster, excluded: &dyn Fn(&Layout, &[usize]) -> Option<String>) -> Result<Plan> {
    plan_cut_within(work, cluster, excluded, &|_| true)
}

/// [`plan_within`] with pipeline cuts only before the layers `cuttable` allows (a layer index
/// `1..layers`): a model whose stages must open and close on certain layers, such as the GPT
/// ([`gpt_cuttable`]: its embeddings open the first stage, its head closes the last). A
/// pipeline with no allowed cut is rejected with that reason.
pub fn plan_cut_within(
    work: &Workload,
    cluster: &Cluster,
    excluded: &dyn Fn(&Layout, &[usize]) -> Option<String>,
    cuttable: &dyn Fn(usize) -> bool,
) -> Result<Plan> {
    if work.layers.is_empty() || work.batch == 0 || cluster.devices.is_empty() {
        return Err(Error::invalid("plan", "a plan needs layers, a batch of at least 1 and at least one device"));
    }
    if let Some(why) = bounds::out_of_bounds(work, cluster) {
        return Err(Error::invalid("plan", why));
    }
    let sorted = cluster.reordered(&cluster.by_speed());
    let cluster = &sorted;
    let mut fits = Vec::new();
    let mut rejected = Vec::new();
    for k in 1..=cluster.devices.len() {
        for (data, tensor, pipeline) in factorisations(k) {
            if pipeline > work.layers.len() {
                continue;
            }
            if tensor > 1 && !work.layers.iter().any(|l| l.tensor_parallel) {
                continue;
            }
            for micro_batches in micro_batch_counts(work.batch, data, pipeline) {
                // Data inside the stages only changes which devices a layout takes where both
                // the data and the pipeline axes exist.
                let orders: &[bool] = if data > 1 && pipeline > 1 { &[false, true] } else { &[false] };
                let variants =
                    [false, true].into_iter().flat_map(|r| shard::modes(data).iter().flat_map(move |s| orders.iter().map(move |&o| (r, *s, o))));
                for (recompute, shard, data_inner) in variants {
                    let mut layout = Layout {
                        data,
                        tensor,
                        pipeline,
                        micro_batches,
                        recompute,
                        cuts: Vec::new(),
                        shard,
                        offload: false,
                        bucket: None,
                        data_inner,
                    };
                    if let Some(why) = unsplittable(work, cluster, &layout)
                        .or_else(|| excluded(&layout, &shares_of(work.batch, cluster, &layout).unwrap_or_default()))
                    {
                        rejected.push(Rejected { layout, why });
                        continue;
                    }
                    match best_cuts(work, cluster, &layout, cuttable) {
                        Some(cuts) => layout.cuts = cuts,
                        None => {
                            let why = format!("no allowed cut of the {} layers into {pipeline} stages", work.layers.len());
                            rejected.push(Rejected { layout, why });
                            continue;
                        }
                    }
                    if let Some(why) = cluster.overhead_of(&layout).and_then(|o| o.failed.clone()) {
                        rejected.push(Rejected { layout, why });
                        continue;
                    }
                    let e = estimate(work, cluster, &layout);
                    let Some(why) = over_memory(cluster, &e) else {
                        fits.push(e);
                        continue;
                    };
                    rejected.push(Rejected { layout: layout.clone(), why });
                    // Smaller buckets only add messages, offloading the optimizer state only
                    // transfers: each is worth it only to fit.
                    for variant in fitting_variants(work, &layout) {
                        if let Some(why) = cluster.overhead_of(&variant).and_then(|o| o.failed.clone()) {
                            rejected.push(Rejected { layout: variant, why });
                            continue;
                        }
                        let e = estimate(work, cluster, &variant);
                        match over_memory(cluster, &e) {
                            Some(why) => rejected.push(Rejected { layout: variant, why }),
                            None => fits.push(e),
                        }
                    }
                }
            }
        }
    }
    fits.sort_by(|a, b| a.step_s.total_cmp(&b.step_s));
    if fits.is_empty() {
        return Err(Error::invalid("plan", format!("no layout fits the devices' memory ({})", show::by_reason(&rejected))));
    }
    let best = fits.remove(fewest_devices_within_margin(&fits));
    let devices = cluster.devices.iter().map(|d| d.name.clone()).collect();
    let shares = shares_of(work.batch, cluster, &best.layout)?;
    let offloaded_states = offloaded_states(work, &best.layout);
    Ok(Plan {
        model: String::new(),
        devices,
        batch: work.batch,
        shares,
        best,
        alternatives: fits,
        rejected,
        grad_dtype: work.grad_dtype,
        offloaded_states,
        processes: Vec::new(),
        tried: Vec::new(),
        precision: None,
        precisions: Vec::new(),
    })
}

/// The fastest of the plans `plan_for` makes in each of `candidates` (a calibration per
/// precision: halves change the layers' times and halve activations, so a layout that does
/// not fit in f32 may in bf16), with [`Plan::precision`] set and the others' best (or why none
/// fits) in [`Plan::precisions`]; the earlier candidate on a tie. Precision changes the
/// numerics, so this search is the caller's choice (`--search-precision`). Errors only when
/// no candidate has a plan, with each one's reason.
pub fn fastest_precision(candidates: &[crate::optim::Precision], plan_for: &mut dyn FnMut(crate::optim::Precision) -> Result<Plan>) -> Result<Plan> {
    let mut planned: Vec<(crate::optim::Precision, Result<Plan>)> = candidates.iter().map(|&c| (c, plan_for(c))).collect();
    let best = planned.iter().enumerate().filter_map(|(i, (_, p))| p.as_ref().ok().map(|p| (i, p.best.step_s))).fold(
        None,
        |acc: Option<(usize, f64)>, (i, s)| match acc {
            Some((_, b)) if b <= s => acc,
            _ => Some((i, s)),
        },
    );
    let Some((i, _)) = best else {
        let why: Vec<String> =
            planned.iter().map(|(c, p)| format!("{}: {}", c.name(), p.as_ref().err().map_or(String::new(), |e| e.to_string()))).collect();
        return Err(Error::invalid("plan", format!("no precision has a plan ({})", why.join("; "))));
    };
    let (chosen, p) = planned.remove(i);
    let mut p = p?;
    p.precision = Some(chosen);
    p.precisions = planned
        .into_iter()
        .map(|(c, other)| {
            let said = match other {
                Ok(o) => format!("{:.2} ms/step ({})", o.best.step_s * 1e3, o.best.layout),
                Err(e) => e.to_string(),
            };
            (c, said)
        })
        .collect();
    Ok(p)
}

/// The variants of `l` (which does not fit) that hold less on each device: with
/// [`SMALL_BUCKETS`] where it has buckets (data parallelism, or one device accumulating
/// micro-batches), then with the optimizer state offloaded where `work` keeps any on the
/// devices, with each bucket size.
fn fitting_variants(work: &Workload, l: &Layout) -> Vec<Layout> {
    let buckets = l.data > 1 || (l.micro_batches > 1 && l.tensor == 1 && l.pipeline == 1);
    let sizes: Vec<Option<u64>> = std::iter::once(None).chain(SMALL_BUCKETS.iter().copied().map(Some).filter(|_| buckets)).collect();
    let offloads: &[bool] = if device_states(work) > 0 { &[false, true] } else { &[false] };
    offloads.iter().flat_map(|&offload| sizes.iter().map(move |&bucket| Layout { offload, bucket, ..l.clone() })).filter(|v| v != l).collect()
}

/// Optimizer state tensors per parameter that `work` keeps on the devices (the state bytes
/// per parameter byte beyond the weights and gradients).
fn device_states(work: &Workload) -> u64 {
    work.state_per_param_byte.saturating_sub(2)
}

/// Optimizer state tensors per parameter in host memory under `l`: those the workload already
/// keeps there, and with [`Layout::offload`] the devices' too.
fn offloaded_states(work: &Workload, l: &Layout) -> u64 {
    work.offloaded_states + if l.offload { device_states(work) } else { 0 }
}

/// How much faster than the fastest layout on fewer devices a layout on more must be predicted
/// to be chosen: a calibration of a few seconds on a shared machine varies by about this much,
/// and more devices bring communication and run-to-run variance that a near-tie does not pay
/// for: a near-tie predicted on two devices can run slower than one (an example in
/// benches/README.md).
pub const MORE_DEVICES_MARGIN: f64 = 0.05;

/// The index in `fits` (fastest first) of the layout to choose: among those predicted within
/// [`MORE_DEVICES_MARGIN`] of the fastest, the fastest of those on the fewest devices.
fn fewest_devices_within_margin(fits: &[Estimate]) -> usize {
    let Some(fastest) = fits.first() else { return 0 };
    let near = |e: &&Estimate| e.step_s <= fastest.step_s * (1.0 + MORE_DEVICES_MARGIN);
    let fewest = fits.iter().filter(near).map(|e| e.layout.devices()).min().unwrap_or(0);
    fits.iter().position(|e| near(&e) && e.layout.devices() == fewest).unwrap_or(0)
}

/// Each replica's samples of the batch under `l`: [`proportional_split`](crate::parallel::proportional_split)
/// of it by the replicas' speeds, the split `DataParallel` and `PipelineGrid` make from the same
/// weights.
fn shares_of(batch: usize, cluster: &Cluster, l: &Layout) -> Result<Vec<usize>> {
    let speeds: Vec<f64> = (0..l.data).map(|r| replica_speed(cluster, l, r)).collect();
    crate::parallel::proportional_split(batch, &speeds)
}

/// Why the batch cannot be shared out as `l` asks: equal pipelines take equal parts of equal
/// micro-batches, so the batch must divide into `data x micro_batches`; unequal ones take
/// shares by speed, and data parallelism without stages cuts any batch into near-equal parts
/// (as `DataParallel` does); each micro-batch holds at least one sample.
fn unsplittable(work: &Workload, cluster: &Cluster, l: &Layout) -> Option<String> {
    let speeds: Vec<f64> = (0..l.data).map(|r| replica_speed(cluster, l, r)).collect();
    let equal = speeds.windows(2).all(|w| w[0] == w[1]);
    let parts = l.data * l.micro_batches;
    if equal && l.pipeline > 1 && !work.batch.is_multiple_of(parts) {
        return Some(format!("the batch of {} does not split into {} replicas x {} micro-batches", work.batch, l.data, l.micro_batches));
    }
    (0..l.data)
        .any(|r| micro_batch(work, cluster, l, r) < 1.0)
        .then(|| format!("a replica's share of the batch of {} holds fewer than {} samples", work.batch, l.micro_batches))
}

/// `(data, tensor, pipeline)` with `data * tensor * pipeline = k`.
fn factorisations(k: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for t in (1..=k).filter(|t| k.is_multiple_of(*t)) {
        for p in (1..=k / t).filter(|p| (k / t).is_multiple_of(*p)) {
            out.push((k / t / p, t, p));
        }
    }
    out
}

/// Micro-batch counts worth trying: 1, and powers of two up to each replica's batch (a pipeline
/// needs at least as many as it has stages to fill; accumulation alone trades time for memory).
fn micro_batch_counts(batch: usize, data: usize, pipeline: usize) -> Vec<usize> {
    let per_replica = (batch / data).max(1);
    let mut out: Vec<usize> = std::iter::successors(Some(1usize), |m| Some(m * 2)).take_while(|m| *m <= per_replica && *m <= 256).collect();
    if pipeline > 1 {
        out.retain(|m| *m >= pipeline.min(per_replica));
    }
    out
}

/// The share of each device's memory a layout may plan to use: the rest is headroom for what
/// the estimate does not count (the allocator's rounding, backward's temporaries); it covers
/// how far the allocator's peak exceeded the estimate on a small GPT (benches/README.md).
pub const MEMORY_USABLE: f64 = 0.85;

/// Why `e` does not fit, naming the first device over its usable memory and the memory it has.
fn over_memory(cluster: &Cluster, e: &Estimate) -> Option<String> {
    let usable = |m: u64| (m as f64 * MEMORY_USABLE) as u64;
    e.memory.iter().enumerate().find(|(i, b)| **b > usable(cluster.devices[*i].memory)).map(|(i, b)| {
        let d = &cluster.devices[i];
        format!("memory: needs {} on {}, over {:.0}% of its {}", bytes(*b), d.name, MEMORY_USABLE * 100.0, bytes(d.memory))
    })
}

/// Bytes as [`format_bytes`](crate::backend::format_bytes) writes them.
pub(super) fn bytes(n: u64) -> String {
    crate::backend::format_bytes(n)
}
