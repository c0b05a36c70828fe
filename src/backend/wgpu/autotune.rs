//! Self-tuning matmul kernels: at the first product of a shape class on an adapter, every
//! candidate kernel is timed on the product's own operands and the fastest runs that class
//! from then on, in this process and (through an on-disk cache) in later ones.
//!
//! The hardware path's tile shapes (`Tiled`: 64×64 or 128×128 tiles chosen by a wave-count
//! estimate, see `tiled::wide_tiles`) were never checked on a real GPU; tuning replaces the
//! estimate by a measurement where it runs. The candidates:
//!
//! - hardware profile: `Tiled64`, `Tiled128` and, for a single product whose output has few
//!   tiles for its K (`tiled::split_k_slices`), `SplitK`;
//! - software profile: the same plus `Registers`, the family chosen untuned.
//!
//! A shape class is the family, the profile, M, N, K and the batch each rounded up to a power
//! of two, the transposes and whether a bias is fused (`Tuning::class` spells one out). Each
//! candidate runs once untimed (pipeline compilation), then up to five times, timed on the
//! device clock (timestamp queries) where the adapter has one and on the host clock around a
//! wait otherwise; its best run counts. A candidate whose untimed run already took ten times
//! the best candidate's time so far (and over a quarter of a second) counts at that run's host
//! time instead of being run again. A candidate that declines the product (the register family
//! declines most fused biases) or fails is left out.
//!
//! `Options::autotune` (from `TANDEM_AUTOTUNE` in `Options::from_env`) says when to tune:
//! `off` never (nor reads the cache); `on` for classes the cache lacks; `force` every class again
//! at its first use on this device, rewriting the cache; unset (`Autotune::Auto`), `on` on
//! hardware GPUs and `off` on software rasterizers, whose register kernels were chosen by
//! measurement on lavapipe and where tuning costs seconds of shader compilation per class. A
//! device forced to one family (`Options::matmul`) does not tune. `Backend::pin_kernels`
//! (deterministic data parallelism) turns tuning off for the rest of the device's life, so
//! results never depend on a timing; every candidate agrees with the CPU reference within the
//! matmul tolerance (tests/autotune.rs), but not bit for bit with the others.
//!
//! The cache is one JSON file per adapter and driver (see `cache_file`) in `Options::cache_dir`,
//! else `cache_dir()`, keyed by class and valid only for the tandem version that wrote it.
mod cache;

pub use cache::{cache_dir, cache_file, CACHE_DIR_ENV};

use super::context::Ctx;
use super::timestamps::Timestamps;
use super::{tiled, MatmulKernel};
use crate::backend::{MatmulSpec, Tuning};
use crate::{DeviceInfo, DeviceKind, Error, Result};
use cache::{Cache, Choice};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// When a wgpu device tunes its matmul kernels (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Autotune {
    /// `On` on hardware GPUs, `Off` on software rasterizers.
    #[default]
    Auto,
    /// Never tunes and never reads the cache: the untuned kernels.
    Off,
    /// Uses the cached choices and tunes the classes the cache lacks.
    On,
    /// Tunes every class again at its first use on this device, rewriting the cache.
    Force,
}

/// The environment variable `Options::from_env` reads `Options::autotune` from: `off`, `on`,
/// `force`, or `auto` (the same as unset).
pub const AUTOTUNE_ENV: &str = "TANDEM_AUTOTUNE";

impl Autotune {
    /// `AUTOTUNE_ENV`'s value; another value is an error naming it.
    pub fn from_env() -> Result<Autotune> {
        match std::env::var(AUTOTUNE_ENV).as_deref() {
            Err(_) | Ok("" | "auto") => Ok(Autotune::Auto),
            Ok("off") => Ok(Autotune::Off),
            Ok("on") => Ok(Autotune::On),
            Ok("force") => Ok(Autotune::Force),
            Ok(other) => Err(Error::invalid("open", format!("{AUTOTUNE_ENV}={other:?}: expected off, on, force or auto"))),
        }
    }
}

