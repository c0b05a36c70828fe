//! Adapter discovery: which adapters are usable (compute they need), software or hardware, in
//! which order, under which names (`wgpu:N` and backend-qualified `vulkan:N`, `gl:N`, ...).
use super::gate::Gate;
use crate::backend::{BackendKind, DeviceInfo, DeviceKind};
use std::sync::OnceLock;

pub(crate) struct Adapters {
    // Adapters refer to the instance; it stays alive with them.
    _instance: wgpu::Instance,
    /// The usable adapters, each with its gate (see `gate.rs`); `wgpu:N` is the N-th.
    pub(crate) list: Vec<(wgpu::Adapter, DeviceInfo, Gate)>,
    /// Adapters that cannot run the kernels, never opened.
    refused: Vec<Refused>,
}

/// An adapter that is listed but never opened, and why.
#[derive(Clone, Debug)]
pub struct Refused {
    pub name: String,
    pub driver: String,
    pub reason: String,
}

/// Names that mark a software rasterizer whatever type the driver reports: wgpu reports
/// lavapipe as `Cpu`, but llvmpipe or SwiftShader through GL may come as `Other`, which is also
/// how real NVIDIA, AMD and ARM GPUs come through GL.
const SOFTWARE_NAMES: [&str; 5] = ["llvmpipe", "softpipe", "lavapipe", "swiftshader", "swrast"];

fn kind(i: &wgpu::AdapterInfo) -> DeviceKind {
    let name = i.name.to_lowercase();
    if SOFTWARE_NAMES.iter().any(|s| name.contains(s)) {
        return DeviceKind::Software;
    }
    match i.device_type {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::Discrete,
        wgpu::DeviceType::IntegratedGpu => DeviceKind::Integrated,
        wgpu::DeviceType::Cpu => DeviceKind::Software,
        wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => DeviceKind::Other,
    }
}

/// Invocations in the largest workgroup the kernels declare (`@workgroup_size(256)`, `(16, 16)`);
/// tests/shaders_validate.rs checks every entry point against it.
pub const NEED_INVOCATIONS: u32 = 256;
/// Workgroup memory of the kernel that uses most: the tiled attention's key/value tiles and
/// accumulators; tests/shaders_validate.rs checks every entry point against it. WebGPU's
/// default limit is 16 KiB.
pub const NEED_WORKGROUP_BYTES: u32 = 12288;
/// Storage buffers one kernel binds at most (an optimizer's parameter, gradient and two states).
const NEED_STORAGE_BUFFERS: u32 = 4;
/// The smallest storage binding GL 4.3 guarantees (GLES 3.1 and WebGPU guarantee 128 MiB): an
/// adapter reporting less has no usable compute.
const NEED_BINDING: u64 = 16 << 20;

/// Why an adapter with these downlevel flags and limits cannot run the kernels, if it cannot:
/// below GL 4.3 / GLES 3.1 an adapter reports no compute at all (zero workgroups, zero storage).
pub fn refusal(flags: wgpu::DownlevelFlags, l: &wgpu::Limits) -> Option<String> {
    let mut why = Vec::new();
    if !flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
        why.push("no compute shaders (GL 4.3 or GLES 3.1 is needed)".to_string());
    }
    if l.max_compute_workgroups_per_dimension == 0 {
        why.push("zero workgroups per dimension".to_string());
    }
    let size = (l.max_compute_workgroup_size_x, l.max_compute_workgroup_size_y);
    if l.max_compute_invocations_per_workgroup < NEED_INVOCATIONS || size.0 < NEED_INVOCATIONS || size.1 < 16 {
        why.push(format!(
            "workgroups of at most {} invocations ({}x{}), {NEED_INVOCATIONS} ({NEED_INVOCATIONS}x16) needed",
            l.max_compute_invocations_per_workgroup, size.0, size.1
        ));
    }
    if l.max_compute_workgroup_storage_size < NEED_WORKGROUP_BYTES {
        why.push(format!("{} bytes of workgroup memory, {NEED_WORKGROUP_BYTES} needed", l.max_compute_workgroup_storage_size));
    }
    if l.max_storage_buffers_per_shader_stage < NEED_STORAGE_BUFFERS {
        why.push(format!("{} storage buffers per kernel, {NEED_STORAGE_BUFFERS} needed", l.max_storage_buffers_per_shader_stage));
    }
    if l.max_storage_buffer_binding_size < NEED_BINDING {
        why.push(format!("storage bindings of {} bytes, {NEED_BINDING} needed", l.max_storage_buffer_binding_size));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Why a GL adapter whose context has version `driver_info` (`"3.3.0 NVIDIA 580.159.04"`,
/// `"4.5 (Core Profile) Mesa 22.3.6"`, `"OpenGL ES 3.2 Mesa ..."`) cannot run the kernels, if it
/// cannot. A driver can report compute through an extension on a GL 3.3 context (NVIDIA's EGL
/// does), but naga writes GLSL of the context's version, and compute needs GLSL 4.30 (or GLSL
/// ES 3.10): every pipeline would then fail to build.
pub fn gl_refusal(driver_info: &str) -> Option<String> {
    let (es, rest) = match driver_info.trim().strip_prefix("OpenGL ES") {
        Some(rest) => (true, rest.trim_start()),
        None => (false, driver_info.trim()),
    };
    let mut parts = rest.split(|c: char| !c.is_ascii_digit()).take(2).map(str::parse::<u32>);
    let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) else { return None };
    let (need, name) = if es { ((3, 1), "GLES") } else { ((4, 3), "GL") };
    ((major, minor) < need).then(|| format!("a {name} {major}.{minor} context: compute shaders need {name} {}.{}", need.0, need.1))
}

/// The lower-case name of a wgpu backend, as in device specs (`vulkan:0`, `gl:0`).
fn backend_name(b: wgpu::Backend) -> &'static str {
    match b {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::Gl => "gl",
        wgpu::Backend::BrowserWebGpu => "webgpu",
        wgpu::Backend::Noop => "noop",
    }
}

