//! The planner's inputs: what each layer costs, what each device and link can do, and the
//! estimate of one layout (step time and memory per device) computed from them.
use super::Layout;
use crate::DType;

/// One pipeline-cuttable unit of a model (a layer, or a transformer block) as the cost model
/// sees it. Times are per sample on a device of [`DeviceSpec::speed`] 1.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerCost {
    pub name: String,
    pub forward_s: f64,
    pub backward_s: f64,
    /// Seconds every forward or backward pass of a micro-batch costs however few its samples:
    /// kernel launches and the floor below which a device is not kept busy. What makes tiny
    /// micro-batches and thin tensor-parallel slices slow.
    pub fixed_s: f64,
    /// Bytes of its parameters (f32).
    pub param_bytes: u64,
    /// Bytes of its largest parameter tensor (f32): what an offloaded optimizer's update holds
    /// on the device at once, times the state tensors. Calibrations from before it read 0,
    /// which counts the whole layer.
    #[serde(default)]
    pub largest_param_bytes: u64,
    /// Bytes per sample its forward keeps for the backward.
    pub activation_bytes: u64,
    /// Bytes per sample of its output: what a pipeline cut after it sends each way, and what a
    /// tensor-parallel split of it all-reduces.
    pub output_bytes: u64,
    /// Whether tensor parallelism splits it (Megatron's column/row split of an MLP or an
    /// attention block): degree `t` divides its compute, parameters and activations by `t` and
    /// adds two all-reduces of its output in the forward and two in the backward.
    pub tensor_parallel: bool,
    /// Bytes of its parameters that are copies of an earlier layer's (a language model's head
    /// tied to its embedding), with that layer's index: a stage holding both holds them once,
    /// as one device's model does; stages that hold one each keep a copy each.
    pub tied: Option<(usize, u64)>,
    /// Seconds of the optimizer's update of its parameters (on a device of speed 1), once per
    /// step: divided by the tensor degree, and by the data degree where sharding divides the
    /// update (ZeRO-1/2/3).
    pub update_s: f64,
}

/// What is trained: the layers in order, the global batch, and the bytes of training state per
/// parameter byte (weights, gradients and optimizer state: 2 + the optimizer's states, so 4
/// for Adam).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    pub layers: Vec<LayerCost>,
    pub batch: usize,
    pub state_per_param_byte: u64,
    /// The type ZeRO-2/3 keep each device's gradient shard in
    /// ([`DataParallelConfig::grad_dtype`](crate::parallel::DataParallelConfig::grad_dtype)):
    /// planned for, not searched, since it changes the numerics. Calibrations and plan files
    /// from before it read as F32.
    #[serde(default = "f32_grads")]
    pub grad_dtype: DType,
    /// Optimizer state tensors per parameter kept in host memory
    /// ([`OptimConfig::offload`](crate::optim::OptimConfig::offload)), not counted in
    /// `state_per_param_byte`: each step moves them to their devices and back, which the
    /// estimate adds to the update as host-staged transfers. Files from before it read 0.
    #[serde(default)]
    pub offloaded_states: u64,
}

fn f32_grads() -> DType {
    DType::F32
}

impl Workload {
    /// The same work with every time multiplied by `factor`: layer costs measured on one device
    /// expressed on another reference, `factor` being the measured device's throughput over
    /// the reference's (costs measured on a CPU of 0.1 TFLOP/s, planned for M60s of 4.8, scale
    /// by 0.1 / 4.8).
    pub fn scaled(&self, factor: f64) -> Workload {
        let layers = self
            .layers
            .iter()
            .map(|l| LayerCost { forward_s: l.forward_s * factor, backward_s: l.backward_s * factor, fixed_s: l.fixed_s * factor, ..l.clone() })
            .collect();
        Workload { layers, ..self.clone() }
    }
}

/// One device: its throughput relative to the layer costs' reference device, its memory, and
/// the server it sits in (links within a server are [`Cluster::within`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSpec {
    pub name: String,
    pub speed: f64,
    pub memory: u64,
    pub server: usize,
}

/// A link's cost: `latency_s + bytes / bytes_per_s` per message.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Link {
    pub latency_s: f64,
    /// Infinite for no link at all (one device): `"inf"` in JSON, which has no infinity.
    #[serde(with = "unbounded")]
    pub bytes_per_s: f64,
}

/// An `f64` that may be infinite, in JSON: a number, or the string `"inf"`.
mod unbounded {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_infinite() && *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_f64(*v)
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Written::deserialize(d)? {
            Written::Number(v) => Ok(v),
            Written::Text(t) if t == "inf" => Ok(f64::INFINITY),
            Written::Text(t) => Err(serde::de::Error::custom(format!("{t:?} is not a number nor \"inf\""))),
        }
    }
}

