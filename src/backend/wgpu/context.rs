//! One logical wgpu device: pipelines compiled lazily, dispatches recorded into a shared command
//! encoder and submitted in batches, parameters in a uniform ring, sub-range bindings, readback.
use super::bind_groups::BindGroups;
use super::gate::{Gate, Held};
use super::shaders;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Bytes of one parameter slot in the uniform ring; every kernel's `Params` fits.
pub(crate) const SLOT: u64 = 256;
/// Dispatches recorded before a batch is submitted, so the device starts working while the host
/// records more; also the number of uniform slots.
const BATCH: usize = 256;
/// Workgroups recorded before a batch is submitted early: bounds how long one submit runs, which
/// on GL is how long the adapter's shared context stays locked against other devices.
const BATCH_GROUPS: u64 = 1 << 16;
/// Longest single wait for the device: on GL, wgpu-hal holds the adapter's shared context while
/// it waits (and gives up after about 2 s), so waits are sliced and other devices on the
/// adapter get a turn between slices.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Bytes of the uniform operand stage: the `array<vec4<f32>, 4096>` the `*_ua` kernels declare.
pub(crate) const STAGE_BYTES: u64 = 65536;

/// A storage binding: a byte range of a buffer.
#[derive(Clone, Copy)]
pub(crate) struct Bind<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

/// Limits that shape how ops are split into dispatches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Largest storage binding in bytes (possibly lowered by `Options`).
    pub max_binding: u64,
    /// Storage binding offsets must be multiples of this many bytes.
    pub align: u64,
    pub max_groups: u32,
}

/// `TANDEM_WGPU_PROFILE`'s dispatch count and seconds by kernel.
type ProfileTable = HashMap<String, (u32, f64)>;

/// Compiled pipelines with their bind-group layout, by (shader, entry point, value of `OP`).
type Pipelines = HashMap<(&'static str, &'static str, Option<u32>), (wgpu::ComputePipeline, wgpu::BindGroupLayout)>;

struct Pending {
    // `pass` records into `encoder` and is ended (dropped) before the encoder is used otherwise.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    uniforms: Vec<u8>,
    dispatches: usize,
    groups: u64,
}

pub(crate) struct Ctx {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub name: String,
    pub limits: Limits,
    /// Subgroups of exactly 8 invocations are available: the `matmul_sg` kernels may run.
    pub subgroup8: bool,
    /// Subgroup operations of any size are available and allowed: the `reduce_sg` kernels may run.
    pub subgroups: bool,
    /// The device runs the hardware GPU kernels (a hardware adapter, or the forced hardware
    /// profile): workgroup tree reductions instead of one invocation per partial.
    pub hardware: bool,
    uniform: wgpu::Buffer,
    uniform_stride: u64,
    /// A uniform copy of a small matmul operand for `*_ua` kernels (see `stage_uniform`).
    stage: wgpu::Buffer,
    bind_groups: Arc<BindGroups>,
    pending: Mutex<Pending>,
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    layouts: Mutex<HashMap<(usize, bool), (wgpu::BindGroupLayout, wgpu::PipelineLayout)>>,
    pipelines: Mutex<Pipelines>,
    errors: Arc<Mutex<Vec<String>>>,
    /// `TANDEM_WGPU_PROFILE=1`: every dispatch is submitted and waited for, and its wall time
    /// summed by kernel (`=2`: by kernel, `OP` and grid); the table goes to stderr when the
    /// device closes. For tuning only.
    profile: Option<(bool, Mutex<ProfileTable>)>,
    /// The adapter's gate (see `gate.rs`): held around every call into wgpu.
    gate: Gate,
    /// Holds the gate while the fields drop; declared last so that it is released last.
    held: Option<Held>,
}

