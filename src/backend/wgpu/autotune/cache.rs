//! The on-disk cache of autotuning's choices: one JSON file per adapter and driver, shared by
//! every device this process opens on that adapter, read once and rewritten atomically after
//! each new choice. A file that is not a regular file, not JSON of this layout, or written by
//! another tandem version or for another adapter or driver is ignored with a warning.
use crate::DeviceInfo;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The environment variable naming tandem's cache directory (shared with the CUDA backend's
/// PTX cache); autotuning keeps its files in its `autotune` subdirectory.
pub const CACHE_DIR_ENV: &str = "TANDEM_CACHE_DIR";

/// A cache file larger than this is not ours (a few hundred bytes per shape class).
const MAX_BYTES: u64 = 1 << 20;

/// What one file holds; `tandem`, `adapter` and `driver` must match the reader's.
#[derive(serde::Serialize, serde::Deserialize)]
struct CacheFile {
    tandem: String,
    adapter: String,
    driver: String,
    choices: BTreeMap<String, Choice>,
}

/// The choice for one shape class: the kernel's name (`MatmulKernel::name`), each candidate's
/// best time per run in microseconds, and the clock that timed them.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Choice {
    pub kernel: String,
    pub times_us: Vec<(String, f64)>,
    pub clock: String,
}

/// The choices of one adapter, as read from its file plus those made since.
pub(crate) struct Cache {
    path: Option<PathBuf>,
    adapter: String,
    driver: String,
    /// Each class's choice, and whether it came from the file.
    entries: Mutex<BTreeMap<String, (Choice, bool)>>,
    /// Whether a failed write has been reported (once per file, not once per class).
    warned: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `$TANDEM_CACHE_DIR/autotune`, else `$XDG_CACHE_HOME/tandem/autotune`, else
/// `~/.cache/tandem/autotune`; `None` without any of these variables.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(CACHE_DIR_ENV) {
        return Some(PathBuf::from(d).join("autotune"));
    }
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tandem").join("autotune"))
}

/// The file in `dir` that holds the choices for the adapter and driver of `info`: the adapter's
/// name made safe for a file name, and a hash of name and driver (lavapipe and llvmpipe share
/// a name; the driver string names the wgpu backend too).
pub fn cache_file(dir: &Path, info: &DeviceInfo) -> PathBuf {
    let slug: String = info.name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(40).collect();
    let hash = Sha256::digest(format!("{}\n{}", info.name, info.driver).as_bytes());
    let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{}-{hex}.json", slug.trim_matches('-')))
}

impl Cache {
    /// The cache of `info`'s adapter in `dir` (no file without one), shared by every device
    /// opened with the same file (or, without a file, on the same adapter) in this process.
    pub(crate) fn shared(dir: Option<&Path>, info: &DeviceInfo) -> Arc<Cache> {
        static ALL: OnceLock<Mutex<HashMap<(Option<PathBuf>, String, String), Arc<Cache>>>> = OnceLock::new();
        let path = dir.map(|d| cache_file(d, info));
        let key = (path.clone(), info.name.clone(), info.driver.clone());
        let mut all = lock(ALL.get_or_init(Mutex::default));
        all.entry(key)
            .or_insert_with(|| {
                let entries = path.as_deref().map_or_else(BTreeMap::new, |p| read(p, &info.name, &info.driver, true));
                let entries = entries.into_iter().map(|(class, c)| (class, (c, true))).collect();
                Arc::new(Cache { path, adapter: info.name.clone(), driver: info.driver.clone(), entries: Mutex::new(entries), warned: AtomicBool::new(false) })
            })
            .clone()
    }

    /// The choice for `class`, and whether it came from the file.
    pub(crate) fn get(&self, class: &str) -> Option<(Choice, bool)> {
        lock(&self.entries).get(class).cloned()
    }

    /// Records `choice` for `class` and rewrites the file with every choice of this process
    /// and any another process wrote meanwhile (ours win); a failed write is reported once.
    pub(crate) fn put(&self, class: &str, choice: Choice) {
        let mut entries = lock(&self.entries);
        entries.insert(class.to_string(), (choice, false));
        let Some(path) = &self.path else { return };
        // Quietly: what was wrong with the file was said when it was first read.
        let mut choices = read(path, &self.adapter, &self.driver, false);
        choices.extend(entries.iter().map(|(k, (c, _))| (k.clone(), c.clone())));
        let file = CacheFile { tandem: env!("CARGO_PKG_VERSION").into(), adapter: self.adapter.clone(), driver: self.driver.clone(), choices };
        if let Err(e) = write(path, &file) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!("autotune cache {} not written ({e}); choices last until the process ends", path.display());
            }
        }
    }
}

/// The choices in the file at `path` if it is a regular file of this tandem version for this
/// adapter and driver; anything else is ignored (a missing file quietly, the rest with a warning
/// when `warn`).
fn read(path: &Path, adapter: &str, driver: &str, warn: bool) -> BTreeMap<String, Choice> {
    let ignore = |why: String| {
        if warn {
            tracing::warn!("ignoring autotune cache {}: {why}", path.display());
        }
        BTreeMap::new()
    };
    let bytes = match read_regular(path) {
        Ok(Some(b)) => b,
        Ok(None) => return BTreeMap::new(),
        Err(why) => return ignore(why),
    };
    let file: CacheFile = match serde_json::from_slice(&bytes) {
        Ok(f) => f,
        Err(e) => return ignore(format!("not a cache file ({e})")),
    };
    if file.tandem != env!("CARGO_PKG_VERSION") || file.adapter != adapter || file.driver != driver {
        return ignore(format!("written by tandem {} for {} ({}), stale for tandem {} on this adapter", file.tandem, file.adapter, file.driver, env!("CARGO_PKG_VERSION")));
    }
    file.choices
}

/// The bytes of the regular file at `path`, never following a symbolic link nor waiting on a
/// FIFO; `Ok(None)` when nothing is there.
fn read_regular(path: &Path) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    #[cfg(not(unix))]
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file()) {
        return Err("not a regular file".into());
    }
    let f = match open.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // O_NOFOLLOW on a symbolic link fails with ELOOP.
        Err(e) => return Err(format!("not a regular file we can read ({e})")),
    };
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_BYTES {
        return Err(format!("{} bytes, more than a cache file holds", meta.len()));
    }
    let mut bytes = Vec::new();
    f.take(MAX_BYTES).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok(Some(bytes))
}

/// Writes `file` to `path` atomically, creating the directory: a new temporary file in the same
/// directory (never an existing one: `create_new`), synced, then renamed over `path`, so that a
/// reader sees the old file or the new one, never a torn mix. A path held by anything but a
/// regular file (a link, a directory, a FIFO) is left as it is. `checkpoint::write_atomic` does
/// the same for outputs but lives in a layer above the backends, and follows links on purpose.
fn write(path: &Path, file: &CacheFile) -> Result<(), String> {
    use std::io::Write;
    let dir = path.parent().ok_or("the cache path has no directory")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file()) {
        return Err("its path holds something other than a regular file, left as it is".into());
    }
    let bytes = serde_json::to_vec_pretty(file).map_err(|e| e.to_string())?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("cache");
    let temp = dir.join(format!(".{name}.tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let written = std::fs::OpenOptions::new().write(true).create_new(true).open(&temp).and_then(|mut f| {
        f.write_all(&bytes)?;
        f.sync_all()
    });
    // Best effort: the temporary file may not exist; the error that matters is the write's.
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(e.to_string());
    }
    Ok(())
}
