//! `Nccl`: collectives through NVIDIA's NCCL, for groups of distinct CUDA GPUs in this process,
//! or across the processes of a [`crate::dist::Group`] ([`Nccl::across`], in `nccl_dist.rs`).
//!
//! One NCCL communicator per device, all created together by `ncclCommInitAll`, each bound to
//! the device's own stream: a collective is queued behind the kernels already issued on that
//! device and ahead of the ones issued after it, with no host synchronisation. The per-device
//! launches of one collective are issued from the calling thread inside one NCCL group
//! (`ncclGroupStart`/`ncclGroupEnd`); without the group the first rank's launch would wait for
//! peers that were never launched. Calls are serialised by a mutex, so every rank sees the
//! collectives in the same order.
//!
//! NCCL picks ring or tree algorithms (and NVLink, PCIe or shared-memory transports) itself.
//! [`Communicator::bytes_moved`] counts the ring algorithm's traffic, the bandwidth optimum: an
//! all-reduce of `S` bytes on `n` devices sends `2(n-1)/n · S` per device (`2(n-1)·S` in all);
//! the other costs are on each method. The summation order is NCCL's, so results match
//! [`super::HostStaged`] to rounding, not bit for bit.
//!
//! Library: NCCL is loaded at run time as `libnccl.so.2` (the `libnccl2` package, the
//! `nvidia-nccl-cu12`/`-cu13` wheels), found in the directories the CUDA backend searches for
//! its libraries (`TANDEM_CUDA_LIBS`, `LD_LIBRARY_PATH`, the wheels' `nvidia/nccl/lib`, the
//! system's). [`Nccl::new`] probes before any NCCL call, because cudarc panics on a missing
//! library, and its error names every file and directory tried.
use super::{check_group, check_root, even_ranges, Communicator, ReduceKind};
pub(super) use crate::backend::cuda::panic_message;
// The version probe is the CUDA backend's, which reports it in its device information.
use crate::autograd::no_grad;
pub use crate::backend::cuda::nccl_version as probe;
use crate::backend::cuda::CudaBackend;
use crate::backend::Buffer;
use crate::{DType, Device, Error, Result, Tensor};
use cudarc::driver::{sys::CUdeviceptr, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::{group_end, group_start, Comm, NcclType, ReduceOp};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Collectives through NCCL; see the module docs.
pub struct Nccl {
    devices: Vec<Device>,
    /// Per rank: the device's stream and label (for error messages).
    ranks: Vec<Rank>,
    /// Dropped before `comms`: stops polling the communicators before they are destroyed.
    pub(super) watchdog: Option<super::nccl_dist::Watchdog>,
    comms: Mutex<Comms>,
    bytes: AtomicU64,
    version: String,
    /// The NCCL rank of `devices[0]` and the number of ranks in all (`(0, n)` in one process).
    span: (usize, usize),
    /// The processes the communicator spans, when it was made by `Nccl::across`.
    group: Option<crate::dist::Group>,
}

pub(super) struct Rank {
    pub stream: Arc<CudaStream>,
    pub label: String,
}

/// The communicators, rank order.
struct Comms(Vec<Comm>);

// SAFETY: an `ncclComm_t` may be used from any thread as long as no two threads use it at
// once; `Comms` is only reached through `Nccl::comms`, a mutex.
unsafe impl Send for Comms {}

impl Drop for Comms {
    fn drop(&mut self) {
        // cudarc's Drop for Comm calls ncclCommAbort, which may cut short a collective still
        // queued on a stream: wait for every rank's stream first. It also panics if the abort
        // fails; that leaves nothing to recover, so it is logged instead of unwinding out of drop.
        for comm in &self.0 {
            if let Err(e) = comm.stream().synchronize() {
                tracing::warn!("nccl: waiting for rank {}'s stream before closing: {e:?}", comm.rank());
            }
        }
        for comm in self.0.drain(..) {
            if catch_unwind(AssertUnwindSafe(|| drop(comm))).is_err() {
                tracing::warn!("nccl: ncclCommAbort failed while dropping a communicator");
            }
        }
    }
}

/// `len` elements of `T` at a raw device address, on `stream`: how a tandem buffer (or a range
/// of one) is handed to cudarc's NCCL calls. Ordering is by the device's one stream (see
/// `backend/cuda/memory.rs`), so there are no events to wait on or record.
struct Span<T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<T> Span<T> {
    /// Elements `start..start + len` of this span.
    fn range(&self, start: usize, len: usize) -> Span<T> {
        debug_assert!(start + len <= self.len);
        let ptr = self.ptr + (start * std::mem::size_of::<T>()) as u64;
        Span { ptr, len, stream: self.stream.clone(), _t: PhantomData }
    }
}

impl<T> DeviceSlice<T> for Span<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}
impl<T> DevicePtr<T> for Span<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
impl<T> DevicePtrMut<T> for Span<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