/// The wgpu backends a device spec may name (`vulkan:N` is the N-th Vulkan adapter).
pub const NAMED_BACKENDS: [&str; 4] = ["vulkan", "gl", "metal", "dx12"];

/// Enumerates once per process: adapter discovery takes long (GL context creation, drivers).
pub(crate) fn all() -> &'static Adapters {
    static ADAPTERS: OnceLock<Adapters> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12 | wgpu::Backends::GL;
        desc.flags = wgpu::InstanceFlags::empty();
        let instance = wgpu::Instance::new(desc);
        let mut found: Vec<wgpu::Adapter> = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let rank = |a: &wgpu::Adapter| {
            let i = a.get_info();
            (kind(&i) == DeviceKind::Software, i.backend == wgpu::Backend::Gl)
        };
        found.sort_by_key(rank);
        let (mut list, mut refused) = (Vec::new(), Vec::new());
        for a in found {
            let i = a.get_info();
            let driver = format!("{:?} {} {}", i.backend, i.driver, i.driver_info).trim().to_string();
            let gl = (i.backend == wgpu::Backend::Gl).then(|| gl_refusal(&i.driver_info)).flatten();
            if let Some(reason) = refusal(a.get_downlevel_capabilities().flags, &a.limits()).or(gl) {
                refused.push(Refused { name: i.name.clone(), driver, reason });
                continue;
            }
            let (matmul, hardware) = super::kernels_for(kind(&i), &super::Options::from_env().unwrap_or_default());
            let matmul = super::matmul_label(matmul, hardware);
            let info = DeviceInfo {
                backend: BackendKind::Wgpu,
                ordinal: list.len(),
                name: i.name.clone(),
                kind: kind(&i),
                memory: None,
                driver,
                matmul,
                libraries: String::new(),
            };
            // The GL backend shares one context among all devices of an adapter.
            list.push((a, info, Gate::new(i.backend == wgpu::Backend::Gl)));
        }
        Adapters { _instance: instance, list, refused }
    })
}

/// Every usable wgpu adapter: hardware before software, Vulkan/Metal/DX12 before GL; ordinals
/// in order.
pub fn adapters() -> Vec<DeviceInfo> {
    all().list.iter().map(|(_, i, _)| i.clone()).collect()
}

/// Adapters found but refused, with the reason (see `refusal`).
pub fn refused() -> Vec<Refused> {
    all().refused.clone()
}

/// The wgpu ordinal of the `n`-th adapter of the backend named `backend` (one of
/// `NAMED_BACKENDS`), if there is one.
pub fn ordinal_of(backend: &str, n: usize) -> Option<usize> {
    all().list.iter().enumerate().filter(|(_, (a, _, _))| backend_name(a.get_info().backend) == backend).nth(n).map(|(i, _)| i)
}

/// The backend-qualified spec (`vulkan:0`, `gl:0`) of wgpu adapter `ordinal`.
pub fn qualified_spec(ordinal: usize) -> Option<String> {
    let backend = backend_name(all().list.get(ordinal)?.0.get_info().backend);
    let n = all().list[..ordinal].iter().filter(|(a, _, _)| backend_name(a.get_info().backend) == backend).count();
    Some(format!("{backend}:{n}"))
}

/// Whether adapter `ordinal` has subgroup operations with subgroups of exactly 8 invocations
/// (lavapipe's at 256-bit vectors), which its devices use for the `matmul_sg` kernels.
pub fn has_subgroups_of_8(ordinal: usize) -> bool {
    all().list.get(ordinal).is_some_and(|(a, _, _)| {
        let i = a.get_info();
        a.features().contains(wgpu::Features::SUBGROUP) && (i.subgroup_min_size, i.subgroup_max_size) == (8, 8)
    })
}

