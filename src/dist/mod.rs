//! Many processes: the process group that `mpirun` or `srun` starts, its collectives over host
//! memory, and which of the machine's devices each process drives.
//!
//! [`init`] reads the launcher's environment. Under one (and with the cargo feature `mpi`) it
//! initialises MPI and returns the process group: rank, size, local rank (the rank among the
//! processes of this machine, from MPI's shared-memory split), and collectives on `f32` host
//! buffers. With no launcher it returns a group of one whose collectives return their input, so
//! the same program runs alone unchanged. Devices' collectives across processes are
//! [`crate::parallel::comm::Hierarchical`]'s.
//!
//! Faults end the whole job instead of leaving ranks waiting forever: a panic on any thread of
//! any rank (a panic hook calls `MPI_Abort`), and a collective that has not completed after
//! `TANDEM_DIST_TIMEOUT_S` seconds (default 300), which aborts naming the rank and the
//! collective. A rank killed outright is noticed by the launcher, which ends the others.
//!
//! Ranks that disagree get an error, not a corrupted heap: before any data moves, every
//! collective all-gathers a fixed 32-byte header per rank (the operation, the element type,
//! the length, the root) and checks it. A rank that passes another length than the others, or
//! calls another collective, makes the call return on every rank the same
//! [`Error::Shape`], naming the collective, what each rank asked for and
//! the ranks that differ; no data has moved, and the group stays usable. The cost is one
//! extra small `MPI_Allgather` per collective (a few microseconds over shared memory, one
//! network round trip across machines); a chunked all-reduce agrees once for all its chunks.
//! Point-to-point messages carry their own length: [`Group::recv`] receives what was sent.
//!
//! ```
//! # fn main() -> tandem::Result<()> {
//! let group = tandem::dist::init()?; // a group of one outside mpirun
//! let mut grads = vec![1.0f32, 2.0];
//! group.all_reduce_sum(&mut grads)?;
//! assert_eq!((group.rank(), group.size(), grads), (0, 1, vec![1.0, 2.0]));
//! # Ok(()) }
//! ```
#![doc = include_str!("processes.md")]
mod agree;
mod launcher;
mod state;
mod sum;
#[cfg(feature = "mpi")]
mod world;

pub use agree::rank_list;
pub(crate) use agree::DeviceOp;
pub use launcher::{detect, Launch, Launcher};
pub use sum::tree_sum;

use crate::{Device, Error, Result};
#[cfg(feature = "mpi")]
use std::sync::Arc;
use std::time::Duration;

/// Seconds a collective may wait for the other ranks before the job is ended.
pub const TIMEOUT_ENV: &str = "TANDEM_DIST_TIMEOUT_S";
const DEFAULT_TIMEOUT_S: f64 = 300.0;

/// How a sum across processes is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `MPI_Allreduce`: the library's fastest algorithm, whose order of additions is its own
    /// choice and may change with the message size, the number of ranks or the transport.
    Mpi,
    /// Sums in rank order with [`tree_sum`], bit for bit the same
    /// for a given number of ranks: each rank receives one slice of every rank's buffer
    /// (all-to-all), sums its slice, and all gather the slices (the traffic of a ring).
    Ranks,
}

/// The processes of one job (or this process alone); cheap to clone, shared by threads.
/// Every collective must be called by every rank, in the same order.
#[derive(Clone)]
pub struct Group {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Alone,
    #[cfg(feature = "mpi")]
    Mpi(Arc<world::World>),
}

