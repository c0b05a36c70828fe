//! ZeRO-3 unit by unit: a unit's (bucket's) full parameters are all-gathered when an op first
//! needs them, in forward and again in backward, the next unit's gather is started ahead, and
//! the units behind are released, so that a device holds about two units of full parameters
//! at a time instead of the whole model (FSDP's `reshard_after_forward = true`, with
//! backward prefetch).
//!
//! How: at the start of a step every parameter's buffer gets a refill hook
//! ([`Buffer::refill`](crate::backend::Buffer)). An op that finds a released parameter runs the
//! hook on the worker's thread, which asks the communication thread to all-gather the unit
//! (`buckets::Msg::Gather`, with this device's block), waits for the whole unit, and fills the
//! members' memory from it. Any model works, with no wrapping: the ops that read a parameter are
//! where its unit is gathered. The hook also asks for the unit that came next at this point of
//! the previous step (prefetch: its all-gather runs while this unit computes), and marks every
//! other held unit for release, done between two ops ([`crate::tensor::between_ops`]), since
//! the op that ran the hook may be reading one of them. Backward releases a unit the moment its
//! gradients are complete.
//!
//! Every device asks for the same gathers in the same order, because each runs the same
//! program with the same rules; the communication thread runs a gather once every device has
//! asked (`buckets::exchange`), so all processes run their collectives in one order.
use super::buckets::{self, GatherAsk, Msg};
use super::shard::Holder;
use super::shard::Sharded;
use super::timing::Stamp;
use crate::autograd::no_grad;
use crate::backend::Refill;
use crate::parallel::comm::Communicator;
use crate::{Device, Error, Result, Tensor};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// One unit as one device holds it.
pub(super) struct UnitOnDevice {
    /// Each member parameter and its offset in the unit's flat values.
    pub members: Vec<(Tensor, usize)>,
    /// This device's pieces of the unit, in block order.
    pub pieces: Vec<Tensor>,
    /// Elements per device block.
    pub block: usize,
}

/// This device's block of a unit: its pieces' values, then zeros to the block's length.
pub(super) fn block_of(pieces: &[Tensor], block: usize, dev: &Device) -> Result<Tensor> {
    let mut parts: Vec<Tensor> = pieces.iter().map(|v| v.detach().flatten_all()).collect::<Result<_>>()?;
    let held: usize = parts.iter().map(Tensor::numel).sum();
    if held < block {
        parts.push(Tensor::zeros([block - held], dev)?);
    }
    Tensor::cat(&parts, 0)
}

/// Gives the members their memory back and their values out of the gathered unit `flat`.
pub(super) fn fill(members: &[(Tensor, usize)], flat: &Tensor) -> Result<()> {
    no_grad(|| {
        for (t, off) in members {
            t.restore_storage()?;
            t.assign(&flat.narrow(0, *off, t.numel())?.reshape(t.shape().clone())?)?;
        }
        Ok(())
    })
}

/// Where a unit's full parameters stand on one device.
enum Held {
    Released,
    /// Asked for; the whole unit arrives here.
    Coming(Receiver<Result<Tensor>>),
    Present,
    /// Present, to be released between the next two ops.
    Retired,
}

/// What the gathers of a step cost on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GatherStats {
    /// Units gathered because an op needed them (forward, backward, re-gathers).
    pub gathers: usize,
    /// Of those, how many had been asked for ahead (prefetched).
    pub prefetched: usize,
    /// Seconds the device waited for its gathered units, on its own clock where it keeps one
    /// (`device_clock`): from the device reaching the op that needed a unit to the unit's
    /// values in place. A wgpu device still running the ops the host recorded before the
    /// demand does not wait for a gather that lands meanwhile, though its host thread does.
    pub waited_s: f64,
    /// The same on the host clock: how long the worker thread blocked on gathers.
    pub host_waited_s: f64,
    /// Whether `waited_s` comes from the device's clock (timestamp queries) rather than the
    /// host's (the CPU, whose clock is the host's, and adapters without timestamps).
    pub device_clock: bool,
}

/// The all-gathers of a ZeRO-3 step gathered unit by unit
/// ([`DataParallel::last_gathers`](super::DataParallel::last_gathers)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gathers {
    /// Per local device.
    pub per_device: Vec<GatherStats>,
    /// Seconds the all-gathers ran on the host, in all.
    pub gather_s: f64,
}

