//! What a `DataParallel` tells about itself: its sharding and buckets, the last step's
//! overlap and gathers, and each replica's parameters and optimizer state.
use super::{DataParallel, Gathers, Overlap, Shard, StepEvent};
use crate::parallel::comm::Communicator;
use crate::Tensor;

impl DataParallel {
    /// How much training state each device keeps.
    pub fn shard(&self) -> Shard {
        self.cfg.shard
    }

    /// The communicator in use (its name says which algorithm; it counts bytes moved).
    pub fn communicator(&self) -> &dyn Communicator {
        &*self.comm
    }
    /// Parameter names of each gradient bucket, in the order backward fills them.
    pub fn buckets(&self) -> Vec<Vec<String>> {
        let names = &self.replicas[0].params;
        self.buckets.iter().map(|b| b.iter().map(|&p| names[p].0.clone()).collect()).collect()
    }
    /// The split proportions in use: the user's, the calibrated ones after the first step, or
    /// `None` for equal shares.
    pub fn split_weights(&self) -> Option<&[f64]> {
        self.split_weights.as_deref()
    }
    /// Bucket launches and backward completions of the last step, in time order (empty in
    /// deterministic mode, which does not overlap).
    pub fn last_step_events(&self) -> &[StepEvent] {
        &self.events
    }
    /// How much of the last step's all-reduce time each device spent still running backward,
    /// timed on the devices' own clocks where they have them; `None` before the first step and
    /// in deterministic mode, which does not overlap.
    pub fn last_overlap(&self) -> Option<&Overlap> {
        self.overlap.as_ref()
    }
    /// Under ZeRO-3, the last step's all-gathers when it gathered unit by unit (see
    /// [`Shard::Full`]); `None` when it gathered the whole model first (deterministic mode, a
    /// calibrating step, or devices with different numbers of micro-batches).
    pub fn last_gathers(&self) -> Option<&Gathers> {
        self.gathers.as_ref()
    }
    /// Bytes of optimizer state held on each device (ZeRO-1, 2 and 3 divide it among them).
    pub fn optimizer_state_bytes(&self) -> Vec<u64> {
        self.opts.iter().map(|o| o.state().0.iter().map(|(_, t)| 4 * t.numel() as u64).sum()).collect()
    }
    /// The parameters of every replica; tests use it to check the replicas stay identical.
    /// Under ZeRO-3 they are released between steps (reading one is an error where the
    /// backend releases memory): read [`Strategy::state_dict`](crate::parallel::Strategy::state_dict) instead.
    pub fn replica_parameters(&self) -> Vec<Vec<(String, Tensor)>> {
        self.replicas.iter().map(|r| r.params.clone()).collect()
    }
    /// The optimizer state replica `i` holds (only its owned parameters' where parameters have
    /// owners) and its step count; `None` past the last replica.
    pub fn replica_optimizer_state(&self, i: usize) -> Option<(Vec<(String, Tensor)>, u64)> {
        self.opts.get(i).map(|o| o.state())
    }
    /// The replica that updates each parameter (state_dict order), or `None` when every
    /// replica updates its own copy: with ZeRO-1, and on devices of different kernel families,
    /// each parameter has one owner.
    pub fn parameter_owners(&self) -> Option<&[usize]> {
        self.owners.as_deref()
    }
}
