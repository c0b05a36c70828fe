//! Resumable training checkpoints: one safetensors file per checkpoint, `ckpt-00000100.safetensors`,
//! holding the weights (`model.<name>`) and optimizer state (`optim.<name>`) with metadata for
//! the step, the data loader's position, the shuffle seed and the run's configuration, sealed
//! by a SHA-256 over all of it.
//!
//! Each file is written atomically (temp file, fsync, rename, fsync of the directory), so a
//! crash leaves whole checkpoints only; the checksum also catches later damage. Resuming takes
//! the newest file that parses and whose checksum matches, and reports the ones it skipped.
use crate::checkpoint::{read_safetensors, sha256_hex, to_host, write_safetensors, HostData, HostTensor};
use crate::data::LoaderState;
use crate::parallel::Strategy;
use crate::{Device, Error, Result, Tensor};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FORMAT: &str = "tandem-checkpoint-1";
const MODEL: &str = "model.";
const OPTIM: &str = "optim.";
/// Checkpoints kept on disk; older ones are deleted after each new one is safely written.
pub const KEEP: usize = 3;

/// What, besides tensors, a checkpoint must restore for the run to continue bit for bit.
#[derive(Clone, Debug, PartialEq)]
pub struct RunState {
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

pub struct Checkpoint {
    pub path: PathBuf,
    pub state: RunState,
    pub weights: Vec<(String, Tensor)>,
    pub optim: Vec<(String, Tensor)>,
}

pub fn file_name(step: u64) -> String {
    format!("ckpt-{step:08}.safetensors")
}

/// Step number of a checkpoint file name, `None` for anything else (temp files start with '.').
fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("ckpt-")?.strip_suffix(".safetensors")?.parse().ok()
}

/// Writes the checkpoint of `strategy` at `state.step` into `dir`, then prunes old ones.
pub fn save(dir: &Path, strategy: &dyn Strategy, state: &RunState) -> Result<PathBuf> {
    let mut tensors: Vec<(String, HostTensor)> = Vec::new();
    for (n, t) in to_host(&strategy.state_dict()?)? {
        tensors.push((format!("{MODEL}{n}"), t));
    }
    let (opt, optim_steps) = strategy.optimizer_state()?;
    for (n, t) in to_host(&opt)? {
        tensors.push((format!("{OPTIM}{n}"), t));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("step".to_string(), state.step.to_string());
    meta.insert("optim_steps".to_string(), optim_steps.to_string());
    meta.insert("loader".to_string(), serde_json::to_string(&state.loader).map_err(|e| Error::Msg(e.to_string()))?);
    meta.insert("shuffle_seed".to_string(), state.shuffle_seed.to_string());
    meta.insert("config".to_string(), state.config.to_string());
    meta.insert("sha256".to_string(), digest(&meta, &tensors));
    let path = dir.join(file_name(state.step));
    write_safetensors(&path, &tensors, &meta)?;
    prune(dir)?;
    Ok(path)
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

/// Checkpoint files in `dir`, oldest first.
fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn prune(dir: &Path) -> Result<()> {
    let all = list(dir)?;
    for (_, path) in all.iter().take(all.len().saturating_sub(KEEP)) {
        std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}

/// Removes temp files of checkpoint writes that a killed run left behind.
pub fn remove_stale_temps(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".ckpt-") && name.contains(".safetensors.tmp-") {
            std::fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        }
    }
    Ok(())
}

/// The newest checkpoint in `dir` that reads back whole; each one skipped is passed to `skip`
/// with the reason. Errors when there is none.
pub fn load_newest(dir: &Path, mut skip: impl FnMut(&Path, &Error)) -> Result<Checkpoint> {
    let all = if dir.is_dir() { list(dir)? } else { Vec::new() };
    if all.is_empty() {
        return Err(Error::Msg(format!("--resume: no checkpoint in {} (expected files like {})", dir.display(), file_name(100))));
    }
    for (_, path) in all.iter().rev() {
        match read(path) {
            Ok(c) => return Ok(c),
            Err(e) => skip(path, &e),
        }
    }
    Err(Error::Msg(format!("--resume: none of the {} checkpoints in {} is valid", all.len(), dir.display())))
}

fn read(path: &Path) -> Result<Checkpoint> {
    let (tensors, meta) = read_safetensors(path)?;
    let field = |k: &str| meta.get(k).ok_or_else(|| Error::format(path, format!("metadata has no '{k}'")));
    if field("format")? != FORMAT {
        return Err(Error::format(path, "not a tandem checkpoint"));
    }
    if *field("sha256")? != digest(&meta, &tensors) {
        return Err(Error::format(path, "checksum mismatch: the file is damaged"));
    }
    let bad = |k: &str| Error::format(path, format!("metadata '{k}' is malformed"));
    let state = RunState {
        step: field("step")?.parse().map_err(|_| bad("step"))?,
        optim_steps: field("optim_steps")?.parse().map_err(|_| bad("optim_steps"))?,
        loader: serde_json::from_str(field("loader")?).map_err(|_| bad("loader"))?,
        shuffle_seed: field("shuffle_seed")?.parse().map_err(|_| bad("shuffle_seed"))?,
        config: serde_json::from_str(field("config")?).map_err(|_| bad("config"))?,
    };
    let (mut weights, mut optim) = (Vec::new(), Vec::new());
    for (name, h) in tensors {
        let HostData::F32(v) = h.data else {
            return Err(Error::format(path, format!("{name} is not F32")));
        };
        let t = Tensor::from_vec(v, h.shape, &Device::cpu())?;
        if let Some(n) = name.strip_prefix(MODEL) {
            weights.push((n.to_string(), t));
        } else if let Some(n) = name.strip_prefix(OPTIM) {
            optim.push((n.to_string(), t));
        } else {
            return Err(Error::format(path, format!("unexpected tensor {name}")));
        }
    }
    Ok(Checkpoint { path: path.to_path_buf(), state, weights, optim })
}