/// Restores the calling thread's current CUDA context on drop: NCCL selects devices through
/// the runtime (`cudaSetDevice`), which would otherwise leave the last rank's context current.
pub(super) struct KeepContext(Option<cudarc::driver::sys::CUcontext>);

impl KeepContext {
    pub(super) fn save() -> Self {
        KeepContext(cudarc::driver::result::ctx::get_current().ok().flatten())
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            // SAFETY: `ctx` was current on this thread a moment ago and the devices' backends
            // (which hold their contexts) outlive the call.
            let _ = unsafe { cudarc::driver::result::ctx::set_current(ctx) };
        }
    }
}

/// The CUDA backend behind `device`, or `None` for any other backend.
pub(super) fn cuda(device: &Device) -> Option<&CudaBackend> {
    device.backend().as_any().downcast_ref::<CudaBackend>()
}

/// Each device's stream and label, and its GPU ordinal. Every device must be a CUDA device on
/// its own GPU: NCCL has one rank per GPU, so two logical devices on one GPU are refused.
pub(super) fn cuda_ranks(devices: &[Device]) -> Result<(Vec<Rank>, Vec<usize>)> {
    if devices.is_empty() {
        return Err(Error::invalid("Nccl", "a communicator needs at least one device"));
    }
    let mut ranks = Vec::with_capacity(devices.len());
    let mut ordinals: Vec<usize> = Vec::with_capacity(devices.len());
    for (i, d) in devices.iter().enumerate() {
        let Some(backend) = cuda(d) else {
            return Err(Error::invalid(
                "Nccl",
                format!("rank {i} is {} ({}), not a CUDA device; NCCL needs every device to be CUDA", d.spec(), d.info().name),
            ));
        };
        let ordinal = backend.info_ref().ordinal;
        if let Some(j) = ordinals.iter().position(|&o| o == ordinal) {
            return Err(Error::invalid("Nccl", format!("ranks {j} and {i} are both on cuda:{ordinal}; NCCL needs one rank per GPU")));
        }
        ordinals.push(ordinal);
        ranks.push(Rank { stream: backend.stream().clone(), label: backend.label().to_string() });
    }
    Ok((ranks, ordinals))
}

impl Nccl {
    /// One NCCL communicator per device. Every device must be a CUDA device of this process on
    /// its own GPU (NCCL has one rank per GPU; two logical devices on one GPU are refused), and
    /// the NCCL library must load (`Error::Unavailable` otherwise, with what to install).
    pub fn new(devices: &[Device]) -> Result<Self> {
        let (ranks, ordinals) = cuda_ranks(devices)?;
        let version = probe()?;
        let streams: Vec<Arc<CudaStream>> = ranks.iter().map(|r| r.stream.clone()).collect();
        let keep = KeepContext::save();
        let created = catch_unwind(AssertUnwindSafe(|| Comm::from_devices(streams)));
        drop(keep);
        let comms = match created {
            Ok(Ok(comms)) => comms,
            Ok(Err(e)) => {
                let gpus: Vec<String> = ordinals.iter().map(|o| format!("cuda:{o}")).collect();
                return Err(Error::Backend { backend: "nccl", device: gpus.join(","), detail: format!("ncclCommInitAll: {e:?}") });
            }
            Err(panic) => return Err(Error::Unavailable { backend: "nccl", reason: format!("ncclCommInitAll: {}", panic_message(panic)) }),
        };
        Ok(Nccl::assemble(devices, ranks, comms, version, (0, devices.len()), None))
    }

    /// The communicator over `comms` (one per device, in order).
    pub(super) fn assemble(
        devices: &[Device],
        ranks: Vec<Rank>,
        comms: Vec<Comm>,
        version: String,
        span: (usize, usize),
        group: Option<crate::dist::Group>,
    ) -> Nccl {
        Nccl { devices: devices.to_vec(), ranks, watchdog: None, comms: Mutex::new(Comms(comms)), bytes: AtomicU64::new(0), version, span, group }
    }

