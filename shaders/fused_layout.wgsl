// fused_layout.wgsl: the parameters and bindings of the fused transformer kernels
// (`FusedOp`), which transformer.wgsl and attention.wgsl share: `shaders::source` appends this
// text to those two modules. What each binding holds is the entry's (see those files' headers).
// Shape letters: R rows of C values (LayerNorm), B row blocks of its partials; N matrices of T
// rows, D values per row of q, k, v.

struct Params {
    rows: u32,  // R, or N·T
    cols: u32,  // C, or T
    d: u32,     // D
    blocks: u32, // B
    eps: f32,
    scale: f32,
    pad0: u32,
    pad1: u32,
    // each binding's first element relative to its bound range: a1..a4 in off[0], a5..a8 in off[1]
    off: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a1: array<f32>;
@group(0) @binding(2) var<storage, read_write> a2: array<f32>;
@group(0) @binding(3) var<storage, read_write> a3: array<f32>;
@group(0) @binding(4) var<storage, read_write> a4: array<f32>;
@group(0) @binding(5) var<storage, read_write> a5: array<f32>;
@group(0) @binding(6) var<storage, read_write> a6: array<f32>;
@group(0) @binding(7) var<storage, read_write> a7: array<f32>;
@group(0) @binding(8) var<storage, read_write> a8: array<f32>;
