//! The one table of WGSL sources, one file per op family, compiled lazily per device.

/// `(name, source)` of every shader the wgpu backend runs; names are what pipelines refer to.
pub const SHADERS: &[(&str, &str)] = &[
    ("unary", include_str!("../../../shaders/unary.wgsl")),
    ("binary", include_str!("../../../shaders/binary.wgsl")),
    ("util", include_str!("../../../shaders/util.wgsl")),
    ("reduce", include_str!("../../../shaders/reduce.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
    ("conv", include_str!("../../../shaders/conv.wgsl")),
    ("pool", include_str!("../../../shaders/pool.wgsl")),
    ("index", include_str!("../../../shaders/index.wgsl")),
    ("optim", include_str!("../../../shaders/optim.wgsl")),
];

/// The source of shader `name`.
pub fn source(name: &str) -> Option<&'static str> {
    SHADERS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}
