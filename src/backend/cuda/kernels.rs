//! The CUDA kernel sources: one `kernels/*.cu` file per op family, embedded with `include_str!`.

/// Prepended to every family before compiling, so each compiles alone without include paths.
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// `(family, source)` for every kernel family; the runtime compiler and the NVRTC test both
/// iterate over this one table.
pub const KERNELS: &[(&str, &str)] = &[
    ("unary", include_str!("../../../kernels/unary.cu")),
    ("binary", include_str!("../../../kernels/binary.cu")),
    ("reduce", include_str!("../../../kernels/reduce.cu")),
    ("conv", include_str!("../../../kernels/conv.cu")),
    ("pool", include_str!("../../../kernels/pool.cu")),
    ("index", include_str!("../../../kernels/index.cu")),
    ("optim", include_str!("../../../kernels/optim.cu")),
    ("matmul", include_str!("../../../kernels/matmul.cu")),
    ("transformer", include_str!("../../../kernels/transformer.cu")),
];

/// The entry points each family defines, loaded when a device opens.
pub const FUNCTIONS: &[(&str, &[&str])] = &[
    ("unary", &["unary_f32"]),
    ("binary", &["binary_f32"]),
    ("reduce", &["reduce_rows_f32", "reduce_cols_f32"]),
    ("conv", &["im2col_f32", "col2im_f32"]),
    ("pool", &["max_pool2d_f32", "max_pool2d_backward_f32"]),
    ("index", &["gather_f32", "scatter_f32", "gather_rows_f32", "scatter_add_rows_f32", "cast_32", "cast_to_half", "cast_from_half"]),
    ("optim", &["sgd_f32", "adam_f32"]),
    ("matmul", &["matmul_f32"]),
    (
        "transformer",
        &[
            "layer_norm_f32",
            "layer_norm_dx_f32",
            "layer_norm_dwb_f32",
            "causal_softmax_f32",
            "causal_softmax_dx_f32",
            "attention_f32",
            "attention_dq_f32",
            "attention_dkv_f32",
            "attention_tiled_f32",
            "attention_dq_tiled_f32",
            "attention_dkv_tiled_f32",
        ],
    ),
];

/// The entry points of `family` (none for an unknown family).
pub fn functions(family: &str) -> &'static [&'static str] {
    FUNCTIONS.iter().find(|(f, _)| *f == family).map_or(&[], |(_, names)| names)
}

/// The full translation unit NVRTC compiles for `family`'s source: `COMMON`, the elementwise
/// ops' codes (`op_table::cuda_constants`), then the source.
pub fn translation_unit(source: &str) -> String {
    format!("{COMMON}\n{}\n{source}", crate::backend::op_table::cuda_constants())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_lists_the_kernels_its_source_defines() {
        assert_eq!(KERNELS.len(), FUNCTIONS.len());
        for (family, source) in KERNELS {
            let names = functions(family);
            assert!(!names.is_empty(), "{family} has no entry in FUNCTIONS");
            for name in names {
                assert!(source.contains(&format!("__global__ void {name}(")), "{family}.cu does not define {name}");
            }
            assert_eq!(source.matches("__global__").count(), names.len(), "{family}.cu defines kernels FUNCTIONS omits");
        }
    }
}