/// Timed runs per candidate at most; fewer once `CANDIDATE_S` has passed.
const REPS: usize = 5;
/// Seconds of timed runs per candidate after which no further run starts.
const CANDIDATE_S: f64 = 0.3;
/// A candidate whose first run is this many times slower than the best so far, and slower than
/// `SLOW_S` seconds, is not timed further (on lavapipe a 2048 product takes 30 s on the 64×64
/// tiles and 0.4 s on the register kernels).
const SLOWER: f64 = 10.0;
const SLOW_S: f64 = 0.25;
/// Marks autotuning's own clock holds: two per timed run, read after each candidate.
const MARKS: u32 = 2 * REPS as u32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One device's tuner: its mode, the adapter's shared choices, and the classes it has run.
pub(crate) struct Tuner {
    /// `None` when this device never tunes (`Off`, or a forced family).
    cache: Option<Arc<Cache>>,
    force: bool,
    pinned: AtomicBool,
    hardware: bool,
    /// The classes this device has run a choice for, with the kernel; `Backend::tuning`.
    used: Mutex<BTreeMap<String, (MatmulKernel, Tuning)>>,
    /// A timestamp query set of its own, so that tuning never renumbers `Backend::mark`'s.
    clock: Option<Timestamps>,
}

impl Tuner {
    /// The tuner of a device just opened on the adapter of `info` (the caller holds its gate,
    /// under which the query set is created).
    pub(crate) fn new(mode: Autotune, info: &DeviceInfo, hardware: bool, dir: Option<&Path>, clock: impl FnOnce(u32) -> Option<Timestamps>) -> Tuner {
        let on = match mode {
            Autotune::Auto => !matches!(info.kind, DeviceKind::Software | DeviceKind::Cpu),
            Autotune::Off => false,
            Autotune::On | Autotune::Force => true,
        };
        let dir = dir.map(Path::to_path_buf).or_else(cache_dir);
        Tuner {
            cache: on.then(|| Cache::shared(dir.as_deref(), info)),
            force: mode == Autotune::Force,
            pinned: AtomicBool::new(false),
            hardware,
            used: Mutex::default(),
            clock: if on { clock(MARKS) } else { None },
        }
    }

    /// Whether this device chooses kernels by measurement (until pinned).
    pub(crate) fn tunes(&self) -> bool {
        self.cache.is_some()
    }

    /// See `Backend::pin_kernels`.
    pub(crate) fn pin(&self) {
        self.pinned.store(true, Ordering::Relaxed);
    }

    /// See `Backend::tuning`.
    pub(crate) fn tuning(&self) -> Vec<Tuning> {
        lock(&self.used).values().map(|(_, t)| t.clone()).collect()
    }

    /// The kernel for product `s` (with a fused bias when `bias`): `default` unless this device
    /// tunes, else the class's cached choice, else the fastest candidate, timed with `run`
    /// (which records the product with a kernel on `ctx`; `Ok(false)` when it declines).
    pub(crate) fn choose(
        &self,
        ctx: &Ctx,
        s: &MatmulSpec,
        bias: bool,
        default: MatmulKernel,
        run: &dyn Fn(MatmulKernel) -> Result<bool>,
    ) -> Result<MatmulKernel> {
        let Some(cache) = &self.cache else { return Ok(default) };
        if self.pinned.load(Ordering::Relaxed) || s.batch * s.m * s.n * s.k == 0 {
            return Ok(default);
        }
        let class = class_of(s, bias, self.hardware);
        if let Some((kernel, _)) = lock(&self.used).get(&class) {
            return Ok(*kernel);
        }
        let cached = if self.force { None } else { cache.get(&class) };
        let (choice, from_cache) = match cached.and_then(|(c, from)| MatmulKernel::from_name(&c.kernel).map(|_| (c, from))) {
            Some(hit) => hit,
            None => match self.tune(ctx, s, run)? {
                Some(choice) => {
                    cache.put(&class, choice.clone());
                    (choice, false)
                }
                None => return Ok(default),
            },
        };
        let kernel = MatmulKernel::from_name(&choice.kernel).unwrap_or(default);
        let tuning = Tuning { class: class.clone(), kernel: choice.kernel, times_us: choice.times_us, clock: choice.clock, from_cache };
        Ok(lock(&self.used).entry(class).or_insert((kernel, tuning)).0)
    }

