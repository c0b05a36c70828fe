//! Calibrations kept on disk: the measured [`Workload`] and [`Cluster`] of a model on a set of
//! devices, keyed by everything that decides them, and reused instead of measured again.
//!
//! The key names tandem's version and build (debug or release), the model (as `Module::describe` names it), the probe's
//! shape, the batch, the optimizer's state count, the host's threads, the autocast type and,
//! for each device, its spec, backend, kind, name, driver, matmul path and libraries. The file, one per key under
//! `$TANDEM_CACHE_DIR/plan` (else the user's cache directory), holds that key, the time of the
//! measurement and its results. One that is not a regular file, not of this layout, for another
//! key, older than [`MAX_AGE_S`], stamped in the future, or damaged (a figure out of the
//! planner's bounds: no layers, a speed of 0, a time that is not finite or over an hour, a
//! size over a pebibyte) is measured over ([`Calibration::Measured`] says why), and
//! a path held by anything but a regular file is never replaced; files are written atomically.
//! The devices' memory is never taken from the file: it is read from their budgets and
//! reports each time, as after a measurement.
use super::{Cluster, Workload};
use crate::backend::cache::{cache_dir, read_regular, write_atomic};
use crate::{Device, Error, Result, Tensor};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable choosing [`Reuse`] where the caller does not (`tandem plan` and
/// `train --strategy auto` without `--recalibrate`): `cached` (the default), `fresh` or `off`.
pub const REUSE_ENV: &str = "TANDEM_CALIBRATION";

/// A calibration older than a week is measured again: drivers, clocks and what else runs on a
/// machine change.
pub const MAX_AGE_S: u64 = 7 * 24 * 3600;

/// A calibration stamped later than this past the clock was not measured on it: the file
/// (or the clock) is wrong, and its age unknowable.
const FUTURE_SLACK_S: u64 = 300;

/// A calibration file larger than this is not one (a few hundred bytes per layer).
const MAX_BYTES: u64 = 16 << 20;

/// Whether a calibration may come from, and goes to, the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// Reuse a valid cached calibration; measure and save otherwise.
    Cached,
    /// Measure, and save the result for later runs (`--recalibrate`).
    Fresh,
    /// Measure, and leave the disk alone.
    Off,
}

impl Reuse {
    /// [`REUSE_ENV`]'s choice; [`Reuse::Cached`] where it is not set.
    pub fn from_env() -> Result<Reuse> {
        match std::env::var(REUSE_ENV).as_deref() {
            Err(_) | Ok("cached") => Ok(Reuse::Cached),
            Ok("fresh") => Ok(Reuse::Fresh),
            Ok("off") => Ok(Reuse::Off),
            Ok(other) => Err(Error::invalid(REUSE_ENV, format!("{other:?} is not cached, fresh or off"))),
        }
    }
}

/// Where a calibration came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Calibration {
    /// Measured in this run, in `seconds`; kept in the file, where it was; `note` says why a
    /// file there was not reused, or why none was written.
    Measured { seconds: f64, saved: Option<PathBuf>, note: Option<String> },
    /// Read from the file, measured `age_s` seconds before.
    Reused { path: PathBuf, age_s: u64 },
}

impl fmt::Display for Calibration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Calibration::Measured { seconds, saved, note } => {
                write!(f, "calibration measured in {seconds:.1} s")?;
                if let Some(p) = saved {
                    write!(f, ", kept in {}", p.display())?;
                }
                match note {
                    Some(n) => write!(f, " ({n})"),
                    None => Ok(()),
                }
            }
            Calibration::Reused { path, age_s } => {
                write!(f, "calibration reused from {} (measured {} ago; --recalibrate measures again)", path.display(), age(*age_s))
            }
        }
    }
}

impl Calibration {
    /// This calibration with `note` added to its notes (a measured one's; a reused one has
    /// none and is returned as it is).
    pub fn noted(self, note: String) -> Calibration {
        match self {
            Calibration::Measured { seconds, saved, note: before } => {
                let note = Some(before.map_or(note.clone(), |b| format!("{b}; {note}")));
                Calibration::Measured { seconds, saved, note }
            }
            reused => reused,
        }
    }
}

fn age(s: u64) -> String {
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        7200..172800 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86400),
    }
}

/// What one file holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct CalibrationFile {
    key: String,
    measured_unix: u64,
    workload: Workload,
    cluster: Cluster,
    /// Each device's seconds on the speed probe (the whole model at its share of the batch)
    /// when measured.
    probe_s: Vec<f64>,
}

/// A kept calibration is measured over where a device now runs the speed probe more than
/// this many times faster than when it was measured: it was measured under load (or another
/// clock or driver), and its layer times are too slow for the machine now. A device slower
/// now is not measured again: a calibration made under this moment's load would be the one
/// too slow.
pub const SPEED_DRIFT: f64 = 1.5;

/// The environment variable that replaces [`SPEED_DRIFT`] (a factor of at least 1): a shared
/// machine whose load swings more than 1.5x, such as a CI runner, sets a larger one.
pub const SPEED_DRIFT_ENV: &str = "TANDEM_CALIBRATION_DRIFT";

/// [`SPEED_DRIFT_ENV`]'s factor, else [`SPEED_DRIFT`].
fn speed_drift() -> f64 {
    let given = std::env::var(SPEED_DRIFT_ENV).ok().and_then(|v| v.trim().parse::<f64>().ok());
    given.filter(|f| f.is_finite() && *f >= 1.0).unwrap_or(SPEED_DRIFT)
}

