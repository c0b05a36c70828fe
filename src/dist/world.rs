//! The MPI world behind a [`super::Group`] (cargo feature `mpi`): initialisation, the panic
//! hook, and every collective as a nonblocking call polled against the timeout.
//!
//! MPI has no timeouts: a blocking `MPI_Allreduce` whose peer stopped answering waits forever.
//! So each operation starts the nonblocking form (`MPI_Iallreduce`, ...) and tests it until it
//! completes or the deadline passes, and then ends the job with `MPI_Abort` naming this rank
//! and the operation. Calls are serialized by one mutex, which also keeps the order of
//! collectives the same on every rank when several threads of a process use the group.
use crate::parallel::comm::{even_ranges, tree_sum};
use crate::{Error, Result};
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::time::{Duration, Instant};

/// The world communicator; only used with the mutex held.
struct Comm(SimpleCommunicator);
// SAFETY: an MPI communicator handle may be used from any thread when MPI granted at least
// MPI_THREAD_SERIALIZED (checked in `World::get`) and calls do not overlap, which the mutex
// around every use guarantees.
unsafe impl Send for Comm {}

/// The initialised MPI library and this process's place in it.
pub(super) struct World {
    comm: Mutex<Comm>,
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub threading: Threading,
    timeout: Duration,
    /// Dropped last: its drop calls MPI_Finalize, after every other use of MPI.
    _universe: mpi::environment::Universe,
}

/// The live world, shared by every `Group`; MPI is finalized when the last one drops.
static WORLD: Mutex<Weak<World>> = Mutex::new(Weak::new());

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable { backend: "mpi", reason: reason.into() }
}

impl World {
    /// The live world, or a newly initialised one.
    pub fn get(timeout: Duration) -> Result<Arc<World>> {
        let mut slot = WORLD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = slot.upgrade() {
            return Ok(w);
        }
        if mpi::environment::is_finalized() {
            return Err(unavailable("MPI was finalized when the last process group was dropped, and cannot be initialised again; keep a Group alive for the whole run"));
        }
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple).ok_or_else(|| unavailable("MPI was initialised by other code; tandem::dist::init must initialise it"))?;
        if threading < Threading::Serialized {
            return Err(unavailable(format!("the MPI library grants thread level {threading:?}; tandem calls MPI from worker threads and needs Serialized")));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let shared = world.split_shared(rank as i32);
        let (local_rank, local_size) = (shared.rank() as usize, shared.size() as usize);
        drop(shared);
        install_panic_hook(rank, size);
        let w = Arc::new(World { comm: Mutex::new(Comm(world)), rank, size, local_rank, local_size, threading, timeout, _universe: universe });
        *slot = Arc::downgrade(&w);
        Ok(w)
    }

    fn lock(&self) -> MutexGuard<'_, Comm> {
        self.comm.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Prints `message` naming this rank and ends every rank of the job.
    pub fn abort(&self, message: &str) -> ! {
        abort_job(&format!("rank {} of {}: {message}", self.rank, self.size))
    }

    /// Polls `req` until it completes; past the timeout, ends the job naming `what`.
    fn wait<'a, D: ?Sized, S: Scope<'a>>(&self, what: &str, mut req: Request<'a, D, S>) {
        let start = Instant::now();
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                self.abort(&format!(
                    "{what} did not complete within {:.1} s ({}); another rank stopped answering or died",
                    self.timeout.as_secs_f64(),
                    super::TIMEOUT_ENV
                ));
            }
            // Polling is what progresses MPI's transfers: poll hard while a reply is likely
            // soon, then let the other ranks on an oversubscribed machine have the core.
            if waited < Duration::from_millis(20) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    pub fn barrier(&self) -> Result<()> {
        let c = self.lock();
        self.wait("barrier", c.0.immediate_barrier());
        Ok(())
    }

