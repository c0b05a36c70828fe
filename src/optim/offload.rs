//! Optimizer state kept in host memory (DeepSpeed's `offload_optimizer`, ZeRO-Offload): each
//! parameter's state goes to its device for that parameter's update and back after it.
//!
//! Why the update stays on the device: the same kernel computes it as without offload, so an
//! offloaded run equals one without bit for bit (FSDP's `CPUOffload` updates on the CPU, which
//! rounds differently from a GPU's kernel). What it costs: each step moves every state tensor
//! to the device and back (Adam: 16 bytes a parameter over the bus, 8 each way); what it gives:
//! the device holds the state of one parameter at a time, not of all of them, which for
//! AdamW in f32 is half of the training state (with ZeRO, half of each device's shard).
use crate::{Device, Result, Tensor};
use std::sync::OnceLock;

/// The host memory offloaded state lives in: a CPU device of its own, so that no device's
/// memory budget counts it (the first `cpu` of a device list is the shared [`Device::cpu`]).
fn host() -> Device {
    static HOST: OnceLock<Device> = OnceLock::new();
    HOST.get_or_init(Device::cpu_independent).clone()
}

/// Where an optimizer keeps its state tensors between steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum StateHome {
    /// With each parameter, on its device.
    #[default]
    Device,
    /// In host memory, on the device only during the parameter's update.
    Host,
}

impl StateHome {
    pub(crate) fn new(offload: bool) -> Self {
        if offload {
            StateHome::Host
        } else {
            StateHome::Device
        }
    }
    /// The device a new state tensor for `p` is made on.
    pub(crate) fn device_for(self, p: &Tensor) -> Device {
        match self {
            StateHome::Device => p.device().clone(),
            StateHome::Host => host(),
        }
    }
    /// A state tensor of zeros for `p`, where this home keeps it.
    pub(crate) fn zeros(self, p: &Tensor) -> Result<Tensor> {
        Tensor::zeros(p.shape().clone(), &self.device_for(p))
    }
    /// `state` where `p`'s update reads and writes it: itself on the device, a copy there when
    /// it lives on the host.
    pub(crate) fn fetch(self, state: &Tensor, p: &Tensor) -> Result<Tensor> {
        match self {
            StateHome::Device => Ok(state.clone()),
            StateHome::Host => state.to(p.device()),
        }
    }
    /// After the update: `state` becomes the device copy's new values, downloaded (the copy is
    /// dropped by the caller, which frees its device memory).
    pub(crate) fn put_back(self, state: &mut Tensor, updated: &Tensor) -> Result<()> {
        if self == StateHome::Host {
            *state = updated.to(&host())?;
        }
        Ok(())
    }
}