/// The process group of this job: under `mpirun`/`srun` (detected from the environment,
/// see [`Launcher`]) the MPI world, initialised once (later calls return the same group);
/// otherwise a group of one. Built without the `mpi` feature, a launch of more than one
/// process is an error rather than N copies training alone.
pub fn init() -> Result<Group> {
    let Some(launch) = launcher::from_env() else { return Ok(Group::alone()) };
    #[cfg(feature = "mpi")]
    {
        let _ = launch;
        Ok(Group { inner: Inner::Mpi(world::World::get(timeout_from_env()?)?) })
    }
    #[cfg(not(feature = "mpi"))]
    match launch.size {
        Some(n) if n > 1 => Err(Error::Unavailable {
            backend: "mpi",
            reason: format!("started by {} as rank {} of {n}, but tandem was built without the `mpi` cargo feature", launch.launcher, launch.rank),
        }),
        _ => Ok(Group::alone()),
    }
}

/// The collective timeout: `TANDEM_DIST_TIMEOUT_S` (seconds, > 0), else 300 s.
pub fn timeout_from_env() -> Result<Duration> {
    match std::env::var(TIMEOUT_ENV) {
        Err(_) => Ok(Duration::from_secs_f64(DEFAULT_TIMEOUT_S)),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::invalid("dist::init", format!("{TIMEOUT_ENV}={v:?} is not a positive number of seconds"))),
        },
    }
}

// Alone, the collectives have nothing to combine: their buffers go unused.
#[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
impl Group {
    /// This process alone: rank 0 of 1.
    pub fn alone() -> Group {
        Group { inner: Inner::Alone }
    }
    pub fn rank(&self) -> usize {
        match &self.inner {
            Inner::Alone => 0,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.rank,
        }
    }
    pub fn size(&self) -> usize {
        match &self.inner {
            Inner::Alone => 1,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.size,
        }
    }
    /// The rank among the processes on this machine (those that share memory).
    pub fn local_rank(&self) -> usize {
        match &self.inner {
            Inner::Alone => 0,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.local_rank,
        }
    }
    /// How many processes of the job run on this machine.
    pub fn local_size(&self) -> usize {
        match &self.inner {
            Inner::Alone => 1,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.local_size,
        }
    }
    /// The thread level MPI granted (`None` alone): always `Multiple`, which tandem requires
    /// because its watchdog and panic hook call `MPI_Abort` from one thread while another
    /// waits inside MPI (collectives themselves are issued one at a time).
    #[cfg(feature = "mpi")]
    pub fn threading(&self) -> Option<mpi::Threading> {
        match &self.inner {
            Inner::Alone => None,
            Inner::Mpi(w) => Some(w.threading),
        }
    }