    /// The NCCL library version in use, such as `2.21.5`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Rank `i`'s buffer `b` (at least `need` elements of `T`) as a span on its stream.
    fn span<T>(&self, op: &'static str, i: usize, b: &Buffer, need: usize, dtype: DType) -> Result<Span<T>> {
        let backend = cuda(&self.devices[i]).ok_or_else(|| Error::invalid(op, format!("rank {i} is not a CUDA device")))?;
        let ptr = backend.device_ptr(op, b, need, dtype)?;
        Ok(Span { ptr, len: need, stream: self.ranks[i].stream.clone(), _t: PhantomData })
    }

    /// Every rank's tensor as a span of its `numel` f32s.
    fn spans(&self, op: &'static str, tensors: &[Tensor]) -> Result<Vec<Span<f32>>> {
        tensors.iter().enumerate().map(|(i, t)| self.span(op, i, t.buffer(), t.numel(), DType::F32)).collect()
    }

    /// A fresh buffer of `len` f32s on rank `i`, with its span.
    fn output(&self, op: &'static str, i: usize, len: usize, dtype: DType) -> Result<(Buffer, Span<f32>)> {
        let buf = self.devices[i].backend().alloc(len, dtype)?;
        let span = self.span(op, i, &buf, len, dtype)?;
        Ok((buf, span))
    }

    /// Runs `calls` (one NCCL call per rank, or more) inside one NCCL group, holding the lock.
    /// `calls` gets the communicators and a checker that turns an NCCL result into tandem's.
    /// Everything that can be validated (buffers, devices, counts) is validated before this, so
    /// a call only fails inside NCCL; the group is closed whatever happens.
    fn grouped(
        &self,
        op: &'static str,
        calls: impl FnOnce(&[Comm], &dyn Fn(usize, &str, Result<(), NcclError>) -> Result<()>) -> Result<()>,
    ) -> Result<()> {
        let comms = self.comms.lock().unwrap_or_else(|e| e.into_inner());
        let check = |rank: usize, what: &str, r: Result<(), NcclError>| {
            r.map_err(|e| Error::Backend { backend: "nccl", device: self.ranks[rank].label.clone(), detail: format!("{op}: {what}: {e:?}") })
        };
        let run = AssertUnwindSafe(|| {
            let _keep = KeepContext::save();
            check(0, "ncclGroupStart", group_start().map(drop))?;
            let issued = calls(&comms.0, &check);
            let ended = check(0, "ncclGroupEnd", group_end().map(drop));
            issued.and(ended)
        });
        catch_unwind(run).unwrap_or_else(|panic| Err(Error::Unavailable { backend: "nccl", reason: format!("{op}: {}", panic_message(panic)) }))
    }