    pub fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        count("Group::broadcast", data.len())?;
        let c = self.lock();
        let what = format!("broadcast of {} floats from rank {root}", data.len());
        mpi::request::scope(|sc| self.wait(&what, c.0.process_at_rank(root as i32).immediate_broadcast_into(sc, data)));
        Ok(())
    }

    pub fn all_reduce_mpi(&self, data: &mut [f32]) -> Result<()> {
        count("Group::all_reduce", data.len())?;
        let send = data.to_vec();
        let c = self.lock();
        let what = format!("all_reduce of {} floats", data.len());
        mpi::request::scope(|sc| self.wait(&what, c.0.immediate_all_reduce_into(sc, &send[..], data, mpi::collective::SystemOperation::sum())));
        Ok(())
    }

    /// The sum in rank order: slice `r` of every rank's buffer goes to rank `r` (all-to-all),
    /// which sums the slices with `tree_sum` over rank, and every rank gathers the sums.
    pub fn all_reduce_ranks(&self, data: &mut [f32]) -> Result<()> {
        count("Group::all_reduce", data.len())?;
        let p = self.size;
        let slices = even_ranges(data.len(), p);
        let m = slices[self.rank].len();
        let counts: Vec<i32> = slices.iter().map(|r| r.len() as i32).collect();
        let starts: Vec<i32> = slices.iter().map(|r| r.start as i32).collect();
        let mut recv = vec![0f32; m * p];
        let c = self.lock();
        {
            let send = Partition::new(&data[..], &counts[..], &starts[..]);
            let recv_starts: Vec<i32> = (0..p).map(|i| (i * m) as i32).collect();
            let mut into = PartitionMut::new(&mut recv[..], vec![m as i32; p], recv_starts);
            let what = format!("all_reduce (rank order, all-to-all step) of {} floats", data.len());
            mpi::request::scope(|sc| self.wait(&what, c.0.immediate_all_to_all_varcount_into(sc, &send, &mut into)));
        }
        let sum = tree_sum((0..p).map(|i| recv[i * m..(i + 1) * m].to_vec()).collect())?;
        let mut into = PartitionMut::new(data, &counts[..], &starts[..]);
        let what = format!("all_reduce (rank order, all-gather step) of {} floats", counts.iter().map(|&n| n as usize).sum::<usize>());
        mpi::request::scope(|sc| self.wait(&what, c.0.immediate_all_gather_varcount_into(sc, &sum[..], &mut into)));
        Ok(())
    }

    pub fn all_gather(&self, data: &[f32]) -> Result<Vec<Vec<f32>>> {
        self.gather_var("all_gather", data)
    }

    pub fn all_gather_u64(&self, values: &[u64]) -> Result<Vec<Vec<u64>>> {
        self.gather_var("all_gather", values)
    }

    /// Every rank's `data`, whose lengths may differ: first the lengths, then the data.
    fn gather_var<T: Equivalence + Copy + Default>(&self, op: &'static str, data: &[T]) -> Result<Vec<Vec<T>>> {
        let n = count(op, data.len())?;
        let c = self.lock();
        let mut counts = vec![0i32; self.size];
        let what = format!("{op} (lengths)");
        mpi::request::scope(|sc| self.wait(&what, c.0.immediate_all_gather_into(sc, &n, &mut counts[..])));
        let mut starts = Vec::with_capacity(self.size);
        let mut total = 0usize;
        for &k in &counts {
            starts.push(count(op, total)?);
            total += k as usize;
        }
        let mut all = vec![T::default(); total];
        {
            let mut into = PartitionMut::new(&mut all[..], &counts[..], &starts[..]);
            let what = format!("{op} of {total} values");
            mpi::request::scope(|sc| self.wait(&what, c.0.immediate_all_gather_varcount_into(sc, data, &mut into)));
        }
        Ok(counts.iter().zip(&starts).map(|(&k, &s)| all[s as usize..(s + k) as usize].to_vec()).collect())
    }

    pub fn send(&self, data: &[f32], dest: usize, tag: u16) -> Result<()> {
        count("Group::send", data.len())?;
        let c = self.lock();
        let what = format!("send of {} floats to rank {dest} (tag {tag})", data.len());
        mpi::request::scope(|sc| self.wait(&what, c.0.process_at_rank(dest as i32).immediate_send_with_tag(sc, data, i32::from(tag))));
        Ok(())
    }

    /// Probes for the message (taking the lock only for each probe, so that this process's
    /// other threads can send meanwhile), then receives exactly its length.
    pub fn recv(&self, src: usize, tag: u16) -> Result<Vec<f32>> {
        let start = Instant::now();
        loop {
            let c = self.lock();
            if let Some((msg, status)) = c.0.process_at_rank(src as i32).immediate_matched_probe_with_tag(i32::from(tag)) {
                let mut buf = vec![0f32; status.count(f32::equivalent_datatype()).max(0) as usize];
                let what = format!("receive of {} floats from rank {src} (tag {tag})", buf.len());
                mpi::request::scope(|sc| self.wait(&what, msg.immediate_matched_receive_into(sc, &mut buf[..])));
                return Ok(buf);
            }
            drop(c);
            if start.elapsed() >= self.timeout {
                self.abort(&format!("no message from rank {src} (tag {tag}) within {:.1} s ({})", self.timeout.as_secs_f64(), super::TIMEOUT_ENV));
            }
            std::thread::sleep(Duration::from_micros(if start.elapsed() < Duration::from_millis(20) { 10 } else { 200 }));
        }
    }
}

/// A length as MPI's `int` count.
fn count(op: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::invalid(op, format!("{n} values exceed MPI's count limit of {} per call", i32::MAX)))
}

/// Prints `message` and calls `MPI_Abort` on the world, which ends every rank; it neither
/// needs nor takes the group's lock (a timed-out wait holds it).
fn abort_job(message: &str) -> ! {
    eprintln!("tandem: {message}; ending the job (MPI_Abort)");
    // SAFETY: MPI is initialised (a World exists or the hook checked) and not finalized;
    // MPI_Abort takes the predefined world communicator, valid for the whole run.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 1);
    }
    std::process::abort()
}

/// After the usual panic message, a panic on any thread ends the job: otherwise the other
/// ranks would wait in their next collective for this one.
fn install_panic_hook(rank: usize, size: usize) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
                abort_job(&format!("rank {rank} of {size} panicked"));
            }
        }));
    });
}
