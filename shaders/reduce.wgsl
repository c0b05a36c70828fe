// reduce.wgsl: one pass of a reduction over the middle axis of a contiguous [O, L, I] view,
// from L values per output down to P partial results: [O, L, I] -> [O, P, I]. Two families:
// `reduce`/`reduce4` (one invocation per partial; software adapters, and inner axes) and
// `tree`/`tree4` (workgroup tree reductions over contiguous rows, I = 1; hardware adapters; the
// subgroup forms of shaders/reduce_sg.wgsl extend this file).
//
// In `reduce`, invocation (o, q, i) folds the elements j = q, q + P, q + 2P, ... < L of its column, so that
// neighbouring invocations read neighbouring addresses and no loop runs more than ceil(L / P)
// times (the host keeps that well below the 65,535 iterations after which Mesa's software
// drivers end a loop). The host repeats passes over the partials until P = 1; every output is
// a fixed sequence of operations, so results are deterministic.
// The override constant `OP` follows `ReduceOp::code()`: 0 sum, 1 max, 2 min, 3 argmax.
// NaN as PyTorch: max and min are NaN when any element is; argmax is the first NaN's index if
// any, else the first maximum's.
// Bindings: 0 `p` parameters; 1 `x` input values (f32; `x4` the same as vec4); 2 `xi` input indices (u32, argmax
// partials; read only when `p.flags` bit 0 is set, else an element's index is its j); 3 `out`
// output words: with P = 1 the results (f32 bits, or i32 indices for argmax), else the partial
// values at `out_off` and (argmax) their indices at `outi_off`.
// Shape letters: O outer rows in this chunk, L reduced length of this pass's input, I inner
// length, P parts (the reduced length of this pass's output); tree kernels only: G lanes per
// segment (`group`, a power of two up to 256), C items per part (`chunk`).

struct Params {
    outer: u32, // O
    len: u32,   // L
    inner: u32, // I
    parts: u32, // P
    x_off: u32,
    xi_off: u32,
    out_off: u32,
    outi_off: u32,
    flags: u32, // bit 0: indices come from `xi`
    group: u32, // G
    chunk: u32, // C
}

override OP: u32 = 0u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> xi: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read_write> x4: array<vec4<f32>>;

// Whether argmax candidate (v, iv) beats the best so far (a, ia): NaN beats any number, and
// between equals (two NaNs, or two equal values) the lower index wins, so the result is the
// first NaN or the first maximum however the axis was split into parts.
fn beats(v: f32, iv: u32, a: f32, ia: u32) -> bool {
    if is_nan(a) { return is_nan(v) && iv < ia; }
    if is_nan(v) { return true; }
    return v > a || (v == a && iv < ia);
}

// A running result: the value, and for argmax its index (none yet: 0xffffffff).
struct Acc {
    v: f32,
    i: u32,
}

fn acc_init() -> Acc {
    var a = Acc(0.0, 0xffffffffu);
    if OP == 1u || OP == 3u { a.v = bitcast<f32>(0xff800000u); }
    if OP == 2u { a.v = bitcast<f32>(0x7f800000u); }
    return a;
}

// Folds element `v` with index `iv` into `a`.
fn fold(a: Acc, v: f32, iv: u32) -> Acc {
    var r = a;
    switch OP {
        case 0u: { r.v += v; }
        case 1u: { if is_nan(v) || v > a.v { r.v = v; } }
        case 2u: { if is_nan(v) || v < a.v { r.v = v; } }
        default: { if beats(v, iv, a.v, a.i) { r = Acc(v, iv); } }
    }
    return r;
}

// Writes invocation `k`'s result: final with P = 1, else a partial (and its index).
fn finish(k: u32, a: Acc) {
    if p.parts == 1u {
        // An empty axis gives index 0, as the CPU reference does.
        out[p.out_off + k] = select(bitcast<u32>(a.v), select(a.i, 0u, a.i == 0xffffffffu), OP == 3u);
    } else {
        out[p.out_off + k] = bitcast<u32>(a.v);
        if OP == 3u { out[p.outi_off + k] = a.i; }
    }
}

@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = grid_index(gid, nwg, 64u);
    let per_row = p.parts * p.inner;
    if k >= p.outer * per_row { return; }
    let row = k / per_row;
    let q = (k % per_row) / p.inner;
    let col = k % p.inner;
    let step = p.parts * p.inner;
    var at = row * p.len * p.inner + q * p.inner + col;
    var a = acc_init();
    let indexed = (p.flags & 1u) != 0u;
    for (var j = q; j < p.len; j += p.parts) {
        // Only argmax reads an index (the compiler drops the load for the other ops).
        var iv = j;
        if OP == 3u && indexed { iv = xi[p.xi_off + at]; }
        a = fold(a, x[p.x_off + at], iv);
        at += step;
    }
    finish(k, a);
}

