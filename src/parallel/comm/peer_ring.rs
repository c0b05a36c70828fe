//! `PeerRing`: ring collectives built on [`Tensor::to`] between neighbouring devices.
//!
//! Rank i sends only to rank i+1 (mod n). The data is cut into n chunks; in each of the
//! `n-1` steps every rank sends one chunk to its neighbour at the same time, so no link
//! carries more than `S/n` per step whatever n is. An all-reduce is a reduce-scatter (each
//! chunk travels the ring once, summed as it goes) followed by an all-gather (each finished
//! chunk travels the ring once more): per device `2(n-1)/n · S` bytes sent and as many
//! received, the bandwidth optimum. With CUDA peer access `Tensor::to` is a direct
//! device-to-device copy; on other backends it stages through the host, which is correct but
//! slower than [`super::HostStaged`]. The sum's order differs per chunk, so results are
//! deterministic for a fixed group but not identical across group sizes.
use super::{check_group, check_root, even_ranges, per_device, Communicator, ReduceKind};
use crate::autograd::no_grad;
use crate::{Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

/// Ring collectives over device-to-device copies; see the module docs for the algorithm.
pub struct PeerRing {
    devices: Vec<Device>,
    bytes: AtomicU64,
}

/// `chunks[rank][c]`: rank's copy of chunk c, `None` for a chunk with no elements (a tensor
/// with fewer elements than devices) so no backend is asked for an empty buffer.
type Chunks = Vec<Vec<Option<Tensor>>>;

impl PeerRing {
    pub fn new(devices: &[Device]) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::invalid("PeerRing", "a communicator needs at least one device"));
        }
        Ok(PeerRing { devices: devices.to_vec(), bytes: AtomicU64::new(0) })
    }

    /// `t` on the next rank, counted.
    fn hop(&self, t: &Tensor, to: usize) -> Result<Tensor> {
        self.bytes.fetch_add(4 * t.numel() as u64, Ordering::Relaxed);
        t.to(&self.devices[to])
    }

    /// Cuts each rank's flat tensor into n chunks (element ranges `ranges`).
    fn cut(tensors: &[Tensor], ranges: &[std::ops::Range<usize>]) -> Result<Chunks> {
        tensors
            .iter()
            .map(|t| {
                let flat = t.flatten_all()?;
                ranges.iter().map(|r| (!r.is_empty()).then(|| flat.narrow(0, r.start, r.len())).transpose()).collect()
            })
            .collect()
    }

    /// Reduce-scatter phase: chunk c starts at rank c+1 and visits c+2, ..., c+n = c, each rank
    /// adding its own copy; afterwards rank c holds the full sum of chunk c.
    /// Step s: every rank i sends chunk (i - s - 1) mod n to rank i+1.
    fn ring_reduce(&self, chunks: &mut Chunks) -> Result<()> {
        let n = chunks.len();
        for s in 0..n - 1 {
            let arrived = per_device(n, |i| {
                let c = (i + 2 * n - s - 1) % n;
                chunks[i][c].as_ref().map(|t| self.hop(t, (i + 1) % n)).transpose()
            })?;
            for (i, got) in arrived.into_iter().enumerate() {
                let (to, c) = ((i + 1) % n, (i + 2 * n - s - 1) % n);
                if let (Some(got), Some(own)) = (got, chunks[to][c].as_ref()) {
                    chunks[to][c] = Some(own.add(&got)?);
                }
            }
        }
        Ok(())
    }

    /// All-gather phase: rank c starts with the finished chunk c; step s: every rank i sends
    /// chunk (i - s) mod n to rank i+1, which takes it as its own.
    fn ring_gather(&self, chunks: &mut Chunks) -> Result<()> {
        let n = chunks.len();
        for s in 0..n - 1 {
            let arrived = per_device(n, |i| chunks[i][(i + n - s) % n].as_ref().map(|t| self.hop(t, (i + 1) % n)).transpose())?;
            for (i, got) in arrived.into_iter().enumerate() {
                chunks[(i + 1) % n][(i + n - s) % n] = got;
            }
        }
        Ok(())
    }
}

