//! The MPI world behind a [`super::Group`] (cargo feature `mpi`): initialisation, the panic
//! hook, and the watchdog that bounds every operation by the timeout.
//!
//! MPI has no timeouts: a blocking `MPI_Allreduce` whose peer stopped answering waits forever.
//! Each operation here is the library's blocking call (its fastest algorithms: Open MPI's
//! nonblocking collectives, polled against a deadline, are much slower; see benches/README.md),
//! registered with a watchdog thread for its duration; past the deadline the watchdog ends
//! the job with `MPI_Abort`, naming this rank and the operation, as PyTorch's NCCL watchdog
//! does. Calling MPI_Abort while another thread waits inside MPI needs
//! `MPI_THREAD_MULTIPLE`, which is therefore required. Collectives are still serialized by
//! one mutex, which keeps their order the same on every rank when several threads of a
//! process use the group; point-to-point calls do not take it. Under the same mutex each
//! collective first all-gathers a fixed-size header (see `agree.rs`) and checks it.
use super::agree::{self, Elem, Header, Op, WORDS};
use super::tree_sum;
use super::Order;
use crate::shape::even_ranges;
use crate::{Error, Result};
use mpi::datatype::{Equivalence, Partition, PartitionMut};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::time::{Duration, Instant};

/// The world communicator.
struct Comm(SimpleCommunicator);
// SAFETY: an MPI communicator handle may be used from any thread, even at once, when MPI
// granted MPI_THREAD_MULTIPLE (checked in `World::get`).
unsafe impl Send for Comm {}
// SAFETY: as above: under MPI_THREAD_MULTIPLE, threads may call MPI on one communicator at once.
unsafe impl Sync for Comm {}

