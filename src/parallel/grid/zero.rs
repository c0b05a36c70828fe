//! ZeRO on a grid's data axis: each slot of a [`DataGrid`](super::DataGrid) (a pipeline stage's
//! device, a tensor shard's device) shards its parameters' optimizer state, gradients and, with
//! ZeRO-3, the parameters themselves over the devices that hold that slot in every replica:
//! the same [`Sharded`] layout `DataParallel` uses, over one slot's parameters instead of a
//! whole model's.
//!
//! A step: (ZeRO-3) every slot's pieces are all-gathered into its full parameters; the replicas
//! run forward and backward; each slot's gradients are reduce-scattered bucket by bucket, each
//! device keeping its block as gradients of its pieces, the full gradients dropped; clipping's
//! global norm is summed over the pieces (every element of the model once); each device's
//! optimizer updates its pieces; every slot's pieces are all-gathered into the full parameters
//! again, so the replicas' tied copies follow their primaries, and ZeRO-3 releases them.
//!
//! The reduction runs after the replicas' backward, not bucket by bucket during it (which
//! `DataParallel` does): the full gradients exist until backward ends, so ZeRO-1 and ZeRO-2 do
//! the same work here, each device keeping only its block of them after. ZeRO-3 holds a slot's
//! full parameters for the whole step and releases them between steps; gathering unit by unit
//! as ops need them is `DataParallel`'s alone.
use crate::autograd::no_grad;
use crate::optim::Optimizer;
use crate::parallel::comm::{Communicator, ReduceKind};
use crate::parallel::data_parallel::buckets::{assign_buckets, padded};
use crate::parallel::data_parallel::shard::{Holder, Sharded};
use crate::parallel::replica::Replica;
use crate::parallel::step::Part;
use crate::parallel::{DataParallelConfig, OptimConfig, Shard};
use crate::{DType, Device, Error, Result, Tensor};

/// Replica `r`'s copy of one slot's parameters.
struct SlotCopy {
    device: Device,
    params: Vec<(String, Tensor)>,
}

impl Holder for SlotCopy {
    fn device(&self) -> &Device {
        &self.device
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
}

/// One slot's sharded state over the data axis.
struct Slot {
    /// Every local replica's copy of the slot, replica order.
    copies: Vec<SlotCopy>,
    /// The gradient buckets (parameter indices), the units of sharding.
    buckets: Vec<Vec<usize>>,
    sharded: Sharded,
    /// One optimizer per local replica, over its pieces.
    opts: Vec<Box<dyn Optimizer>>,
    tracks: Vec<String>,
}

/// The sharded training state of every slot of a grid.
pub(super) struct Zero {
    pub mode: Shard,
    grad_dtype: DType,
    /// `None` for a slot without parameters.
    slots: Vec<Option<Slot>>,
}

/// What [`DataGrid::shard`](super::DataGrid::shard) refuses of a [`DataParallelConfig`]: the
/// options that belong to one-device replicas.
pub(super) fn check_config(cfg: &DataParallelConfig) -> Result<()> {
    const OP: &str = "DataGrid::shard";
    let refused = [
        (cfg.deterministic, "deterministic mode"),
        (cfg.calibrate, "calibration (give the grid split_weights)"),
        (cfg.weights.is_some(), "split weights in the config (give the grid split_weights)"),
        (cfg.micro_batches != 1, "micro-batches in the config (a pipeline replica takes its own)"),
    ];
    if let Some((_, what)) = refused.iter().find(|(on, _)| *on) {
        return Err(Error::invalid(OP, format!("a grid's data axis does not take {what}")));
    }
    crate::parallel::data_parallel::construct::check_grad_dtype(OP, cfg)?;
    if cfg.bucket_bytes == 0 {
        return Err(Error::invalid(OP, "the bucket size must be at least 1 byte"));
    }
    Ok(())
}

impl Zero {
    /// The pieces of every slot of `replicas` (replica 0's values, broadcast over each slot's
    /// communicator `comms[s]`), one optimizer from `opt` per replica and slot over its pieces.
    /// ZeRO-3 releases the full parameters once cut.
    pub fn new<R: Replica>(cfg: &DataParallelConfig, replicas: &[R], comms: &[Box<dyn Communicator>], opt: &OptimConfig) -> Result<Zero> {
        check_config(cfg)?;
        let per_replica: Vec<Vec<Vec<(String, Tensor)>>> = replicas.iter().map(|r| r.slot_params()).collect();
        let mut slots = Vec::with_capacity(comms.len());
        for (s, comm) in comms.iter().enumerate() {
            let copies: Vec<SlotCopy> =
                replicas.iter().zip(&per_replica).map(|(r, ps)| SlotCopy { device: r.devices()[s].clone(), params: ps[s].clone() }).collect();
            if copies[0].params.is_empty() {
                slots.push(None);
                continue;
            }
            let sizes: Vec<usize> = copies[0].params.iter().map(|(_, t)| 4 * t.numel()).collect();
            let buckets = assign_buckets(&sizes, cfg.bucket_bytes);
            let (first, world) = comm.device_span();
            let sharded = Sharded::new(cfg.shard, &copies, &buckets, first, world, &**comm)?;
            let opts = sharded.values.iter().map(|v| opt.build(v.clone())).collect::<Result<Vec<_>>>()?;
            let tracks = copies.iter().enumerate().map(|(r, c)| format!("replica {r} slot {s} ({})", c.device.spec())).collect();
            slots.push(Some(Slot { copies, buckets, sharded, opts, tracks }));
        }
        Ok(Zero { mode: cfg.shard, grad_dtype: cfg.grad_dtype, slots })
    }