impl Gathers {
    /// Seconds of all-gather the devices did not wait for (it ran while they computed), on
    /// average over the devices, their waits on their own clocks.
    pub fn hidden_s(&self) -> f64 {
        let n = self.per_device.len().max(1) as f64;
        let waited = self.per_device.iter().map(|s| s.waited_s).sum::<f64>() / n;
        (self.gather_s - waited).max(0.0)
    }
}

struct State {
    held: Vec<Held>,
    /// Units in the order ops needed them this step.
    order: Vec<usize>,
    stats: GatherStats,
    /// Each wait on the device's timeline: reaching the op that needed a unit, the unit filled.
    waits: Vec<(Stamp, Stamp)>,
    /// A release between ops that failed (it cannot return its error there).
    failed: Option<Error>,
}

/// What a window leaves at the end of a step: the order ops needed the units in, what the
/// gathers cost, and each wait on the device's timeline.
pub(super) type Finished = (Vec<usize>, GatherStats, Vec<(Stamp, Stamp)>);

/// One device's gathering for one step.
pub(super) struct Window {
    device: usize,
    dev: Device,
    units: Vec<UnitOnDevice>,
    tx: Sender<Msg>,
    /// The order of the previous step, which says what to prefetch.
    previous: Vec<usize>,
    state: Mutex<State>,
}

