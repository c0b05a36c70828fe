//! ZeRO-2 and ZeRO-3 ([`Shard::Grads`], [`Shard::Full`]): each device keeps only its shard of
//! the gradients (and of the parameters, with ZeRO-3) and updates only that shard.
//!
//! The gradient buckets are the units of sharding (FSDP's flat parameters). A bucket's
//! parameters, flattened in bucket order and padded with zeros to a multiple of the world size
//! `W` (the devices of every process), split into `W` equal blocks; block `g` belongs to global
//! device `g`. Where its block overlaps a parameter, a device holds a *piece* of it: a flat
//! tensor named as the parameter, which that device's optimizer owns. Optimizer state so
//! exists only for pieces, under the parameter's own names (`fc.weight.exp_avg`), and an
//! elementwise optimizer (SGD, Adam, AdamW) computes on a piece bit for bit what it computes
//! on the whole parameter.
//!
//! A step: (ZeRO-3 only) each unit's blocks are all-gathered into its full parameters when an
//! op first needs them, in forward and again in backward, and released after (`gather.rs`);
//! forward and backward run as in plain data parallelism; each bucket's gradients are
//! reduce-scattered the moment backward completes it, overlapping the rest of backward; the
//! full gradients are dropped; clipping's global norm is summed over the pieces (every element
//! once, so it is exact over shards); each device updates its pieces; then the blocks are
//! all-gathered into the full parameters again (ZeRO-2) or the full parameters stay released
//! until an op needs them (ZeRO-3, `Backend::release`). Where the devices would not ask for the
//! same gathers (uneven micro-batch counts), ZeRO-3 gathers every unit before forward instead,
//! with `Sharded::gather`; so does deterministic mode across processes whose devices compute
//! different numbers of micro-shards (otherwise it gathers unit by unit: `deterministic.rs`).
use super::gather;
use crate::autograd::no_grad;
use crate::nn::models::StateShards;
use crate::parallel::comm::Communicator;
use crate::{Device, Error, Result, Tensor};
use std::collections::HashMap;

/// How much of the training state each data-parallel device keeps (ZeRO's stages). In JSON
/// (plans) as the `--shard` words: `"none"`, `"optimizer"`, `"grads"`, `"full"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shard {
    /// Every device holds everything: plain data parallelism (PyTorch DDP).
    #[default]
    None,
    /// ZeRO-1: optimizer state of the parameters each device owns (whole tensors, balanced by
    /// size); gradients and parameters stay full.
    Optimizer,
    /// ZeRO-2: gradients reduce-scattered, each device keeps and updates its shard of them and
    /// of the optimizer state; parameters all-gathered after the update.
    Grads,
    /// ZeRO-3 (FSDP's `FULL_SHARD`): parameters, gradients and optimizer state sharded between
    /// steps; each unit's (bucket's) full parameters are all-gathered when an op needs them, in
    /// forward and in backward, the next unit prefetched, and released after use.
    Full,
}

impl Shard {
    /// Every mode, least sharded first.
    pub const ALL: [Shard; 4] = [Shard::None, Shard::Optimizer, Shard::Grads, Shard::Full];

    /// The mode's `--shard` word.
    pub fn name(self) -> &'static str {
        match self {
            Shard::None => "none",
            Shard::Optimizer => "optimizer",
            Shard::Grads => "grads",
            Shard::Full => "full",
        }
    }

    /// What this mode leaves each of `ranks` devices only a share of, for the GPT's fit check
    /// ([`GptConfig::check_sharded_training_fits`](crate::nn::models::GptConfig::check_sharded_training_fits)).
    pub fn state_shards(self, ranks: u64) -> StateShards {
        match self {
            Shard::None => StateShards::WHOLE,
            Shard::Optimizer => StateShards { ranks, gradients: false, optimizer: true, parameters: false, gradient_bytes: 4 },
            Shard::Grads => StateShards { ranks, gradients: true, optimizer: true, parameters: false, gradient_bytes: 4 },
            Shard::Full => StateShards { ranks, gradients: true, optimizer: true, parameters: true, gradient_bytes: 4 },
        }
    }
}

impl std::str::FromStr for Shard {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Shard::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::invalid("--shard", format!("{s:?} is not none, optimizer, grads or full")))
    }
}

