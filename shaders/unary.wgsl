// unary.wgsl: elementwise ops of one input, out[i] = op(x[pos(i)]).
//
// One invocation per output element of this dispatch's chunk. The op is the override
// constant `OP`, the numbering of `UnaryOp::code()`, fixed per pipeline; `p.p0`/`p.p1` are its parameters (Affine: mul, add; Powf: p).
// Bindings: 0 `p` parameters; 1 `x` input (f32; `x4` the same as vec4); 2 `out` output (f32,
// contiguous; `out4` the same as vec4).
// Shape letters: N elements in the chunk, D0..D5 the layout's dimensions padded to rank 6.
// Offsets are relative to the bound range and wrap modulo 2^32, so a chunk may bind `x` from
// an aligned position before its first element.

struct Params {
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
    n: u32,      // N
    start: u32,  // linear index of the chunk's first element in the whole output
    x_off: u32,  // layout offset of x minus the bound range's first element
    out_off: u32,
    p0: f32,
    p1: f32,
    rank: u32,   // dimensions in use after merging, 1..6: D(6-rank)..D5
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out4: array<vec4<f32>>;

override OP: u32 = 0u;

fn apply(v: f32) -> f32 {
    switch OP {
        case 0u: { return v; }
        case 1u: { return -v; }
        case 2u: { return exp(v); }
        case 3u: { return log(v); }
        case 4u: { return max(v, 0.0); }
        case 5u: { return select(0.0, 1.0, v > 0.0); }
        case 6u: { return sqrt(v); }
        case 7u: { return 1.0 / v; }
        case 8u: { return v * v; }
        case 9u: { return abs(v); }
        // tanh(v) from exp(-2|v|) stays finite for large |v|, where the builtin can give NaN.
        case 10u: { let e = exp(-2.0 * abs(v)); return sign(v) * (1.0 - e) / (1.0 + e); }
        case 11u: { return 1.0 / (1.0 + exp(-v)); }
        case 12u: { return v * p.p0 + p.p1; }
        default: { return pow(v, p.p0); }
    }
}

// Dispatches wider than the per-dimension limit use a 2-D grid of 256-wide workgroups.
fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.y * nwg.x * 256u + gid.x;
}

@compute @workgroup_size(256)
fn contig(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if i >= p.n { return; }
    out[p.out_off + i] = apply(x[p.x_off + p.start + i]);
}

// `contig` four elements per invocation, for chunks of a multiple of 4 elements at 16-byte
// aligned offsets: CPU rasterizers load and store storage buffers lane by lane, so one vec4 per
// lane costs little more than one f32 and the op runs about twice as fast.
@compute @workgroup_size(256)
fn contig4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if i >= p.n / 4u { return; }
    let v = x4[(p.x_off + p.start) / 4u + i];
    out4[p.out_off / 4u + i] = vec4<f32>(apply(v.x), apply(v.y), apply(v.z), apply(v.w));
}

@compute @workgroup_size(256)
fn strided(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if i >= p.n { return; }
    var rem = p.start + i;
    var pos = p.x_off;
    // One division per dimension but the outermost, whose coordinate is what remains.
    let outer = 6 - i32(p.rank);
    for (var d = 5; d > outer; d--) {
        let dim = p.shape[d / 4][d % 4];
        let q = rem / dim;
        pos += (rem - q * dim) * p.strides[d / 4][d % 4];
        rem = q;
    }
    pos += rem * p.strides[outer / 4][outer % 4];
    out[p.out_off + i] = apply(x[pos]);
}