#[cfg(test)]
mod tests {
    use super::{gl_refusal, kind, refusal, NEED_BINDING};

    /// NVIDIA's EGL gives wgpu a GL 3.3 context whose compute pipelines all fail (seen on an
    /// H200 with driver 580): refused by its version; Mesa's 4.5 and GLES 3.2 contexts run.
    #[test]
    fn gl_contexts_below_4_3_are_refused() {
        let why = gl_refusal("3.3.0 NVIDIA 580.159.04").expect("refused");
        assert!(why.contains("GL 3.3") && why.contains("GL 4.3"), "{why}");
        assert_eq!(gl_refusal("4.5 (Core Profile) Mesa 22.3.6"), None);
        assert_eq!(gl_refusal("4.3.0 NVIDIA 580.159.04"), None);
        assert_eq!(gl_refusal("OpenGL ES 3.2 Mesa 22.3.6"), None);
        assert!(gl_refusal("OpenGL ES 3.0 Mesa 22.3.6").is_some_and(|w| w.contains("GLES 3.1")));
        assert_eq!(gl_refusal("unknown"), None, "an unreadable version is left to the other checks");
    }
    use crate::backend::DeviceKind;

    #[test]
    fn adapters_without_compute_are_refused_with_the_reason() {
        let full = wgpu::DownlevelFlags::all();
        assert_eq!(refusal(full, &wgpu::Limits::default()), None, "WebGPU's default limits run every kernel");
        assert_eq!(refusal(full, &wgpu::Limits::downlevel_defaults()), None, "GLES 3.1's limits run every kernel");
        // What a GL 3.3 / GLES 3.0 adapter reports: no compute at all.
        let webgl2 = refusal(wgpu::DownlevelFlags::empty(), &wgpu::Limits::downlevel_webgl2_defaults()).expect("refused");
        for part in ["no compute shaders", "zero workgroups", "storage bindings of 0 bytes"] {
            assert!(webgl2.contains(part), "{part:?} missing from {webgl2:?}");
        }
        let one = |f: &dyn Fn(&mut wgpu::Limits)| {
            let mut l = wgpu::Limits::default();
            f(&mut l);
            refusal(full, &l)
        };
        assert!(refusal(full - wgpu::DownlevelFlags::COMPUTE_SHADERS, &wgpu::Limits::default()).is_some());
        assert!(one(&|l| l.max_compute_workgroups_per_dimension = 0).is_some_and(|r| r.contains("zero workgroups")));
        assert!(one(&|l| l.max_compute_invocations_per_workgroup = 128).is_some_and(|r| r.contains("128 invocations")));
        assert!(one(&|l| l.max_compute_workgroup_size_x = 128).is_some());
        assert!(one(&|l| l.max_compute_workgroup_storage_size = 4096).is_some_and(|r| r.contains("4096 bytes of workgroup memory")));
        assert!(one(&|l| l.max_storage_buffers_per_shader_stage = 3).is_some_and(|r| r.contains("3 storage buffers")));
        assert!(one(&|l| l.max_storage_buffer_binding_size = NEED_BINDING - 4).is_some());
        assert_eq!(one(&|l| l.max_storage_buffer_binding_size = NEED_BINDING), None);
    }

    #[test]
    fn only_cpu_types_and_software_rasterizer_names_are_software() {
        let info = |name: &str, device_type| wgpu::AdapterInfo {
            name: name.into(),
            device_type,
            backend: wgpu::Backend::Gl,
            ..wgpu::AdapterInfo::new(wgpu::DeviceType::Other, wgpu::Backend::Gl)
        };
        use wgpu::DeviceType::*;
        assert_eq!(kind(&info("NVIDIA GeForce RTX 4090/PCIe/SSE2", Other)), DeviceKind::Other);
        assert_eq!(kind(&info("AMD Radeon RX 7900 (radeonsi, navi31)", Other)), DeviceKind::Other);
        assert_eq!(kind(&info("Virtio GPU", VirtualGpu)), DeviceKind::Other);
        assert_eq!(kind(&info("llvmpipe (LLVM 15.0.7, 256 bits)", Other)), DeviceKind::Software);
        assert_eq!(kind(&info("SwiftShader Device (LLVM 10.0.0)", Other)), DeviceKind::Software);
        assert_eq!(kind(&info("llvmpipe (LLVM 15.0.7, 256 bits)", Cpu)), DeviceKind::Software);
        assert_eq!(kind(&info("Some CPU device", Cpu)), DeviceKind::Software);
        assert_eq!(kind(&info("NVIDIA H200", DiscreteGpu)), DeviceKind::Discrete);
    }
}
