// index.wgsl: indexing by i32 labels and ids.
//
// gather: one invocation per row, out[r] = x[r, idx[r]]; scatter: one invocation per output
// element, out[r, c] = (c == idx[r]) ? x[r] : 0. Labels outside 0..C read 0 and write nothing.
// gather_rows: one invocation per output element, out[i, d] = x[idx[i], d] (an embedding
// lookup) for the ids among the bound table rows row0..row0+bound (a large table comes in
// chunks); the chunk with row0 = 0 also writes 0 for ids outside 0..V.
// scatter_add_rows: one invocation per (v, d) of the table gradient, out[v, d] = the sum of
// x[order[j], d] for j in row_ptr[v]..row_ptr[v+1], ascending, from +0. Pass `first` (a
// multiple of SPAN) adds the plan entries from row_ptr[v] + first on, at most SPAN of them,
// onto what the earlier passes left (software drivers end any loop after 65,535 iterations),
// so the sum is the same sequence of additions however many passes it takes.
// Bindings: 0 `p` parameters; 1 `x` values ([R, C] for gather, [R] for scatter, table rows
// [bound, C] for gather_rows, the [N, C] gradient for scatter_add_rows); 2 `idx` (labels [R],
// ids [R], or the plan [V + 1 + N]: row_ptr then order); 3 `out` ([R], [R, C], [R, C], or the
// table rows row0..row0+R of [V, C]).
// Shape letters: R rows in this chunk, C columns (classes, embedding width), V table rows, N ids.

struct Params {
    rows: u32, // R
    cols: u32, // C
    x_off: u32,
    idx_off: u32,
    out_off: u32,
    table: u32, // V
    ids: u32,   // N
    row0: u32,  // the chunk's first table row
    first: u32, // plan entries each row skips in this pass (scatter_add_rows)
    bound: u32, // table rows bound from row0 on (gather_rows)
}

const SPAN: u32 = 16384u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> idx: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = grid_index(gid, nwg, 64u);
    if r >= p.rows { return; }
    let c = idx[p.idx_off + r];
    var v = 0.0;
    if c >= 0 && u32(c) < p.cols { v = x[p.x_off + r * p.cols + u32(c)]; }
    out[p.out_off + r] = v;
}

@compute @workgroup_size(256)
fn scatter(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 256u);
    if e >= p.rows * p.cols { return; }
    let r = e / p.cols;
    let c = idx[p.idx_off + r];
    out[p.out_off + e] = select(0.0, x[p.x_off + r], c >= 0 && u32(c) == e % p.cols);
}

@compute @workgroup_size(256)
fn gather_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 256u);
    if e >= p.rows * p.cols { return; }
    let v = idx[p.idx_off + e / p.cols];
    let here = v >= 0 && u32(v) >= p.row0 && u32(v) - p.row0 < p.bound;
    if here {
        out[p.out_off + e] = x[p.x_off + (u32(v) - p.row0) * p.cols + e % p.cols];
    } else if p.row0 == 0u && (v < 0 || u32(v) >= p.table) {
        out[p.out_off + e] = 0.0;
    }
}

@compute @workgroup_size(256)
fn scatter_add_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 256u);
    if e >= p.rows * p.cols { return; }
    let v = p.row0 + e / p.cols;
    let d = e % p.cols;
    let n = i32(p.ids);
    let lo = u32(clamp(idx[p.idx_off + v], 0, n));
    let hi = u32(clamp(idx[p.idx_off + v + 1u], i32(lo), n));
    let start = lo + p.first;
    if p.first > 0u && start >= hi { return; }
    let end = min(hi, start + SPAN);
    var acc = 0.0;
    if p.first > 0u { acc = out[p.out_off + e]; }
    let order = p.idx_off + p.table + 1u;
    for (var j = start; j < end; j++) {
        let i = idx[order + j];
        if i >= 0 && i < n { acc += x[p.x_off + u32(i) * p.cols + d]; }
    }
    out[p.out_off + e] = acc;
}
