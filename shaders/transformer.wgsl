// transformer.wgsl: the fused transformer kernels (`FusedOp`): LayerNorm forward and backward,
// softmax under a causal mask forward and backward, causal attention forward and backward.
//
// Shape letters: R rows of C values (LayerNorm); N matrices (batch × heads) of T rows (tokens),
// D values per row of q, k, v (head size); B = ceil(R / 256) row blocks of LayerNorm partials.
// Bindings (declared in fused_layout.wgsl): 0 `p` parameters; 1..8 `a1`..`a8` storage
// buffers whose meaning is the entry's:
//   layer_norm        a1 x [R, C], a2 w [C], a3 b [C], a4 y [R, C], a5 mean [R], a6 rstd [R]
//   layer_norm_dx     a1 g [R, C], a2 x, a3 w, a4 mean, a5 rstd, a6 dx [R, C]
//   layer_norm_dwb    the same, then a7 dw partials [B, C], a8 db partials [B, C]
//   (entries ending `_1` are the row kernels' one-invocation-per-row forms, same bindings)
//   causal_softmax    a1 x [N, T, T], a2 y [N, T, T]
//   causal_softmax_dx a1 g, a2 y, a3 dx, all [N, T, T]
//   attention         a1 q, a2 k, a3 v, a4 o, all [N, T, D]; a5 lse [N, T]
//   attention_dq      a1 q, a2 k, a3 v, a4 o, a5 lse, a6 g, a7 dq, a8 delta [N, T] (written)
//   attention_dkv     a1 q, a2 k, a3 v, a4 delta, a5 lse, a6 g, a7 dk, a8 dv
// `p.off` holds each binding's first element relative to its bound range.
// Row kernels come in two forms: a workgroup of 256 per row (hardware GPUs), and one
// invocation per row (`_1`, software rasterizers, which run a workgroup barrier as a switch
// through every invocation: 10-30x slower there), for rows shorter than 65,535.
// Loops: row loops stride by the 256 invocations of a workgroup (C / 256 iterations); key and
// query loops run at most T times and D loops D times: Rust refuses T or D of 65,535 or more
// (Mesa's software drivers end any loop after 65,535 iterations). Workgroup reductions are
// tree sums in a fixed order, so every result is the same bits on every run.

const WG: u32 = 256u;
var<workgroup> red: array<f32, 256>;

// The sum (or with `is_max` the NaN-propagating maximum) of `v` over the workgroup, in a fixed
// tree order; every invocation gets it.
fn wg_reduce(lid: u32, v: f32, is_max: bool) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            if is_max { red[lid] = nan_max(red[lid], red[lid + s]); } else { red[lid] += red[lid + s]; }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn row_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// The row kernels' passes, shared by their two forms: each takes columns j0, j0 + step, ... of
// the row (a workgroup lane's share, or with j0 = 0 and step = 1 the whole row, in order). The
// sums are this share's partial; the workgroup form reduces them with `wg_reduce`.
// LayerNorm: Σ x, then Σ (x - mean)².
fn layer_norm_sum(row: u32, j0: u32, step: u32) -> f32 {
    let x0 = p.off[0].x + row * p.cols;
    var s = 0.0;
    for (var j = j0; j < p.cols; j += step) { s += a1[x0 + j]; }
    return s;
}

fn layer_norm_sq(row: u32, mean: f32, j0: u32, step: u32) -> f32 {
    let x0 = p.off[0].x + row * p.cols;
    var q = 0.0;
    for (var j = j0; j < p.cols; j += step) {
        let c = a1[x0 + j] - mean;
        q += c * c;
    }
    return q;
}

// LayerNorm's backward: (Σ g·w, Σ g·w·x̂).
fn layer_norm_dx_sums(row: u32, mean: f32, rstd: f32, j0: u32, step: u32) -> vec2<f32> {
    let g0 = p.off[0].x + row * p.cols;
    let x0 = p.off[0].y + row * p.cols;
    var sa = 0.0;
    var sc = 0.0;
    for (var j = j0; j < p.cols; j += step) {
        let gw = a1[g0 + j] * a3[p.off[0].z + j];
        sa += gw;
        sc += gw * ((a2[x0 + j] - mean) * rstd);
    }
    return vec2<f32>(sa, sc);
}