impl Link {
    /// A ring all-reduce of `bytes` over `n` members: `2(n-1)` messages of `bytes/n`, a
    /// reduce-scatter then an all-gather.
    pub fn all_reduce_s(&self, bytes: f64, n: usize) -> f64 {
        2.0 * self.all_gather_s(bytes, n)
    }
    /// A ring reduce-scatter of `bytes` over `n` members (each ends with the sum of its
    /// `bytes/n`): `n-1` messages of `bytes/n`.
    pub fn reduce_scatter_s(&self, bytes: f64, n: usize) -> f64 {
        self.all_gather_s(bytes, n)
    }
    /// A ring all-gather of `n` blocks of `bytes/n` into `bytes` on every member: `n-1`
    /// messages of `bytes/n`.
    pub fn all_gather_s(&self, bytes: f64, n: usize) -> f64 {
        if n < 2 {
            return 0.0;
        }
        (n as f64 - 1.0) * (self.latency_s + bytes / n as f64 / self.bytes_per_s)
    }
    pub fn send_s(&self, bytes: f64) -> f64 {
        self.latency_s + bytes / self.bytes_per_s
    }
}

/// Devices and their links: a server's devices talk over `within` (PCIe, NVLink), servers over
/// `across` (Ethernet, InfiniBand).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cluster {
    pub devices: Vec<DeviceSpec>,
    pub within: Link,
    pub across: Link,
    /// How much slower each device computes when all of them compute at once than when it runs
    /// alone: 1 for independent GPUs, more where devices share the host's cores (CPU devices,
    /// software adapters such as lavapipe), which one-at-a-time calibration cannot see. A layout
    /// on `k` of the `n` devices pays `1 + (contention - 1)(k - 1)/(n - 1)`.
    pub contention: f64,
    /// Layouts tried on these devices ([`tried`](super::tried)): what each cost per step
    /// beyond the layer model, added to its estimate. Empty for a described cluster and in
    /// files from before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_overheads: Vec<super::StepOverhead>,
    /// The link of each pair of devices (`links[a][b]`, devices in [`Cluster::devices`]'
    /// order) where each pair was measured: a CPU and a GPU talk over host staging, two GPUs
    /// over peer-to-peer where the driver allows it, so pairs differ. Empty: [`Cluster::within`]
    /// inside a server and [`Cluster::across`] between servers, as for described clusters and
    /// files from before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<Vec<Link>>,
}

/// The most devices a plan searches (a described cluster's, or a calibrated one's): every
/// count of the fastest devices up to it, each with its factorisations, micro-batch counts and
/// cuts, is a search that grows faster than the devices (256 devices plan in a few seconds
/// in a release build; eight thousand ran for minutes), and one device's description each
/// is allocated before the search.
pub const MAX_CLUSTER_DEVICES: usize = 256;

/// The fp32 throughput of speed 1 in the described clusters ([`Cluster::dual_m60`],
/// [`Cluster::h100_nvlink`]): one M60 GPU, ~4.8 TFLOP/s.
pub const REFERENCE_FLOPS: f64 = 4.8e12;