/// The initialised MPI library and this process's place in it.
pub(super) struct World {
    comm: Comm,
    /// Held for each collective, so that threads of one process issue them in one order; it
    /// holds the all-reduce's send copy, kept between calls (a fresh buffer of many MiB costs
    /// its page faults on every call).
    order: Mutex<Vec<f32>>,
    watchdog: Arc<Watchdog>,
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub threading: Threading,
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
            return Err(unavailable(
                "MPI was finalized when the last process group was dropped, and cannot be initialised again; keep a Group alive for the whole run",
            ));
        }
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| unavailable("MPI was initialised by other code; tandem::dist::init must initialise it"))?;
        if threading < Threading::Multiple {
            return Err(unavailable(format!(
                "the MPI library grants thread level {threading:?}; tandem needs Multiple (its watchdog ends the job from its own thread while another waits inside MPI)"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let shared = world.split_shared(rank as i32);
        let (local_rank, local_size) = (shared.rank() as usize, shared.size() as usize);
        drop(shared);
        install_panic_hook(rank, size);
        let watchdog = Watchdog::start(format!("rank {rank} of {size}"), timeout);
        let w = Arc::new(World {
            comm: Comm(world),
            order: Mutex::new(Vec::new()),
            watchdog,
            rank,
            size,
            local_rank,
            local_size,
            threading,
            _universe: universe,
        });
        *slot = Arc::downgrade(&w);
        Ok(w)
    }

    /// Holds the collective order for the caller's collective.
    fn lock(&self) -> MutexGuard<'_, Vec<f32>> {
        self.order.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Prints `message` naming this rank and ends every rank of the job.
    pub fn abort(&self, message: &str) -> ! {
        abort_job(&format!("rank {} of {}: {message}", self.rank, self.size))
    }

    /// Runs the blocking MPI call `f` under the watchdog: past the timeout, the job ends.
    fn guarded<T>(&self, what: impl FnOnce() -> String, f: impl FnOnce(&SimpleCommunicator) -> T) -> T {
        let token = self.watchdog.arm(what);
        let out = f(&self.comm.0);
        self.watchdog.disarm(token);
        out
    }

    /// Every rank's header of the collective about to run, checked against this one's (see
    /// [`agree::check`]); the caller holds the order lock. One `MPI_Allgather` of 32 bytes
    /// per rank: a few microseconds over shared memory, one network latency across machines.
    fn agree(&self, op: &'static str, mine: Header, lengths_may_differ: bool) -> Result<Vec<Header>> {
        let mut all = vec![0u64; WORDS * self.size];
        self.guarded(|| format!("{} (agreeing on lengths)", mine.describe()), |c| c.all_gather_into(&mine.0[..], &mut all[..]));
        let all: Vec<Header> = all.chunks_exact(WORDS).map(|w| Header([w[0], w[1], w[2], w[3]])).collect();
        agree::check(op, &all, self.rank, lengths_may_differ)?;
        Ok(all)
    }

    /// The header exchange is the barrier: no rank has every header before every rank has
    /// sent its own.
    pub fn barrier(&self) -> Result<()> {
        let _order = self.lock();
        self.agree("Group::barrier", Header::new(Op::Barrier, Elem::None, 0, 0), false).map(drop)
    }

    pub fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        count("Group::broadcast", data.len())?;
        let _order = self.lock();
        let n = data.len();
        self.agree("Group::broadcast", Header::new(Op::Broadcast, Elem::F32, n, root), false)?;
        self.guarded(|| format!("broadcast of {n} floats from rank {root}"), |c| c.process_at_rank(root as i32).broadcast_into(data));
        Ok(())
    }

    /// Checks once that every rank all-reduces `len` values in chunks of `chunk`, in `order`;
    /// each chunk then moves without a check of its own ([`Checked::Agreed`]).
    pub fn agree_chunks(&self, len: usize, chunk: usize, order: Order) -> Result<()> {
        let op = if order == Order::Mpi { Op::AllReduceChunks } else { Op::AllReduceRanksChunks };
        let _order = self.lock();
        self.agree("Group::all_reduce", Header::new(op, Elem::F32, len, chunk), false).map(drop)
    }

    pub fn agree_device(&self, op: agree::DeviceOp, len: usize, extra: usize) -> Result<()> {
        let _order = self.lock();
        self.agree("Group::agree_device", Header::device(op, len, extra), false).map(drop)
    }

    pub fn all_reduce_mpi(&self, data: &mut [f32], checked: Checked) -> Result<()> {
        count("Group::all_reduce", data.len())?;
        let mut send = self.lock();
        if checked == Checked::Here {
            self.agree("Group::all_reduce", Header::new(Op::AllReduce, Elem::F32, data.len(), 0), false)?;
        }
        send.clear();
        send.extend_from_slice(data);
        self.guarded(
            || format!("all_reduce of {} floats", send.len()),
            |c| c.all_reduce_into(&send[..], data, mpi::collective::SystemOperation::sum()),
        );
        Ok(())
    }

    /// `MPI_Allreduce` from `send` into `recv`: the caller's buffers, no copy.
    pub fn all_reduce_mpi_into(&self, send: &[f32], recv: &mut [f32], checked: Checked) -> Result<()> {
        count("Group::all_reduce_into", send.len())?;
        let _order = self.lock();
        if checked == Checked::Here {
            self.agree("Group::all_reduce_into", Header::new(Op::AllReduce, Elem::F32, send.len(), 0), false)?;
        }
        self.guarded(|| format!("all_reduce of {} floats", send.len()), |c| c.all_reduce_into(send, recv, mpi::collective::SystemOperation::sum()));
        Ok(())
    }

    /// The sum in rank order: slice `r` of every rank's buffer goes to rank `r` (all-to-all),
    /// which sums the slices with `tree_sum` over rank, and every rank gathers the sums.
    pub fn all_reduce_ranks(&self, data: &mut [f32], checked: Checked) -> Result<()> {
        let len = count("Group::all_reduce", data.len())?;
        let p = self.size;
        let slices = even_ranges(data.len(), p);
        let m = slices[self.rank].len();
        let counts: Vec<i32> = slices.iter().map(|r| r.len() as i32).collect();
        let starts: Vec<i32> = slices.iter().map(|r| r.start as i32).collect();
        let _order = self.lock();
        if checked == Checked::Here {
            self.agree("Group::all_reduce", Header::new(Op::AllReduceRanks, Elem::F32, data.len(), 0), false)?;
        }
        let mut recv = vec![0f32; m * p];
        {
            let send = Partition::new(&data[..], &counts[..], &starts[..]);
            let mut into = PartitionMut::new(&mut recv[..], vec![m as i32; p], (0..p).map(|i| (i * m) as i32).collect::<Vec<_>>());
            self.guarded(|| format!("all_reduce of {len} floats in rank order (all-to-all)"), |c| c.all_to_all_varcount_into(&send, &mut into));
        }
        let sum = tree_sum((0..p).map(|i| recv[i * m..(i + 1) * m].to_vec()).collect())?;
        let mut into = PartitionMut::new(data, &counts[..], &starts[..]);
        self.guarded(|| format!("all_reduce of {len} floats in rank order (all-gather)"), |c| c.all_gather_varcount_into(&sum[..], &mut into));
        Ok(())
    }

    pub fn all_gather(&self, data: &[f32]) -> Result<Vec<Vec<f32>>> {
        self.gather_var("Group::all_gather", Elem::F32, data)
    }

    pub fn all_gather_u64(&self, values: &[u64]) -> Result<Vec<Vec<u64>>> {
        self.gather_var("Group::all_gather_u64", Elem::U64, values)
    }

    /// Every rank's `data`, whose lengths may differ: first the headers (which carry the
    /// lengths, and must agree on the element type), then the data.
    fn gather_var<T: Equivalence + Copy + Default>(&self, op: &'static str, elem: Elem, data: &[T]) -> Result<Vec<Vec<T>>> {
        count(op, data.len())?;
        let _order = self.lock();
        let headers = self.agree(op, Header::new(Op::AllGather, elem, data.len(), 0), true)?;
        let mut counts = Vec::with_capacity(self.size);
        let mut starts = Vec::with_capacity(self.size);
        let mut total = 0usize;
        for h in &headers {
            // Each rank checked its own length against MPI's limit; the sum may still pass it.
            let k = count(op, h.len() as usize)?;
            starts.push(count(op, total)?);
            counts.push(k);
            total += k as usize;
        }
        count(op, total)?;
        let mut all = vec![T::default(); total];
        {
            let mut into = PartitionMut::new(&mut all[..], &counts[..], &starts[..]);
            self.guarded(|| format!("{op} of {total} values"), |c| c.all_gather_varcount_into(data, &mut into));
        }
        Ok(counts.iter().zip(&starts).map(|(&k, &s)| all[s as usize..(s + k) as usize].to_vec()).collect())
    }

    pub fn send(&self, data: &[f32], dest: usize, tag: u16) -> Result<()> {
        count("Group::send", data.len())?;
        self.guarded(
            || format!("send of {} floats to rank {dest} (tag {tag})", data.len()),
            |c| c.process_at_rank(dest as i32).send_with_tag(data, i32::from(tag)),
        );
        Ok(())
    }

    /// Probes for the message to learn its length, then receives exactly that: a message's
    /// length travels with it, so nothing is agreed beforehand. One whose bytes are not whole
    /// `f32` values is received (so that it does not linger) and refused.
    pub fn recv(&self, src: usize, tag: u16) -> Result<Vec<f32>> {
        self.guarded(
            || format!("receive from rank {src} (tag {tag})"),
            |c| {
                let (msg, status) = c.process_at_rank(src as i32).matched_probe_with_tag(i32::from(tag));
                let floats = status.count(f32::equivalent_datatype());
                if floats < 0 {
                    let bytes = status.count(u8::equivalent_datatype()).max(0) as usize;
                    let mut raw = vec![0u8; bytes];
                    msg.matched_receive_into(&mut raw[..]);
                    return Err(Error::shape(
                        "Group::recv",
                        format!("rank {src} sent {bytes} bytes with tag {tag}, not whole f32 values (this is rank {})", self.rank),
                    ));
                }
                let mut buf = vec![0f32; floats as usize];
                msg.matched_receive_into(&mut buf[..]);
                Ok(buf)
            },
        )
    }
}

/// Whether an all-reduce exchanges its header itself, or its caller agreed for it (one
/// header for the many calls of a chunked all-reduce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Checked {
    Here,
    Agreed,
}