    /// Waits until every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        match &self.inner {
            Inner::Alone => Ok(()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.barrier(),
        }
    }
    /// Overwrites `data` on every rank with rank `root`'s. Every rank must pass the same length
    /// and root; otherwise every rank gets an error naming each rank's (see the module docs).
    pub fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.check_rank("Group::broadcast", root)?;
        match &self.inner {
            Inner::Alone => Ok(()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.broadcast(data, root),
        }
    }
    /// Replaces `data` on every rank with the elementwise sum over ranks, by `MPI_Allreduce`
    /// ([`Order::Mpi`]).
    pub fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        self.all_reduce(data, Order::Mpi)
    }
    /// Replaces `data` on every rank with the elementwise sum over ranks, in `order`. Every
    /// rank must pass the same length and order, else all get an error.
    pub fn all_reduce(&self, data: &mut [f32], order: Order) -> Result<()> {
        match &self.inner {
            Inner::Alone => Ok(()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => match order {
                Order::Mpi => w.all_reduce_mpi(data, world::Checked::Here),
                Order::Ranks => w.all_reduce_ranks(data, world::Checked::Here),
            },
        }
    }
    /// Writes into `recv` on every rank the elementwise sum over ranks of `send`, in `order`
    /// (equal lengths): with `Order::Mpi`, MPI reads `send` and writes `recv`, which saves
    /// [`Group::all_reduce`]'s copy of the input.
    pub fn all_reduce_into(&self, send: &[f32], recv: &mut [f32], order: Order) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::invalid(
                "Group::all_reduce_into",
                format!("{} values to send, room for {} (rank {})", send.len(), recv.len(), self.rank()),
            ));
        }
        match &self.inner {
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) if order == Order::Mpi => w.all_reduce_mpi_into(send, recv, world::Checked::Here),
            _ => {
                recv.copy_from_slice(send);
                self.all_reduce(recv, order)
            }
        }
    }

    /// Checks, in one header exchange, that every rank is about to all-reduce `len` values in
    /// `order` as calls of [`Group::all_reduce_chunk_into`] on chunks of `chunk` values (the
    /// last one short); those calls then check nothing themselves. Collective.
    pub(crate) fn agree_all_reduce_chunks(&self, len: usize, chunk: usize, order: Order) -> Result<()> {
        match &self.inner {
            Inner::Alone => Ok(()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.agree_chunks(len, chunk, order),
        }
    }

    /// Checks that every rank is about to run the device collective `op` on `len` values
    /// (`extra`: its root), for device communicators that trust each rank's count, as NCCL's
    /// do: one header exchange through MPI before the device call. Collective.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn agree_device(&self, op: DeviceOp, len: usize, extra: usize) -> Result<()> {
        match &self.inner {
            Inner::Alone => Ok(()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.agree_device(op, len, extra),
        }
    }

    /// [`Group::all_reduce_into`] of one chunk of an all-reduce that
    /// [`Group::agree_all_reduce_chunks`] checked: no header of its own.
    pub(crate) fn all_reduce_chunk_into(&self, send: &[f32], recv: &mut [f32], order: Order) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::invalid(
                "Group::all_reduce_into",
                format!("{} values to send, room for {} (rank {})", send.len(), recv.len(), self.rank()),
            ));
        }
        match &self.inner {
            Inner::Alone => {
                recv.copy_from_slice(send);
                Ok(())
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => match order {
                Order::Mpi => w.all_reduce_mpi_into(send, recv, world::Checked::Agreed),
                Order::Ranks => {
                    recv.copy_from_slice(send);
                    w.all_reduce_ranks(recv, world::Checked::Agreed)
                }
            },
        }
    }
    /// Every rank's `data` (lengths may differ), on every rank, in rank order. A rank calling
    /// [`Group::all_gather_u64`] (or another collective) at the same time makes every rank's
    /// call an error.
    pub fn all_gather(&self, data: &[f32]) -> Result<Vec<Vec<f32>>> {
        match &self.inner {
            Inner::Alone => Ok(vec![data.to_vec()]),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.all_gather(data),
        }
    }
    /// Every rank's `values`, on every rank, in rank order.
    pub fn all_gather_u64(&self, values: &[u64]) -> Result<Vec<Vec<u64>>> {
        match &self.inner {
            Inner::Alone => Ok(vec![values.to_vec()]),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.all_gather_u64(values),
        }
    }
    /// Sends `data` to rank `dest`, which receives it with [`Group::recv`]; `tag` tells apart
    /// messages between the same two ranks. Returns once `data` may be reused.
    pub fn send(&self, data: &[f32], dest: usize, tag: u16) -> Result<()> {
        self.check_peer("Group::send", dest)?;
        match &self.inner {
            Inner::Alone => Ok(()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.send(data, dest, tag),
        }
    }
    /// The next message with `tag` from rank `src`, whatever its length: the length comes with
    /// the message (MPI's probe), and a message that is not whole `f32` values is an error.
    pub fn recv(&self, src: usize, tag: u16) -> Result<Vec<f32>> {
        self.check_peer("Group::recv", src)?;
        match &self.inner {
            Inner::Alone => Ok(Vec::new()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.recv(src, tag),
        }
    }
    /// Ends the whole job: prints `message` with this rank and calls `MPI_Abort` (alone, exits
    /// with status 1). For errors a rank cannot recover from, which would otherwise leave the
    /// other ranks waiting in their next collective until the timeout.
    pub fn abort(&self, message: &str) -> ! {
        match &self.inner {
            Inner::Alone => {
                eprintln!("tandem: {message}");
                std::process::exit(1)
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.abort(message),
        }
    }

    fn check_rank(&self, op: &'static str, rank: usize) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::invalid(op, format!("rank {rank} is outside the group of {} processes (this is rank {})", self.size(), self.rank())));
        }
        Ok(())
    }
    fn check_peer(&self, op: &'static str, peer: usize) -> Result<()> {
        self.check_rank(op, peer)?;
        if peer == self.rank() {
            return Err(Error::invalid(op, format!("rank {peer} is this process; send and receive need another rank")));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group(rank {} of {}, local {} of {})", self.rank(), self.size(), self.local_rank(), self.local_size())
    }
}

/// This process's devices out of `spec`, which names the devices of the whole machine (a
/// comma list as for [`Device::parse`]). With as many entries as the machine's processes, or
/// a multiple, local rank `r` of `L` takes the `r`-th of `L` equal runs of entries: `cuda:0,
/// cuda:1` gives each of two processes one GPU. With fewer entries than processes, process `r`
/// shares entry `r mod n` with others: `cpu` or `wgpu:0` under four processes gives each its
/// own logical device on that adapter.
pub fn local_devices(spec: &str, group: &Group) -> Result<Vec<Device>> {
    Device::parse(&local_spec(spec, group.local_rank(), group.local_size())?)
}

/// The part of `spec` that local rank `rank` of `size` takes (see [`local_devices`]).
pub fn local_spec(spec: &str, rank: usize, size: usize) -> Result<String> {
    let entries: Vec<&str> = spec.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
    let n = entries.len();
    if n == 0 || size == 0 || rank >= size {
        return Err(Error::invalid("dist::local_devices", format!("no devices for local rank {rank} of {size} in {spec:?}")));
    }
    if n < size {
        return Ok(entries[rank % n].to_string());
    }
    if !n.is_multiple_of(size) {
        return Err(Error::invalid(
            "dist::local_devices",
            format!("{n} devices in {spec:?} cannot be shared equally by the {size} processes on this machine; name a multiple of {size}, or fewer devices than processes"),
        ));
    }
    let per = n / size;
    Ok(entries[rank * per..(rank + 1) * per].join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_local_rank_takes_its_run_of_devices() {
        assert_eq!(local_spec("cuda:0,cuda:1", 1, 2).unwrap(), "cuda:1");
        assert_eq!(local_spec("cuda:0,cuda:1,cuda:2,cuda:3", 1, 2).unwrap(), "cuda:2,cuda:3");
        assert_eq!(local_spec("cpu,cpu", 0, 1).unwrap(), "cpu,cpu");
        assert_eq!(local_spec("wgpu:0", 2, 3).unwrap(), "wgpu:0");
        assert_eq!(local_spec("wgpu:0, wgpu:1", 3, 4).unwrap(), "wgpu:1");
        assert!(local_spec("cuda:0,cuda:1,cuda:2", 0, 2).is_err());
        assert!(local_spec("", 0, 1).is_err());
    }

    #[test]
    fn a_group_of_one_returns_its_input() {
        let g = Group::alone();
        let mut v = vec![1.5f32, -2.0];
        g.all_reduce(&mut v, Order::Ranks).unwrap();
        let mut into = vec![0.0; 2];
        g.all_reduce_into(&v, &mut into, Order::Mpi).unwrap();
        assert_eq!(into, v);
        assert!(g.all_reduce_into(&v, &mut [0.0; 3], Order::Mpi).is_err());
        g.broadcast(&mut v, 0).unwrap();
        assert_eq!(v, vec![1.5, -2.0]);
        assert_eq!(g.all_gather(&v).unwrap(), vec![v.clone()]);
        assert!(g.broadcast(&mut v, 1).is_err());
        assert!(g.send(&v, 0, 0).is_err());
    }
}
