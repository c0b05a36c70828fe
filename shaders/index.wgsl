// index.wgsl: row-wise indexing by i32 class labels.
//
// gather: one invocation per row, out[r] = x[r, idx[r]]; scatter: one invocation per output
// element, out[r, c] = (c == idx[r]) ? x[r] : 0. Labels outside 0..C read 0 and write nothing.
// Bindings: 0 `p` parameters; 1 `x` values ([R, C] for gather, [R] for scatter); 2 `idx` labels
// [R] (i32); 3 `out` ([R] for gather, [R, C] for scatter).
// Shape letters: R rows in this chunk, C columns (classes).

struct Params {
    rows: u32, // R
    cols: u32, // C
    x_off: u32,
    idx_off: u32,
    out_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> idx: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = gid.y * nwg.x * 64u + gid.x;
    if r >= p.rows { return; }
    let c = idx[p.idx_off + r];
    var v = 0.0;
    if c >= 0 && u32(c) < p.cols { v = x[p.x_off + r * p.cols + u32(c)]; }
    out[p.out_off + r] = v;
}

@compute @workgroup_size(256)
fn scatter(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.y * nwg.x * 256u + gid.x;
    if e >= p.rows * p.cols { return; }
    let r = e / p.cols;
    let c = idx[p.idx_off + r];
    out[p.out_off + e] = select(0.0, x[p.x_off + r], c >= 0 && u32(c) == e % p.cols);
}
