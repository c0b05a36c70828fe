//! [`Nccl`] across processes: one NCCL communicator per GPU of every rank of a
//! [`Group`], and the watchdog that ends the job when NCCL reports an asynchronous error.
//!
//! Rank 0 creates NCCL's unique id and broadcasts its 128 bytes through MPI; every process
//! then creates its devices' communicators with `ncclCommInitRank`, NCCL rank = the device's
//! global index (rank 0's devices first), inside one NCCL group so that a process driving
//! several GPUs does not wait on itself. Before any NCCL call the ranks agree that every one of
//! them can take part (its devices are CUDA GPUs, one per GPU, and the library loads): a rank
//! that cannot would otherwise leave the others waiting in `ncclCommInitRank` forever.
//!
//! NCCL reports a failed peer or network (a remote rank died, a socket closed) only through
//! `ncclCommGetAsyncError`, while the collective's kernels wait on the GPU. As PyTorch's
//! watchdog does, a thread polls every communicator; on an error it aborts the communicator
//! (`ncclCommAbort`, which ends the waiting kernels) and ends the job naming this rank.
//!
//! Across processes, each all-reduce, broadcast and reduce-scatter first checks through MPI
//! that every rank passes the same length ([`Nccl::agree_across`]); an all-gather exchanges
//! every device's count anyway and sizes its buffers from them.
use super::nccl::{cuda_ranks, panic_message, probe, Nccl};
use super::Communicator;
use crate::dist::Group;
use crate::{Device, Error, Result};
use cudarc::nccl::sys::{ncclCommAbort, ncclCommGetAsyncError, ncclComm_t, ncclResult_t};
use cudarc::nccl::{group_end, group_start, Comm, Id};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watchdog asks NCCL for asynchronous errors.
const POLL: Duration = Duration::from_millis(200);

impl Nccl {
    /// A communicator over this process's `devices` and every other rank's of `group`
    /// (collective: every rank calls it with its own devices, one per GPU). Errors, on every
    /// rank and naming the rank at fault, when any rank's devices are not distinct CUDA GPUs
    /// or its NCCL library does not load; nothing waits forever.
    pub fn across(devices: &[Device], group: &Group) -> Result<Nccl> {
        let local = cuda_ranks(devices).and_then(|r| probe().map(|v| (r, v)));
        // Rank 0's id goes out with the agreement, so a rank that fails makes no NCCL call.
        let id = if group.rank() == 0 { local.as_ref().ok().map(|_| Id::new()) } else { None };
        let ready = match (&local, &id) {
            (Err(_), _) | (_, Some(Err(_))) => 0,
            _ => 1,
        };
        let all = group.all_gather_u64(&[ready, devices.len() as u64])?;
        let (rank, size) = (group.rank(), group.size());
        let failed: Vec<usize> = all.iter().enumerate().filter(|(_, v)| v.first() != Some(&1)).map(|(r, _)| r).collect();
        let ((ranks, ordinals), version) = match local {
            Err(e) => {
                return Err(Error::Unavailable {
                    backend: "nccl",
                    reason: format!("rank {rank} of {size} cannot take part in NCCL across processes: {e}"),
                })
            }
            Ok(l) if failed.is_empty() => l,
            Ok(_) => {
                return Err(Error::Unavailable {
                    backend: "nccl",
                    reason: format!("ranks {failed:?} of {size} cannot take part in NCCL across processes (see their errors); rank {rank} stops too"),
                })
            }
        };
        let id = match id {
            Some(Ok(id)) => Some(id),
            Some(Err(e)) => {
                return Err(Error::Backend { backend: "nccl", device: format!("rank {rank}"), detail: format!("ncclGetUniqueId: {e:?}") })
            }
            None => None,
        };
        let mut bytes = id.map_or([0u8; 128], |id| id.internal().map(|c| c as u8));
        group.broadcast_bytes(&mut bytes, 0)?;
        let id = Id::uninit(bytes.map(|b| b as std::ffi::c_char));
        let counts: Vec<usize> = all.iter().map(|v| v.get(1).map_or(0, |&n| n as usize)).collect();
        let first: usize = counts[..rank].iter().sum();
        let total: usize = counts.iter().sum();
        let gpus: Vec<String> = ordinals.iter().map(|o| format!("cuda:{o}")).collect();
        let created = catch_unwind(AssertUnwindSafe(|| -> std::result::Result<Vec<Comm>, String> {
            let _keep = super::nccl::KeepContext::save();
            group_start().map_err(|e| format!("ncclGroupStart: {e:?}"))?;
            let made: std::result::Result<Vec<Comm>, String> = ranks
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    // ncclCommInitRank binds the communicator to the calling thread's device.
                    r.stream.context().bind_to_thread().map_err(|e| format!("binding {}: {e:?}", r.label))?;
                    Comm::from_rank(r.stream.clone(), first + i, total, id)
                        .map_err(|e| format!("ncclCommInitRank (rank {} of {total}): {e:?}", first + i))
                })
                .collect();
            let ended = group_end().map_err(|e| format!("ncclGroupEnd: {e:?}"));
            let made = made?;
            ended?;
            Ok(made)
        }));
        let comms = match created {
            Ok(Ok(c)) => c,
            Ok(Err(detail)) => return Err(Error::Backend { backend: "nccl", device: format!("rank {rank} of {size}: {}", gpus.join(",")), detail }),
            Err(panic) => return Err(Error::Unavailable { backend: "nccl", reason: format!("rank {rank} of {size}: {}", panic_message(panic)) }),
        };
        let handles: Vec<Handle> = comms.iter().filter_map(raw_handle).collect();
        let mut nccl = Nccl::assemble(devices, ranks, comms, version, (first, total), Some(group.clone()));
        if handles.len() == devices.len() {
            nccl.watchdog = Some(Watchdog::start(handles, group.clone(), gpus)?);
        } else {
            tracing::warn!("nccl: cannot read the communicators' handles; NCCL's asynchronous errors are not watched");
        }
        Ok(nccl)
    }
}

