//! A checkpoint directory that belongs to one run at a time: an advisory lock keeps a second
//! process out while the first runs, a fresh run refuses a directory that holds checkpoints
//! (unless told to resume or to start over), and retention counts and prunes only the valid
//! files of this run, so nothing another run wrote, nothing damaged and nothing that is not a
//! regular checkpoint file is ever deleted by it. Telling the run's files from the others
//! reads only a file's header, and each file of the run is read whole and hashed once per
//! process, so a save costs the same however many or large the other files in the directory.
//!
//! Inside the directory nothing is followed: a symbolic link, a FIFO, a directory or any other
//! file that is not a regular file where a checkpoint, a checkpoint's temp file or the lock
//! goes makes [`RunDir::open`] fail naming it, before any step; writes create their temp files
//! new and rename over nothing but a regular file, and retention deletes regular files only.
use super::run_file::{self as checkpoints, RunState};
use crate::checkpoint::HostTensor;
use crate::{Error, Result};
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Checkpoints of a run kept on disk unless [`RunDir::keep`] says otherwise; older ones are
/// deleted after each new one is safely written.
pub const KEEP: usize = 3;
/// The lock file; it stays in the directory (removing a lock file races with its next taker).
const LOCK: &str = ".tandem-lock";

/// What a run wants from a directory that may already hold checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Continue the newest valid checkpoint's run.
    Resume,
    /// Start a new run; refused when the directory holds checkpoints.
    Fresh,
    /// Start a new run after deleting the checkpoint files already there (see
    /// [`RunDir::discard_earlier`]).
    Overwrite,
}

/// A locked checkpoint directory; the lock is released when this is dropped or the process ends.
pub struct RunDir {
    path: PathBuf,
    _lock: File,
    /// Files known to be whole checkpoints of this run: written by this process, or verified
    /// once. The lock keeps other tandem runs from changing them meanwhile.
    ours: Mutex<BTreeSet<PathBuf>>,
    keep: usize,
    claim: Claim,
}

impl std::fmt::Debug for RunDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunDir").field("path", &self.path).field("keep", &self.keep).field("claim", &self.claim).finish()
    }
}

/// Whether a file named `name` in a checkpoint directory is the run's to write or delete: a
/// checkpoint's name, a checkpoint's temp file, or the lock.
pub fn is_reserved(name: &str) -> bool {
    name == LOCK || checkpoints::is_checkpoint_name(name) || checkpoints::is_temp_name(name)
}

/// Refuses `dir` when anything but a regular file holds a name the run may write, read or
/// delete there ([`is_reserved`]): a link would be followed out of the directory, and a FIFO,
/// a directory or a device could only fail the run later, after steps were spent.
fn check_entries(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if !entry.file_name().to_str().is_some_and(is_reserved) {
            continue;
        }
        // The entry's own type: a link is not followed.
        let kind = entry.file_type().map_err(|e| Error::io(entry.path(), e))?;
        if !kind.is_file() {
            let what = checkpoints::kind_name(&kind);
            if entry.file_name() == LOCK {
                let detail = format!("is {what}, not a regular file; the lock must be a regular file (the run creates it): remove it");
                return Err(Error::io(entry.path(), std::io::Error::new(std::io::ErrorKind::InvalidInput, detail)));
            }
            return Err(checkpoints::not_regular(&entry.path(), what));
        }
    }
    Ok(())
}

/// Opens (creating it) the lock file without following a link or waiting on a FIFO, and
/// checks that what it opened is a regular file.
fn open_lock(lock_path: &Path, cannot: impl Fn(&str, std::io::Error) -> Error) -> Result<File> {
    let mut open = OpenOptions::new();
    open.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let lock = match open.open(lock_path) {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(checkpoints::not_regular(lock_path, "a symbolic link")),
        Err(e) => return Err(cannot("write there", e)),
    };
    let kind = lock.metadata().map_err(|e| Error::io(lock_path, e))?.file_type();
    if !kind.is_file() {
        return Err(checkpoints::not_regular(lock_path, checkpoints::kind_name(&kind)));
    }
    Ok(lock)
}

