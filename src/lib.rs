//! tandem: train neural networks on GPUs of any vendor (WGSL via wgpu, CUDA via cudarc) with a
//! CPU reference backend, autograd, `nn` layers, optimizers and a multi-device scheduler.
//!
//! A [`Device`] is a cheap, `Send + Sync` handle to one opened device of any backend: the CPU
//! reference (always compiled in), a wgpu adapter (feature `wgpu`: Vulkan, Metal, DX12, GL) or a
//! CUDA GPU (feature `cuda`). A [`Tensor`] lives on one device and records the operations that
//! made it, so `loss.backward()` fills the gradients of the tensors it depends on. Layers and
//! models implement [`nn::Module`] with PyTorch's parameter names and layouts; [`optim`] holds
//! PyTorch's optimizers; [`checkpoint`] reads and writes safetensors files that PyTorch loads;
//! [`parallel`] trains one model over many devices, and [`dist`] over many processes.
//!
//! # Example
//!
//! Two epochs of the seed CNN on the best device found through the [`train::Trainer`], validated
//! on held-out digits and checkpointed, then its weights saved in PyTorch's names (this is the
//! example of README.md, kept identical to it by `tests/readme.rs`):
//!
//! ```rust
//! use std::sync::Arc;
//! use tandem::data::{digits, DataLoader};
//! use tandem::nn::models::SeedModel;
//! use tandem::optim::SgdConfig;
//! use tandem::parallel::{Loss, OptimConfig, Parallel};
//! use tandem::train::{Accuracy, Checkpoints, MeanLoss, PrintEvery, Trainer};
//! use tandem::Device;
//!
//! fn main() -> tandem::Result<()> {
//!     let dev = Device::auto()?; // CUDA, else a hardware GPU adapter, else the CPU reference
//!     let (train, test) = digits::load(1024, 256, 0)?; // rendered digits with a held-out split
//!     let model = SeedModel::Cnn.build(0, &dev)?; // conv1, conv2, fc1, fc2 as in PyTorch
//!     let opt = OptimConfig::sgd(SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
//!     let test = DataLoader::new(Arc::new(test), 256, false, 0)?;
//!     let metrics = vec![Box::new(MeanLoss::new(Loss::CrossEntropy)) as _, Box::new(Accuracy::new()) as _];
//!     let run_dir = std::env::temp_dir().join("tandem-example-run");
//!     let mut trainer = Trainer::new(Parallel::single(|_| Ok(model), &dev, &opt, Loss::CrossEntropy).build()?)
//!         .epochs(2)
//!         .validate_named("test", 16, test, metrics) // test_loss, test_accuracy: every 16 steps and after the last
//!         .checkpoints(Checkpoints::new(&run_dir).every(16).overwrite()) // .resume() continues a run
//!         .observe(PrintEvery(8));
//!     let fit = trainer.fit(&mut DataLoader::new(Arc::new(train), 64, true, 0)?)?;
//!     println!("test accuracy {:.3} after {} steps", fit.metric("test_accuracy").unwrap_or(0.0), fit.step);
//!     let weights = trainer.state_dict()?;
//!     tandem::checkpoint::save_weights(run_dir.join("seed_cnn.safetensors"), &weights)?; // loads in PyTorch, strictly
//!     Ok(())
//! }
//! ```
//!
//! # Layering
//!
//! ```text
//! user code -> Tensor API (records autograd) -> Backend trait -> shaders/*.wgsl | kernels/*.cu | CPU
//!              parallel/ (strategies, collectives) talks to devices only through Tensor/Backend
//! ```
//!
//! - [`backend`]: the small, object-safe [`Backend`] trait that every device implements (ops
//!   generic over op enums, batched matmul with transpose flags, im2col/col2im, pooling,
//!   fill/copy/upload/download, `sync`, memory statistics, and optional fused fast paths that a
//!   backend may decline, the caller then composing the same result), and its three
//!   implementations: `cpu`, `wgpu` (one WGSL file per op family in `shaders/`) and `cuda` (the
//!   same families in CUDA C in `kernels/`).
//! - [`tensor`]: [`Tensor`], contiguous storage (reshape is free; transposes are matmul flags or
//!   strided reads), broadcasting arithmetic, reductions, matmul, convolutions, pooling,
//!   softmax, losses with PyTorch's semantics, and the differentiable move `Tensor::to(&device)`.
//! - [`autograd`]: define-by-run reverse mode with one gradient table; `no_grad` is per thread,
//!   and tensors and devices are `Send + Sync`, so each device can be driven by its own thread;
//!   activation recomputation ([`autograd::checkpoint`]).
//! - [`nn`] and [`optim`]: `Module` with PyTorch's `state_dict` names and layouts, the layers, the
//!   seed models and a nanoGPT-compatible GPT; SGD (momentum, dampening, nesterov, weight decay),
//!   Adam and AdamW with PyTorch's exact update rules, parameter groups, LR schedules, clipping.
//! - [`data`]: host-side datasets and a seeded, resumable loader; the seeds' random data; the
//!   built-in **digits** set (rendered digit glyphs with random shift, scale, stroke and noise,
//!   with a held-out test split); MNIST IDX files (plain or .gz); safetensors data files; text.
//! - [`checkpoint`]: safetensors read/write, written atomically.
//! - [`parallel`]: the [`parallel::Strategy`] trait and its implementations, collectives, traces;
//!   [`dist`]: the process group under `mpirun` or `srun`.
//! - [`train`]: the [`train::Trainer`] over any strategy: epochs or steps over a data source,
//!   validation metrics, LR schedules, clipping, checkpoints with exact resume, a stop token,
//!   observers.
//! - [`tolerance`]: the one comparison rule the tests use, `|got - want| <= atol + rtol * |want|`.
//!
//! # Guides
//!
//! Each topic has a guide in the documentation of the module a user reaches for:
//!
//! | guide | module | what it covers |
//! |---|---|---|
//! | devices | [`backend`] | device specs and listing, refused adapters, GL adapters under several threads, kernel profiles, CUDA and Tesla M60 servers, the backend's argument checks |
//! | models | [`nn`] | your own `Module`, the layers, losses, tensor ops for models, embeddings and casts, batched matmul, the GPT, the fused transformer kernels |
//! | training | [`optim`] | optimizers, parameter groups, LR schedules, gradient clipping, initialisation |
//! | strategies | [`parallel`] | data, layer, tensor and pipeline parallelism and their grid, collectives, Dropout and BatchNorm under a split, mixed backends, determinism, traces |
//! | processes | [`dist`] | MPI under `mpirun` and `srun`, `tandem train` across processes, pipelines and ZeRO-1 across processes, NCCL |
//! | numerics | [`tensor`] | tolerances, NaN and the edge cases against PyTorch, determinism, accumulation order, Mesa's loop limit, kernel profiles |
//! | training runs | [`train`] | the `Trainer`, metrics, checkpoints and exact resume, the stop token, observers, a loop of your own that resumes exactly |
//! | checkpoints | [`checkpoint`] | the file format, PyTorch's names, atomic writes, run directories, resume |
//!
//! README.md has the command line in brief, benches/README.md the benchmarks and their measured
//! figures, and CONTRIBUTING.md the kernel internals, how to add an op and the test layout.
//!
//! # Errors
//!
//! Every fallible function returns [`Result`], whose error is the one enum [`Error`]: a shape
//! mismatch names the op and the shapes, a missing file names the path, out of memory names the
//! device, the bytes asked and what is free. Its `Debug` is that sentence too, so a
//! `fn main() -> tandem::Result<()>` that fails prints `Error: ` and the sentence (`{:#?}` adds
//! the variant's name). [`Error`] is `#[non_exhaustive]`; match it with a
//! wildcard arm. Causes a caller can act on have variants of their own, never to be recognised by
//! their message: `Label` (a class label or token id out of range), `ResumeMismatch` (a
//! checkpoint written with other settings), `Worker` (the thread of a pipeline
//! stage, a placement stage or a collective's device failed; it names the role, the index and the
//! device, and carries the cause: [`Error::root_cause`] unwraps it), `Panicked` (a worker thread
//! panicked; the panic's message) and `ChannelClosed` (a neighbouring stage stopped). A pipeline
//! stage that errors or panics makes `Pipeline::step` return `Worker { role: "pipeline stage",
//! index, device, .. }` for that stage (not the closed channels its neighbours then see), without
//! hanging or aborting; the pipeline can step again or be dropped.
pub mod autograd;
pub mod backend;
pub mod checkpoint;
pub mod data;
mod device;
pub mod dist;
mod error;
pub mod nn;
pub mod optim;
pub mod parallel;
mod shape;
pub mod tensor;
pub mod tolerance;
pub mod train;

