// cast.wgsl: the 32-bit dtype conversions of `CastOp`, one invocation per element.
//
// Values travel as raw words, so that an I32 is never loaded as an F32 (a driver may flush
// what would be a denormal); OP (CastOp::code) picks the conversion: 0 F32 -> I32 toward zero,
// saturating, NaN -> 0; 1 I32 -> F32 (nearest); 2 the high half x >> 16 and 3 the low half
// x & 0xFFFF of an I32, each as an exact F32.
// Bindings: 0 `p` parameters; 1 `x` the input words [N]; 2 `out` the output words [N].
// Shape letters: N elements in this chunk.

struct Params {
    n: u32, // N
    x_off: u32,
    out_off: u32,
}

override OP: u32;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

// Every comparison with NaN is false, so NaN falls through to 0.
fn to_i32(f: f32) -> i32 {
    if f >= 2147483648.0 { return 2147483647; }
    if f >= -2147483648.0 { return i32(f); }
    if f < 0.0 { return bitcast<i32>(0x80000000u); }
    return 0;
}

@compute @workgroup_size(256)
fn convert(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 256u);
    if e >= p.n { return; }
    let w = x[p.x_off + e];
    var r = 0u;
    switch OP {
        case 0u: { r = bitcast<u32>(to_i32(bitcast<f32>(w))); }
        case 1u: { r = bitcast<u32>(f32(bitcast<i32>(w))); }
        case 2u: { r = bitcast<u32>(f32(bitcast<i32>(w) >> 16u)); }
        default: { r = bitcast<u32>(f32(w & 0xFFFFu)); }
    }
    out[p.out_off + e] = r;
}
