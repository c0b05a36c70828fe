//! WGSL compute backend on wgpu (being written).
use crate::backend::{Backend, DeviceInfo};
use crate::Result;
use std::sync::Arc;
pub fn adapters() -> Vec<DeviceInfo> { Vec::new() }
pub fn open(_ordinal: usize) -> Result<Arc<dyn Backend>> { Err(crate::Error::Unavailable { backend: "wgpu", reason: "not yet".into() }) }