// Causal softmax of row i (of its matrix): the NaN-propagating max of the scaled scores j <= i,
// then Σ exp(z - m).
fn causal_softmax_max(row: u32, j0: u32, step: u32) -> f32 {
    let i = row % p.cols;
    let x0 = p.off[0].x + row * p.cols;
    var m = neg_inf();
    for (var j = j0; j <= i; j += step) { m = nan_max(m, a1[x0 + j] * p.scale); }
    return m;
}

fn causal_softmax_sum(row: u32, m: f32, j0: u32, step: u32) -> f32 {
    let i = row % p.cols;
    let x0 = p.off[0].x + row * p.cols;
    var s = 0.0;
    for (var j = j0; j <= i; j += step) { s += exp(a1[x0 + j] * p.scale - m); }
    return s;
}

// Its backward: Σ g·y over j <= i.
fn causal_softmax_dot(row: u32, j0: u32, step: u32) -> f32 {
    let i = row % p.cols;
    let g0 = p.off[0].x + row * p.cols;
    let y0 = p.off[0].y + row * p.cols;
    var s = 0.0;
    for (var j = j0; j <= i; j += step) { s += a1[g0 + j] * a2[y0 + j]; }
    return s;
}

// Their last passes, from the row's sums over the same columns.
// LayerNorm: y = (x - mean)·rstd·w + b.
fn layer_norm_out(row: u32, mean: f32, rstd: f32, j0: u32, step: u32) {
    let x0 = p.off[0].x + row * p.cols;
    let y0 = p.off[0].w + row * p.cols;
    for (var j = j0; j < p.cols; j += step) {
        a4[y0 + j] = (a1[x0 + j] - mean) * rstd * a2[p.off[0].y + j] + a3[p.off[0].z + j];
    }
}

// LayerNorm's dx = rstd·(g·w - a - x̂·c), a = mean(g·w), c = mean(g·w·x̂).
fn layer_norm_dx_out(row: u32, mean: f32, rstd: f32, a: f32, c: f32, j0: u32, step: u32) {
    let g0 = p.off[0].x + row * p.cols;
    let x0 = p.off[0].y + row * p.cols;
    let d0 = p.off[1].y + row * p.cols;
    for (var j = j0; j < p.cols; j += step) {
        let xhat = (a2[x0 + j] - mean) * rstd;
        a6[d0 + j] = rstd * (a1[g0 + j] * a3[p.off[0].z + j] - a - xhat * c);
    }
}

// Causal softmax: y = exp(z - m) / s with z = -inf above the diagonal (max m, sum s).
fn causal_softmax_out(row: u32, m: f32, s: f32, j0: u32, step: u32) {
    let t = p.cols;
    let i = row % t;
    let x0 = p.off[0].x + row * t;
    let y0 = p.off[0].y + row * t;
    for (var j = j0; j < t; j += step) {
        var z = neg_inf();
        if j <= i { z = a1[x0 + j] * p.scale; }
        a2[y0 + j] = exp(z - m) / s;
    }
}

// Its dx = scale·y·(g - dot) on and below the diagonal, 0 above (dot = Σ g·y).
fn causal_softmax_dx_out(row: u32, dot: f32, j0: u32, step: u32) {
    let t = p.cols;
    let i = row % t;
    let g0 = p.off[0].x + row * t;
    let y0 = p.off[0].y + row * t;
    let d0 = p.off[0].z + row * t;
    for (var j = j0; j < t; j += step) {
        var v = 0.0;
        if j <= i { v = p.scale * a2[y0 + j] * (a1[g0 + j] - dot); }
        a3[d0 + j] = v;
    }
}

// One workgroup per row: mean, then the variance about it (two passes, as the reference).
@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = row_of(wid, nwg);
    if row >= p.rows { return; }
    let mean = wg_reduce(lid.x, layer_norm_sum(row, lid.x, WG), false) / f32(p.cols);
    let rstd = 1.0 / sqrt(wg_reduce(lid.x, layer_norm_sq(row, mean, lid.x, WG), false) / f32(p.cols) + p.eps);
    layer_norm_out(row, mean, rstd, lid.x, WG);
    if lid.x == 0u {
        a5[p.off[1].x + row] = mean;
        a6[p.off[1].y + row] = rstd;
    }
}

