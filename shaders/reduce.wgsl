// reduce.wgsl: reductions over the middle axis of a contiguous [O, L, I] view into [O, I].
//
// One invocation per output element; each walks its L inputs in order, so results are
// deterministic and match the CPU reference's order. The override constant `OP`
// follows `ReduceOp::code()`:
// 0 sum, 1 max, 2 min, 3 argmax (first maximum, written as an i32 index).
// Bindings: 0 `p` parameters; 1 `x` input (f32); 2 `out` output words (f32 bits, or i32 for
// argmax).
// Shape letters: O outer rows in this chunk, L reduced length, I inner length.

struct Params {
    outer: u32, // O
    len: u32,   // L
    inner: u32, // I
    x_off: u32,
    out_off: u32,
}

override OP: u32 = 0u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = gid.y * nwg.x * 64u + gid.x;
    if o >= p.outer * p.inner { return; }
    let row = o / p.inner;
    let col = o % p.inner;
    let base = p.x_off + row * p.len * p.inner + col;
    var acc = 0.0;
    if OP == 1u || OP == 3u { acc = bitcast<f32>(0xff800000u); }
    if OP == 2u { acc = bitcast<f32>(0x7f800000u); }
    var best = 0u;
    for (var j = 0u; j < p.len; j++) {
        let v = x[base + j * p.inner];
        switch OP {
            case 0u: { acc += v; }
            case 1u: { acc = max(acc, v); }
            case 2u: { acc = min(acc, v); }
            default: {
                if v > acc || j == 0u {
                    acc = v;
                    best = j;
                }
            }
        }
    }
    out[p.out_off + o] = select(bitcast<u32>(acc), best, OP == 3u);
}