    /// Times every candidate for `s` and returns the fastest, or `None` when none ran.
    fn tune(&self, ctx: &Ctx, s: &MatmulSpec, run: &dyn Fn(MatmulKernel) -> Result<bool>) -> Result<Option<Choice>> {
        let mut candidates = if self.hardware {
            vec![MatmulKernel::Tiled64, MatmulKernel::Tiled128]
        } else {
            vec![MatmulKernel::Registers, MatmulKernel::Tiled64, MatmulKernel::Tiled128]
        };
        if tiled::split_k_slices(ctx, s).is_some() {
            candidates.push(MatmulKernel::SplitK);
        }
        let (mut times, mut device_clock) = (Vec::new(), true);
        for kernel in candidates {
            let best = times.iter().map(|(_, us)| us * 1e-6).fold(f64::INFINITY, f64::min);
            match self.time(ctx, kernel, run, best) {
                Ok(Some((secs, on_device))) => {
                    // Whole nanoseconds: 7 or so digits, which JSON carries back exactly.
                    times.push((kernel.name().to_string(), (secs * 1e9).round() / 1e3));
                    device_clock &= on_device;
                }
                Ok(None) => {}
                // The candidate is left out; a fault of the device itself shows in the next op.
                Err(e) => tracing::debug!("autotune on {}: {} failed: {e}", ctx.name, kernel.name()),
            }
        }
        let Some((kernel, _)) = times.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else { return Ok(None) };
        let clock = if device_clock { "device" } else { "wall" };
        tracing::debug!("autotune on {}: {kernel} for {s:?} ({times:?} us, {clock} clock)", ctx.name);
        Ok(Some(Choice { kernel: kernel.clone(), times_us: times, clock: clock.into() }))
    }

    /// `kernel`'s best time on `s` in seconds and whether the device clock measured it, after
    /// one untimed run; `None` when it declines the product. A first run slower than `SLOWER`
    /// times `best` (the best candidate's so far) and than `SLOW_S` is not repeated: it has lost
    /// anyway. That first run is judged by the device clock where there is one, since its host
    /// time includes building the kernel's pipelines (0.3 s on an H200's Vulkan driver, where
    /// the product itself takes 40 µs).
    fn time(&self, ctx: &Ctx, kernel: MatmulKernel, run: &dyn Fn(MatmulKernel) -> Result<bool>, best: f64) -> Result<Option<(f64, bool)>> {
        let Some((first, on_device)) = self.run_once(ctx, kernel, run)? else { return Ok(None) };
        if first > SLOW_S && first > SLOWER * best {
            return Ok(Some((first, on_device)));
        }
        let start = Instant::now();
        let (mut best, mut all_on_device) = (f64::INFINITY, true);
        for _ in 0..REPS {
            let Some((secs, on_device)) = self.run_once(ctx, kernel, run)? else { return Ok(None) };
            all_on_device &= on_device;
            best = best.min(secs);
            if start.elapsed().as_secs_f64() > CANDIDATE_S {
                break;
            }
        }
        Ok(Some((best, all_on_device)))
    }

    /// One run of `kernel`, timed on the device clock between two marks, or on the host when
    /// the device has no clock, ran out of marks or returned a clock that did not advance;
    /// `None` when the kernel declines the product.
    fn run_once(&self, ctx: &Ctx, kernel: MatmulKernel, run: &dyn Fn(MatmulKernel) -> Result<bool>) -> Result<Option<(f64, bool)>> {
        let wall = Instant::now();
        let marks = self.clock.as_ref().map(|c| c.mark(ctx));
        if !run(kernel)? {
            return Ok(None);
        }
        let end = self.clock.as_ref().map(|c| c.mark(ctx));
        let device = match (marks, end, &self.clock) {
            (Some(Some(_)), Some(Some(_)), Some(c)) => c.read(ctx)?,
            (_, _, Some(c)) => {
                // Out of marks: start numbering again and time this run on the host.
                c.read(ctx)?;
                Vec::new()
            }
            _ => Vec::new(),
        };
        ctx.wait()?;
        // A device clock that did not advance (some drivers return zeros) does not count.
        Ok(Some(match device.as_slice() {
            [t0, t1] if t1 > t0 => (t1 - t0, true),
            _ => (wall.elapsed().as_secs_f64(), false),
        }))
    }
}

/// The shape class of `s` (see `Tuning::class`).
fn class_of(s: &MatmulSpec, bias: bool, hardware: bool) -> String {
    let up = |x: usize| x.max(1).next_power_of_two();
    let t = |x: bool| if x { 'T' } else { 'N' };
    format!(
        "matmul {} m{} n{} k{} b{} {}{}{}",
        if hardware { "hardware" } else { "software" },
        up(s.m),
        up(s.n),
        up(s.k),
        up(s.batch),
        t(s.trans_a),
        t(s.trans_b),
        if bias { " bias" } else { "" }
    )
}
