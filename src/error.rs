//! The one error type of tandem: every fallible public function returns `Result<T>`.
use std::path::PathBuf;

/// Everything that can go wrong in tandem, grouped by kind. Each variant names what the user
/// needs to fix it: the op, the shapes, the device, the path. A cause a caller can act on has
/// a variant of its own; match on variants, never on the message text. New variants may come,
/// so matches need a wildcard arm.
///
/// `Debug` prints the same sentence as `Display` (as `anyhow::Error` does), so that a
/// `fn main() -> tandem::Result<()>` that returns an error, and an `unwrap`, show the sentence
/// rather than the variant's fields; the alternate form `{:#?}` puts the variant's name before
/// it (`ResumeMismatch: resume: ...`), and matching on the variant gives its fields.
///
/// ```
/// let e = tandem::Tensor::from_vec(vec![1.0; 5], [2, 3], &tandem::Device::cpu()).unwrap_err();
/// assert_eq!(format!("{e:?}"), "from_vec: shape mismatch: 5 values for shape [2, 3]");
/// assert_eq!(format!("{e:#?}"), "Shape: from_vec: shape mismatch: 5 values for shape [2, 3]");
/// assert!(matches!(e, tandem::Error::Shape { op: "from_vec", .. }));
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
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
    /// A class label outside `0..classes` (the first one, by position). From an embedding
    /// lookup (`op` is `Embedding`, `Gpt` or `index_select`) it is a token id outside the
    /// vocabulary, `classes` its size: "token id X at index I is outside 0..V (vocab_size V)".
    #[error("{}", label_message(op, *.label, *.index, *.classes))]
    Label { op: &'static str, label: i32, index: usize, classes: usize },

    // --- resources ---
    #[error("out of memory on {device}: asked for {requested} bytes, {free} bytes free ({detail})")]
    OutOfMemory { device: String, requested: u64, free: u64, detail: String },
    #[error("{backend} backend error on {device}: {detail}")]
    Backend { backend: &'static str, device: String, detail: String },
    #[error("{backend} backend is not available: {reason}")]
    Unavailable { backend: &'static str, reason: String },

    // --- files ---
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Format { path: PathBuf, detail: String },
    /// A checkpoint directory another run holds the lock of (`holder`: its pid, when known).
    #[error("{}: in use by another tandem run{}; wait for it to end or choose another directory", .path.display(), .holder.as_ref().map_or_else(String::new, |pid| format!(" (pid {pid})")))]
    InUse { path: PathBuf, holder: Option<String> },
    /// A resume found no checkpoint that reads back whole in `dir` (`found` damaged ones).
    #[error("resume: {}", no_checkpoint(.dir, *.found))]
    NoCheckpoint { dir: PathBuf, found: usize },
    /// Resuming from a checkpoint written with other settings; `changed` names each one.
    #[error("resume: {path} was written with other settings: {}", capped_list(changed))]
    ResumeMismatch { path: PathBuf, changed: Vec<String> },
    /// A fresh run refused a checkpoint directory that holds `count` checkpoints (`files`, the
    /// newest first): resume that run, or delete them and start over.
    #[error("{}: already holds {count} checkpoint(s) ({files}); resume that run (--resume, Claim::Resume) or delete them and start over (--overwrite-checkpoints, Claim::Overwrite)", .dir.display())]
    CheckpointsPresent { dir: PathBuf, count: usize, files: String },

    // --- parallel workers (pipeline stages, per-device threads) ---
    /// The thread driving `role` `index` on `device` stopped with `source`.
    #[error("{role} {index} on {device} failed: {source}")]
    Worker {
        role: &'static str,
        index: usize,
        device: String,
        #[source]
        source: Box<Error>,
    },
    /// A thread panicked; the message is the panic's.
    #[error("panicked: {0}")]
    Panicked(String),
    /// The other end of a channel between workers went away: a knock-on of its own failure,
    /// which the step reports instead.
    #[error("{role} {index}: the {what} channel closed (the neighbour stopped)")]
    ChannelClosed { role: &'static str, index: usize, what: &'static str },

    // --- training ---
    /// Training stopped at `step` because `what` (the loss, or a tensor of the state) is no
    /// longer finite; `kept` is the newest checkpoint whose state is all finite, if any.
    #[error("{what}; stopped{}", .kept.as_ref().map_or_else(String::new, |p| format!("; the newest finite checkpoint is {}", p.display())))]
    NonFinite { step: u64, what: String, kept: Option<PathBuf> },
    /// A broken invariant inside tandem: a bug to report, not a cause to handle.
    #[error("{0}")]
    Msg(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The sentence, as `Display` writes it; `{:#?}` puts the variant's name first.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if f.alternate() {
            write!(f, "{}: ", self.variant())?;
        }
        std::fmt::Display::fmt(self, f)
    }
}

/// Items listed in an error message: at most this many, then how many more there are.
pub(crate) const LISTED: usize = 8;
/// Characters of one listed item shown (a hostile file's tensor name may be megabytes long).
const ITEM_CHARS: usize = 80;

/// `items` for an error message, comma-separated: the first [`LISTED`], each cut to 80
/// characters, then "and N more", so that a file of a million tensors makes a one-line
/// error, not a 15 MB one.
pub(crate) fn capped_list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut out = String::new();
    let mut more = 0usize;
    for (i, item) in items.into_iter().enumerate() {
        if i >= LISTED {
            more += 1;
            continue;
        }
        if i > 0 {
            out.push_str(", ");
        }
        let item = item.to_string();
        match item.char_indices().nth(ITEM_CHARS) {
            Some((cut, _)) => {
                out.push_str(&item[..cut]);
                out.push_str("...");
            }
            None => out.push_str(&item),
        }
    }
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

fn no_checkpoint(dir: &std::path::Path, found: usize) -> String {
    match found {
        0 => format!("no checkpoint in {} (expected files like ckpt-00000100.safetensors)", dir.display()),
        n => format!("none of the {n} checkpoints in {} is valid", dir.display()),
    }
}

impl Error {
    /// The variant's name (`"ResumeMismatch"`), what `{:#?}` prints before the sentence.
    pub fn variant(&self) -> &'static str {
        match self {
            Error::Shape { .. } => "Shape",
            Error::DType { .. } => "DType",
            Error::DeviceMismatch { .. } => "DeviceMismatch",
            Error::NoSuchDevice { .. } => "NoSuchDevice",
            Error::Invalid { .. } => "Invalid",
            Error::Label { .. } => "Label",
            Error::OutOfMemory { .. } => "OutOfMemory",
            Error::Backend { .. } => "Backend",
            Error::Unavailable { .. } => "Unavailable",
            Error::Io { .. } => "Io",
            Error::Format { .. } => "Format",
            Error::InUse { .. } => "InUse",
            Error::NoCheckpoint { .. } => "NoCheckpoint",
            Error::ResumeMismatch { .. } => "ResumeMismatch",
            Error::CheckpointsPresent { .. } => "CheckpointsPresent",
            Error::Worker { .. } => "Worker",
            Error::Panicked(_) => "Panicked",
            Error::ChannelClosed { .. } => "ChannelClosed",
            Error::NonFinite { .. } => "NonFinite",
            Error::Msg(_) => "Msg",
        }
    }
    /// `items` listed for an error message, comma-separated: the first 8, each cut to 80
    /// characters, then "and N more", so that a file of a million tensor names makes a
    /// one-line message.
    ///
    /// ```
    /// let names = (0..10).map(|i| format!("w{i}"));
    /// assert_eq!(tandem::Error::capped_list(names), "w0, w1, w2, w3, w4, w5, w6, w7 and 2 more");
    /// ```
    pub fn capped_list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
        capped_list(items)
    }
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
    /// `Panicked` with the message of a caught panic (`catch_unwind`, `JoinHandle::join`).
    pub fn panicked(payload: Box<dyn std::any::Any + Send>) -> Self {
        let msg = match payload.downcast::<String>() {
            Ok(s) => *s,
            Err(p) => p.downcast_ref::<&str>().map_or_else(|| "a panic without a message".to_string(), |s| s.to_string()),
        };
        Error::Panicked(msg)
    }
    /// `self` as the failure of `role` `index` on `device`, unless it already names a worker.
    pub fn in_worker(self, role: &'static str, index: usize, device: impl std::fmt::Display) -> Self {
        match self {
            Error::Worker { .. } => self,
            e => Error::Worker { role, index, device: device.to_string(), source: Box::new(e) },
        }
    }
    /// `self`, when it is an `OutOfMemory` (inside any `Worker` wrapping), saying the training
    /// step that asked and the newest checkpoint, which the failure leaves as it was.
    pub fn at_step(self, step: u64, kept: Option<&std::path::Path>) -> Self {
        match self {
            Error::Worker { role, index, device, source } => Error::Worker { role, index, device, source: Box::new(source.at_step(step, kept)) },
            Error::OutOfMemory { device, requested, free, detail } => {
                let kept = kept
                    .map_or_else(|| "no checkpoint was written yet".to_string(), |p| format!("the newest checkpoint, {}, is intact", p.display()));
                Error::OutOfMemory { device, requested, free, detail: format!("{detail}; at training step {step}; {kept}") }
            }
            e => e,
        }
    }
    /// The error at the bottom of any `Worker` wrapping.
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::Worker { source, .. } => source.root_cause(),
            e => e,
        }
    }
}

/// Ops whose "labels" are token ids looked up in a table of `vocab_size` rows.
const TOKEN_LOOKUPS: [&str; 5] = ["Embedding", "Gpt", "index_select", "CharVocab::decode", "Gpt2Tokenizer::decode"];

fn label_message(op: &str, label: i32, index: usize, classes: usize) -> String {
    if TOKEN_LOOKUPS.contains(&op) {
        format!("{op}: token id {label} at index {index} is outside 0..{classes} (vocab_size {classes})")
    } else {
        format!("{op}: label {label} at index {index} is outside 0..{classes} ({classes} classes)")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn capped_list_shows_the_first_items_and_counts_the_rest() {
        assert_eq!(super::capped_list(["a", "b"]), "a, b");
        assert_eq!(super::capped_list(0..1_000_000), "0, 1, 2, 3, 4, 5, 6, 7 and 999992 more");
        let long = "x".repeat(10_000);
        assert_eq!(super::capped_list([long]).len(), 83);
    }
}
