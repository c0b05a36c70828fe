//! `Device`: a cheap, thread-safe handle to one opened logical device, plus discovery and specs.
use crate::backend::{Backend, BackendKind, DeviceInfo, DeviceKind, MemoryStats};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// One opened logical device. Cloning shares it; it is `Send + Sync`, so each worker thread can
/// hold its own clone. Opening the same adapter twice gives two independent devices.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// let dev = tandem::Device::cpu();
/// let x = tandem::Tensor::from_vec(vec![1.0, 2.0, 3.0], [3], &dev)?;
/// assert_eq!(x.sum_all()?.to_scalar()?, 6.0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    backend: Arc<dyn Backend>,
    id: u64,
}

impl Device {
    /// Wraps an opened backend as a new logical device.
    pub fn from_backend(backend: Arc<dyn Backend>) -> Self {
        Device { inner: Arc::new(DeviceInner { backend, id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed) }) }
    }
    /// The CPU reference device (one shared instance).
    pub fn cpu() -> Self {
        static CPU: OnceLock<Device> = OnceLock::new();
        CPU.get_or_init(|| Device::from_backend(Arc::new(crate::backend::cpu::CpuBackend::new()))).clone()
    }
    /// A CPU device of its own (its own allocator, statistics and memory budget), as the second
    /// `cpu` of a [`Device::parse`] spec gives.
    pub fn cpu_independent() -> Self {
        Device::from_backend(Arc::new(crate::backend::cpu::CpuBackend::new()))
    }
    pub fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }
    pub fn backend_arc(&self) -> Arc<dyn Backend> {
        self.inner.backend.clone()
    }
    pub fn info(&self) -> &DeviceInfo {
        self.inner.backend.info()
    }
    /// Unique per opened logical device in this process.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// How messages name `a` and `b` side by side: the specs a user types (`wgpu:0`, `cpu`),
    /// with the logical instance only when both have the same spec (`wgpu:0 (instance 2)`).
    pub fn names_of(a: &Device, b: &Device) -> (String, String) {
        if a.spec() == b.spec() {
            (format!("{a:?}"), format!("{b:?}"))
        } else {
            (a.spec(), b.spec())
        }
    }
    /// The spec this device answers to, such as `wgpu:0` or `cpu`.
    pub fn spec(&self) -> String {
        let i = self.info();
        match i.backend {
            BackendKind::Cpu => "cpu".into(),
            b => format!("{}:{}", b.name(), i.ordinal),
        }
    }
    pub fn same(&self, other: &Device) -> bool {
        self.inner.id == other.inner.id
    }
    pub fn sync(&self) -> Result<()> {
        self.inner.backend.sync()
    }
    pub fn memory(&self) -> MemoryStats {
        self.inner.backend.memory()
    }
    /// Starts [`MemoryStats::peak`] again from the bytes in use now (PyTorch's
    /// `torch.cuda.reset_peak_memory_stats`): a step's peak apart from the model's setup.
    ///
    /// ```
    /// let dev = tandem::Device::cpu_independent();
    /// let big = tandem::Tensor::zeros([1 << 20], &dev)?;
    /// drop(big);
    /// dev.reset_peak_memory();
    /// assert_eq!(dev.memory().peak, dev.memory().in_use);
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn reset_peak_memory(&self) {
        self.inner.backend.reset_peak_memory()
    }
    /// Caps the bytes this device's live tensors may hold (`None` lifts the cap): past it an
    /// allocation fails with [`Error::OutOfMemory`] naming the device, the bytes asked, the
    /// budget and the bytes in use, so a run that would not fit an 8 GB M60 fails here on a CPU
    /// or lavapipe device at the same step. [`Device::cpu`] is one device shared by the whole
    /// process; a budget meant for one CPU device alone goes on one from [`Device::parse`]
    /// (`"cpu,cpu"` gives a second, independent one) or [`Device::cpu_independent`].
    ///
    /// ```
    /// # fn main() -> tandem::Result<()> {
    /// let dev = tandem::Device::cpu_independent();
    /// dev.set_memory_budget(Some(1 << 20));
    /// let ok = tandem::Tensor::zeros([1024], &dev)?; // 4 KiB
    /// let e = tandem::Tensor::zeros([1024, 1024], &dev).unwrap_err(); // 4 MiB
    /// assert!(matches!(e, tandem::Error::OutOfMemory { .. }), "{e}");
    /// assert_eq!(dev.memory().budget, Some(1 << 20));
    /// # drop(ok); Ok(()) }
    /// ```
    pub fn set_memory_budget(&self, bytes: Option<u64>) {
        self.inner.backend.set_memory_budget(bytes)
    }

    /// Every device of every compiled backend that [`BACKENDS_ENV`] lets through: CUDA
    /// devices, wgpu adapters (hardware before software, Vulkan/Metal/DX12 before GL), then the
    /// CPU reference, which is always there.
    pub fn list() -> Vec<DeviceInfo> {
        let wanted = backends().unwrap_or(None);
        let probe = |b: BackendKind| wanted.as_ref().is_none_or(|w| w.contains(&b));
        let mut out = Vec::new();
        #[cfg(feature = "cuda")]
        if probe(BackendKind::Cuda) {
            out.extend(crate::backend::cuda::devices());
        }
        #[cfg(feature = "wgpu")]
        if probe(BackendKind::Wgpu) {
            out.extend(crate::backend::wgpu::adapters());
        }
        let _ = probe;
        out.push(Device::cpu().info().clone());
        out
    }

    /// Opens the devices a spec names: `cpu`, `wgpu:N`, `cuda:N`, `auto`, `all`, or a comma
    /// list of these. `vulkan:N`, `gl:N`, `metal:N` and `dx12:N` name the N-th wgpu adapter of
    /// that backend, and are an error when it has none: unlike `wgpu:N`, they cannot come to
    /// mean another backend's adapter when a driver is missing. Each named entry opens a fresh logical device, so `wgpu:0,wgpu:0` gives
    /// two independent devices on one adapter (the first `cpu` is the shared CPU reference,
    /// later ones are independent CPU devices).
    pub fn parse(spec: &str) -> Result<Vec<Device>> {
        backends()?;
        let mut out = Vec::new();
        for part in spec.split(',').map(str::trim) {
            match part {
                "auto" => out.push(Device::auto()?),
                "all" => {
                    for info in Device::list() {
                        out.push(Device::open(info.backend, info.ordinal)?);
                    }
                }
                _ => {
                    let (backend, ordinal) = parse_one(part)?;
                    let repeated_cpu = backend == BackendKind::Cpu && out.iter().any(|d: &Device| d.info().backend == BackendKind::Cpu);
                    if repeated_cpu {
                        out.push(Device::cpu_independent());
                    } else {
                        out.push(Device::open(backend, ordinal)?);
                    }
                }
            }
        }
        if out.is_empty() {
            return Err(no_such(spec));
        }
        Ok(out)
    }

    /// CUDA device 0 if any, else the first hardware GPU adapter (discrete, integrated, or a
    /// GPU reached through GL or virtualised), else the CPU reference. A software adapter
    /// (lavapipe, llvmpipe) is slower than the CPU reference and is used only by name.
    pub fn auto() -> Result<Device> {
        backends()?;
        let list = Device::list();
        let pick = list
            .iter()
            .find(|i| i.backend == BackendKind::Cuda)
            .or_else(|| list.iter().find(|i| i.backend == BackendKind::Wgpu && !matches!(i.kind, DeviceKind::Software | DeviceKind::Cpu)));
        match pick {
            Some(i) => Device::open(i.backend, i.ordinal),
            None => Ok(Device::cpu()),
        }
    }

    /// Opens a new logical device on the given backend's `ordinal`-th device. Only that backend
    /// is probed: opening `cpu` loads no GPU driver (and so prints no driver's warnings), and
    /// `cuda:0` enumerates no wgpu adapter.
    pub fn open(backend: BackendKind, ordinal: usize) -> Result<Device> {
        let wanted = backends().unwrap_or(None);
        let probed = wanted.as_ref().is_none_or(|w| w.contains(&backend));
        let exists = match backend {
            BackendKind::Cpu => ordinal == 0,
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu if probed => ordinal < crate::backend::wgpu::adapters().len(),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda if probed => crate::backend::cuda::devices().iter().any(|i| i.ordinal == ordinal),
            _ => false,
        };
        let _ = probed;
        if !exists {
            return Err(no_such(&format!("{}:{ordinal}", backend.name())));
        }
        match backend {
            BackendKind::Cpu => Ok(Device::cpu()),
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => Ok(Device::from_backend(crate::backend::wgpu::open(ordinal)?)),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => Ok(Device::from_backend(crate::backend::cuda::open(ordinal)?)),
            #[allow(unreachable_patterns)]
            b => Err(Error::Unavailable { backend: b.name(), reason: "not compiled in (cargo feature)".into() }),
        }
    }
}

