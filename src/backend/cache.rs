//! tandem's on-disk caches (the CUDA kernels' PTX, autotuning's choices, the planner's
//! calibrations): where they live, and the one way to read and write their files, so that a
//! cache can never block, follow a link into another file, or leave a torn entry.
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming tandem's cache directory; each cache keeps its files in a
/// subdirectory of it (`ptx`, `autotune`, `plan`).
pub const CACHE_DIR_ENV: &str = "TANDEM_CACHE_DIR";

/// `$TANDEM_CACHE_DIR/<sub>`, else `$XDG_CACHE_HOME/tandem/<sub>`, else
/// `~/.cache/tandem/<sub>`; `None` without any of these variables. A variable set to the empty
/// string counts as unset (`TANDEM_CACHE_DIR=` does not mean the working directory), and so
/// does a relative `XDG_CACHE_HOME` or `HOME`, which the XDG base directory specification says
/// to ignore.
pub fn cache_dir(sub: &str) -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name);
    cache_dir_from(var(CACHE_DIR_ENV), var("XDG_CACHE_HOME"), var("HOME"), sub)
}

/// [`cache_dir`] from the values of `TANDEM_CACHE_DIR`, `XDG_CACHE_HOME` and `HOME`.
fn cache_dir_from(tandem: Option<OsString>, xdg: Option<OsString>, home: Option<OsString>, sub: &str) -> Option<PathBuf> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = set(tandem) {
        return Some(d.join(sub));
    }
    let absolute = |v: Option<OsString>| set(v).filter(|p| p.is_absolute());
    let base = absolute(xdg).or_else(|| absolute(home).map(|h| h.join(".cache")))?;
    Some(base.join("tandem").join(sub))
}

/// The bytes of the regular file at `path`, never following a symbolic link nor waiting on a
/// FIFO, and refusing one larger than `max_bytes`; `Ok(None)` when nothing is there.
pub(crate) fn read_regular(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, String> {
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
    if meta.len() > max_bytes {
        return Err(format!("{} bytes, more than a cache file holds", meta.len()));
    }
    let mut bytes = Vec::new();
    f.take(max_bytes).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok(Some(bytes))
}

/// Writes `bytes` to `path` atomically, creating the directory: a new temporary file in the
/// same directory (never an existing one: `create_new`), synced, then renamed over `path`, so
/// that a reader sees the old file or the new one, never a torn mix. A path held by anything
/// but a regular file (a link, a directory, a FIFO) is left as it is. `checkpoint::write_atomic`
/// does the same for outputs but lives in a layer above the backends, and follows links on
/// purpose.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let dir = path.parent().ok_or("the cache path has no directory")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file()) {
        return Err("its path holds something other than a regular file, left as it is".into());
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("cache");
    let temp = dir.join(format!(".{name}.tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let written = std::fs::OpenOptions::new().write(true).create_new(true).open(&temp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    // Best effort: the temporary file may not exist; the error that matters is the write's.
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(e.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::cache_dir_from;
    use std::path::PathBuf;

    fn dir(tandem: Option<&str>, xdg: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
        cache_dir_from(tandem.map(Into::into), xdg.map(Into::into), home.map(Into::into), "plan")
    }

    /// An empty variable is an unset one: `TANDEM_CACHE_DIR=` must not put the cache in the
    /// working directory (`./plan`), nor an empty or relative `XDG_CACHE_HOME` or `HOME` under it.
    #[test]
    fn empty_and_relative_variables_count_as_unset() {
        assert_eq!(dir(Some("/c"), Some("/x"), Some("/h")), Some("/c/plan".into()));
        // A relative TANDEM_CACHE_DIR is the user's own choice, kept.
        assert_eq!(dir(Some("rel"), None, None), Some("rel/plan".into()));
        assert_eq!(dir(Some(""), Some("/x"), Some("/h")), Some("/x/tandem/plan".into()));
        assert_eq!(dir(Some(""), Some(""), Some("/h")), Some("/h/.cache/tandem/plan".into()));
        assert_eq!(dir(None, Some("cache"), Some("/h")), Some("/h/.cache/tandem/plan".into()));
        assert_eq!(dir(Some(""), Some(""), Some("")), None);
        assert_eq!(dir(None, None, Some("home")), None);
        assert_eq!(dir(None, None, None), None);
    }
}
