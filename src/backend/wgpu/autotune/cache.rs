//! The on-disk cache of autotuning's choices: one JSON file per adapter and driver, shared by
//! every device this process opens on that adapter, read once and rewritten atomically after
//! each new choice. A file that is not a regular file, not JSON of this layout, or written by
//! another tandem version or for another adapter or driver is ignored with a warning.
use crate::backend::cache::{read_regular, write_atomic};
use crate::DeviceInfo;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub use crate::backend::cache::CACHE_DIR_ENV;

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
/// `~/.cache/tandem/autotune`; `None` without any of these variables (an empty one counts as
/// unset, see [`crate::backend::cache::cache_dir`]).
pub fn cache_dir() -> Option<PathBuf> {
    crate::backend::cache::cache_dir("autotune")
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
        /// Open caches by file (or none), adapter name and driver.
        type Caches = HashMap<(Option<PathBuf>, String, String), Arc<Cache>>;
        static ALL: OnceLock<Mutex<Caches>> = OnceLock::new();
        let path = dir.map(|d| cache_file(d, info));
        let key = (path.clone(), info.name.clone(), info.driver.clone());
        let mut all = lock(ALL.get_or_init(Mutex::default));
        all.entry(key)
            .or_insert_with(|| {
                let entries = path.as_deref().map_or_else(BTreeMap::new, |p| read(p, &info.name, &info.driver, true));
                let entries = entries.into_iter().map(|(class, c)| (class, (c, true))).collect();
                Arc::new(Cache {
                    path,
                    adapter: info.name.clone(),
                    driver: info.driver.clone(),
                    entries: Mutex::new(entries),
                    warned: AtomicBool::new(false),
                })
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
        if let Err(e) = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string()).and_then(|bytes| write_atomic(path, &bytes)) {
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
    let bytes = match read_regular(path, MAX_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return BTreeMap::new(),
        Err(why) => return ignore(why),
    };
    let file: CacheFile = match serde_json::from_slice(&bytes) {
        Ok(f) => f,
        Err(e) => return ignore(format!("not a cache file ({e})")),
    };
    if file.tandem != env!("CARGO_PKG_VERSION") || file.adapter != adapter || file.driver != driver {
        return ignore(format!(
            "written by tandem {} for {} ({}), stale for tandem {} on this adapter",
            file.tandem,
            file.adapter,
            file.driver,
            env!("CARGO_PKG_VERSION")
        ));
    }
    file.choices
}
