// attention.wgsl: the tiled causal attention kernels (FlashAttention's scheme) that hardware
// GPUs run, forward and backward; `FusedOp::Attention{,Backward}` with head size D <= DMAX.
//
// Shape letters: N matrices (batch × heads) of T rows (tokens), D values per row of q, k, v.
// Bindings (declared in fused_layout.wgsl, as transformer.wgsl's): 0 `p` parameters; 1..8
// `a1`..`a8`:
//   tiled_attention     a1 q, a2 k, a3 v, a4 o, all [N, T, D]; a5 lse [N, T]
//   tiled_attention_dq  a1 q, a2 k, a3 v, a4 o, a5 lse, a6 g, a7 dq, a8 delta [N, T] (written)
//   tiled_attention_dkv a1 q, a2 k, a3 v, a4 delta, a5 lse, a6 g, a7 dk, a8 dv
// `p.off` holds each binding's first element relative to its bound range.
// A workgroup of BR invocations owns BR consecutive rows of one matrix (query rows forward and
// for dq, key rows for dk and dv, so each output row has one writer: no atomics, the same bits
// every run) and streams the other side through workgroup memory in tiles of BC rows, each
// tile read from global memory once per workgroup instead of once per row. Causal: tiles
// wholly above the diagonal are never loaded, and in the diagonal tile each row stops at its
// own index. Per row the sums of the one-row-per-invocation kernels, in the same order.
// Every workgroup variable is written before it is read, and the entries' `tiled_` prefix
// turns off wgpu's zeroing of workgroup memory (naga's GL form of it, one array constructor
// per variable, took llvmpipe minutes to compile).
// Loops: at most T / BC + 1 tiles, BC rows per tile, D values (T < 65,535 and D <= DMAX are
// checked by the caller: Mesa's software drivers end any loop after 65,535 iterations).

const BR: u32 = 16u;
const BC: u32 = 8u;
const DMAX: u32 = 64u;
// Two tiles of BC rows × DMAX, and each owned row's accumulators (the output row, or dk and
// dv), DMAX apiece: 12 KiB in all of WebGPU's guaranteed 16 KiB. The accumulators live here
// rather than in variably indexed per-invocation arrays, which GPUs keep in local memory.
var<workgroup> t1: array<f32, 512>;
var<workgroup> t2: array<f32, 512>;
var<workgroup> acc: array<f32, 2048>; // [BR, 2, DMAX]

// This workgroup's (first row of its matrix, first owned row), or none past the last block;
// and this invocation's owned row: its index in the matrix (`own`), whether it exists (`live`:
// rows past T still join every barrier), and its row of all N·T (the last one when not live).
struct Block {
    base: u32,
    first: u32,
    ok: bool,
    own: u32,
    live: bool,
    row: u32,
}

fn block_of(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> Block {
    let t = p.cols;
    let blocks = (t + BR - 1u) / BR;
    let wgi = wid.y * nwg.x + wid.x;
    let base = (wgi / blocks) * t;
    let first = (wgi % blocks) * BR;
    let own = first + lid;
    return Block(base, first, wgi < (p.rows / t) * blocks, own, own < t, base + min(own, t - 1u));
}

// The key tiles the block's query rows see: up to the one holding its last row.
fn query_tiles(first: u32) -> u32 {
    return (min(first + BR, p.cols) - 1u) / BC + 1u;
}

// The rows of tile j0 of the matrix at `base` (up to BC, fewer at the end).
fn tile_rows(j0: u32) -> u32 {
    return min(BC, p.cols - j0);
}

// Loads k and v rows of tile j0 into t1 and t2 (a separate function from `load_qg`, so that
// the forward, which binds five buffers, uses only those).
fn load_kv(lid: u32, base: u32, j0: u32) {
    workgroupBarrier();
    for (var x = lid; x < tile_rows(j0) * p.d; x += BR) {
        t1[x] = a2[p.off[0].y + (base + j0) * p.d + x];
        t2[x] = a3[p.off[0].z + (base + j0) * p.d + x];
    }
    workgroupBarrier();
}

// Loads q and g rows of tile j0 into t1 and t2.
fn load_qg(lid: u32, base: u32, j0: u32) {
    workgroupBarrier();
    for (var x = lid; x < tile_rows(j0) * p.d; x += BR) {
        t1[x] = a1[p.off[0].x + (base + j0) * p.d + x];
        t2[x] = a6[p.off[1].y + (base + j0) * p.d + x];
    }
    workgroupBarrier();
}

// Keys of tile j0 that query row i sees: up to its own index.
fn keys_seen(live: bool, i: u32, j0: u32) -> u32 {
    if !live || i < j0 { return 0u; }
    return min(BC, i + 1u - j0);
}

// Forward: per query row the online softmax (running max m, sum l, output accumulator).
@compute @workgroup_size(BR)
fn tiled_attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let b = block_of(wid, nwg, lid.x);
    if !b.ok { return; }
    let d = p.d;
    let q0 = p.off[0].x + b.row * d;
    let a0 = lid.x * 2u * DMAX;
    for (var e = 0u; e < d; e++) { acc[a0 + e] = 0.0; }
    var m = neg_inf();
    var l = 0.0;
    for (var tile = 0u; tile < query_tiles(b.first); tile++) {
        let j0 = tile * BC;
        load_kv(lid.x, b.base, j0);
        for (var jj = 0u; jj < keys_seen(b.live, b.own, j0); jj++) {
            var s = 0.0;
            for (var e = 0u; e < d; e++) { s += a1[q0 + e] * t1[jj * d + e]; }
            s *= p.scale;
            let m_new = nan_max(m, s);
            // exp(-inf - -inf) is NaN: nothing has accumulated before the first key.
            var alpha = exp(m - m_new);
            if j0 + jj == 0u { alpha = 0.0; }
            let pr = exp(s - m_new);
            l = l * alpha + pr;
            for (var e = 0u; e < d; e++) { acc[a0 + e] = acc[a0 + e] * alpha + pr * t2[jj * d + e]; }
            m = m_new;
        }
    }
    if b.live {
        let o0 = p.off[0].w + b.row * d;
        for (var e = 0u; e < d; e++) { a4[o0 + e] = acc[a0 + e] / l; }
        a5[p.off[1].x + b.row] = m + log(l);
    }
}