/// The environment variable that limits which GPU backends a process probes and opens: a comma
/// list of `cuda` and `wgpu`. `TANDEM_BACKENDS=cuda` gives a process that never loads a Vulkan
/// or GL driver (so a fault on the CUDA side is not mistaken for one there); unset or empty,
/// every compiled backend. The CPU reference is always listed. Any other name makes
/// [`Device::parse`] and [`Device::auto`] fail, naming it.
pub const BACKENDS_ENV: &str = "TANDEM_BACKENDS";

/// The backends [`BACKENDS_ENV`] names; `None` when it is unset or empty.
fn backends() -> Result<Option<Vec<BackendKind>>> {
    let Ok(value) = std::env::var(BACKENDS_ENV) else { return Ok(None) };
    if value.trim().is_empty() {
        return Ok(None);
    }
    let mut out = vec![BackendKind::Cpu];
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        out.push(match name {
            "cuda" => BackendKind::Cuda,
            "wgpu" => BackendKind::Wgpu,
            "cpu" => BackendKind::Cpu,
            other => return Err(Error::invalid("devices", format!("{BACKENDS_ENV}={value:?}: {other:?} is not a backend (cuda, wgpu or cpu)"))),
        });
    }
    Ok(Some(out))
}

fn parse_one(part: &str) -> Result<(BackendKind, usize)> {
    if part == "cpu" || part == "cpu:0" {
        return Ok((BackendKind::Cpu, 0));
    }
    let (name, idx) = part.split_once(':').ok_or_else(|| no_such(part))?;
    let ordinal = idx.parse::<usize>().map_err(|_| no_such(part))?;
    match name {
        "wgpu" => Ok((BackendKind::Wgpu, ordinal)),
        "cuda" => Ok((BackendKind::Cuda, ordinal)),
        #[cfg(feature = "wgpu")]
        _ if crate::backend::wgpu::NAMED_BACKENDS.contains(&name) => {
            crate::backend::wgpu::ordinal_of(name, ordinal).map(|n| (BackendKind::Wgpu, n)).ok_or_else(|| no_such(part))
        }
        _ => Err(no_such(part)),
    }
}