/// Why `file`'s speeds no longer hold, given each device's seconds on the probe `now`.
fn moved(file: &CalibrationFile, now: &[f64]) -> Option<String> {
    let drift = speed_drift();
    let apart = |(then, now): (&f64, &f64)| now * drift < *then;
    let i = file.probe_s.iter().zip(now).position(apart)?;
    let name = file.cluster.devices.get(i).map_or("?", |d| d.name.as_str());
    let (then, now) = (file.probe_s[i] * 1e3, now[i] * 1e3);
    Some(format!("device {i} ({name}) runs the speed probe in {now:.2} ms, {then:.2} ms when calibrated: its speed moved more than {drift}x (the calibration was made under load)"))
}

/// Everything that decides a calibration of `model` (its description) at `probe` on `devices`,
/// one fact a line.
pub(super) fn key(model: &str, probe: &Tensor, devices: &[Device], batch: usize, optimizer_states: usize) -> String {
    let threads = std::thread::available_parallelism().map_or(0, usize::from);
    let mut lines = vec![
        // The second line changes when what a calibration measures does (2: each layer's
        // largest parameter; 3: each pair's link; 4: each device's speed-probe time), so that
        // an older file is measured over, not read with a gap.
        format!("tandem {}", env!("CARGO_PKG_VERSION")),
        "calibration 4".to_string(),
        // A debug build's layers run several times slower than a release build's: neither
        // may plan from the other's times.
        format!("build {}", if cfg!(debug_assertions) { "debug" } else { "release" }),
        format!("model {model}"),
        format!("probe {:?} {:?}", probe.dims(), probe.dtype()),
        format!("batch {batch}, {optimizer_states} optimizer states, {threads} host threads, autocast {:?}", crate::tensor::autocast_dtype()),
    ];
    for d in devices {
        let i = d.info();
        lines.push(format!("device {} | {:?} {:?} | {} | {} | {} | {}", d.spec(), i.backend, i.kind, i.name, i.driver, i.matmul, i.libraries));
    }
    lines.join("\n")
}

/// The calibration of `key` from its file where `reuse` allows and one is valid, else
/// `measure()`'s, saved where `reuse` allows (a file that cannot be written is a warning).
/// `measure` also returns each device's seconds on the speed probe, and `probe` times them
/// again: a file whose devices now run the probe more than [`SPEED_DRIFT`] times faster than
/// when it was measured is measured over.
pub(super) fn calibrated(
    key: &str,
    reuse: Reuse,
    measure: impl FnOnce() -> Result<(Workload, Cluster, Vec<f64>)>,
    probe: impl FnOnce() -> Result<Vec<f64>>,
) -> Result<(Workload, Cluster, Calibration)> {
    let path = (reuse != Reuse::Off).then(|| cache_dir("plan")).flatten().map(|dir| {
        let hex: String = Sha256::digest(key.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
        dir.join(format!("{hex}.json"))
    });
    let mut notes = Vec::new();
    if let (Some(p), Reuse::Cached) = (&path, reuse) {
        match read(p, key) {
            Ok(Some((file, age_s))) => match moved(&file, &probe()?) {
                None => return Ok((file.workload, file.cluster, Calibration::Reused { path: p.clone(), age_s })),
                Some(why) => notes.push(format!("{} not reused: {why}", p.display())),
            },
            Ok(None) => {}
            Err(why) => notes.push(format!("{} not reused: {why}", p.display())),
        }
    }
    let t0 = std::time::Instant::now();
    let (work, cluster, probe_s) = measure()?;
    let seconds = t0.elapsed().as_secs_f64();
    let saved = path.filter(|p| {
        let file = CalibrationFile { key: key.to_string(), measured_unix: now(), workload: work.clone(), cluster: cluster.clone(), probe_s };
        let written = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string()).and_then(|bytes| write_atomic(p, &bytes));
        written.map_err(|e| notes.push(format!("not kept in {}: {e}", p.display()))).is_ok()
    });
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    if let Some(n) = &note {
        tracing::warn!("calibration {n}");
    }
    Ok((work, cluster, Calibration::Measured { seconds, saved, note }))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The calibration in the file at `path` and its age, if it is a valid one of `key`; `Ok(None)`
/// where there is none, the reason where there is one that is not valid.
fn read(path: &std::path::Path, key: &str) -> std::result::Result<Option<(CalibrationFile, u64)>, String> {
    let Some(bytes) = read_regular(path, MAX_BYTES)? else { return Ok(None) };
    let file: CalibrationFile = serde_json::from_slice(&bytes).map_err(|e| format!("not a calibration file ({e})"))?;
    if file.key != key {
        return Err("measured for other devices, another model or another tandem".into());
    }
    let devices = key.lines().filter(|l| l.starts_with("device ")).count();
    if file.cluster.devices.len() != devices {
        return Err(format!("{} devices in it for {devices} devices", file.cluster.devices.len()));
    }
    if let Some(why) = super::bounds::out_of_bounds(&file.workload, &file.cluster) {
        return Err(format!("damaged: {why}"));
    }
    let now = now();
    if file.measured_unix > now.saturating_add(FUTURE_SLACK_S) {
        return Err(format!("damaged: measured at unix time {}, {} from now", file.measured_unix, age(file.measured_unix - now)));
    }
    let age_s = now.saturating_sub(file.measured_unix);
    if age_s > MAX_AGE_S {
        return Err(format!("measured {} ago, more than a week", age(age_s)));
    }
    if file.probe_s.len() != devices || file.probe_s.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return Err(format!("damaged: speed probe times {:?} for {devices} devices", file.probe_s));
    }
    Ok(Some((file, age_s)))
}
