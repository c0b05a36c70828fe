//! `Hierarchical`: collectives over the devices of many processes (`mpirun`, `srun`).
//!
//! Each collective combines this process's devices through host memory in device order (as
//! [`super::HostStaged`] does), combines the processes' host buffers through MPI, and writes
//! the result back to the devices. The devices of all processes form one group in rank-major
//! order: rank 0's devices first. MPI moves host memory only (Debian's Open MPI is not
//! CUDA-aware), so every device's data crosses the host anyway; per process, an all-reduce of
//! `S` bytes on `d` devices downloads `dS`, moves about `2S` through MPI and uploads `dS`.
//!
//! One device per process, the common case, takes a shorter road: a CPU device's buffer is
//! host memory, so MPI reads it and writes a kept buffer that then takes its place (no copy
//! at all); another device's values are downloaded into the buffer MPI reads and uploaded from
//! the one it writes (no host copy besides MPI's own).
//!
//! Sums across processes run in the group's [`Order`]: `Order::Mpi` is `MPI_Allreduce`,
//! whose order of additions is the library's; `Order::Ranks` sums in rank order, bit for bit
//! reproducible for a given number of processes. Neither makes 2 processes equal 1 process
//! with 2 devices bit for bit (the tree over devices differs); data parallelism's
//! deterministic mode does, through [`Communicator::sum_by_index`].
//!
//! Every collective checks that all ranks pass the same lengths before data moves (see
//! [`crate::dist`]): a bucket of another length on one rank is an error on every rank. The
//! pipelined all-reduce checks once per tensor, for all its chunks.
use super::host_staged::{finish, finish_in_place};
use super::{check_group, check_root, per_device, tree_sum, Communicator, ReduceKind};
use crate::autograd::no_grad;
use crate::backend::cpu::CpuBuffer;
use crate::dist::{Group, Order};
use crate::{Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Most bytes of receive buffers kept between calls (see [`Spares`]).
const SPARE_BYTES: usize = 256 << 20;

/// Bytes per chunk of the pipelined all-reduce unless `TANDEM_ALLREDUCE_CHUNK_BYTES` says.
const CHUNK_BYTES: usize = 2 << 20;

/// `TANDEM_ALLREDUCE_CHUNK_BYTES`, or [`CHUNK_BYTES`] when unset.
fn chunk_bytes_from_env() -> Result<usize> {
    match std::env::var("TANDEM_ALLREDUCE_CHUNK_BYTES") {
        Err(_) => Ok(CHUNK_BYTES),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::invalid("Hierarchical::new", format!("TANDEM_ALLREDUCE_CHUNK_BYTES={v:?} is not a positive number of bytes"))),
    }
}

/// Collectives over this process's devices and every other rank's; see the module docs.
pub struct Hierarchical {
    devices: Vec<Device>,
    group: Group,
    order: Order,
    /// The global index of this process's first device, and the number of devices in all.
    span: (usize, usize),
    bytes: AtomicU64,
    spares: Spares,
    /// Bytes per chunk of a lone non-CPU device's pipelined all-reduce.
    chunk_bytes: usize,
}

/// Receive buffers of the one-device all-reduce, kept by length between calls: a fresh one of
/// many MiB costs its page faults on every call. Data parallelism's buckets have a few lengths.
#[derive(Default)]
struct Spares(Mutex<Vec<Vec<u32>>>);

impl Spares {
    fn take(&self, len: usize) -> Vec<u32> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.iter().position(|v| v.len() == len) {
            Some(i) => kept.swap_remove(i),
            None => vec![0; len],
        }
    }

    /// Keeps `v`, dropping the oldest kept buffers beyond [`SPARE_BYTES`].
    fn keep(&self, v: Vec<u32>) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.push(v);
        while kept.iter().map(|v| 4 * v.len()).sum::<usize>() > SPARE_BYTES && kept.len() > 1 {
            kept.remove(0);
        }
    }
}

