//! Resumable training checkpoints (a run's whole state, not only its weights): one safetensors file per checkpoint, `ckpt-00000100.safetensors`,
//! holding the weights (`model.<name>`) and optimizer state (`optim.<name>`) with metadata for
//! the run's id, the step, the data loader's position, the shuffle seed and the run's configuration, sealed
//! by a SHA-256 over all of it.
//!
//! Each file is written atomically (temp file, fsync, rename, fsync of the directory), so a
//! crash leaves whole checkpoints only; the checksum also catches later damage. Inside the
//! directory nothing is followed: a checkpoint or temp file is created new (never opened
//! through a link), only a regular file is ever replaced or read, and anything else at a
//! checkpoint's name is an error naming it. Resuming takes
//! the newest file that parses and whose checksum matches, and reports the ones it skipped.
//! Who may write into a directory, and which files a run may prune, is [`run_dir`](super::run_dir)'s business.
use crate::checkpoint::{safetensors_bytes, safetensors_from_bytes, sha256_hex, to_host, HostData, HostTensor, SafetensorsContents};
use crate::data::LoaderState;
use crate::parallel::Strategy;
use crate::{Device, Error, Result, Tensor};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::{self, File, FileType, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const FORMAT: &str = "tandem-checkpoint-1";
const MODEL: &str = "model.";
const OPTIM: &str = "optim.";
/// F16's loss scaler: `amp.loss_scale` and `amp.growth_tracker`, one value each.
const AMP_SCALE: &str = "amp.loss_scale";
const AMP_TRACKER: &str = "amp.growth_tracker";
/// What, besides tensors, a checkpoint must restore for the run to continue bit for bit.
#[derive(Clone, Debug, PartialEq)]
pub struct RunState {
    /// The run's id, drawn when it starts fresh and kept across resumes; retention only ever
    /// counts and prunes the files of this run. Empty in files written before run ids.
    pub run: String,
    /// Optimizer steps completed.
    pub step: u64,
    /// The optimizer's own step count (Adam's bias correction uses it).
    pub optim_steps: u64,
    pub loader: LoaderState,
    /// The only randomness after initialisation is the loader's shuffle, keyed by
    /// `(shuffle_seed, epoch)`; with the loader position it is the whole RNG state.
    pub shuffle_seed: u64,
    /// The flags that shape the trajectory; a resume must match them.
    pub config: serde_json::Value,
}

/// A run checkpoint read back: its path, run state, weights and optimizer state.
pub struct RunCheckpoint {
    pub path: PathBuf,
    pub state: RunState,
    pub weights: Vec<(String, Tensor)>,
    pub optim: Vec<(String, Tensor)>,
    /// The loss scale and its growth tracker of an f16 run (`None` in other precisions).
    pub grad_scaler: Option<(f32, u32)>,
}

pub fn file_name(step: u64) -> String {
    format!("ckpt-{step:08}.safetensors")
}

/// Whether `name` is a checkpoint file's name (`ckpt-<step>.safetensors`).
pub fn is_checkpoint_name(name: &str) -> bool {
    step_of(name).is_some()
}

/// Step number of a checkpoint file name, `None` for anything else (temp files start with '.').
fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("ckpt-")?.strip_suffix(".safetensors")?.parse().ok()
}

/// Whether `name` is a checkpoint's temp file (`.ckpt-00000100.safetensors.tmp-<pid>-<n>`),
/// which a write renames into place and a run removes when a killed one left it.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(".ckpt-") && name.contains(".safetensors.tmp-")
}

/// Distinguishes the temp files of concurrent writes within one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What a file type is, for a message: "a symbolic link", "a FIFO", ...
pub(crate) fn kind_name(kind: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_char_device() {
            return "a character device";
        }
    }
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// The error for `what` (a [`kind_name`]) found at `path` in a checkpoint directory, where only
/// regular files are read, replaced or deleted.
pub(crate) fn not_regular(path: &Path, what: &str) -> Error {
    let detail = format!("is {what}, not a regular file; a checkpoint directory's files are never followed or replaced unless they are regular files: remove it, or use another directory");
    Error::io(path, std::io::Error::new(ErrorKind::InvalidInput, detail))
}

