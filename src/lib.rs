//! tandem: train neural networks on GPUs of any vendor (WGSL via wgpu, CUDA via cudarc) with a
//! CPU reference backend, autograd, `nn` layers, optimizers and a multi-device scheduler.
pub mod autograd;
pub mod backend;
pub mod checkpoint;
#[cfg(feature = "cli")]
pub mod cli;
pub mod data;
pub mod dist;
mod device;
mod error;
pub mod nn;
pub mod optim;
pub mod parallel;
mod shape;
pub mod tensor;
pub mod tolerance;

pub use backend::{Backend, BackendKind, DeviceInfo, DeviceKind, MemoryStats};
pub use device::{Device, BACKENDS_ENV};
pub use error::{Error, Result};
pub use shape::{DType, Layout, Shape, MAX_RANK};
pub use tensor::{CrossEntropy, Tensor};