/// Deadlines of the MPI calls in progress, and a thread that ends the job when one passes.
/// It holds no MPI object, so MPI is finalized when the last group drops.
struct Watchdog {
    armed: Mutex<Vec<(u64, Instant, String)>>,
    changed: Condvar,
    next: AtomicU64,
    /// This rank, for the message.
    who: String,
    timeout: Duration,
}

impl Watchdog {
    fn start(who: String, timeout: Duration) -> Arc<Watchdog> {
        let w = Arc::new(Watchdog { armed: Mutex::new(Vec::new()), changed: Condvar::new(), next: AtomicU64::new(0), who, timeout });
        let watched = Arc::clone(&w);
        std::thread::Builder::new().name("tandem-mpi-watchdog".into()).spawn(move || watched.watch()).expect("spawning the MPI watchdog thread");
        w
    }

    /// Watches an operation from now until `disarm(token)`.
    fn arm(&self, what: impl FnOnce() -> String) -> u64 {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.armed.lock().unwrap_or_else(PoisonError::into_inner).push((token, Instant::now() + self.timeout, what()));
        self.changed.notify_one();
        token
    }

    fn disarm(&self, token: u64) {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner).retain(|a| a.0 != token);
    }

    fn watch(&self) {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            if let Some((_, _, what)) = armed.iter().find(|a| a.1 <= now) {
                abort_job(&format!(
                    "{}: {what} did not complete within the timeout ({} = {:.1} s); another rank stopped answering or died",
                    self.who,
                    super::TIMEOUT_ENV,
                    self.timeout.as_secs_f64()
                ));
            }
            let wake = armed.iter().map(|a| a.1).min().map_or(Duration::from_secs(3600), |d| d.saturating_duration_since(now));
            armed = self.changed.wait_timeout(armed, wake).unwrap_or_else(PoisonError::into_inner).0;
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