/// Nothing, or a regular file, at `path`, seen without following a link: what a checkpoint
/// may be written over.
fn absent_or_regular(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => Ok(()),
        Ok(m) => Err(not_regular(path, kind_name(&m.file_type()))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Opens `opts` at `path` without following a link at its last component or waiting on a FIFO.
fn open_no_follow(opts: &mut OpenOptions, path: &Path) -> std::io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    #[cfg(not(unix))]
    if fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file()) {
        return Err(std::io::Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    opts.open(path)
}

/// The bytes of the regular file at `path` in a checkpoint directory: a link is not followed
/// and a FIFO not waited on; either is an error naming the path.
pub(crate) fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let mut f = match open_no_follow(OpenOptions::new().read(true), path) {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(not_regular(path, "a symbolic link")),
        Err(e) => return Err(Error::io(path, e)),
    };
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_regular(path, kind_name(&meta.file_type())));
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// Writes `bytes` as `dir/name` atomically without following anything: a new temp file
/// (`O_EXCL`, `O_NOFOLLOW`), fsync, a rename over `name` only when nothing or a regular file is
/// there (checked before the write and again before the rename), and an fsync of `dir`.
fn write_in_dir(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let path = dir.join(name);
    absent_or_regular(&path)?;
    let temp = dir.join(format!(".{name}.tmp-{}-{}", std::process::id(), TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)));
    let written = open_no_follow(OpenOptions::new().write(true).create_new(true), &temp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written {
        // Best effort: the temp file may not exist (create_new refused what was there, which
        // is left alone: remove_file deletes only a name it created or a stale name).
        if !matches!(e.kind(), ErrorKind::AlreadyExists) {
            let _ = fs::remove_file(&temp);
        }
        return Err(Error::io(&temp, e));
    }
    let renamed = absent_or_regular(&path).and_then(|()| fs::rename(&temp, &path).map_err(|e| Error::io(&path, e)));
    if let Err(e) = renamed {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    // Windows cannot open a directory as a File to fsync it; its rename is already journaled.
    #[cfg(unix)]
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))?;
    Ok(path)
}