impl Hierarchical {
    /// A communicator over `devices` (this process's) and those every other rank of `group`
    /// passes. Collective: every rank calls it, each with its own devices.
    pub fn new(devices: &[Device], group: Group, order: Order) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::invalid("Hierarchical::new", format!("rank {} of {} has no device", group.rank(), group.size())));
        }
        let counts = group.all_gather_u64(&[devices.len() as u64])?;
        let count = |c: &Vec<u64>| c.first().map_or(0, |&n| n as usize);
        let first = counts[..group.rank()].iter().map(count).sum();
        let total = counts.iter().map(count).sum();
        Ok(Hierarchical {
            devices: devices.to_vec(),
            group,
            order,
            span: (first, total),
            bytes: AtomicU64::new(0),
            spares: Spares::default(),
            chunk_bytes: chunk_bytes_from_env()?,
        })
    }

    /// Moves a lone non-CPU device's all-reduce in chunks of `bytes` (at least one element);
    /// the default is `TANDEM_ALLREDUCE_CHUNK_BYTES`, else 2 MiB (the best of 1, 2 and 4 MiB on
    /// lavapipe, see README).
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }

    pub fn group(&self) -> &Group {
        &self.group
    }
    pub fn order(&self) -> Order {
        self.order
    }

    fn count(&self, elements: usize) {
        self.bytes.fetch_add(4 * elements as u64, Ordering::Relaxed);
    }

    /// Every local tensor's values, downloaded in parallel.
    fn download_all(&self, tensors: &[Tensor]) -> Result<Vec<Vec<f32>>> {
        let out = per_device(tensors.len(), |i| tensors[i].to_vec())?;
        self.count(out.iter().map(Vec::len).sum());
        Ok(out)
    }

    /// Writes `values` into every local tensor except `skip`'s.
    fn write_all(&self, tensors: &[Tensor], values: &[f32], skip: Option<usize>) -> Result<()> {
        per_device(tensors.len(), |i| {
            if skip == Some(i) {
                return Ok(());
            }
            tensors[i].assign(&Tensor::from_vec(values.to_vec(), tensors[i].shape().clone(), &self.devices[i])?)
        })?;
        self.count((tensors.len() - usize::from(skip.is_some())) * values.len());
        Ok(())
    }

    /// A lone CPU device: MPI reads the tensor's buffer and writes a kept one of the same
    /// length, and the two trade places (rank order sums in place). `Ok(false)` for a device
    /// of another backend.
    fn cpu_in_place(&self, t: &Tensor, op: ReduceKind) -> Result<bool> {
        let Some(buf) = t.buffer().downcast::<CpuBuffer>() else { return Ok(false) };
        let n = t.numel();
        let mut data = buf.data.write().unwrap_or_else(PoisonError::into_inner);
        if self.order == Order::Mpi {
            let mut recv = self.spares.take(data.len());
            self.group.all_reduce_into(bytemuck::cast_slice(&data[..n]), bytemuck::cast_slice_mut(&mut recv[..n]), Order::Mpi)?;
            std::mem::swap(&mut *data, &mut recv);
            self.spares.keep(recv);
        } else {
            self.group.all_reduce(bytemuck::cast_slice_mut(&mut data[..n]), self.order)?;
        }
        finish_in_place(bytemuck::cast_slice_mut(&mut data[..n]), op, self.span.1);
        Ok(true)
    }

    /// A lone device of another backend: MPI reads the downloaded bytes and writes a kept
    /// buffer, which is uploaded as it is. Beyond one chunk ([`Hierarchical::with_chunk_bytes`])
    /// the buffer moves in chunks through a pipeline of three threads: this one runs MPI on
    /// chunk `k` while one downloads chunk `k+1` and another uploads chunk `k-1`, so that the
    /// time nears the slowest of the three instead of their sum. Every element still takes the
    /// same sum over ranks (elementwise, in `order`), so chunking changes no bit for 2
    /// processes, nor for any number under `Order::Ranks`.
    fn staged_one(&self, t: &Tensor, op: ReduceKind) -> Result<()> {
        let n = t.numel();
        let chunk = (self.chunk_bytes / 4).max(1);
        let backend = t.backend();
        let mut recv = self.spares.take(n);
        let sums: &mut [f32] = bytemuck::cast_slice_mut(&mut recv);
        let result = if n <= chunk {
            self.reduce_chunk(&backend.download(t.buffer())?, sums, op, false).and_then(|()| upload_into(backend, t, 0, sums))
        } else {
            self.pipelined(t, chunk, sums, op)
        };
        self.spares.keep(recv);
        self.count(2 * n);
        result
    }

    /// MPI's sum of the f32 values in `bytes` into `sums`, then `op`'s finish; `agreed`: one
    /// chunk of many whose lengths [`Group::agree_all_reduce_chunks`] checked.
    fn reduce_chunk(&self, bytes: &[u8], sums: &mut [f32], op: ReduceKind, agreed: bool) -> Result<()> {
        let bytes = &bytes[..4 * sums.len()];
        // An allocator's large blocks are aligned for f32; a copy covers any other.
        let copied: Vec<f32>;
        let values: &[f32] = match bytemuck::try_cast_slice(bytes) {
            Ok(v) => v,
            Err(_) => {
                copied = bytemuck::pod_collect_to_vec(bytes);
                &copied
            }
        };
        if agreed {
            self.group.all_reduce_chunk_into(values, sums, self.order)?;
        } else {
            self.group.all_reduce_into(values, sums, self.order)?;
        }
        finish_in_place(sums, op, self.span.1);
        Ok(())
    }

    /// [`Self::staged_one`]'s pipeline over chunks of `chunk` elements; `sums` holds the whole
    /// result. The channels hold one chunk each, so at most a few chunks are in flight. The
    /// ranks agree on the length and the chunk once, before the first chunk, not per chunk.
    fn pipelined(&self, t: &Tensor, chunk: usize, sums: &mut [f32], op: ReduceKind) -> Result<()> {
        let backend = t.backend();
        let n = t.numel();
        self.group.agree_all_reduce_chunks(n, chunk, self.order)?;
        std::thread::scope(|s| {
            let (down_tx, down_rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(1);
            let (up_tx, up_rx) = std::sync::mpsc::sync_channel::<(usize, &mut [f32])>(1);
            s.spawn(move || {
                for start in (0..n).step_by(chunk) {
                    // A send fails only when MPI's side stopped on an error it reports.
                    if down_tx.send(backend.download_range(t.buffer(), start, chunk.min(n - start))).is_err() {
                        break;
                    }
                }
            });
            let uploader = s.spawn(move || -> Result<()> {
                for (start, values) in up_rx {
                    upload_into(backend, t, start, values)?;
                }
                Ok(())
            });
            let mut reduced = Ok(());
            for (k, out) in sums.chunks_mut(chunk).enumerate() {
                reduced = down_rx
                    .recv()
                    .map_err(|_| Error::Msg("all_reduce: the download thread ended early".into()))
                    .and_then(|b| b)
                    .and_then(|bytes| self.reduce_chunk(&bytes, out, op, true));
                if reduced.is_err() || up_tx.send((k * chunk, out)).is_err() {
                    break;
                }
            }
            drop(up_tx);
            drop(down_rx);
            let uploaded = uploader.join().unwrap_or_else(|_| Err(Error::Msg("all_reduce: the upload thread panicked".into())));
            reduced.and(uploaded)
        })
    }
    /// The reduction over every device of every process, on the host.
    fn reduce_to_host(&self, tensors: &[Tensor], op: ReduceKind) -> Result<Vec<f32>> {
        let mut sum = tree_sum(self.download_all(tensors)?)?;
        self.count(sum.len());
        self.group.all_reduce(&mut sum, self.order)?;
        Ok(finish(sum, op, self.span.1))
    }
}