impl DeviceInfo {
    /// How this listed device is named in specs: `cpu`, `cuda:0`, or `wgpu:1 = gl:0` for a wgpu
    /// adapter (its ordinal, and the backend-qualified name that names it too), as `tandem
    /// devices` shows it.
    ///
    /// ```
    /// let cpu = tandem::Device::list().pop().unwrap(); // the CPU reference comes last
    /// assert_eq!(cpu.spec_names(), "cpu");
    /// ```
    pub fn spec_names(&self) -> String {
        spec_names(self)
    }
}

/// See [`DeviceInfo::spec_names`].
fn spec_names(i: &DeviceInfo) -> String {
    match i.backend {
        BackendKind::Cpu => "cpu".to_string(),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => match crate::backend::wgpu::qualified_spec(i.ordinal) {
            Some(q) => format!("wgpu:{} = {q}", i.ordinal),
            None => format!("wgpu:{}", i.ordinal),
        },
        b => format!("{}:{}", b.name(), i.ordinal),
    }
}

fn no_such(spec: &str) -> Error {
    let available = Device::list()
        .iter()
        .map(|i| match i.backend {
            BackendKind::Cpu => "cpu".to_string(),
            _ => format!("{} ({})", spec_names(i), i.name),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Error::NoSuchDevice { spec: spec.to_string(), available }
}

/// The spec with the logical instance, `wgpu:0 (instance 2)`: two devices opened on one
/// adapter differ only there.
impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (instance {})", self.spec(), self.inner.id)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.spec())
    }
}