    /// All-gathers every slot's pieces into the replicas' full parameters.
    pub fn gather(&self, comms: &[Box<dyn Communicator>]) -> Result<()> {
        self.each(comms, |slot, comm| slot.sharded.gather(&slot.copies, comm))
    }

    /// ZeRO-3: frees the replicas' full parameters.
    pub fn release(&self) -> Result<()> {
        if self.mode != Shard::Full {
            return Ok(());
        }
        self.slots.iter().flatten().try_for_each(|slot| slot.sharded.release(&slot.copies))
    }

    /// ZeRO-3: gives the replicas' released parameters memory again (before a load assigns
    /// them).
    pub fn restore(&self) -> Result<()> {
        for slot in self.slots.iter().flatten() {
            slot.copies.iter().flat_map(|c| &c.params).try_for_each(|(_, t)| t.restore_storage().map(drop))?;
        }
        Ok(())
    }

    /// Runs `f` with the full parameters present: under ZeRO-3 gathered before and released
    /// after (a collective across processes).
    pub fn with_full<T>(&self, comms: &[Box<dyn Communicator>], f: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.mode != Shard::Full {
            return f();
        }
        self.gather(comms)?;
        let out = f();
        self.release()?;
        out
    }

    /// Reduce-scatters every slot's gradients over its communicator, bucket by bucket: each
    /// device's block becomes its pieces' gradients (in the gradient type), and the replicas'
    /// full gradients are dropped.
    pub fn reduce(&self, comms: &[Box<dyn Communicator>]) -> Result<()> {
        let dtype = self.grad_dtype;
        no_grad(|| {
            self.each(comms, |slot, comm| {
                let world = slot.sharded.world();
                let mut reduced = Vec::with_capacity(slot.buckets.len());
                for bucket in &slot.buckets {
                    let flats = slot.copies.iter().map(|c| flat_grads(&c.params, bucket)).collect::<Result<Vec<_>>>()?;
                    let blocks = comm.reduce_scatter(&padded(flats, world)?, ReduceKind::Sum)?;
                    reduced.push(blocks.into_iter().map(|b| if b.dtype() == dtype { Ok(b) } else { b.to_dtype(dtype) }).collect::<Result<Vec<_>>>()?);
                }
                slot.copies.iter().flat_map(|c| &c.params).for_each(|(_, t)| t.set_grad(None));
                slot.sharded.grads_from_blocks(reduced)
            })
        })
    }

    /// Every device's optimizer over its pieces, for the grid's update.
    pub fn parts(&mut self) -> Vec<Part<'_>> {
        let mut parts = Vec::new();
        for slot in self.slots.iter_mut().flatten() {
            for ((opt, copy), track) in slot.opts.iter_mut().zip(&slot.copies).zip(&slot.tracks) {
                parts.push(Part { opt, device: &copy.device, track: Some(track.clone()) });
            }
        }
        parts
    }