/// One device's full copy of the parameters a [`Sharded`] cuts into pieces: a data-parallel
/// replica's, or one slot of a grid's replica (a pipeline stage's, a tensor shard's), the same
/// parameters in the same order on every device of the data axis.
pub(crate) trait Holder {
    fn device(&self) -> &Device;
    fn params(&self) -> &[(String, Tensor)];
}

/// One device's piece of a parameter.
#[derive(Clone, Debug)]
struct Piece {
    param: usize,
    unit: usize,
    /// First element of the piece in the parameter's flat values.
    from: usize,
    /// First element of the piece in the device's block of the unit.
    at: usize,
    len: usize,
    /// `[1, .., 1, len]`, of the parameter's rank: parameter groups may go by rank
    /// (`GroupRule::RankBelow`, AdamW's no decay for biases and norms), and a piece must fall
    /// in its parameter's group.
    dims: Vec<usize>,
}

/// One bucket as a unit of sharding: its parameters, and their offsets in its flat values.
struct Unit {
    members: Vec<usize>,
    offsets: Vec<usize>,
    /// Elements per device: the unit's length divided by the world size, rounded up.
    block: usize,
}

/// The sharded state of this process's devices.
pub(crate) struct Sharded {
    pub mode: Shard,
    world: usize,
    units: Vec<Unit>,
    /// Per local device: its pieces, by unit and then position in the block.
    pieces: Vec<Vec<Piece>>,
    /// Per local device: the pieces' values (the optimizer's parameters), named as their
    /// parameters. Gradients are set on them after the reduce-scatter.
    pub values: Vec<Vec<(String, Tensor)>>,
}