/// The non-empty chunks of one rank, concatenated.
fn join(chunks: &[Option<Tensor>]) -> Result<Tensor> {
    let present: Vec<Tensor> = chunks.iter().flatten().cloned().collect();
    Tensor::cat(&present, 0)
}

impl Communicator for PeerRing {
    fn name(&self) -> &'static str {
        "peer-ring"
    }
    fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Ring reduce-scatter then ring all-gather: `2(n-1)/n · S` sent per device.
    fn all_reduce(&self, tensors: &[Tensor], op: ReduceKind) -> Result<()> {
        check_group("all_reduce", &self.devices, tensors, true)?;
        let n = tensors.len();
        no_grad(|| {
            let mut chunks = Self::cut(tensors, &even_ranges(tensors[0].numel(), n))?;
            self.ring_reduce(&mut chunks)?;
            if op == ReduceKind::Mean {
                for (c, chunk) in chunks.iter_mut().enumerate() {
                    chunk[c] = chunk[c].as_ref().map(|t| t.mul_scalar(1.0 / n as f32)).transpose()?;
                }
            }
            self.ring_gather(&mut chunks)?;
            per_device(n, |i| tensors[i].assign(&join(&chunks[i])?.reshape(tensors[i].shape().clone())?))?;
            Ok(())
        })
    }

    /// A chain from the root around the ring: `S` sent by every device but the last.
    fn broadcast(&self, tensors: &[Tensor], root: usize) -> Result<()> {
        check_group("broadcast", &self.devices, tensors, true)?;
        check_root("broadcast", root, tensors.len())?;
        let n = tensors.len();
        no_grad(|| {
            for k in 1..n {
                let (from, to) = ((root + k - 1) % n, (root + k) % n);
                tensors[to].assign(&self.hop(&tensors[from], to)?)?;
            }
            Ok(())
        })
    }

    /// Ring all-gather of the parts: `(n-1)` parts sent per device.
    fn all_gather(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        check_group("all_gather", &self.devices, tensors, false)?;
        let n = tensors.len();
        no_grad(|| {
            let mut chunks: Chunks = (0..n).map(|i| (0..n).map(|c| (c == i).then(|| tensors[i].clone())).collect()).collect();
            self.ring_gather(&mut chunks)?;
            chunks.iter().map(|c| join(c)).collect()
        })
    }

    /// The reduce-scatter phase of the ring all-reduce over row blocks: `(n-1)/n · S` sent.
    fn reduce_scatter(&self, tensors: &[Tensor], op: ReduceKind) -> Result<Vec<Tensor>> {
        check_group("reduce_scatter", &self.devices, tensors, true)?;
        let n = tensors.len();
        let dims = tensors[0].dims().to_vec();
        if dims[0] < n {
            return Err(Error::shape("reduce_scatter", format!("{dims:?} has fewer rows than the {n} devices")));
        }
        let row = tensors[0].numel() / dims[0];
        let blocks = even_ranges(dims[0], n);
        let ranges: Vec<_> = blocks.iter().map(|r| r.start * row..r.end * row).collect();
        no_grad(|| {
            let mut chunks = Self::cut(tensors, &ranges)?;
            self.ring_reduce(&mut chunks)?;
            (0..n)
                .map(|i| {
                    let mut shape = dims.clone();
                    shape[0] = blocks[i].len();
                    let mine = chunks[i][i].as_ref().ok_or_else(|| Error::Msg("reduce_scatter: empty block".into()))?;
                    let mine = if op == ReduceKind::Mean { mine.mul_scalar(1.0 / n as f32)? } else { mine.clone() };
                    mine.reshape(shape)
                })
                .collect()
        })
    }

    /// One `Tensor::to`: a peer copy where the backend has one.
    fn send_recv(&self, src: &Tensor, dst: &Device) -> Result<Tensor> {
        self.bytes.fetch_add(4 * src.numel() as u64, Ordering::Relaxed);
        no_grad(|| src.to(dst))
    }

    fn bytes_moved(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}