// The first pass over contiguous rows (I = 1) whose length and start are multiples of 4, four
// elements per step through the vec4 view `x4`: `p.len` and `p.x_off` count vec4s. CPU
// rasterizers load storage lane by lane, so a vec4 load costs about one f32 load.
@compute @workgroup_size(64)
fn reduce4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = grid_index(gid, nwg, 64u);
    if k >= p.outer * p.parts { return; }
    let row = k / p.parts;
    let q = k % p.parts;
    var a = acc_init();
    for (var j = q; j < p.len; j += p.parts) {
        let v = x4[p.x_off + row * p.len + j];
        a = fold(fold(fold(fold(a, v.x, 4u * j), v.y, 4u * j + 1u), v.z, 4u * j + 2u), v.w, 4u * j + 3u);
    }
    finish(k, a);
}

// The tree kernels: a workgroup of 256 invocations is split into segments of G lanes; segment s
// reduces part q = s % P of row s / P, items [q·C, min(L, (q + 1)·C)) ("items": f32s, or vec4s in
// `tree4`, where `p.len`, `p.chunk` and `p.x_off` count vec4s). Lane l folds items q·C + l,
// + G, ... (neighbouring lanes read neighbouring addresses; the host keeps C / G at most 32),
// then the lanes combine pairwise in workgroup memory, halving G in log2(G) steps: a fixed
// order, so results are deterministic. Lanes past the last segment fold nothing but still
// reach every barrier.
const TREE_WG: u32 = 256u;
var<workgroup> tv: array<f32, 256>;
var<workgroup> ti: array<u32, 256>;

// This lane's segment: its index `k` (its output word), row, range of items and lane.
struct Seg {
    k: u32,
    live: bool,
    row: u32,
    lo: u32,
    hi: u32,
    lane: u32,
}

fn segment(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> Seg {
    let k = (wid.y * nwg.x + wid.x) * (TREE_WG / p.group) + lid / p.group;
    let live = k < p.outer * p.parts;
    let q = k % p.parts;
    let lo = min(q * p.chunk, p.len);
    return Seg(k, live, k / p.parts, lo, min(lo + p.chunk, p.len), lid % p.group);
}

// This lane's fold of f32 items (indices from `xi` when `p.flags` bit 0 is set).
fn lane_fold(s: Seg) -> Acc {
    var a = acc_init();
    if !s.live { return a; }
    let indexed = (p.flags & 1u) != 0u;
    let base = s.row * p.len;
    for (var j = s.lo + s.lane; j < s.hi; j += p.group) {
        var iv = j;
        if OP == 3u && indexed { iv = xi[p.xi_off + base + j]; }
        a = fold(a, x[p.x_off + base + j], iv);
    }
    return a;
}

// This lane's fold of vec4 items: element indices 4j to 4j + 3.
fn lane_fold4(s: Seg) -> Acc {
    var a = acc_init();
    if !s.live { return a; }
    let base = p.x_off + s.row * p.len;
    for (var j = s.lo + s.lane; j < s.hi; j += p.group) {
        let v = x4[base + j];
        a = fold(fold(fold(fold(a, v.x, 4u * j), v.y, 4u * j + 1u), v.z, 4u * j + 2u), v.w, 4u * j + 3u);
    }
    return a;
}

// Combines the G lanes of each segment in workgroup memory; lane 0 writes the result.
fn tree_combine(lid: u32, s: Seg, a: Acc) {
    tv[lid] = a.v;
    ti[lid] = a.i;
    workgroupBarrier();
    for (var h = p.group / 2u; h > 0u; h >>= 1u) {
        if s.lane < h {
            let r = fold(Acc(tv[lid], ti[lid]), tv[lid + h], ti[lid + h]);
            tv[lid] = r.v;
            ti[lid] = r.i;
        }
        workgroupBarrier();
    }
    if s.lane == 0u && s.live { finish(s.k, Acc(tv[lid], ti[lid])); }
}

@compute @workgroup_size(256)
fn tree(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = segment(wid, nwg, lid);
    tree_combine(lid, s, lane_fold(s));
}

@compute @workgroup_size(256)
fn tree4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = segment(wid, nwg, lid);
    tree_combine(lid, s, lane_fold4(s));
}