impl Sharded {
    /// The layout over `buckets` for devices `first..first + local` of `world`, with pieces cut
    /// from replica 0's parameters, broadcast to every replica one parameter at a time (the
    /// replicas' own values, a random initialisation, do not matter). ZeRO-3 releases each
    /// parameter once its pieces are cut, so a device never holds more than its pieces and one
    /// whole parameter: with replicas built by [`build_deferred`](crate::tensor::build_deferred)
    /// a model several times a device's memory is sharded onto it.
    pub fn new<H: Holder>(
        mode: Shard,
        replicas: &[H],
        buckets: &[Vec<usize>],
        first: usize,
        world: usize,
        comm: &dyn Communicator,
    ) -> Result<Sharded> {
        let params = replicas[0].params();
        let units: Vec<Unit> = buckets
            .iter()
            .map(|members| {
                let mut offsets = Vec::with_capacity(members.len());
                let mut n = 0;
                for &p in members {
                    offsets.push(n);
                    n += params[p].1.numel();
                }
                Unit { members: members.clone(), offsets, block: n.div_ceil(world) }
            })
            .collect();
        let pieces: Vec<Vec<Piece>> = (0..replicas.len())
            .map(|i| {
                let g = first + i;
                let mut mine = Vec::new();
                for (u, unit) in units.iter().enumerate() {
                    let (lo, hi) = (g * unit.block, (g + 1) * unit.block);
                    for (&p, &off) in unit.members.iter().zip(&unit.offsets) {
                        let (start, end) = (off.max(lo), (off + params[p].1.numel()).min(hi));
                        if start < end {
                            let len = end - start;
                            let rank = params[p].1.rank();
                            let dims = if rank == 0 { Vec::new() } else { [vec![1; rank - 1], vec![len]].concat() };
                            mine.push(Piece { param: p, unit: u, from: start - off, at: start - lo, len, dims });
                        }
                    }
                }
                mine
            })
            .collect();
        let mut cuts: Vec<Vec<Option<Tensor>>> = pieces.iter().map(|ps| vec![None; ps.len()]).collect();
        no_grad(|| {
            for p in 0..params.len() {
                let group: Vec<Tensor> = replicas.iter().map(|r| r.params()[p].1.clone()).collect();
                comm.broadcast(&group, 0)?;
                for ((r, ps), cs) in replicas.iter().zip(&pieces).zip(cuts.iter_mut()) {
                    for (pc, c) in ps.iter().zip(cs.iter_mut()).filter(|(pc, _)| pc.param == p) {
                        *c = Some(cut(&r.params()[pc.param].1, pc)?.requires_grad());
                    }
                }
                if mode == Shard::Full {
                    for t in &group {
                        t.release_storage()?;
                        // A deferred build's host values are the pieces' now.
                        t.buffer().set_refill(None);
                    }
                }
            }
            Ok::<_, Error>(())
        })?;
        let values = cuts
            .into_iter()
            .zip(&pieces)
            .zip(replicas)
            .map(|((cs, ps), r)| {
                cs.into_iter()
                    .zip(ps)
                    .map(|(c, pc)| {
                        Ok((
                            r.params()[pc.param].0.clone(),
                            c.ok_or_else(|| Error::Msg(format!("data parallel: no piece of parameter {} was cut", pc.param)))?,
                        ))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sharded { mode, world, units, pieces, values })
    }

    /// The world size every bucket is padded to a multiple of, for the reduce-scatter.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Copies the replicas' parameters into the pieces (after a checkpoint is loaded).
    pub fn refresh<H: Holder>(&self, replicas: &[H]) -> Result<()> {
        no_grad(|| {
            for ((r, ps), vs) in replicas.iter().zip(&self.pieces).zip(&self.values) {
                for (pc, (_, v)) in ps.iter().zip(vs) {
                    v.assign(&cut(&r.params()[pc.param].1, pc)?)?;
                }
            }
            Ok(())
        })
    }

    /// Every device's pieces cut straight from the full tensors of `state` (by parameter name),
    /// where they are (the host, from a checkpoint): ZeRO-3's load, which never puts a whole
    /// parameter on a device.
    pub fn load_pieces(&self, state: &HashMap<&str, &Tensor>) -> Result<()> {
        no_grad(|| {
            for (ps, vs) in self.pieces.iter().zip(&self.values) {
                for (pc, (name, v)) in ps.iter().zip(vs) {
                    let t = state
                        .get(name.as_str())
                        .ok_or_else(|| Error::invalid("DataParallel::load_state_dict", format!("the state has no {name}")))?;
                    v.assign(&cut(t, pc)?)?;
                }
            }
            Ok(())
        })
    }

    /// Every device's gradient pieces out of its reduce-scattered blocks (`[unit][device]`),
    /// each unit's blocks dropped once cut (a piece is a copy), so that the gradients are held
    /// once, not twice, when the update starts.
    pub fn grads_from_blocks(&self, mut reduced: Vec<Vec<Tensor>>) -> Result<()> {
        for u in 0..self.units.len() {
            let blocks = std::mem::take(reduced.get_mut(u).ok_or_else(|| Error::Msg(format!("data parallel: no reduced block of bucket {u}")))?);
            for (i, (ps, vs)) in self.pieces.iter().zip(&self.values).enumerate() {
                for (pc, (_, v)) in ps.iter().zip(vs).filter(|(pc, _)| pc.unit == u) {
                    let block = blocks.get(i).ok_or_else(|| Error::Msg(format!("data parallel: bucket {u} has no block for device {i}")))?;
                    v.set_grad(Some(block.narrow(0, pc.at, pc.len)?.reshape(pc.dims.clone())?));
                }
            }
        }
        Ok(())
    }

    /// Every device's gradient pieces out of the host sum of every parameter's gradient
    /// (`sum`, state_dict order: deterministic mode), in `dtype`.
    pub fn grads_from_host<H: Holder>(&self, sum: &[f32], replicas: &[H], dtype: crate::DType) -> Result<()> {
        let starts = super::deterministic::offsets(replicas[0].params());
        let at = starts[starts.len() - 1];
        if sum.len() != at {
            return Err(Error::shape("DataParallel::step", format!("the summed gradient has {} values for {at} parameters' values", sum.len())));
        }
        for ((r, ps), vs) in replicas.iter().zip(&self.pieces).zip(&self.values) {
            for (pc, (_, v)) in ps.iter().zip(vs) {
                let from = starts[pc.param] + pc.from;
                let piece = Tensor::from_vec(sum[from..from + pc.len].to_vec(), pc.dims.clone(), r.device())?;
                v.set_grad(Some(if piece.dtype() == dtype { piece } else { no_grad(|| piece.to_dtype(dtype))? }));
            }
        }
        Ok(())
    }

    /// Drops the pieces' gradients (kept only from the reduce-scatter to the update).
    pub fn drop_grads(&self) {
        self.values.iter().flatten().for_each(|(_, v)| v.set_grad(None));
    }

    /// All-gathers every unit's blocks into the replicas' full parameters, one collective per
    /// unit; released parameters get their memory back first.
    pub fn gather<H: Holder>(&self, replicas: &[H], comm: &dyn Communicator) -> Result<()> {
        no_grad(|| {
            for u in 0..self.units.len() {
                let blocks = self.blocks(u, replicas)?;
                for (r, flat) in replicas.iter().zip(&self.all_gather_unit(u, blocks, comm)?) {
                    gather::fill(&self.members(u, r), flat)?;
                }
            }
            Ok(())
        })
    }

    /// Every parameter's full values on `host`, gathered unit by unit (each device holds one
    /// unit's values at a time, never the whole model: what a sharded model too big for one
    /// device saves through), keyed by replica 0's tensor id. A collective across processes.
    pub fn gather_to_host<H: Holder>(&self, replicas: &[H], comm: &dyn Communicator, host: &Device) -> Result<HashMap<u64, Tensor>> {
        let mut out = HashMap::new();
        no_grad(|| {
            for u in 0..self.units.len() {
                let whole = self.all_gather_unit(u, self.blocks(u, replicas)?, comm)?;
                for (t, off) in self.members(u, &replicas[0]) {
                    out.insert(t.id(), whole[0].narrow(0, off, t.numel())?.reshape(t.shape().clone())?.to(host)?);
                }
            }
            Ok(out)
        })
    }

    /// Every local device's block of unit `u`.
    fn blocks<H: Holder>(&self, u: usize, replicas: &[H]) -> Result<Vec<Tensor>> {
        replicas.iter().enumerate().map(|(i, r)| self.block(i, u, r)).collect()
    }

    /// Unit `u` whole on every local device, all-gathered from `blocks` (every local device's,
    /// in order), its length checked.
    pub fn all_gather_unit(&self, u: usize, blocks: Vec<Tensor>, comm: &dyn Communicator) -> Result<Vec<Tensor>> {
        let whole = comm.all_gather(&blocks)?;
        drop(blocks);
        whole.iter().try_for_each(|flat| self.check_gathered(u, flat))?;
        Ok(whole)
    }

    /// Unit `u` whole on local device `d` only, from its own block `own` and the other local
    /// devices' (one process: `world` local devices), its length checked.
    pub fn unit_onto<H: Holder>(&self, d: usize, u: usize, own: Tensor, replicas: &[H]) -> Result<Tensor> {
        let dev = replicas[d].device();
        let blocks = replicas
            .iter()
            .enumerate()
            .map(|(i, r)| if i == d { Ok(own.clone()) } else { self.block(i, u, r)?.to(dev) })
            .collect::<Result<Vec<_>>>()?;
        let flat = Tensor::cat(&blocks, 0)?;
        self.check_gathered(u, &flat)?;
        Ok(flat)
    }

    fn check_gathered(&self, u: usize, flat: &Tensor) -> Result<()> {
        let unit = &self.units[u];
        if flat.numel() != self.world * unit.block {
            return Err(Error::shape(
                "DataParallel::step",
                format!("bucket {u} gathered {} values, not {} blocks of {}", flat.numel(), self.world, unit.block),
            ));
        }
        Ok(())
    }

    /// Unit `u`'s parameters on replica `r`, each with its offset in the unit's flat values.
    fn members<H: Holder>(&self, u: usize, r: &H) -> Vec<(Tensor, usize)> {
        let unit = &self.units[u];
        unit.members.iter().zip(&unit.offsets).map(|(&p, &off)| (r.params()[p].1.clone(), off)).collect()
    }

    /// Every unit as device `i` (replica `r`) holds it, for gathering unit by unit.
    pub(super) fn units_on<H: Holder>(&self, i: usize, r: &H) -> Vec<gather::UnitOnDevice> {
        (0..self.units.len())
            .map(|u| gather::UnitOnDevice { members: self.members(u, r), pieces: self.pieces_of(i, u), block: self.units[u].block })
            .collect()
    }

    /// Device `i`'s pieces of unit `u`, in block order.
    fn pieces_of(&self, i: usize, u: usize) -> Vec<Tensor> {
        self.pieces[i].iter().zip(&self.values[i]).filter(|(pc, _)| pc.unit == u).map(|(_, (_, v))| v.detach()).collect()
    }

    /// Device `i`'s block of unit `u`: its pieces' values, then zeros to the block's length.
    pub fn block<H: Holder>(&self, i: usize, u: usize, r: &H) -> Result<Tensor> {
        gather::block_of(&self.pieces_of(i, u), self.units[u].block, r.device())
    }

    /// Frees the replicas' full parameters (ZeRO-3 between steps); a backend that cannot
    /// (`Backend::release` returning `false`: none of tandem's) keeps them allocated, and only
    /// gradients and optimizer state are sharded there.
    pub fn release<H: Holder>(&self, replicas: &[H]) -> Result<()> {
        for r in replicas {
            for (_, t) in r.params() {
                t.release_storage()?;
            }
        }
        Ok(())
    }

    /// The full optimizer state, in the replicas' parameter order and under PyTorch's names,
    /// assembled on `host` from `all`: every device's pieces' state, in global device order
    /// (across processes, every rank's, gathered). On the host, since the whole of it need not
    /// fit any one device.
    pub fn full_state<H: Holder>(&self, all: &[Vec<(String, Tensor)>], replicas: &[H], host: &Device) -> Result<Vec<(String, Tensor)>> {
        let dev0 = host;
        let mut out = Vec::new();
        for (name, p) in replicas[0].params() {
            let prefix = format!("{name}.");
            let mut keys: Vec<&str> = Vec::new();
            for (k, _) in all.iter().flatten().filter(|(k, _)| k.starts_with(&prefix) && !k[prefix.len()..].contains('.')) {
                if !keys.contains(&k.as_str()) {
                    keys.push(k);
                }
            }
            for key in keys {
                let parts = all.iter().flatten().filter(|(k, _)| k == key).map(|(_, t)| t.flatten_all()?.to(dev0)).collect::<Result<Vec<_>>>()?;
                let whole = Tensor::cat(&parts, 0)?;
                if whole.numel() != p.numel() {
                    return Err(Error::shape(
                        "DataParallel::optimizer_state",
                        format!("{key}: the shards hold {} values for a parameter of {:?}", whole.numel(), p.shape()),
                    ));
                }
                out.push((key.to_string(), whole.reshape(p.shape().clone())?));
            }
        }
        Ok(out)
    }

    /// Device `i`'s part of a full optimizer state: each entry of a parameter it holds a piece
    /// of, cut to that piece, where `state` is.
    pub fn state_piece<H: Holder>(&self, i: usize, state: &[(String, Tensor)], replica: &H) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for pc in &self.pieces[i] {
            let (name, p) = &replica.params()[pc.param];
            let prefix = format!("{name}.");
            for (k, t) in state.iter().filter(|(k, _)| k.starts_with(&prefix) && !k[prefix.len()..].contains('.')) {
                if t.numel() != p.numel() {
                    return Err(Error::shape(
                        "DataParallel::load_optimizer_state",
                        format!("{k} is {:?} for a parameter of {:?}", t.shape(), p.shape()),
                    ));
                }
                // Cut where the state is (the host, from a checkpoint) and left there: the
                // optimizer copies each piece into state of its own on the device, so only one
                // piece at a time is there twice.
                out.push((k.clone(), cut(t, pc)?));
            }
        }
        Ok(out)
    }
}

/// `pc`'s elements of `t` (a parameter, or a tensor of its shape), as a fresh tensor of the
/// piece's shape (`narrow` copies, so a piece never shares memory with a parameter that may be
/// released).
fn cut(t: &Tensor, pc: &Piece) -> Result<Tensor> {
    t.flatten_all()?.narrow(0, pc.from, pc.len)?.reshape(pc.dims.clone())
}

/// A copy of `t` in memory of its own (what `state_dict` returns under ZeRO-3, whose
/// parameters are released after it).
pub(crate) fn copy_of(t: &Tensor) -> Result<Tensor> {
    if t.numel() == 0 {
        return Ok(t.clone());
    }
    no_grad(|| t.flatten_all()?.narrow(0, 0, t.numel())?.reshape(t.shape().clone()))
}