// Per query row i: delta_i = g_i · o_i, then dq_i = scale Σ_{j<=i} p_ij (g_i·v_j - delta_i) k_j
// with p_ij = exp(q_i·k_j · scale - lse_i) recomputed from the tile.
@compute @workgroup_size(BR)
fn tiled_attention_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let b = block_of(wid, nwg, lid.x);
    if !b.ok { return; }
    let d = p.d;
    let q0 = p.off[0].x + b.row * d;
    let g0 = p.off[1].y + b.row * d;
    let a0 = lid.x * 2u * DMAX;
    var delta = 0.0;
    for (var e = 0u; e < d; e++) {
        acc[a0 + e] = 0.0;
        delta += a6[g0 + e] * a4[p.off[0].w + b.row * d + e];
    }
    let lse = a5[p.off[1].x + b.row];
    for (var tile = 0u; tile < query_tiles(b.first); tile++) {
        let j0 = tile * BC;
        load_kv(lid.x, b.base, j0);
        for (var jj = 0u; jj < keys_seen(b.live, b.own, j0); jj++) {
            var s = 0.0;
            var gv = 0.0;
            for (var e = 0u; e < d; e++) {
                s += a1[q0 + e] * t1[jj * d + e];
                gv += a6[g0 + e] * t2[jj * d + e];
            }
            let ds = exp(s * p.scale - lse) * (gv - delta);
            for (var e = 0u; e < d; e++) { acc[a0 + e] += ds * p.scale * t1[jj * d + e]; }
        }
    }
    if b.live {
        a8[p.off[1].w + b.row] = delta;
        for (var e = 0u; e < d; e++) { a7[p.off[1].z + b.row * d + e] = acc[a0 + e]; }
    }
}

// Per key row j: dk_j = scale Σ_{i>=j} ds_ij q_i and dv_j = Σ_{i>=j} p_ij g_i, over the query
// tiles from the one holding the block's first key to the end, with delta from the dq pass.
@compute @workgroup_size(BR)
fn tiled_attention_dkv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let b = block_of(wid, nwg, lid.x);
    if !b.ok { return; }
    let t = p.cols;
    let d = p.d;
    let k0 = p.off[0].y + b.row * d;
    let v0 = p.off[0].z + b.row * d;
    // dk at acc[dk0..], dv DMAX further.
    let dk0 = lid.x * 2u * DMAX;
    for (var e = 0u; e < d; e++) {
        acc[dk0 + e] = 0.0;
        acc[dk0 + DMAX + e] = 0.0;
    }
    for (var tile = b.first / BC; tile <= (t - 1u) / BC; tile++) {
        let i0 = tile * BC;
        load_qg(lid.x, b.base, i0);
        var lo = BC;
        if b.live && b.own < i0 + BC { lo = max(b.own, i0) - i0; }
        let to = tile_rows(i0);
        for (var ii = lo; ii < to; ii++) {
            var s = 0.0;
            var gv = 0.0;
            for (var e = 0u; e < d; e++) {
                s += t1[ii * d + e] * a2[k0 + e];
                gv += t2[ii * d + e] * a3[v0 + e];
            }
            let pr = exp(s * p.scale - a5[p.off[1].x + b.base + i0 + ii]);
            let ds = pr * (gv - a4[p.off[0].w + b.base + i0 + ii]);
            for (var e = 0u; e < d; e++) {
                acc[dk0 + e] += ds * p.scale * t1[ii * d + e];
                acc[dk0 + DMAX + e] += pr * t2[ii * d + e];
            }
        }
    }
    if b.live {
        for (var e = 0u; e < d; e++) {
            a7[p.off[1].z + b.row * d + e] = acc[dk0 + e];
            a8[p.off[1].w + b.row * d + e] = acc[dk0 + DMAX + e];
        }
    }
}
