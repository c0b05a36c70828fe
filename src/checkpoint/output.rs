//! Writing an output path without ever replacing what is not a regular file: a regular file
//! or a new path is replaced atomically (temp file, fsync, rename, fsync of the directory); a
//! symbolic link is followed and the file it names is written that way, so the link stays; a
//! character device (`/dev/null`) or a FIFO is written in place; a directory, a block device
//! or a socket is refused with an error naming the path.
use crate::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Links followed before a path counts as a loop (Linux's own limit, `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// What an output path resolves to, and so how [`write_atomic`] writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputTarget {
    /// A regular file, or nothing yet: replaced atomically by a rename in its directory.
    File(PathBuf),
    /// A character device such as `/dev/null`: opened and written in place.
    Device(PathBuf),
    /// A FIFO: written in place, and only while a reader has it open.
    Fifo(PathBuf),
}

impl OutputTarget {
    /// The path written: the given one with every symbolic link on it followed.
    pub fn path(&self) -> &Path {
        match self {
            OutputTarget::File(p) | OutputTarget::Device(p) | OutputTarget::Fifo(p) => p,
        }
    }
}

/// Where an output `path` leads, following symbolic links (a relative link is read from its
/// own directory; a link to nothing leads to a new file there). A directory, a block device,
/// a socket, or a chain of more than 40 links is an error naming `path`.
///
/// ```
/// use tandem::checkpoint::{output_target, OutputTarget};
/// let dir = std::env::temp_dir().join(format!("tandem-doc-target-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// assert_eq!(output_target(&dir.join("new.svg"))?, OutputTarget::File(dir.join("new.svg")));
/// assert!(output_target(&dir).is_err());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn output_target(path: &Path) -> Result<OutputTarget> {
    let refuse = |at: &Path, what: &str| {
        let via = if at == path { String::new() } else { format!(" (the link leads to {})", at.display()) };
        Error::io(path, std::io::Error::new(ErrorKind::InvalidInput, format!("is {what}{via}; give a file path")))
    };
    let mut at = path.to_path_buf();
    for _ in 0..=MAX_LINKS {
        let meta = match fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(OutputTarget::File(at)),
            Err(e) => return Err(Error::io(path, e)),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            let link = fs::read_link(&at).map_err(|e| Error::io(&at, e))?;
            at = match at.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        if kind.is_file() {
            return Ok(OutputTarget::File(at));
        }
        if kind.is_dir() {
            return Err(refuse(&at, "a directory"));
        }
        return special(&at, &kind).ok_or_else(|| refuse(&at, kind_name(&kind)));
    }
    Err(Error::io(path, std::io::Error::new(ErrorKind::InvalidInput, format!("more than {MAX_LINKS} symbolic links deep (a loop?)"))))
}

#[cfg(unix)]
fn special(at: &Path, kind: &fs::FileType) -> Option<OutputTarget> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_char_device() {
        Some(OutputTarget::Device(at.to_path_buf()))
    } else if kind.is_fifo() {
        Some(OutputTarget::Fifo(at.to_path_buf()))
    } else {
        None
    }
}

#[cfg(not(unix))]
fn special(_at: &Path, _kind: &fs::FileType) -> Option<OutputTarget> {
    None
}

#[cfg(unix)]
fn kind_name(kind: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_block_device() {
        // A raw disk is never what a weights or plot path means; writing it would destroy it.
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "neither a file nor a device"
    }
}

#[cfg(not(unix))]
fn kind_name(_kind: &fs::FileType) -> &'static str {
    "neither a file nor a directory"
}

/// Distinguishes temp files of concurrent writers within one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to the output `path`, never replacing anything but a regular file:
///
/// - a regular file or a new path: written so that a crash leaves either the old file or the
///   new one, never a torn mix: a temp file in the same directory (rename is only atomic within
///   one filesystem), fsynced, renamed over the file, then the directory fsynced so the rename
///   itself is durable. On failure the temp file is removed and the file is untouched;
/// - a symbolic link: followed (see [`output_target`]), and the file it leads to written as
///   above in that file's own directory, so the link survives and keeps naming the new
///   contents, as a shell's `>` would;
/// - a character device (`--save /dev/null` to discard an output): opened without creating or
///   truncating anything and written in place;
/// - a FIFO: written in place when a reader has it open; with no reader it is an error at once
///   rather than a wait that may never end;
/// - a directory, a block device or a socket: an error naming the path, before anything is
///   written.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("tandem-doc-atomic-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// tandem::checkpoint::write_atomic(dir.join("state.json"), b"{}")?;
/// assert_eq!(std::fs::read(dir.join("state.json")).unwrap(), b"{}");
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), tandem::Error>(())
/// ```
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    let path = path.as_ref();
    match output_target(path)? {
        OutputTarget::File(file) => replace(path, &file, bytes),
        OutputTarget::Device(node) | OutputTarget::Fifo(node) => in_place(path, &node, bytes),
    }
}

/// The temp-file-and-rename write of `file`, which `path` (named in errors) leads to.
fn replace(path: &Path, file: &Path, bytes: &[u8]) -> Result<()> {
    let name = file.file_name().ok_or_else(|| Error::invalid("write_atomic", format!("{} has no file name", path.display())))?;
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp-{}-{n}", std::process::id()));
    let temp = dir.join(temp_name);

    let written = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&temp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        // Best effort: the temp file may not even exist; the write error is what matters.
        let _ = fs::remove_file(&temp);
        return Err(Error::io(path, e));
    }
    if let Err(e) = fs::rename(&temp, file) {
        let _ = fs::remove_file(&temp);
        return Err(Error::io(path, e));
    }
    sync_dir(&dir)
}

/// Writes `bytes` into the device or FIFO `node` as it is: nothing created, truncated or
/// renamed. The open does not wait (a FIFO without a reader fails with ENXIO instead of
/// blocking forever); the writes then block as usual.
#[cfg(unix)]
fn in_place(path: &Path, node: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let opened = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(node);
    let mut f = match opened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            let what = "is a FIFO that no process is reading; start its reader first (tandem does not wait for one)";
            return Err(Error::io(path, std::io::Error::new(ErrorKind::NotConnected, what)));
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    // SAFETY: fcntl on a descriptor this function owns, with flags it read from it.
    let blocking = unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) >= 0
    };
    if !blocking {
        return Err(Error::io(path, std::io::Error::last_os_error()));
    }
    // No fsync: a device or a pipe has nothing to make durable (and /dev/null refuses it).
    f.write_all(bytes).and_then(|()| f.flush()).map_err(|e| Error::io(path, e))
}

#[cfg(not(unix))]
fn in_place(path: &Path, node: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new().write(true).open(node).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))
}

// Windows cannot open a directory as a File to fsync it; its rename is already journaled.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<()> {
    Ok(())
}