impl Cluster {
    /// A described cluster by name: `dual-m60:N` ([`Cluster::dual_m60`]) or `h100:N`
    /// ([`Cluster::h100_nvlink`]), `N` servers.
    /// At most [`MAX_CLUSTER_DEVICES`] devices in all, checked before any is described.
    pub fn parse(spec: &str) -> crate::Result<Cluster> {
        let bad = |why: &str| crate::Error::invalid("--cluster", format!("'{spec}': {why}; give dual-m60:N or h100:N (N servers)"));
        let (name, n) = spec.split_once(':').ok_or_else(|| bad("no server count"))?;
        let per_server = match name {
            "dual-m60" => 4,
            "h100" => 8,
            _ => return Err(bad("unknown cluster name")),
        };
        let servers: u64 = n.parse().ok().filter(|n| *n >= 1).ok_or_else(|| bad("the server count must be a whole number of at least 1"))?;
        let max = MAX_CLUSTER_DEVICES / per_server;
        if servers > max as u64 {
            let why = format!("{servers} servers of {per_server} devices each is more than the {MAX_CLUSTER_DEVICES} devices a plan searches; at most {max} servers");
            return Err(bad(&why));
        }
        let servers = servers as usize;
        Ok(if per_server == 4 { Cluster::dual_m60(servers) } else { Cluster::h100_nvlink(servers) })
    }
    /// `servers` servers of `per_server` devices like `device` each.
    pub fn servers(servers: usize, per_server: usize, device: DeviceSpec, within: Link, across: Link) -> Cluster {
        let devices = (0..servers * per_server)
            .map(|i| DeviceSpec { server: i / per_server, name: format!("{}#{i}", device.name), ..device.clone() })
            .collect();
        Cluster { devices, within, across, contention: 1.0, step_overheads: Vec::new(), links: Vec::new() }
    }
    /// Servers of two Tesla M60 boards (4 GM204 GPUs of 8 GB, ~4.8 TFLOP/s each at speed 1)
    /// on PCIe 3.0 (~12 GB/s, no NVLink, no peer-to-peer assumed), 10 GbE between servers.
    pub fn dual_m60(servers: usize) -> Cluster {
        let gpu = DeviceSpec { name: "M60".into(), speed: 1.0, memory: 8 << 30, server: 0 };
        Cluster::servers(servers, 4, gpu, Link { latency_s: 10e-6, bytes_per_s: 12e9 }, Link { latency_s: 50e-6, bytes_per_s: 1.25e9 })
    }
    /// Servers of 8 H100 SXM GPUs (80 GB, ~60x an M60's fp32 rate with TF32 tensor cores at
    /// the reference's scale) on NVLink (~450 GB/s), 8x400 Gb/s InfiniBand between (~50 GB/s
    /// per GPU pair, 5 µs).
    pub fn h100_nvlink(servers: usize) -> Cluster {
        let gpu = DeviceSpec { name: "H100".into(), speed: 60.0, memory: 80 << 30, server: 0 };
        Cluster::servers(servers, 8, gpu, Link { latency_s: 3e-6, bytes_per_s: 450e9 }, Link { latency_s: 5e-6, bytes_per_s: 50e9 })
    }
    /// The link between devices `a` and `b`: measured for the pair where [`Cluster::links`]
    /// has it, else by server.
    pub fn link(&self, a: usize, b: usize) -> Link {
        if let Some(l) = self.links.get(a).and_then(|row| row.get(b)).filter(|_| a != b) {
            return *l;
        }
        if self.devices[a].server == self.devices[b].server {
            self.within
        } else {
            self.across
        }
    }

    /// The same cluster with its devices (and their links) in the order `order` gives, as
    /// indices into this one's devices.
    pub fn reordered(&self, order: &[usize]) -> Cluster {
        let devices = order.iter().map(|&i| self.devices[i].clone()).collect();
        let links = match self.links.len() == self.devices.len() {
            true => order.iter().map(|&a| order.iter().map(|&b| self.links[a][b]).collect()).collect(),
            false => Vec::new(),
        };
        Cluster { devices, links, ..self.clone() }
    }

    /// Device indices fastest first, stable among equals: the order the search places them in.
    pub fn by_speed(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.devices.len()).collect();
        order.sort_by(|&a, &b| self.devices[b].speed.total_cmp(&self.devices[a].speed));
        order
    }
    /// The slowdown of each device's compute when `k` of the devices run at once (see
    /// [`Cluster::contention`]).
    pub fn contention_of(&self, k: usize) -> f64 {
        let n = self.devices.len();
        if k < 2 || n < 2 {
            return 1.0;
        }
        1.0 + (self.contention - 1.0).max(0.0) * (k - 1) as f64 / (n - 1) as f64
    }
    /// The slowest link among `members`: of the hops of their ring (each member to the next)
    /// where pairs were measured, else by server.
    pub fn group_link(&self, members: &[usize]) -> Link {
        if !self.links.is_empty() && members.len() > 1 {
            let hops = (0..members.len()).map(|i| self.link(members[i], members[(i + 1) % members.len()]));
            return hops
                .reduce(|a, b| Link { latency_s: a.latency_s.max(b.latency_s), bytes_per_s: a.bytes_per_s.min(b.bytes_per_s) })
                .unwrap_or(self.within);
        }
        let one_server = members.windows(2).all(|w| self.devices[w[0]].server == self.devices[w[1]].server);
        if one_server {
            self.within
        } else {
            self.across
        }
    }
}

/// What the cost model predicts for one layout.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimate {
    pub layout: Layout,
    /// Predicted seconds per optimizer step, and its parts.
    pub step_s: f64,
    pub compute_s: f64,
    pub comm_s: f64,
    /// The pipeline's idle fraction, `(p - 1) / (m + p - 1)`.
    pub bubble: f64,
    /// Seconds of the step outside the layer model, measured by trying the layout or a
    /// variant of it ([`Cluster::overhead_for`]); 0 where none was tried, and in files from
    /// before it.
    #[serde(default)]
    pub overhead_s: f64,
    /// Peak bytes per device, in device order of the layout's placement.
    pub memory: Vec<u64>,
}