impl Communicator for Hierarchical {
    fn name(&self) -> &'static str {
        "hierarchical"
    }
    fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn all_reduce(&self, tensors: &[Tensor], op: ReduceKind) -> Result<()> {
        check_group("all_reduce", &self.devices, tensors, true)?;
        no_grad(|| {
            if let [t] = tensors {
                if self.cpu_in_place(t, op)? {
                    return Ok(());
                }
                return self.staged_one(t, op);
            }
            let sum = self.reduce_to_host(tensors, op)?;
            self.write_all(tensors, &sum, None)
        })
    }

    /// Every tensor of every process takes rank 0's `tensors[root]` (`root` indexes the
    /// process's own devices; rank 0's is the one that counts).
    fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<()> {
        check_group("broadcast", &self.devices, tensors, true)?;
        check_root("broadcast", root, tensors.len())?;
        no_grad(|| {
            let mut values = if self.group.rank() == 0 { tensors[root].to_vec()? } else { vec![0.0; tensors[root].numel()] };
            self.count(values.len());
            self.group.broadcast(&mut values, 0)?;
            self.write_all(tensors, &values, (self.group.rank() == 0).then_some(root))
        })
    }

    /// The concatenation along dim 0 over every device of every process, rank-major.
    fn all_gather(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        check_group("all_gather", &self.devices, tensors, false)?;
        no_grad(|| {
            let local = self.download_all(tensors)?.concat();
            let row: usize = tensors[0].dims()[1..].iter().product();
            let parts = self.group.all_gather(&local)?;
            self.count(parts.iter().map(Vec::len).sum());
            if let Some((r, p)) = parts.iter().enumerate().find(|(_, p)| p.len() % row.max(1) != 0) {
                return Err(Error::shape("all_gather", format!("rank {r} sent {} values, not whole rows of {:?}", p.len(), &tensors[0].dims()[1..])));
            }
            let whole = parts.concat();
            let mut shape = tensors[0].dims().to_vec();
            shape[0] = whole.len() / row.max(1);
            let out = per_device(tensors.len(), |i| Tensor::from_vec(whole.clone(), shape.clone(), &self.devices[i]))?;
            self.count(tensors.len() * whole.len());
            Ok(out)
        })
    }

    /// Block `g` of the reduction goes to the device of global index `g`. The whole reduction
    /// crosses the host (no scatter-reduce across processes): simple, not bandwidth-optimal.
    fn reduce_scatter(&self, tensors: &[Tensor], op: ReduceKind) -> Result<Vec<Tensor>> {
        check_group("reduce_scatter", &self.devices, tensors, true)?;
        let (first, total) = self.span;
        let dims = tensors[0].dims().to_vec();
        if dims[0] < total {
            return Err(Error::shape("reduce_scatter", format!("{dims:?} has fewer rows than the {total} devices of all processes")));
        }
        no_grad(|| {
            let sum = self.reduce_to_host(tensors, op)?;
            let row = sum.len() / dims[0];
            let blocks = super::even_ranges(dims[0], total);
            per_device(tensors.len(), |i| {
                let b = &blocks[first + i];
                let mut shape = dims.clone();
                shape[0] = b.len();
                self.count(b.len() * row);
                Tensor::from_vec(sum[b.start * row..b.end * row].to_vec(), shape, &self.devices[i])
            })
        })
    }

    /// A copy within this process (to another rank, use the group's `send`/`recv`).
    fn send_recv(&self, src: &Tensor, dst: &Device) -> Result<Tensor> {
        let values = src.to_vec()?;
        self.count(2 * values.len());
        Tensor::from_vec(values, src.shape().clone(), dst)
    }

    fn bytes_moved(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn device_span(&self) -> (usize, usize) {
        self.span
    }

    fn process_group(&self) -> Option<&Group> {
        Some(&self.group)
    }

    /// Gathers every rank's parts (their indices, then their values), then sums as in one
    /// process: the same tree over the same indices.
    fn sum_by_index(&self, parts: Vec<(usize, Vec<f32>)>) -> Result<Vec<f32>> {
        sum_by_index_across(&self.group, parts, |n| self.count(n))
    }
}