impl Window {
    pub fn new(device: usize, dev: &Device, units: Vec<UnitOnDevice>, tx: Sender<Msg>, previous: Vec<usize>) -> Arc<Window> {
        let held = units.iter().map(|_| Held::Released).collect();
        Arc::new(Window {
            device,
            dev: dev.clone(),
            units,
            tx,
            previous,
            state: Mutex::new(State { held, order: Vec::new(), stats: GatherStats::default(), waits: Vec::new(), failed: None }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets every member's refill hook to this window; the hooks go when the guard drops
    /// (they hold the window, which holds the members: the guard breaks that cycle).
    pub fn install(self: &Arc<Self>) -> Hooks {
        for (u, unit) in self.units.iter().enumerate() {
            for (t, _) in &unit.members {
                let w = Arc::clone(self);
                let hook: Refill = Arc::new(move |_: &crate::backend::Buffer| w.demand(u));
                t.buffer().set_refill(Some(hook));
            }
        }
        Hooks(Arc::clone(self))
    }

    /// What the refill hook of unit `u` runs: gathers it (or takes its prefetched gather),
    /// prefetches the next, retires the others.
    fn demand(&self, u: usize) -> Result<()> {
        let mut st = self.lock();
        if matches!(st.held[u], Held::Present | Held::Retired) {
            st.held[u] = Held::Present;
            return Ok(());
        }
        let at = st.order.len();
        st.order.push(u);
        st.stats.gathers += 1;
        if matches!(st.held[u], Held::Coming(_)) {
            st.stats.prefetched += 1;
        } else {
            self.ask(&mut st, u)?;
        }
        if let Some(&next) = self.previous.get(at + 1).filter(|&&v| v < self.units.len()) {
            if matches!(st.held[next], Held::Released) {
                self.ask(&mut st, next)?;
            }
        }
        for h in st.held.iter_mut() {
            if matches!(h, Held::Present) {
                *h = Held::Retired;
            }
        }
        let Held::Coming(rx) = std::mem::replace(&mut st.held[u], Held::Released) else {
            return Err(Error::Msg(format!("data parallel: unit {u} was not asked for")));
        };
        let (t, reached) = (Instant::now(), Stamp::now(&self.dev)?);
        let flat = rx.recv().map_err(|_| buckets::stopped())??;
        fill(&self.units[u].members, &flat)?;
        st.waits.push((reached, Stamp::now(&self.dev)?));
        st.stats.host_waited_s += t.elapsed().as_secs_f64();
        st.held[u] = Held::Present;
        Ok(())
    }

    /// Sends this device's block of unit `u` to be all-gathered.
    fn ask(&self, st: &mut State, u: usize) -> Result<()> {
        let unit = &self.units[u];
        let block = no_grad(|| block_of(&unit.pieces, unit.block, &self.dev))?;
        let (reply, rx) = channel();
        buckets::send(&self.tx, Msg::Gather(GatherAsk { unit: u, device: self.device, block, reply }))?;
        st.held[u] = Held::Coming(rx);
        Ok(())
    }

    /// Releases the retired units; run between two ops. Skipped while a gather holds the
    /// window (the ops that fill a unit run inside it).
    pub fn settle(&self) {
        let Ok(mut st) = self.state.try_lock() else { return };
        for u in 0..st.held.len() {
            if matches!(st.held[u], Held::Retired) {
                if let Err(e) = self.release_members(u) {
                    st.failed.get_or_insert(e);
                }
                st.held[u] = Held::Released;
            }
        }
    }

    /// Releases unit `u` now (backward completed its gradients; no op is running).
    pub fn release(&self, u: usize) -> Result<()> {
        let mut st = self.lock();
        if matches!(st.held[u], Held::Present | Held::Retired) {
            st.held[u] = Held::Released;
        }
        self.release_members(u)
    }

    fn release_members(&self, u: usize) -> Result<()> {
        self.units[u].members.iter().try_for_each(|(t, _)| t.release_storage().map(drop))
    }

    /// Ends the step: releases every unit, drops unused prefetches; the order ops needed the
    /// units in (the next step's prefetch order), what it cost (its waits on the host clock;
    /// `timing::measure` puts them on the device's) and the waits' stamps, or the first failed
    /// release.
    pub fn finish(&self) -> Result<Finished> {
        let mut st = self.lock();
        for u in 0..st.held.len() {
            st.held[u] = Held::Released;
            self.release_members(u)?;
        }
        if let Some(e) = st.failed.take() {
            return Err(e);
        }
        st.stats.waited_s = st.stats.host_waited_s;
        Ok((std::mem::take(&mut st.order), st.stats, std::mem::take(&mut st.waits)))
    }
}

/// The refill hooks of a window's members; dropping it removes them.
pub(super) struct Hooks(Arc<Window>);

impl Drop for Hooks {
    fn drop(&mut self) {
        for unit in &self.0.units {
            for (t, _) in &unit.members {
                t.buffer().set_refill(None);
            }
        }
    }
}

/// Whether a ZeRO-3 step may gather unit by unit: only where every device, in every process,
/// runs `micro` micro-batches, so that all of them ask for the same gathers (a device with
/// fewer samples than micro-batches runs fewer). Across processes that takes one small sum.
pub(super) fn every_device_alike(parts: &[Vec<crate::parallel::split::Part>], micro: usize, comm: &dyn Communicator) -> Result<bool> {
    let alike = parts.iter().all(|p| p.len() == micro);
    let (first, world) = comm.device_span();
    if world == parts.len() {
        return Ok(alike);
    }
    let unlike = comm.sum_by_index(vec![(first, vec![if alike { 0.0 } else { 1.0 }])])?;
    Ok(unlike.first() == Some(&0.0))
}

/// Runs `f` (a forward on replica 0, such as `predict`) with each unit gathered onto replica
/// 0 when an op needs it and released after, in one process: [`serve`] gathers every local
/// device's blocks, so the other devices need not run anything, and no device but replica 0's
/// ever holds a whole unit.
pub(crate) fn on_first_device<T, H: Holder + Sync>(sharded: &Sharded, replicas: &[H], f: impl FnOnce() -> Result<T>) -> Result<T> {
    let (tx, rx) = channel::<Msg>();
    std::thread::scope(|s| {
        let server = s.spawn(move || serve(sharded, replicas, rx));
        let window = Window::new(0, replicas[0].device(), sharded.units_on(0, &replicas[0]), tx, Vec::new());
        let out = {
            let _hooks = window.install();
            let w = Arc::clone(&window);
            let _between = crate::tensor::between_ops(std::rc::Rc::new(move || w.settle()));
            let out = f();
            window.finish().and(out)
        };
        // The window holds the server's only sender: dropping it ends the server.
        drop(window);
        if server.join().is_err() {
            return Err(Error::Panicked("the data-parallel gather thread panicked".into()));
        }
        out
    })
}

/// Answers each device's ask for a unit, in one process, until every window has gone: the
/// unit assembled on the asking device alone from every local device's block (read from its
/// pieces, which no step changes while units are gathered), so devices gather on their own
/// schedules, as many times as each needs, without the others asking. A failed gather is the
/// asking worker's error. Returns when each gather (unit, start, end) ran.
pub(super) fn serve<H: Holder>(sharded: &Sharded, replicas: &[H], rx: Receiver<Msg>) -> Vec<(usize, Instant, Instant)> {
    let mut spans = Vec::new();
    for msg in rx {
        let Msg::Gather(ask) = msg else { continue };
        let t = Instant::now();
        let whole = no_grad(|| sharded.unit_onto(ask.device, ask.unit, ask.block, replicas));
        spans.push((ask.unit, t, Instant::now()));
        let _ = ask.reply.send(whole);
    }
    spans
}