/// Entry points that write every word of their workgroup memory before reading it: the tiled
/// matmuls and attention, the tree reductions and the transformer row kernels. Their pipelines
/// skip naga's zeroing pass, which is one invocation's loop on some drivers and took llvmpipe's
/// GL about 0.4-1.1 s to compile per pipeline.
fn writes_before_reading(entry: &str) -> bool {
    entry.starts_with("tiled_")
        || entry.starts_with("tree")
        || matches!(entry, "layer_norm" | "layer_norm_dx" | "causal_softmax" | "causal_softmax_dx")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ctx {
    /// A context for a device just opened; the caller holds `gate`.
    pub(crate) fn new(
        device: wgpu::Device,
        queue: wgpu::Queue,
        name: String,
        max_binding: Option<u64>,
        subgroup8: bool,
        bind_groups: Arc<BindGroups>,
        gate: Gate,
    ) -> Self {
        let l = device.limits();
        // u32 element offsets in kernels stay exact below 2 GiB per binding.
        let mut max = l.max_storage_buffer_binding_size.min(1 << 31);
        if let Some(m) = max_binding {
            max = max.min(m);
        }
        // At least 16 so that vec4 kernels see vec4-aligned bindings.
        let align = u64::from(l.min_storage_buffer_offset_alignment).max(16);
        // Adapters without workgroups are refused before they are opened; `max(1)` keeps
        // `grid` from dividing by zero all the same.
        let max_groups = l.max_compute_workgroups_per_dimension.max(1);
        let limits = Limits { max_binding: max.max(align * 2), align, max_groups };
        let uniform_stride = SLOT.max(u64::from(l.min_uniform_buffer_offset_alignment));
        let uniform = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tandem params"),
            size: uniform_stride * BATCH as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let stage = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tandem uniform operand"),
            size: STAGE_BYTES.min(l.max_uniform_buffer_binding_size),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        // wgpu's default handler panics; errors are reported by the next op that waits instead.
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| lock(&sink).push(e.to_string())));
        Ctx {
            device,
            queue,
            name,
            limits,
            subgroup8,
            subgroups: false,
            hardware: false,
            uniform,
            uniform_stride,
            stage,
            bind_groups,
            pending: Mutex::new(Pending { pass: None, encoder: None, uniforms: Vec::new(), dispatches: 0, groups: 0 }),
            modules: Mutex::default(),
            layouts: Mutex::default(),
            pipelines: Mutex::default(),
            errors,
            profile: match std::env::var("TANDEM_WGPU_PROFILE").as_deref() {
                Ok("1") => Some((false, Mutex::default())),
                Ok("2") => Some((true, Mutex::default())),
                _ => None,
            },
            gate,
            held: None,
        }
    }

    /// This context with the reduction kernels' choices: `subgroups` and `hardware` (see the fields).
    pub(crate) fn with_kernels(mut self, subgroups: bool, hardware: bool) -> Self {
        self.subgroups = subgroups;
        self.hardware = hardware;
        self
    }

    /// The backend error every wgpu failure becomes.
    pub(crate) fn err(&self, detail: impl Into<String>) -> Error {
        Error::Backend { backend: "wgpu", device: self.name.clone(), detail: detail.into() }
    }

    /// Errors wgpu reported asynchronously since the last check.
    fn check_errors(&self) -> Result<()> {
        let mut e = lock(&self.errors);
        if e.is_empty() {
            return Ok(());
        }
        let detail = e.join("; ");
        e.clear();
        Err(self.err(detail))
    }

    /// The layout of a kernel with `storage` buffer bindings after the parameters; with
    /// `uniform_first`, binding 1 is a uniform buffer instead (entry points with `_ua` in their name).
    fn layout(&self, storage: usize, uniform_first: bool) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
        let mut layouts = lock(&self.layouts);
        let (bgl, pl) = layouts.entry((storage, uniform_first)).or_insert_with(|| {
            // The parameters (binding 0) sit at a dynamic offset in the uniform ring.
            let buffer = |binding, ty| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: binding == 0, min_binding_size: None },
                count: None,
            };
            // Every storage binding is read-write so that an op may alias its input and output
            // (in-place updates): read-only and writable uses of one buffer may not mix.
            let mut entries = vec![buffer(0, wgpu::BufferBindingType::Uniform)];
            entries.extend((1..=storage as u32).map(|b| {
                let ty =
                    if b == 1 && uniform_first { wgpu::BufferBindingType::Uniform } else { wgpu::BufferBindingType::Storage { read_only: false } };
                buffer(b, ty)
            }));
            let bgl = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries });
            let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
            (bgl, pl)
        });
        (bgl.clone(), pl.clone())
    }

    fn pipeline(
        &self,
        shader: &'static str,
        entry: &'static str,
        op: Option<u32>,
        storage: usize,
    ) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
        if let Some(p) = lock(&self.pipelines).get(&(shader, entry, op)) {
            return Ok(p.clone());
        }
        let module = {
            let mut modules = lock(&self.modules);
            match modules.get(shader) {
                Some(m) => m.clone(),
                None => {
                    let src = shaders::source(shader).ok_or_else(|| self.err(format!("no shader named {shader}")))?;
                    let m = self
                        .device
                        .create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(shader), source: wgpu::ShaderSource::Wgsl(src.into()) });
                    modules.insert(shader, m.clone());
                    m
                }
            }
        };
        let (bgl, layout) = self.layout(storage, entry.contains("_ua"));
        let p = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &op.map(|v| [("OP", f64::from(v))]).unwrap_or_default()[..usize::from(op.is_some())],
                zero_initialize_workgroup_memory: !writes_before_reading(entry),
            },
            cache: None,
        });
        self.check_errors()?;
        lock(&self.pipelines).insert((shader, entry, op), (p.clone(), bgl.clone()));
        Ok((p, bgl))
    }

    /// Binds `count` elements from element `first` of `buf`: the range starts at the aligned
    /// position at or before `first`, and the returned offset is `first` relative to it.
    pub(crate) fn span<'a>(&self, op: &'static str, buf: &'a wgpu::Buffer, first: usize, count: usize) -> Result<(Bind<'a>, u32)> {
        let start = first as u64 * 4;
        let offset = start - start % self.limits.align;
        // 16 bytes at least: a vec4 array binding holds one element.
        let end = ((first + count) as u64 * 4).max(offset + 16).min(buf.size());
        let size = end - offset;
        if size > self.limits.max_binding {
            return Err(Error::invalid(
                op,
                format!(
                    "an operand range of {size} bytes exceeds the device's storage binding limit of {} bytes on {}",
                    self.limits.max_binding, self.name
                ),
            ));
        }
        Ok((Bind { buf, offset, size }, ((start - offset) / 4) as u32))
    }

    /// Elements one binding may span, leaving room for the alignment of its start.
    pub(crate) fn max_elems(&self) -> usize {
        ((self.limits.max_binding - self.limits.align) / 4) as usize
    }

    /// Splits `units` (rows, images, batch entries) into chunks whose every binding fits:
    /// `per_unit[i]` is how many elements binding `i` spans per unit.
    pub(crate) fn chunks(&self, op: &'static str, units: usize, per_unit: &[usize]) -> Result<Vec<(usize, usize)>> {
        let cap = self.max_elems();
        let most = per_unit.iter().filter(|&&e| e > 0).map(|&e| cap / e).min().unwrap_or(units.max(1));
        if most == 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "one unit of work spans {} bytes, more than the storage binding limit of {} bytes on {}",
                    per_unit.iter().max().copied().unwrap_or(0) * 4,
                    self.limits.max_binding,
                    self.name
                ),
            ));
        }
        Ok((0..units).step_by(most).map(|s| (s, (s + most).min(units))).collect())
    }

    /// A grid covering `invocations` with workgroups of `wg`, folded into Y past the X limit;
    /// kernels recover the linear id as `gid.y * num_workgroups.x * wg + gid.x`.
    pub(crate) fn grid(&self, invocations: usize, wg: usize) -> [u32; 3] {
        let groups = invocations.div_ceil(wg) as u64;
        let max = u64::from(self.limits.max_groups);
        if groups <= max {
            [groups as u32, 1, 1]
        } else {
            [max as u32, groups.div_ceil(max) as u32, 1]
        }
    }

    /// Records one dispatch of `shader::entry` with `params` (32-bit words) and storage `binds`.
    pub(crate) fn dispatch(&self, shader: &'static str, entry: &'static str, params: &[u32], binds: &[Bind], grid: [u32; 3]) -> Result<()> {
        self.dispatch_op(shader, entry, None, params, binds, grid)
    }

    /// `dispatch` of a pipeline whose override constant `OP` is `op`: the elementwise and
    /// reduce kernels select their operation this way, so that the compiler removes the other
    /// cases (CPU rasterizers run every arm of a switch on a value they cannot prove uniform).
    pub(crate) fn dispatch_op(
        &self,
        shader: &'static str,
        entry: &'static str,
        op: Option<u32>,
        params: &[u32],
        binds: &[Bind],
        grid: [u32; 3],
    ) -> Result<()> {
        if grid.contains(&0) {
            return Ok(());
        }
        let _held = self.gate.hold();
        debug_assert!(params.len() * 4 <= SLOT as usize);
        let (pipeline, layout) = self.pipeline(shader, entry, op, binds.len())?;
        let group = self.bind_groups.get(&self.device, &layout, &self.uniform, binds);
        let mut guard = lock(&self.pending);
        let p = &mut *guard;
        let slot = p.dispatches as u64 * self.uniform_stride;
        p.uniforms.resize((slot + SLOT) as usize, 0);
        for (i, w) in params.iter().enumerate() {
            p.uniforms[slot as usize + 4 * i..slot as usize + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        if p.pass.is_none() {
            let enc = p.encoder.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
            let pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            p.pass = Some(pass.forget_lifetime());
        }
        let Some(pass) = p.pass.as_mut() else {
            return Err(self.err("no compute pass to record into"));
        };
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[slot as u32]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        p.dispatches += 1;
        p.groups += grid.iter().map(|&g| u64::from(g)).product::<u64>();
        if p.dispatches >= BATCH || p.groups >= BATCH_GROUPS {
            self.submit(p);
        }
        if let Some((detailed, prof)) = &self.profile {
            // Everything before this dispatch has already been waited for.
            let t = std::time::Instant::now();
            self.submit(p);
            drop(guard);
            self.wait_idle()?;
            let key = match (detailed, op) {
                (false, _) => format!("{shader}::{entry}"),
                (true, None) => format!("{shader}::{entry} {grid:?}"),
                (true, Some(op)) => format!("{shader}::{entry} OP={op} {grid:?}"),
            };
            let mut prof = lock(prof);
            let e = prof.entry(key).or_default();
            *e = (e.0 + 1, e.1 + t.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// The profile table (see `profile`), slowest kernel first.
    fn profile_report(&self) -> Option<String> {
        let prof = lock(&self.profile.as_ref()?.1);
        let mut rows: Vec<_> = prof.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = rows.iter().map(|r| r.1 .1).sum();
        let mut out = format!("wgpu profile of {}: {:.1} ms in {} kernels\n", self.name, total * 1e3, rows.len());
        for (kernel, (count, secs)) in rows {
            out += &format!("  {:>9.2} ms {:>6} x  {kernel}\n", secs * 1e3, count);
        }
        Some(out)
    }

    /// f32 values the uniform stage holds: 0 where the adapter's uniform bindings are smaller
    /// than the 64 KiB array the `*_ua` kernels declare.
    pub(crate) fn stage_floats(&self) -> usize {
        if self.stage.size() < STAGE_BYTES {
            0
        } else {
            (STAGE_BYTES / 4) as usize
        }
    }

    /// Copies `len` f32 (at most `stage_floats()`) from `src` at element `first` to the uniform
    /// stage, in order with the dispatches, and returns the stage's binding. CPU rasterizers
    /// load storage buffers lane by lane but a uniform value once for all lanes, so a small
    /// operand that every lane reads at the same address is cheaper from here.
    pub(crate) fn stage_uniform(&self, src: &wgpu::Buffer, first: usize, len: usize) -> Result<Bind<'_>> {
        self.stage_at(src, first, len, 0)?;
        Ok(Bind { buf: &self.stage, offset: 0, size: STAGE_BYTES })
    }

    /// Copies `len` f32 from `src` at element `first` to element `at` of the uniform stage (a
    /// second operand beside the first, such as a bias), in order with the dispatches.
    pub(crate) fn stage_at(&self, src: &wgpu::Buffer, first: usize, len: usize, at: usize) -> Result<()> {
        if len == 0 || at + len > self.stage_floats() {
            return Err(self.err(format!("{len} values at {at} do not fit the uniform stage")));
        }
        self.encode(|e| e.copy_buffer_to_buffer(src, first as u64 * 4, &self.stage, at as u64 * 4, len as u64 * 4));
        Ok(())
    }

    /// Records a non-compute command (copy, clear) in order with the dispatches.
    pub(crate) fn encode(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let _held = self.gate.hold();
        let mut p = lock(&self.pending);
        p.pass = None;
        let enc = p.encoder.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
        f(enc);
    }

    fn submit(&self, p: &mut Pending) {
        p.pass = None;
        if let Some(enc) = p.encoder.take() {
            if !p.uniforms.is_empty() {
                self.queue.write_buffer(&self.uniform, 0, &p.uniforms);
            }
            self.queue.submit([enc.finish()]);
        }
        p.uniforms.clear();
        p.dispatches = 0;
        p.groups = 0;
    }

    /// Submits everything recorded so far.
    pub(crate) fn flush(&self) {
        let _held = self.gate.hold();
        let mut p = lock(&self.pending);
        self.submit(&mut p);
    }

    /// Writes `bytes` at byte `offset` of `buf`, after every op recorded so far (which may still
    /// read a recycled buffer's previous contents).
    pub(crate) fn write(&self, buf: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        let _held = self.gate.hold();
        self.flush();
        if !bytes.is_empty() {
            self.queue.write_buffer(buf, offset, bytes);
        }
    }

    /// Waits for all submitted work and reports errors wgpu raised meanwhile.
    pub(crate) fn wait(&self) -> Result<()> {
        self.flush();
        self.wait_idle()?;
        self.check_errors()
    }

    /// Waits for all submitted work in slices of `WAIT_SLICE`, holding the gate for one slice at
    /// a time: one unbounded wait on GL would hold the adapter's context for its whole length,
    /// and wgpu-hal's GL wait ends after about 2 s with a timeout error rather than the work.
    /// It waits for an (empty) submission of its own, so work other threads submit meanwhile
    /// does not lengthen the wait.
    fn wait_idle(&self) -> Result<()> {
        let target = {
            let _held = self.gate.hold();
            let _pending = lock(&self.pending);
            self.queue.submit([])
        };
        loop {
            let _held = self.gate.hold();
            // No submission (which also polls) while this one waits: wgpu-core 30 asserts that
            // the fence it sampled reached the wait index once the queue is empty, and panics
            // when another thread's poll emptied the queue in between (gfx-rs/wgpu#9958).
            let _pending = lock(&self.pending);
            match self.device.poll(wgpu::PollType::Wait { submission_index: Some(target.clone()), timeout: Some(WAIT_SLICE) }) {
                Ok(_) => return Ok(()),
                Err(wgpu::PollError::Timeout) => {}
                Err(e) => return Err(self.err(e.to_string())),
            }
        }
    }

    /// `bytes` bytes of `src` from byte `offset` on, after every op recorded so far.
    pub(crate) fn read(&self, src: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        if bytes == 0 {
            self.wait()?;
            return Ok(Vec::new());
        }
        // Held throughout, so that the staging buffer is created, mapped and dropped under it.
        let _held = self.gate.hold();
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tandem readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.encode(|enc| enc.copy_buffer_to_buffer(src, offset, &staging, 0, bytes));
        self.flush();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv().map_err(|_| self.err("readback mapping was dropped"))?.map_err(|e| self.err(format!("readback mapping failed: {e}")))?;
        let data = {
            let mapped = staging.get_mapped_range(..).map_err(|e| self.err(format!("readback: {e}")))?;
            let mut data = crate::backend::host::try_vec(mapped.len(), "host", &format!("a readback from {}", self.name))?;
            data.extend_from_slice(&mapped);
            data
        };
        staging.unmap();
        Ok(data)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if let Some(r) = self.profile_report() {
            eprint!("{r}");
        }
        // The fields (device, buffers, pipelines) drop after this body, and dropping them
        // takes the GL context: `held`, the last field, keeps the gate until they have.
        self.held = Some(self.gate.hold());
    }
}
