//! The one error type of tandem: every fallible public function returns `Result<T>`.
use std::path::PathBuf;

/// Everything that can go wrong in tandem, grouped by kind. Each variant names what the user
/// needs to fix it: the op, the shapes, the device, the path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // --- user input: shapes, dtypes, devices ---
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: expected dtype {expected:?}, got {got:?}")]
    DType { op: &'static str, expected: crate::DType, got: crate::DType },
    #[error("{op}: tensors live on different devices ({a} and {b}); move one with Tensor::to")]
    DeviceMismatch { op: &'static str, a: String, b: String },
    #[error("no device matches '{spec}'; devices found: {available}")]
    NoSuchDevice { spec: String, available: String },
    #[error("invalid argument to {op}: {detail}")]
    Invalid { op: &'static str, detail: String },

    // --- resources ---
    #[error("out of memory on {device}: asked for {requested} bytes, {free} bytes free ({detail})")]
    OutOfMemory { device: String, requested: u64, free: u64, detail: String },
    #[error("{backend} backend error on {device}: {detail}")]
    Backend { backend: &'static str, device: String, detail: String },
    #[error("{backend} backend is not available: {reason}")]
    Unavailable { backend: &'static str, reason: String },

    // --- files ---
    #[error("{path}: {source}")]
    Io { path: PathBuf, #[source] source: std::io::Error },
    #[error("{path}: {detail}")]
    Format { path: PathBuf, detail: String },

    // --- training ---
    #[error("{strategy}: replica {replica} on {device} failed: {source}")]
    Replica { strategy: &'static str, replica: usize, device: String, #[source] source: Box<Error> },
    #[error("loss is {value} at step {step}; stopped (the last good checkpoint is kept)")]
    NonFinite { step: u64, value: f32 },
    #[error("{0}")]
    Msg(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A shape error for `op`, with a message that names the shapes involved.
    pub fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Shape { op, detail: detail.into() }
    }
    pub fn invalid(op: &'static str, detail: impl Into<String>) -> Self {
        Error::Invalid { op, detail: detail.into() }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    pub fn format(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        Error::Format { path: path.into(), detail: detail.into() }
    }
}