/// [`Communicator::sum_by_index`] over every rank of `group` (collective): each rank's
/// indices, then its values, are gathered, and every rank sums the same parts in index order.
/// `gathered` is told how many values arrived.
pub(super) fn sum_by_index_across(group: &Group, parts: Vec<(usize, Vec<f32>)>, gathered: impl FnOnce(usize)) -> Result<Vec<f32>> {
    let indices: Vec<u64> = parts.iter().map(|p| p.0 as u64).collect();
    let flat: Vec<f32> = parts.into_iter().flat_map(|p| p.1).collect();
    let all_indices = group.all_gather_u64(&indices)?;
    let all_flat = group.all_gather(&flat)?;
    gathered(all_flat.iter().map(Vec::len).sum());
    let mut all = Vec::new();
    for (rank, (ks, values)) in all_indices.iter().zip(&all_flat).enumerate() {
        if ks.is_empty() {
            continue;
        }
        if values.len() % ks.len() != 0 {
            return Err(Error::shape("sum_by_index", format!("rank {rank} sent {} values for {} parts", values.len(), ks.len())));
        }
        let len = values.len() / ks.len();
        all.extend(ks.iter().enumerate().map(|(j, &k)| (k as usize, values[j * len..(j + 1) * len].to_vec())));
    }
    all.sort_by_key(|p| p.0);
    tree_sum(all.into_iter().map(|p| p.1).collect())
}

/// Writes `values` into `t`'s buffer from element `start` on.
fn upload_into(backend: &dyn crate::backend::Backend, t: &Tensor, start: usize, values: &[f32]) -> Result<()> {
    backend.write_at(t.buffer(), start, bytemuck::cast_slice(values))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pipelined path (chunks of 997 elements, the last one short) writes exactly what the
    /// whole-buffer path writes, in both orders; a group of one still runs every chunk through
    /// the group's all-reduce and `op`'s finish.
    #[test]
    fn chunked_all_reduce_equals_whole() -> Result<()> {
        let n = 10_007;
        let values: Vec<f32> = (0..n).map(|i| ((i * 37 % 1013) as f32 - 500.0) / 7.0).collect();
        for device in Device::parse("cpu,wgpu:0")? {
            for order in [Order::Mpi, Order::Ranks] {
                let run = |chunk: usize| -> Result<Vec<f32>> {
                    let comm = Hierarchical::new(std::slice::from_ref(&device), Group::alone(), order)?.with_chunk_bytes(chunk);
                    let t = Tensor::from_vec(values.clone(), [n], &device)?;
                    comm.all_reduce(std::slice::from_ref(&t), ReduceKind::Mean)?;
                    t.to_vec()
                };
                let whole = run(usize::MAX)?;
                let chunked = run(4 * 997)?;
                assert!(whole.iter().zip(&chunked).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {order:?}: chunked differs", device.spec());
                assert_eq!(whole, values, "{} {order:?}: the mean over one device is the input", device.spec());
            }
        }
        Ok(())
    }
}