/// The weights and optimizer state of `strategy` on the host, in the checkpoint's naming, and
/// the optimizer's step count.
pub fn snapshot<S: Strategy + ?Sized>(strategy: &S) -> Result<(Vec<(String, HostTensor)>, u64)> {
    let mut tensors: Vec<(String, HostTensor)> = Vec::new();
    for (n, t) in to_host(&strategy.state_dict()?)? {
        tensors.push((format!("{MODEL}{n}"), t));
    }
    let (opt, optim_steps) = strategy.optimizer_state()?;
    for (n, t) in to_host(&opt)? {
        tensors.push((format!("{OPTIM}{n}"), t));
    }
    if let Some(s) = strategy.core().grad_scaler() {
        tensors.push((AMP_SCALE.into(), HostTensor::f32(vec![1], vec![s.scale()])?));
        tensors.push((AMP_TRACKER.into(), HostTensor::f32(vec![1], vec![s.growth_tracker() as f32])?));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((tensors, optim_steps))
}

/// The first tensor of a snapshot holding a NaN or an infinity, and that value: such a state
/// must never become a checkpoint, since resuming from it could only continue the blow-up.
pub fn first_non_finite(tensors: &[(String, HostTensor)]) -> Option<(&str, f32)> {
    tensors.iter().find_map(|(name, t)| match &t.data {
        HostData::F32(v) => v.iter().find(|x| !x.is_finite()).map(|&x| (name.as_str(), x)),
        HostData::I32(_) => None,
    })
}

/// Writes `tensors` (a [`snapshot`]) as the checkpoint of `state.step` into `dir`.
pub fn write(dir: &Path, tensors: &[(String, HostTensor)], state: &RunState) -> Result<PathBuf> {
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("run".to_string(), state.run.clone());
    meta.insert("step".to_string(), state.step.to_string());
    meta.insert("optim_steps".to_string(), state.optim_steps.to_string());
    meta.insert("loader".to_string(), serde_json::to_string(&state.loader).map_err(|e| Error::Msg(e.to_string()))?);
    meta.insert("shuffle_seed".to_string(), state.shuffle_seed.to_string());
    meta.insert("config".to_string(), state.config.to_string());
    meta.insert("sha256".to_string(), digest(&meta, tensors));
    let name = file_name(state.step);
    let bytes = safetensors_bytes(&dir.join(&name), tensors, &meta)?;
    write_in_dir(dir, &name, &bytes)
}

/// SHA-256 over the metadata (except the checksum itself) and every tensor's name, dtype,
/// shape and little-endian bytes, in name order.
fn digest(meta: &BTreeMap<String, String>, tensors: &[(String, HostTensor)]) -> String {
    let mut h = Sha256::new();
    for (k, v) in meta.iter().filter(|(k, _)| k.as_str() != "sha256") {
        h.update((k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
        h.update((v.len() as u64).to_le_bytes());
        h.update(v.as_bytes());
    }
    for (name, t) in tensors {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update((t.shape.len() as u64).to_le_bytes());
        for d in &t.shape {
            h.update((*d as u64).to_le_bytes());
        }
        match &t.data {
            HostData::F32(v) => {
                h.update(b"f32");
                v.iter().for_each(|x| h.update(x.to_le_bytes()));
            }
            HostData::I32(v) => {
                h.update(b"i32");
                v.iter().for_each(|x| h.update(x.to_le_bytes()));
            }
        }
    }
    // sha256_hex of the digest keeps one hex convention for every checksum in the crate.
    sha256_hex(&h.finalize())
}

/// Regular files in `dir` named like checkpoints, oldest first. Anything else, a directory
/// named like a checkpoint included, is not a checkpoint and is never read or removed.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let is_file = entry.file_type().map_err(|e| Error::io(entry.path(), e))?.is_file();
        if let Some(step) = entry.file_name().to_str().and_then(step_of).filter(|_| is_file) {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Removes temp files of checkpoint writes that a killed run left behind: regular files only
/// (anything else at a temp file's name is an error naming it, and is left as it is).
pub fn remove_stale_temps(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if entry.file_name().to_str().is_some_and(is_temp_name) {
            let kind = entry.file_type().map_err(|e| Error::io(entry.path(), e))?;
            if !kind.is_file() {
                return Err(not_regular(&entry.path(), kind_name(&kind)));
            }
            std::fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        }
    }
    Ok(())
}

/// The newest checkpoint in `dir` that reads back whole, and its file's bytes (which rank 0
/// sends the other ranks under mpirun); each one skipped is passed to `skip` with the reason.
/// Errors when there is none.
pub fn load_newest(dir: &Path, mut skip: impl FnMut(&Path, &Error)) -> Result<(RunCheckpoint, Vec<u8>)> {
    let all = if dir.is_dir() { list(dir)? } else { Vec::new() };
    if all.is_empty() {
        return Err(Error::NoCheckpoint { dir: dir.to_path_buf(), found: 0 });
    }
    for (_, path) in all.iter().rev() {
        let read = read_regular(path).and_then(|bytes| Ok((from_bytes(path, &bytes)?, bytes)));
        match read {
            Ok(c) => return Ok(c),
            Err(e) => skip(path, &e),
        }
    }
    Err(Error::NoCheckpoint { dir: dir.to_path_buf(), found: all.len() })
}

/// The largest safetensors header read (the safetensors crate's own limit).
const HEADER_MAX: u64 = 100_000_000;

/// The run id a file's header says it is a tandem checkpoint of, read from the header alone:
/// its tensors are neither read nor hashed, so a large file of anything else costs one small
/// read. `None` for a file that is not one (whether it is whole is [`verify`]'s question).
pub fn claimed_run(path: &Path) -> Option<String> {
    let mut meta = header_meta(path)?;
    (meta.get("format").map(String::as_str) == Some(FORMAT)).then(|| meta.remove("run").unwrap_or_default())
}

/// The run configuration recorded by the newest file in `dir` whose header says it is a
/// tandem checkpoint, and that file, read from headers alone (whether the file is whole is
/// [`load_newest`]'s question): what a program checks its flags against before resuming.
/// `None` when no file in `dir` claims to be one.
pub fn recorded_config(dir: &Path) -> Option<(PathBuf, serde_json::Value)> {
    let all = list(dir).ok()?;
    all.into_iter().rev().find_map(|(_, path)| {
        let meta = header_meta(&path).filter(|m| m.get("format").map(String::as_str) == Some(FORMAT))?;
        let config = serde_json::from_str(meta.get("config")?).ok()?;
        Some((path, config))
    })
}

/// The string metadata of the safetensors file at `path`, read from its header alone, without
/// following a link; `None` for anything unreadable.
fn header_meta(path: &Path) -> Option<BTreeMap<String, String>> {
    #[derive(serde::Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__", default)]
        meta: BTreeMap<String, String>,
    }
    let f = open_no_follow(OpenOptions::new().read(true), path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut f = f;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = u64::from_le_bytes(len);
    if len > HEADER_MAX {
        return None;
    }
    let mut header = Vec::new();
    // `take` grows the buffer with what is there, not with what the length field claims.
    f.take(len).read_to_end(&mut header).ok()?;
    let Header { meta } = serde_json::from_slice(&header).ok()?;
    Some(meta)
}

#[cfg(test)]
thread_local! {
    /// Files [`verify`] read and hashed whole on this thread, for tests of what a save costs.
    pub static VERIFIED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The run state of a checkpoint file whose checksum matches, without building its tensors.
/// `path` is a file the caller names, so a link is followed (a run's own files are read
/// without, see [`run_dir`](super::run_dir)).
pub fn verify(path: &Path) -> Result<RunState> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    verify_bytes(path, &bytes)
}

/// [`verify`] of a file in a checkpoint directory: only a regular file is read.
pub(crate) fn verify_in_dir(path: &Path) -> Result<RunState> {
    verify_bytes(path, &read_regular(path)?)
}

fn verify_bytes(path: &Path, bytes: &[u8]) -> Result<RunState> {
    #[cfg(test)]
    VERIFIED.with(|n| n.set(n.get() + 1));
    let (_, meta) = checked(path, safetensors_from_bytes(path, bytes)?)?;
    state_of(path, &meta)
}

/// The tensors and metadata of a tandem checkpoint whose checksum matches.
fn checked(path: &Path, (tensors, meta): SafetensorsContents) -> Result<SafetensorsContents> {
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(Error::format(path, "not a tandem checkpoint"));
    }
    if meta.get("sha256") != Some(&digest(&meta, &tensors)) {
        return Err(Error::format(path, "checksum mismatch: the file is damaged"));
    }
    Ok((tensors, meta))
}

fn state_of(path: &Path, meta: &BTreeMap<String, String>) -> Result<RunState> {
    let field = |k: &str| meta.get(k).ok_or_else(|| Error::format(path, format!("metadata has no '{k}'")));
    let bad = |k: &str| Error::format(path, format!("metadata '{k}' is malformed"));
    Ok(RunState {
        run: meta.get("run").cloned().unwrap_or_default(),
        step: field("step")?.parse().map_err(|_| bad("step"))?,
        optim_steps: field("optim_steps")?.parse().map_err(|_| bad("optim_steps"))?,
        loader: serde_json::from_str(field("loader")?).map_err(|_| bad("loader"))?,
        shuffle_seed: field("shuffle_seed")?.parse().map_err(|_| bad("shuffle_seed"))?,
        config: serde_json::from_str(field("config")?).map_err(|_| bad("config"))?,
    })
}

/// The checkpoint in `bytes`, the contents of the file at `path` (named in errors).
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<RunCheckpoint> {
    let (tensors, meta) = checked(path, safetensors_from_bytes(path, bytes)?)?;
    let state = state_of(path, &meta)?;
    let (mut weights, mut optim) = (Vec::new(), Vec::new());
    let (mut scale, mut tracker) = (None, None);
    // A CPU device of its own: the shared one may be a training device under a memory budget
    // (`--devices cpu,.. --memory-limit`), which a checkpoint of a sharded run need not fit.
    let host = Device::cpu_independent();
    for (name, h) in tensors {
        let HostData::F32(v) = h.data else {
            return Err(Error::format(path, format!("{name} is not F32")));
        };
        if name == AMP_SCALE || name == AMP_TRACKER {
            let [x] = v[..] else { return Err(Error::format(path, format!("{name} holds {} values, not one", v.len()))) };
            match name.as_str() {
                AMP_SCALE => scale = Some(x),
                _ if x.fract() == 0.0 && (0.0..=u32::MAX as f32).contains(&x) => tracker = Some(x as u32),
                _ => return Err(Error::format(path, format!("{name} is {x}, not a count"))),
            }
            continue;
        }
        let t = Tensor::from_vec(v, h.shape, &host)?;
        if let Some(n) = name.strip_prefix(MODEL) {
            weights.push((n.to_string(), t));
        } else if let Some(n) = name.strip_prefix(OPTIM) {
            optim.push((n.to_string(), t));
        } else {
            return Err(Error::format(path, format!("unexpected tensor {name}")));
        }
    }
    let grad_scaler = match (scale, tracker) {
        (Some(s), Some(t)) => Some((s, t)),
        (None, None) => None,
        _ => return Err(Error::format(path, format!("{AMP_SCALE} and {AMP_TRACKER} come together"))),
    };
    Ok(RunCheckpoint { path: path.to_path_buf(), state, weights, optim, grad_scaler })
}