pub use backend::{Backend, BackendKind, DeviceInfo, DeviceKind, MemoryStats};
pub use device::{Device, BACKENDS_ENV};
pub use error::{Error, Result};
pub use shape::{DType, Layout, Shape, MAX_RANK};
pub use tensor::{autocast, autocast_dtype, on_cpu_pool, CrossEntropy, Tensor};

/// The `rand` crate of tandem's signatures (`Tensor::randn`, the layers' `new`), so that a
/// program's RNG is of the same version without a dependency of its own:
///
/// ```
/// use tandem::rand::{rngs::StdRng, SeedableRng};
/// # fn main() -> tandem::Result<()> {
/// let mut rng = StdRng::seed_from_u64(0);
/// let w = tandem::Tensor::randn([2, 3], &mut rng, &tandem::Device::cpu())?;
/// assert_eq!(w.dims(), &[2, 3]);
/// # Ok(()) }
/// ```
pub use rand;

/// The JSON crate of [`Trainer::settings`](train::Trainer::settings) and of the run
/// configuration checkpoints record, so that a program needs no dependency of its own:
///
/// ```
/// let settings = tandem::serde_json::json!({ "model": "mlp-4-16-1", "batch": 8 });
/// assert_eq!(settings["batch"], 8);
/// ```
pub use serde_json;

/// The seeded random number generator [`rng`] makes: ChaCha8, whose stream is the same on
/// every platform.
pub type SeededRng = rand_chacha::ChaCha8Rng;

/// A random number generator seeded with `seed`, for what takes one (the layers' `new`,
/// `Tensor::randn`, `nn::init`): the same seed draws the same weights everywhere.
///
/// ```
/// # fn main() -> tandem::Result<()> {
/// let dev = tandem::Device::cpu();
/// let a = tandem::nn::Linear::new(4, 3, &mut tandem::rng(0), &dev)?;
/// let b = tandem::nn::Linear::new(4, 3, &mut tandem::rng(0), &dev)?;
/// assert_eq!(a.weight.to_vec()?, b.weight.to_vec()?);
/// # Ok(()) }
/// ```
pub fn rng(seed: u64) -> SeededRng {
    <SeededRng as rand::SeedableRng>::seed_from_u64(seed)
}