    /// After the update: the pieces' gradients dropped, and every replica's full parameters
    /// all-gathered from the updated pieces (ZeRO-3 releases them once the caller has synced
    /// what follows them).
    pub fn updated(&self, comms: &[Box<dyn Communicator>]) -> Result<()> {
        self.slots.iter().flatten().for_each(|slot| slot.sharded.drop_grads());
        self.gather(comms)
    }

    /// Cuts the pieces again from the replicas' (full) parameters, after a load.
    pub fn refresh(&self) -> Result<()> {
        self.slots.iter().flatten().try_for_each(|slot| slot.sharded.refresh(&slot.copies))
    }

    /// The whole model's optimizer state in the unsplit model's names and shapes: each slot's
    /// assembled on the host from its pieces (every process's, across processes), then put
    /// together as `replica` (any replica of the grid) puts its devices' states together.
    pub fn optimizer_state<R: Replica>(&self, replica: &R, comms: &[Box<dyn Communicator>]) -> Result<(Vec<(String, Tensor)>, u64)> {
        let host = Device::cpu_independent();
        let mut per_slot = Vec::with_capacity(self.slots.len());
        let steps = self.slots.iter().flatten().next().map_or(0, |s| s.opts[0].state().1);
        for (slot, comm) in self.slots.iter().zip(comms) {
            let Some(slot) = slot else {
                per_slot.push((Vec::new(), steps));
                continue;
            };
            let mine: Vec<Vec<(String, Tensor)>> = slot.opts.iter().map(|o| o.state().0).collect();
            let all = match comm.process_group().filter(|g| g.size() > 1) {
                Some(group) => vec![group.all_gather_named(&mine.concat())?],
                None => mine,
            };
            per_slot.push((slot.sharded.full_state(&all, &slot.copies, &host)?, steps));
        }
        replica.state_of_slots(per_slot)
    }

    /// Each device's pieces of a whole optimizer state (cut as `replica` cuts it by slot).
    pub fn load_optimizer_state<R: Replica>(&mut self, replica: &R, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        let per_slot = replica.slots_of_state(state)?;
        if per_slot.len() != self.slots.len() {
            return Err(Error::Msg(format!("DataGrid::load_optimizer_state: {} slots' states for {} slots", per_slot.len(), self.slots.len())));
        }
        for (slot, whole) in self.slots.iter_mut().zip(&per_slot) {
            let Some(slot) = slot else { continue };
            for (i, (opt, copy)) in slot.opts.iter_mut().zip(&slot.copies).enumerate() {
                opt.load_state(&slot.sharded.state_piece(i, whole, copy)?, steps)?;
            }
        }
        Ok(())
    }

    /// Each device's optimizer-state bytes (pieces only), per slot and local replica.
    pub fn state_bytes(&self) -> Vec<Vec<u64>> {
        self.slots.iter().map(|slot| slot.as_ref().map_or_else(Vec::new, |s| s.opts.iter().map(|o| state_bytes(&**o)).collect())).collect()
    }

    fn each(&self, comms: &[Box<dyn Communicator>], mut f: impl FnMut(&Slot, &dyn Communicator) -> Result<()>) -> Result<()> {
        for (slot, comm) in self.slots.iter().zip(comms) {
            if let Some(slot) = slot {
                f(slot, &**comm)?;
            }
        }
        Ok(())
    }
}

/// Bytes of the optimizer state `o` holds.
pub(super) fn state_bytes(o: &dyn Optimizer) -> u64 {
    o.state().0.iter().map(|(_, t)| t.numel() as u64 * t.dtype().size() as u64).sum()
}

/// The gradients of `params[bucket]`, flattened in bucket order (zeros where backward left
/// none).
pub(super) fn flat_grads(params: &[(String, Tensor)], bucket: &[usize]) -> Result<Tensor> {
    let parts = bucket
        .iter()
        .map(|&p| {
            let t = &params[p].1;
            match t.grad() {
                Some(g) => g.reshape([t.numel()]),
                None => Tensor::zeros([t.numel()], t.device()),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0)
}