    fn count(&self, bytes: usize) {
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// An NCCL call's status, dropped.
fn done(r: Result<NcclStatus, NcclError>) -> Result<(), NcclError> {
    r.map(drop)
}

/// `t / n` written back into `t` (the Mean of a Sum): one scale kernel and one copy per device.
fn scale_in_place(tensors: &[Tensor], n: usize) -> Result<()> {
    let k = 1.0 / n as f32;
    tensors.iter().try_for_each(|t| t.assign(&t.mul_scalar(k)?))
}

fn elem<T: NcclType>() -> usize {
    std::mem::size_of::<T>()
}

impl Communicator for Nccl {
    fn name(&self) -> &'static str {
        "nccl"
    }
    fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// `ncclAllReduce` (Sum) in place; Mean then scales by `1/n` on each device. Ring cost:
    /// `2(n-1)/n · S` sent and as many received per device; NCCL may use a tree instead
    /// (`2·S` per device at most, lower latency for small tensors).
    fn all_reduce(&self, tensors: &[Tensor], op: ReduceKind) -> Result<()> {
        check_group("all_reduce", &self.devices, tensors, true)?;
        self.agree_across(crate::dist::DeviceOp::AllReduce, tensors[0].numel(), 0)?;
        let n = self.span.1;
        let mut spans = self.spans("all_reduce", tensors)?;
        self.grouped("all_reduce", |comms, check| {
            for (i, span) in spans.iter_mut().enumerate() {
                check(i, "ncclAllReduce", done(comms[i].all_reduce_in_place(span, &ReduceOp::Sum)))?;
            }
            Ok(())
        })?;
        self.count(2 * (n - 1) * tensors[0].numel() * elem::<f32>());
        if op == ReduceKind::Mean {
            no_grad(|| scale_in_place(tensors, n))?;
        }
        Ok(())
    }

    /// `ncclBroadcast` in place from `root`: pipelined along a ring, each device but the last
    /// sends `S` and each but the root receives `S`. Across processes the root is rank 0's
    /// `tensors[root]` (NCCL rank `root`, since rank 0's devices come first).
    fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<()> {
        check_group("broadcast", &self.devices, tensors, true)?;
        check_root("broadcast", root, tensors.len())?;
        self.agree_across(crate::dist::DeviceOp::Broadcast, tensors[0].numel(), root)?;
        let n = self.span.1;
        let mut spans = self.spans("broadcast", tensors)?;
        self.grouped("broadcast", |comms, check| {
            for (i, span) in spans.iter_mut().enumerate() {
                check(i, "ncclBroadcast", done(comms[i].broadcast_in_place(span, root as i32)))?;
            }
            Ok(())
        })?;
        self.count((n - 1) * tensors[0].numel() * elem::<f32>());
        Ok(())
    }

    /// `ncclAllGather` when every part has the same rows, else one `ncclBroadcast` per part into
    /// its place in every output (grouped, so they overlap). Ring cost: each device receives the
    /// `n-1` parts it lacks, `(n-1)/n` of the result.
    fn all_gather(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        check_group("all_gather", &self.devices, tensors, false)?;
        let (first, n) = self.span;
        let inputs = self.spans("all_gather", tensors)?;
        let counts = self.global_counts(tensors.iter().map(Tensor::numel).collect())?;
        let rows = self.global_counts(tensors.iter().map(|t| t.dims()[0]).collect())?;
        let total: usize = counts.iter().sum();
        let mut outputs = (0..tensors.len()).map(|i| self.output("all_gather", i, total, DType::F32)).collect::<Result<Vec<_>>>()?;
        let equal = counts.iter().all(|&c| c == counts[0]);
        self.grouped("all_gather", |comms, check| {
            if equal {
                for (i, (_, out)) in outputs.iter_mut().enumerate() {
                    check(i, "ncclAllGather", done(comms[i].all_gather(&inputs[i], out)))?;
                }
                return Ok(());
            }
            let mut offset = 0;
            for (root, &count) in counts.iter().enumerate() {
                for (i, (_, out)) in outputs.iter_mut().enumerate() {
                    let mut place = out.range(offset, count);
                    let send = (first + i == root).then_some(&inputs[i]);
                    check(i, "ncclBroadcast", done(comms[i].broadcast(send, &mut place, root as i32)))?;
                }
                offset += count;
            }
            Ok(())
        })?;
        self.count((n - 1) * total * elem::<f32>());
        let mut shape = tensors[0].dims().to_vec();
        shape[0] = rows.iter().sum();
        Ok(outputs
            .into_iter()
            .enumerate()
            .map(|(i, (buf, _))| Tensor::from_parts(buf, shape.clone().into(), self.devices[i].clone(), None))
            .collect())
    }

    /// `ncclReduceScatter` when the rows split evenly, else one `ncclReduce` per row block to its
    /// rank (grouped). Ring cost: `(n-1)/n · S` sent per device, half an all-reduce.
    fn reduce_scatter(&self, tensors: &[Tensor], op: ReduceKind) -> Result<Vec<Tensor>> {
        check_group("reduce_scatter", &self.devices, tensors, true)?;
        self.agree_across(crate::dist::DeviceOp::ReduceScatter, tensors[0].numel(), tensors[0].dims().first().copied().unwrap_or(1))?;
        let (first, n) = self.span;
        let dims = tensors[0].dims().to_vec();
        if dims[0] < n {
            return Err(Error::shape("reduce_scatter", format!("{dims:?} has fewer rows than the {n} devices")));
        }
        let row = tensors[0].numel() / dims[0];
        let blocks = even_ranges(dims[0], n);
        let inputs = self.spans("reduce_scatter", tensors)?;
        let mut outputs =
            (0..tensors.len()).map(|i| self.output("reduce_scatter", i, blocks[first + i].len() * row, DType::F32)).collect::<Result<Vec<_>>>()?;
        let even = dims[0].is_multiple_of(n);
        self.grouped("reduce_scatter", |comms, check| {
            if even {
                for (i, (_, out)) in outputs.iter_mut().enumerate() {
                    check(i, "ncclReduceScatter", done(comms[i].reduce_scatter(&inputs[i], out, &ReduceOp::Sum)))?;
                }
                return Ok(());
            }
            for (root, block) in blocks.iter().enumerate() {
                for i in 0..tensors.len() {
                    let part = inputs[i].range(block.start * row, block.len() * row);
                    let recv = if first + i == root { Some(&mut outputs[i].1) } else { None };
                    check(i, "ncclReduce", done(comms[i].reduce(&part, recv, &ReduceOp::Sum, root as i32)))?;
                }
            }
            Ok(())
        })?;
        self.count((n - 1) * tensors[0].numel() * elem::<f32>());
        let out: Vec<Tensor> = outputs
            .into_iter()
            .enumerate()
            .map(|(i, (buf, _))| {
                let mut shape = dims.clone();
                shape[0] = blocks[first + i].len();
                Tensor::from_parts(buf, shape.into(), self.devices[i].clone(), None)
            })
            .collect();
        if op == ReduceKind::Mean {
            return no_grad(|| out.iter().map(|t| t.mul_scalar(1.0 / n as f32)).collect());
        }
        Ok(out)
    }

    /// `ncclSend`/`ncclRecv` when both devices are ranks of this group (`S` over the link),
    /// else [`Tensor::to`] (a peer copy or host staging).
    fn send_recv(&self, src: &Tensor, dst: &Device) -> Result<Tensor> {
        let rank = |d: &Device| self.devices.iter().position(|g| g.same(d));
        let (Some(s), Some(d)) = (rank(src.device()), rank(dst)) else {
            self.count(if src.device().same(dst) { 0 } else { src.numel() * 4 });
            return no_grad(|| src.to(dst));
        };
        if s == d || src.numel() == 0 {
            return no_grad(|| src.to(dst));
        }
        let len = src.numel();
        let buf = match src.dtype() {
            DType::F32 => self.point_to_point::<f32>(src, s, d, len)?,
            DType::I32 => self.point_to_point::<i32>(src, s, d, len)?,
            // Halves move as the tensors they are (a peer copy or host staging), not through NCCL.
            DType::Bf16 | DType::F16 => {
                self.count(len * 2);
                return no_grad(|| src.to(dst));
            }
        };
        self.count(len * 4);
        Ok(Tensor::from_parts(buf, src.shape().clone(), dst.clone(), None))
    }

    fn bytes_moved(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn device_span(&self) -> (usize, usize) {
        self.span
    }

    fn process_group(&self) -> Option<&crate::dist::Group> {
        self.group.as_ref()
    }

    /// Across processes, every rank's parts gathered and summed in index order (as
    /// [`super::Hierarchical`] does); in one process, the parts sorted and summed here.
    fn sum_by_index(&self, mut parts: Vec<(usize, Vec<f32>)>) -> Result<Vec<f32>> {
        match &self.group {
            Some(g) => super::hierarchical::sum_by_index_across(g, parts, |n| self.count(4 * n)),
            None => {
                parts.sort_by_key(|p| p.0);
                super::tree_sum(parts.into_iter().map(|p| p.1).collect())
            }
        }
    }
}

impl Nccl {
    /// `len` elements of `src` (on rank `s`) into a fresh buffer on rank `d`.
    fn point_to_point<T: NcclType>(&self, src: &Tensor, s: usize, d: usize, len: usize) -> Result<Buffer> {
        let dtype = src.dtype();
        let input: Span<T> = self.span("send_recv", s, src.buffer(), len, dtype)?;
        let buf = self.devices[d].backend().alloc(len, dtype)?;
        let mut out: Span<T> = self.span("send_recv", d, &buf, len, dtype)?;
        let first = self.span.0;
        self.grouped("send_recv", |comms, check| {
            check(s, "ncclSend", comms[s].send(&input, (first + d) as i32))?;
            check(d, "ncclRecv", done(comms[d].recv(&mut out, (first + s) as i32)))
        })?;
        Ok(buf)
    }
}