impl Nccl {
    /// Across processes, checks that every rank is about to run `op` on `len` values (`root`:
    /// the broadcast's) before any NCCL call: NCCL trusts each rank's count, and ranks that
    /// disagree would read and write past each other's GPU buffers or wait forever. One small
    /// MPI all-gather per collective (see [`crate::dist`]); nothing within one process.
    pub(super) fn agree_across(&self, op: crate::dist::DeviceOp, len: usize, root: usize) -> Result<()> {
        match self.process_group().filter(|g| g.size() > 1) {
            Some(group) => group.agree_device(op, len, root),
            None => Ok(()),
        }
    }

    /// `local` (one count per device of this process) for every NCCL rank: gathered from
    /// every process when the communicator spans several (collective), else `local`.
    pub(super) fn global_counts(&self, local: Vec<usize>) -> Result<Vec<usize>> {
        let Some(group) = self.process_group().filter(|g| g.size() > 1) else { return Ok(local) };
        let all = group.all_gather_u64(&local.iter().map(|&c| c as u64).collect::<Vec<_>>())?;
        Ok(all.into_iter().flatten().map(|c| c as usize).collect())
    }
}

/// A raw communicator, polled from the watchdog's thread.
#[derive(Clone, Copy)]
struct Handle(ncclComm_t);
// SAFETY: NCCL allows ncclCommGetAsyncError and ncclCommAbort from any thread, at any time
// while the communicator exists (they are meant for a watchdog); the watchdog stops before the
// communicators are destroyed (`Nccl::watchdog` is dropped before `Nccl::comms`).
unsafe impl Send for Handle {}

/// The raw `ncclComm_t` inside cudarc's `Comm`. cudarc 0.19 keeps it private and shows it only
/// in its `Debug` output (`Comm { comm: 0x…, … }`); `None` if that ever changes, and then the
/// watchdog is not started (reported) rather than reading a wrong pointer.
fn raw_handle(comm: &Comm) -> Option<Handle> {
    let text = format!("{comm:?}");
    let hex = text.strip_prefix("Comm { comm: 0x")?;
    let end = hex.find(|c: char| !c.is_ascii_hexdigit())?;
    let addr = usize::from_str_radix(&hex[..end], 16).ok().filter(|&a| a != 0)?;
    Some(Handle(addr as ncclComm_t))
}

/// The thread that polls NCCL's asynchronous errors; stops when dropped.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    fn start(handles: Vec<Handle>, group: Group, gpus: Vec<String>) -> Result<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tandem-nccl-watchdog".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    for (i, h) in handles.iter().enumerate() {
                        if let Some(err) = async_error(*h) {
                            // SAFETY: the communicator exists (see `Handle`); aborting it ends
                            // its kernels, and the job ends before anything uses it again.
                            unsafe { ncclCommAbort(h.0) };
                            group.abort(&format!(
                                "NCCL reported {err:?} on {} (NCCL rank {i} of this process); the communicator was aborted",
                                gpus[i]
                            ));
                        }
                    }
                    std::thread::sleep(POLL);
                }
            })
            .map_err(|e| Error::Msg(format!("nccl: cannot start the watchdog thread: {e}")))?;
        Ok(Watchdog { stop, thread: Some(thread) })
    }
}

/// The communicator's asynchronous error, `None` while it is fine (or still connecting).
fn async_error(h: Handle) -> Option<ncclResult_t> {
    let mut state = ncclResult_t::ncclSuccess;
    // SAFETY: `h` is a live communicator (see `Handle`) and `state` a valid out-pointer.
    let called = unsafe { ncclCommGetAsyncError(h.0, &mut state) };
    let fine = |r: ncclResult_t| matches!(r, ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress);
    if !fine(called) {
        return Some(called);
    }
    (!fine(state)).then_some(state)
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_other_than_cuda_gpus_are_refused_before_any_nccl_call() {
        let err = Nccl::across(&[Device::cpu()], &Group::alone()).err().expect("a CPU device is refused");
        let text = err.to_string();
        assert!(text.contains("rank 0 of 1") && text.contains("not a CUDA device"), "{text}");
        assert!(Nccl::across(&[], &Group::alone()).is_err());
    }
}
