// binary.wgsl: elementwise ops of two inputs, out[i] = op(a[pos_a(i)], b[pos_b(i)]).
//
// One invocation per output element of this dispatch's chunk; `a` and `b` are read through
// strided layouts that share the output's shape (stride 0 broadcasts). The op is the override
// constant `OP`, `BinaryOp::code()`, fixed per pipeline; the cases name the codes by the
// `BINARY_*` constants generated from backend/op_table.rs and appended to the module.
// Bindings: 0 `p` parameters; 1 `a` input (f32); 2 `b` input (f32); 3 `out` output (f32,
// contiguous); `a4`, `b4`, `out4` are the same bindings as vec4 arrays.
// Shape letters: N elements in the chunk, D0..D5 the shared shape padded to rank 6 (after
// merging dimensions both operands walk as one).
// Offsets are relative to each bound range and wrap modulo 2^32.

struct Params {
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
    n: u32,      // N
    start: u32,  // linear index of the chunk's first element in the whole output
    a_off: u32,
    b_off: u32,
    out_off: u32,
    rank: u32,   // dimensions in use after merging, 1..6: D(6-rank)..D5
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read_write> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>;

override OP: u32 = 0u;

// torch.maximum / torch.minimum: NaN if either is NaN; of two equal values (±0 included) the
// bitwise AND is the maximum (+0 over -0) and the OR the minimum.
fn max_or_min(x: f32, y: f32, is_max: bool) -> f32 {
    if is_nan(x) || is_nan(y) { return bitcast<f32>(0x7fc00000u); }
    if x == y {
        let bx = bitcast<u32>(x);
        let by = bitcast<u32>(y);
        return bitcast<f32>(select(bx | by, bx & by, is_max));
    }
    return select(min(x, y), max(x, y), is_max);
}

fn apply(x: f32, y: f32) -> f32 {
    let ordered = !is_nan(x) && !is_nan(y);
    switch OP {
        case BINARY_ADD: { return x + y; }
        case BINARY_SUB: { return x - y; }
        case BINARY_MUL: { return x * y; }
        case BINARY_DIV: { return x / y; }
        case BINARY_MAX: { return max_or_min(x, y, true); }
        case BINARY_MIN: { return max_or_min(x, y, false); }
        case BINARY_GT: { return select(0.0, 1.0, ordered && x > y); }
        case BINARY_EQ: { return select(0.0, 1.0, ordered && x == y); }
        // PyTorch's threshold_backward: x unless y <= 0 (+0, -0 and below; not NaN)
        case BINARY_RELU_BACKWARD: {
            let b = bitcast<u32>(y);
            return select(x, 0.0, b == 0u || (b >= 0x80000000u && b <= 0xff800000u));
        }
        // a code no case names: NaN, as on every backend
        default: { return bitcast<f32>(0x7fc00000u); }
    }
}

@compute @workgroup_size(256)
fn contig(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    let g = p.start + i;
    out[p.out_off + i] = apply(a[p.a_off + g], b[p.b_off + g]);
}

fn apply4(x: vec4<f32>, y: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(apply(x.x, y.x), apply(x.y, y.y), apply(x.z, y.z), apply(x.w, y.w));
}

// `contig` four elements per invocation (a multiple of 4 in the chunk, 16-byte aligned
// operands): CPU rasterizers access storage lane by lane, so a vec4 per lane costs little more
// than an f32.
@compute @workgroup_size(256)
fn contig4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n / 4u { return; }
    let g = p.start + 4u * i;
    out4[p.out_off / 4u + i] = apply4(a4[(p.a_off + g) / 4u], b4[(p.b_off + g) / 4u]);
}

@compute @workgroup_size(256)
fn strided(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    var rem = p.start + i;
    var pa = p.a_off;
    var pb = p.b_off;
    // One division per dimension but the outermost, whose coordinate is what remains.
    let outer = 6 - i32(p.rank);
    for (var d = 5; d > outer; d--) {
        let dim = p.shape[d / 4][d % 4];
        let q = rem / dim;
        let c = rem - q * dim;
        pa += c * p.a_strides[d / 4][d % 4];
        pb += c * p.b_strides[d / 4][d % 4];
        rem = q;
    }
    pa += rem * p.a_strides[outer / 4][outer % 4];
    pb += rem * p.b_strides[outer / 4][outer % 4];
    out[p.out_off + i] = apply(a[pa], b[pb]);
}

// `strided` for rank <= 3 after merging (D0..D2 are 1): constant indices into the parameters
// and exactly two divisions, no loop. `bcast3` is the same with `a` contiguous, read like
// `contig` so that its loads (and the stores) stay vector loads on CPU rasterizers: a bias
// broadcast over [N, C, H*W].
fn pos3(g: u32, off: u32, s: array<vec4<u32>, 2>) -> u32 {
    let d5 = p.shape[1].y;
    let d4 = p.shape[1].x;
    let q = g / d5;
    let c5 = g - q * d5;
    let c3 = q / d4;
    let c4 = q - c3 * d4;
    return off + c3 * s[0].w + c4 * s[1].x + c5 * s[1].y;
}

@compute @workgroup_size(256)
fn strided3(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    let g = p.start + i;
    out[p.out_off + i] = apply(a[pos3(g, p.a_off, p.a_strides)], b[pos3(g, p.b_off, p.b_strides)]);
}

@compute @workgroup_size(256)
fn bcast3(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    let g = p.start + i;
    out[p.out_off + i] = apply(a[p.a_off + g], b[pos3(g, p.b_off, p.b_strides)]);
}

// `bcast3` four elements per invocation, when D5 and the chunk start are multiples of 4 (the
// four share D3 and D4, so `b` is four loads at its D5 stride) and `a` and `out` are aligned.
@compute @workgroup_size(256)
fn bcast4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n / 4u { return; }
    let g = p.start + 4u * i;
    let pb = pos3(g, p.b_off, p.b_strides);
    let sb = p.b_strides[1].y;
    let bv = vec4<f32>(b[pb], b[pb + sb], b[pb + 2u * sb], b[pb + 3u * sb]);
    out4[p.out_off / 4u + i] = apply4(a4[(p.a_off + g) / 4u], bv);
}
