// util.wgsl: fill, out[i] = value for i in 0..N, on raw 32-bit words (f32 or i32 bit patterns).
//
// Bindings: 0 `p` parameters; 1 `out` the buffer being filled (u32 words).
// Shape letters: N words in this dispatch's chunk.

struct Params {
    n: u32,       // N
    out_off: u32, // first word to fill, relative to the bound range
    bits: u32,    // the value's bit pattern
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    out[p.out_off + i] = p.bits;
}