impl RunDir {
    /// Creates `path` if needed, checks that every file the run may write, read or delete
    /// there is a regular file (or not there yet), takes its lock, removes temp files a killed
    /// run left, and applies `claim`. Runs before any data is loaded, so an unusable directory
    /// (read-only, under /proc, in use, a link or a FIFO at a checkpoint's name) fails the
    /// command up front.
    ///
    /// ```
    /// use tandem::train::{Claim, RunDir};
    /// let dir = std::env::temp_dir().join(format!("tandem-doc-run-dir-{}", std::process::id()));
    /// # let _ = std::fs::remove_dir_all(&dir);
    /// std::fs::create_dir_all(&dir).unwrap();
    /// # #[cfg(unix)] {
    /// // A link where a checkpoint would go is refused, naming it: nothing is written through it.
    /// std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("ckpt-00000002.safetensors")).unwrap();
    /// let refused = RunDir::open(&dir, Claim::Fresh).unwrap_err().to_string();
    /// assert!(refused.contains("ckpt-00000002.safetensors: is a symbolic link"), "{refused}");
    /// std::fs::remove_file(dir.join("ckpt-00000002.safetensors")).unwrap();
    /// # }
    /// let run = RunDir::open(&dir, Claim::Fresh)?;
    /// assert_eq!(run.claim(), Claim::Fresh);
    /// # drop(run);
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), tandem::Error>(())
    /// ```
    pub fn open(path: &Path, claim: Claim) -> Result<RunDir> {
        let cannot =
            |what: &str, e: std::io::Error| Error::io(path, std::io::Error::new(e.kind(), format!("checkpoint directory: cannot {what}: {e}")));
        std::fs::create_dir_all(path).map_err(|e| cannot("create it", e))?;
        check_entries(path)?;
        let lock_path = path.join(LOCK);
        let mut lock = open_lock(&lock_path, cannot)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                // The holder's pid is only for the message; an unreadable one is left out.
                let _ = lock.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = (!holder.is_empty()).then(|| holder.to_string());
                return Err(Error::InUse { path: path.to_path_buf(), holder });
            }
            Err(TryLockError::Error(e)) => return Err(cannot("lock it", e)),
        }
        let pid = std::process::id().to_string();
        let written = lock.set_len(0).and_then(|()| lock.rewind()).and_then(|()| lock.write_all(pid.as_bytes()));
        written.map_err(|e| Error::io(&lock_path, e))?;
        checkpoints::remove_stale_temps(path)?;
        let dir = RunDir { path: path.to_path_buf(), _lock: lock, ours: Mutex::default(), keep: KEEP, claim };
        dir.apply(claim)?;
        Ok(dir)
    }

    /// Keeps the newest `n` checkpoints of this run (at least 1; [`KEEP`] by default).
    pub fn keep(mut self, n: usize) -> Result<RunDir> {
        if n == 0 {
            return Err(Error::invalid("RunDir::keep", "a run must keep at least its newest checkpoint"));
        }
        self.keep = n;
        Ok(self)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// How many of this run's newest checkpoints it keeps.
    pub fn kept(&self) -> usize {
        self.keep
    }
    /// What the run claimed of the directory when it opened it.
    pub fn claim(&self) -> Claim {
        self.claim
    }

    fn apply(&self, claim: Claim) -> Result<()> {
        let existing = checkpoints::list(&self.path)?;
        match claim {
            Claim::Resume => Ok(()),
            Claim::Fresh if existing.is_empty() => Ok(()),
            Claim::Fresh => {
                let files = crate::error::capped_list(existing.iter().rev().map(|(_, p)| file_name(p)));
                Err(Error::CheckpointsPresent { dir: self.path.clone(), count: existing.len(), files })
            }
            Claim::Overwrite => Ok(()),
        }
    }

    /// For [`Claim::Overwrite`] (`--overwrite-checkpoints`): deletes the checkpoint files already in the directory.
    /// Called once every input has been checked, so a run that fails to start loses nothing.
    pub fn discard_earlier(&self) -> Result<()> {
        for (_, p) in checkpoints::list(&self.path)? {
            std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        }
        Ok(())
    }

    /// Writes a checkpoint of `tensors` at `state.step`, then deletes this run's valid
    /// checkpoints beyond the newest [`keep`](RunDir::keep). A file whose header names another run at the
    /// same step (possible after resuming in a directory that holds two runs) is not replaced.
    pub fn save(&self, tensors: &[(String, HostTensor)], state: &RunState) -> Result<PathBuf> {
        let target = self.path.join(checkpoints::file_name(state.step));
        if let Some(other) = checkpoints::claimed_run(&target).filter(|r| *r != state.run) {
            return Err(Error::Msg(format!(
                "{}: holds a checkpoint of another run ({other}, this run is {}); not replacing it",
                target.display(),
                state.run
            )));
        }
        let path = checkpoints::write(&self.path, tensors, state)?;
        self.ours.lock().unwrap_or_else(|e| e.into_inner()).insert(path.clone());
        self.prune(&state.run)?;
        Ok(path)
    }

    /// Only files that read back whole and carry this run's id count toward the kept ones; a
    /// damaged file cannot be shown to be ours, so it is neither counted nor deleted. A file
    /// whose header names another run, or no run, is not read further.
    fn prune(&self, run: &str) -> Result<()> {
        let mut known = self.ours.lock().unwrap_or_else(|e| e.into_inner());
        let mut ours = Vec::new();
        for (_, p) in checkpoints::list(&self.path)? {
            let whole = known.contains(&p)
                || (checkpoints::claimed_run(&p).as_deref() == Some(run) && checkpoints::verify_in_dir(&p).is_ok_and(|s| s.run == run));
            if whole {
                known.insert(p.clone());
                ours.push(p);
            }
        }
        for p in ours.iter().take(ours.len().saturating_sub(self.keep)) {
            std::fs::remove_file(p).map_err(|e| Error::io(p, e))?;
            known.remove(p);
        }
        Ok(())
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// A new run's id: random, so two runs never share one, whatever their flags.
pub fn new_run_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::write_safetensors;
    use crate::data::LoaderState;
    use std::collections::BTreeMap;

    fn state(run: &str, step: u64) -> RunState {
        let loader = LoaderState { epoch: 0, position: 0 };
        RunState { run: run.to_string(), step, optim_steps: step, loader, shuffle_seed: 0, config: serde_json::json!({}) }
    }

    fn weights(n: usize) -> Vec<(String, HostTensor)> {
        vec![("model.w".to_string(), HostTensor::f32(vec![n], vec![0.5; n]).unwrap())]
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tandem-run-dir-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[cfg(unix)]
    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
    }

    /// Every kind of file that is not a regular file, at each name the run writes, reads or
    /// deletes (a checkpoint, a checkpoint's temp file, the lock), makes `open` fail naming it,
    /// and nothing outside the directory is written or created.
    #[cfg(unix)]
    #[test]
    fn open_refuses_what_is_not_a_regular_file_at_the_runs_names() {
        let names = [checkpoints::file_name(2), ".ckpt-00000001.safetensors.tmp-1-0".to_string(), LOCK.to_string()];
        let kinds = ["link to a file outside", "dangling link", "FIFO", "directory"];
        for (i, name) in names.iter().enumerate() {
            for (j, kind) in kinds.iter().enumerate() {
                let dir = scratch(&format!("refuse-{i}-{j}"));
                let outside = scratch(&format!("outside-{i}-{j}"));
                std::fs::write(outside.join("file"), b"precious").unwrap();
                let at = dir.join(name);
                match *kind {
                    "link to a file outside" => std::os::unix::fs::symlink(outside.join("file"), &at).unwrap(),
                    "dangling link" => std::os::unix::fs::symlink(outside.join("new"), &at).unwrap(),
                    "FIFO" => mkfifo(&at),
                    _ => std::fs::create_dir(&at).unwrap(),
                }
                for claim in [Claim::Fresh, Claim::Resume, Claim::Overwrite] {
                    let e = RunDir::open(&dir, claim).expect_err(&format!("{kind} at {name} was accepted")).to_string();
                    assert!(e.contains(&at.display().to_string()) && e.contains("not a regular file"), "{kind} at {name}: {e}");
                }
                assert_eq!(std::fs::read(outside.join("file")).unwrap(), b"precious", "{kind} at {name}: the outside file changed");
                assert!(!outside.join("new").exists(), "{kind} at {name}: a file was created through the link");
                let left = std::fs::symlink_metadata(&at).unwrap().file_type();
                assert!(!left.is_file(), "{kind} at {name} was replaced");
                if name == LOCK && *kind == "FIFO" {
                    let e = RunDir::open(&dir, Claim::Fresh).unwrap_err().to_string();
                    assert!(e.contains("is a FIFO, not a regular file; the lock must be a regular file"), "{e}");
                }
                std::fs::remove_dir_all(&dir).unwrap();
                std::fs::remove_dir_all(&outside).unwrap();
            }
        }
    }

    /// A link planted at a checkpoint's name after the directory was opened is neither followed
    /// nor replaced by a save (the save fails naming it), and retention never deletes one.
    #[cfg(unix)]
    #[test]
    fn saves_refuse_a_link_planted_after_open_and_retention_keeps_links() {
        let dir = scratch("planted");
        let outside = scratch("planted-outside");
        std::fs::write(outside.join("file"), b"precious").unwrap();
        let run = RunDir::open(&dir, Claim::Fresh).unwrap().keep(1).unwrap();
        run.save(&weights(4), &state("ours", 1)).unwrap();
        let planted = dir.join(checkpoints::file_name(2));
        std::os::unix::fs::symlink(outside.join("file"), &planted).unwrap();
        let e = run.save(&weights(4), &state("ours", 2)).unwrap_err().to_string();
        assert!(e.contains(&planted.display().to_string()) && e.contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read(outside.join("file")).unwrap(), b"precious", "the save wrote through the link");
        assert!(std::fs::symlink_metadata(&planted).unwrap().file_type().is_symlink(), "the link was replaced");
        // Retention past it: the link named like an older checkpoint stays, and so does its target.
        let old = dir.join(checkpoints::file_name(0));
        std::os::unix::fs::symlink(outside.join("file"), &old).unwrap();
        run.save(&weights(4), &state("ours", 3)).unwrap();
        assert!(std::fs::symlink_metadata(&old).unwrap().file_type().is_symlink(), "retention deleted a link");
        assert!(!dir.join(checkpoints::file_name(1)).exists(), "retention kept an old checkpoint of the run");
        assert_eq!(std::fs::read(outside.join("file")).unwrap(), b"precious");
        // No temp file is left behind by the refused save.
        let temps =
            std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_str().is_some_and(checkpoints::is_temp_name)).count();
        assert_eq!(temps, 0, "a refused save left its temp file");
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    /// Files read whole and hashed by `f`.
    fn verified(f: impl FnOnce()) -> usize {
        let before = checkpoints::VERIFIED.with(|n| n.get());
        f();
        checkpoints::VERIFIED.with(|n| n.get()) - before
    }

    /// A save reads only the headers of the files that are not this run's, and reads each of
    /// this run's files whole at most once per process, however many saves follow.
    #[test]
    fn saves_do_not_reread_other_files() {
        let dir = std::env::temp_dir().join(format!("tandem-run-dir-{}-index", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Another run's checkpoints and a foreign file, all named like checkpoints.
        for step in [1, 3, 5] {
            checkpoints::write(&dir, &weights(1000), &state("other", step)).unwrap();
        }
        write_safetensors(dir.join(checkpoints::file_name(7)), &weights(1000), &BTreeMap::new()).unwrap();

        let first = RunDir::open(&dir, Claim::Resume).unwrap();
        let n = verified(|| {
            for s in 10..16 {
                first.save(&weights(4), &state("ours", s)).unwrap();
            }
        });
        assert_eq!(n, 0, "saves read other runs' files whole");
        drop(first);

        // A resumed run reads its own earlier files once, then never again.
        let second = RunDir::open(&dir, Claim::Resume).unwrap();
        let n = verified(|| {
            second.save(&weights(4), &state("ours", 16)).unwrap();
        });
        assert_eq!(n, KEEP, "the first save after resuming checks this run's kept files once");
        let n = verified(|| {
            for s in 17..20 {
                second.save(&weights(4), &state("ours", s)).unwrap();
            }
        });
        assert_eq!(n, 0, "later saves read this run's files again");

        let mut left: Vec<u64> = checkpoints::list(&dir).unwrap().into_iter().map(|(s, _)| s).collect();
        left.sort();
        assert_eq!(left, [1, 3, 5, 7, 17, 18, 19], "retention kept the wrong files");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