// dx = rstd · (g·w - mean(g·w) - x̂ · mean(g·w·x̂)), one workgroup per row.
@compute @workgroup_size(256)
fn layer_norm_dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = row_of(wid, nwg);
    if row >= p.rows { return; }
    let mean = a4[p.off[0].w + row];
    let rstd = a5[p.off[1].x + row];
    let sums = layer_norm_dx_sums(row, mean, rstd, lid.x, WG);
    let a = wg_reduce(lid.x, sums.x, false) / f32(p.cols);
    let c = wg_reduce(lid.x, sums.y, false) / f32(p.cols);
    layer_norm_dx_out(row, mean, rstd, a, c, lid.x, WG);
}

// One invocation per (row block, column): Σ g·x̂ and Σ g over the block's rows, in order.
@compute @workgroup_size(256)
fn layer_norm_dwb(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = grid_index(gid, nwg, WG);
    if k >= p.blocks * p.cols { return; }
    let blk = k / p.cols;
    let j = k % p.cols;
    let end = min(p.rows, (blk + 1u) * WG);
    var sw = 0.0;
    var sb = 0.0;
    for (var r = blk * WG; r < end; r++) {
        let g = a1[p.off[0].x + r * p.cols + j];
        sw += g * ((a2[p.off[0].y + r * p.cols + j] - a4[p.off[0].w + r]) * a5[p.off[1].x + r]);
        sb += g;
    }
    a7[p.off[1].z + k] = sw;
    a8[p.off[1].w + k] = sb;
}

// One workgroup per row i of a T × T matrix: columns j <= i are scaled scores, the others -inf,
// so that y = exp(z - max) / Σ is NaN throughout a row whose max is NaN or ±inf (as the
// composition and PyTorch give) and 0 above the diagonal otherwise.
@compute @workgroup_size(256)
fn causal_softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = row_of(wid, nwg);
    if row >= p.rows { return; }
    let m = wg_reduce(lid.x, causal_softmax_max(row, lid.x, WG), true);
    let s = wg_reduce(lid.x, causal_softmax_sum(row, m, lid.x, WG), false);
    causal_softmax_out(row, m, s, lid.x, WG);
}

// dx = scale · y · (g - Σ g·y) on and below the diagonal, 0 above.
@compute @workgroup_size(256)
fn causal_softmax_dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = row_of(wid, nwg);
    if row >= p.rows { return; }
    let dot = wg_reduce(lid.x, causal_softmax_dot(row, lid.x, WG), false);
    causal_softmax_dx_out(row, dot, lid.x, WG);
}

// The row kernels with one invocation per row (rows shorter than 65,535): the same sums,
// taken in order along the row.
@compute @workgroup_size(64)
fn layer_norm_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = grid_index(gid, nwg, 64u);
    if row >= p.rows { return; }
    let mean = layer_norm_sum(row, 0u, 1u) / f32(p.cols);
    let rstd = 1.0 / sqrt(layer_norm_sq(row, mean, 0u, 1u) / f32(p.cols) + p.eps);
    layer_norm_out(row, mean, rstd, 0u, 1u);
    a5[p.off[1].x + row] = mean;
    a6[p.off[1].y + row] = rstd;
}

@compute @workgroup_size(64)
fn layer_norm_dx_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = grid_index(gid, nwg, 64u);
    if row >= p.rows { return; }
    let mean = a4[p.off[0].w + row];
    let rstd = a5[p.off[1].x + row];
    let sums = layer_norm_dx_sums(row, mean, rstd, 0u, 1u);
    let a = sums.x / f32(p.cols);
    let c = sums.y / f32(p.cols);
    layer_norm_dx_out(row, mean, rstd, a, c, 0u, 1u);
}

@compute @workgroup_size(64)
fn causal_softmax_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = grid_index(gid, nwg, 64u);
    if row >= p.rows { return; }
    let m = causal_softmax_max(row, 0u, 1u);
    let s = causal_softmax_sum(row, m, 0u, 1u);
    causal_softmax_out(row, m, s, 0u, 1u);
}

@compute @workgroup_size(64)
fn causal_softmax_dx_1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = grid_index(gid, nwg, 64u);
    if row >= p.rows { return; }
    let dot = causal_softmax_dot(row, 0u, 1u);
    causal_softmax_dx_out(row, dot, 0u, 1u);
}

