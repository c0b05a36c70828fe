//! Parses and validates every WGSL shader of the wgpu backend with naga; needs no GPU.
#![cfg(feature = "wgpu")]
use tandem::backend::wgpu::shaders::{source, COMMON, SHADERS, SHARED_LAYOUTS, SUBGROUP8_MODULES, SUBGROUP_MODULES};
use tandem::backend::wgpu::{NEED_INVOCATIONS, NEED_WORKGROUP_BYTES};

#[test]
fn every_shader_parses_and_validates() {
    assert!(SHADERS.len() >= 9, "the shader table lost entries");
    for (name, file) in SHADERS {
        // As compiled: the file plus any generated kernels.
        let src = source(name).expect("every table entry has a source");
        assert!(src.starts_with(file), "{name}: generated kernels come after the file");
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{name}.wgsl: {}", e.emit_to_string(src)));
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty());
        if let Err(e) = v.validate(&module) {
            panic!("{name}.wgsl does not validate: {}", e.emit_to_string(src));
        }
        assert!(module.entry_points.iter().all(|e| e.stage == naga::ShaderStage::Compute), "{name}.wgsl: every entry point is a compute shader");
        assert!(src.starts_with(&format!("// {name}.wgsl: ")), "{name}.wgsl opens with what it computes");
    }
}

#[test]
fn subgroup_modules_validate_only_with_subgroups() {
    assert!(!SUBGROUP8_MODULES.is_empty());
    let caps = naga::valid::Capabilities::SUBGROUP;
    let stages = naga::valid::ShaderStages::COMPUTE;
    let ops = naga::valid::SubgroupOperationSet::all();
    for (name, base) in SUBGROUP8_MODULES {
        let src = source(name).expect("every subgroup module has a source");
        assert!(src.starts_with(source(base).expect("its base shader")), "{name} extends {base}");
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
        v.subgroup_stages(stages).subgroup_operations(ops);
        if let Err(e) = v.validate(&module) {
            panic!("{name} does not validate: {}", e.emit_to_string(src));
        }
        // The gate in `Ctx::subgroup8` is what keeps it off devices without subgroups.
        let plain = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty()).validate(&module);
        assert!(plain.is_err(), "{name} validated without the subgroup capability: it needs no gate");
    }
}

/// common.wgsl is appended to modules that have their own bindings: it may hold functions only,
/// and each module, the subgroup ones that extend another included, holds it exactly once; a
/// shared layout (parameters and bindings) is appended once to each module it names.
#[test]
fn shared_text_is_appended_once_and_common_is_bindingless() {
    assert!(COMMON.starts_with("// common.wgsl: "), "common.wgsl opens with what it holds");
    let module = naga::front::wgsl::parse_str(COMMON).unwrap_or_else(|e| panic!("common.wgsl: {}", e.emit_to_string(COMMON)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
        .validate(&module)
        .unwrap_or_else(|e| panic!("common.wgsl does not validate: {}", e.emit_to_string(COMMON)));
    assert!(!module.functions.is_empty(), "common.wgsl lost its helpers");
    assert!(module.global_variables.is_empty(), "common.wgsl declares module variables (bindings)");
    assert!(module.entry_points.is_empty() && module.overrides.is_empty(), "common.wgsl has entry points or overrides");
    let modules = SHADERS.iter().chain(SUBGROUP8_MODULES).chain(SUBGROUP_MODULES).map(|(name, _)| *name);
    for name in modules {
        let src = source(name).expect("every module has a source");
        assert_eq!(src.matches(COMMON).count(), 1, "{name}: common.wgsl appended once");
    }
    for (name, layout) in SHARED_LAYOUTS {
        assert!(SHADERS.iter().any(|(n, _)| n == name), "{name}: a shared layout for no shader");
        assert!(layout.starts_with("// ") && layout.contains(".wgsl: "), "{name}'s layout opens with its file name");
        assert_eq!(source(name).expect("its source").matches(layout).count(), 1, "{name}: its layout appended once");
    }
}

#[test]
fn a_broken_shader_is_rejected() {
    let src = "@compute @workgroup_size(1) fn f() { let x: u32 = 1.5; }";
    let ok = naga::front::wgsl::parse_str(src)
        .ok()
        .map(|m| naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty()).validate(&m).is_ok());
    assert_ne!(ok, Some(true), "the validator accepted a type error");
}

/// Every entry point of every module stays within the workgroup size and workgroup memory that
/// adapter discovery demands of an adapter (`NEED_INVOCATIONS`, `NEED_WORKGROUP_BYTES`): a kernel
/// past them would fail to build its pipeline on an adapter that was accepted.
#[test]
fn every_kernel_fits_the_limits_adapters_are_checked_for() {
    let caps = naga::valid::Capabilities::SUBGROUP;
    let modules = SHADERS.iter().chain(SUBGROUP8_MODULES).chain(SUBGROUP_MODULES).map(|(name, _)| *name);
    let (mut most_bytes, mut most_invocations) = (0, 0);
    for name in modules {
        let src = source(name).expect("every module has a source");
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
        let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
        v.subgroup_stages(naga::valid::ShaderStages::COMPUTE).subgroup_operations(naga::valid::SubgroupOperationSet::all());
        let info = v.validate(&module).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
        for (i, ep) in module.entry_points.iter().enumerate() {
            let uses = info.get_entry_point(i);
            let bytes: u32 = module
                .global_variables
                .iter()
                .filter(|(h, g)| g.space == naga::AddressSpace::WorkGroup && !uses[*h].is_empty())
                .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
                .sum();
            let invocations = ep.workgroup_size.iter().product::<u32>();
            assert!(
                bytes <= NEED_WORKGROUP_BYTES,
                "{name}::{} uses {bytes} bytes of workgroup memory; adapters are checked for {NEED_WORKGROUP_BYTES}",
                ep.name
            );
            assert!(
                invocations <= NEED_INVOCATIONS,
                "{name}::{} has {invocations} invocations; adapters are checked for {NEED_INVOCATIONS}",
                ep.name
            );
            most_bytes = most_bytes.max(bytes);
            most_invocations = most_invocations.max(invocations);
        }
    }
    // The limits say what the kernels need, not more: an adapter is never refused for less.
    assert_eq!(most_bytes, NEED_WORKGROUP_BYTES, "the largest kernel's workgroup memory");
    assert_eq!(most_invocations, NEED_INVOCATIONS, "the largest workgroup");
}