// One invocation per query row: keys 0..=i in order with an online softmax (running max m,
// sum l, and the output row, kept in `o` itself, rescaled by exp(m_old - m_new)).
@compute @workgroup_size(64)
fn attention(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = grid_index(gid, nwg, 64u);
    if row >= p.rows { return; }
    let t = p.cols;
    let d = p.d;
    let base = row - row % t;
    let q0 = p.off[0].x + row * d;
    let o0 = p.off[0].w + row * d;
    var m = neg_inf();
    var l = 0.0;
    for (var e = 0u; e < d; e++) { a4[o0 + e] = 0.0; }
    for (var j = 0u; j <= row % t; j++) {
        let k0 = p.off[0].y + (base + j) * d;
        let v0 = p.off[0].z + (base + j) * d;
        var s = 0.0;
        for (var e = 0u; e < d; e++) { s += a1[q0 + e] * a2[k0 + e]; }
        s *= p.scale;
        let m_new = nan_max(m, s);
        // exp(-inf - -inf) is NaN: nothing has accumulated before the first key.
        var alpha = exp(m - m_new);
        if j == 0u { alpha = 0.0; }
        let pr = exp(s - m_new);
        l = l * alpha + pr;
        for (var e = 0u; e < d; e++) { a4[o0 + e] = a4[o0 + e] * alpha + pr * a3[v0 + e]; }
        m = m_new;
    }
    for (var e = 0u; e < d; e++) { a4[o0 + e] = a4[o0 + e] / l; }
    a5[p.off[1].x + row] = m + log(l);
}

// The weight of key j for query row i, recomputed: exp(q_i·k_j · scale - lse_i).
fn prob(qrow: u32, krow: u32) -> f32 {
    let q0 = p.off[0].x + qrow * p.d;
    let k0 = p.off[0].y + krow * p.d;
    var s = 0.0;
    for (var e = 0u; e < p.d; e++) { s += a1[q0 + e] * a2[k0 + e]; }
    return exp(s * p.scale - a5[p.off[1].x + qrow]);
}

// g_i · v_j
fn g_dot_v(qrow: u32, krow: u32) -> f32 {
    let g0 = p.off[1].y + qrow * p.d;
    let v0 = p.off[0].z + krow * p.d;
    var s = 0.0;
    for (var e = 0u; e < p.d; e++) { s += a6[g0 + e] * a3[v0 + e]; }
    return s;
}

// One invocation per query row i: delta_i = g_i · o_i, then dq_i = scale Σ_{j<=i} ds_ij k_j.
@compute @workgroup_size(64)
fn attention_dq(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = grid_index(gid, nwg, 64u);
    if row >= p.rows { return; }
    let d = p.d;
    let base = row - row % p.cols;
    let g0 = p.off[1].y + row * d;
    let o0 = p.off[0].w + row * d;
    var delta = 0.0;
    for (var e = 0u; e < d; e++) { delta += a6[g0 + e] * a4[o0 + e]; }
    a8[p.off[1].w + row] = delta;
    let dq0 = p.off[1].z + row * d;
    for (var e = 0u; e < d; e++) { a7[dq0 + e] = 0.0; }
    for (var j = 0u; j <= row % p.cols; j++) {
        let ds = prob(row, base + j) * (g_dot_v(row, base + j) - delta);
        let k0 = p.off[0].y + (base + j) * d;
        for (var e = 0u; e < d; e++) { a7[dq0 + e] += ds * p.scale * a2[k0 + e]; }
    }
}

// One invocation per key row j: dk_j = scale Σ_{i>=j} ds_ij q_i, dv_j = Σ_{i>=j} p_ij g_i,
// with delta (a4) from `attention_dq`.
@compute @workgroup_size(64)
fn attention_dkv(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = grid_index(gid, nwg, 64u);
    if row >= p.rows { return; }
    let d = p.d;
    let base = row - row % p.cols;
    let dk0 = p.off[1].z + row * d;
    let dv0 = p.off[1].w + row * d;
    for (var e = 0u; e < d; e++) {
        a7[dk0 + e] = 0.0;
        a8[dv0 + e] = 0.0;
    }
    for (var i = row % p.cols; i < p.cols; i++) {
        let pr = prob(base + i, row);
        let ds = pr * (g_dot_v(base + i, row) - a4[p.off[0].w + base + i]);
        let q0 = p.off[0].x + (base + i) * d;
        let g0 = p.off[1].y + (base + i) * d;
        for (var e = 0u; e < d; e++) {
            a7[dk0 + e] += ds * p.scale * a1[q0 + e];
            a8[dv0 + e] += pr * a6[g0 + e];
        }
    }
}
