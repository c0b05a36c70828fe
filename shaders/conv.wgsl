// conv.wgsl: im2col and its adjoint col2im, the data movement around a convolution's matmul.
//
// im2col: cols[n, r, q] = x[n, ci, y, x] with
// r = (ci*KH + i)*KW + j, q = oy*OW + ox, y = oy*SH + i - PH, x = ox*SW + j - PW (0 in padding).
// im2col takes one invocation per group of KW column row segments and slice of at most OC
// output columns (`workgroup_id.z` is the slice), so that no loop runs past the 65,535
// iterations after which Mesa's software drivers end it, however wide the image.
// col2im: one invocation per input pixel, summing the column entries that read it in the order
// of r, so the result is deterministic and needs no atomics.
// Bindings: 0 `p` parameters; 1 `x` image [N, C, H, W] (`x4` the same as vec4); 2 `cols`
// [N, C*KH*KW, OH*OW] (`cols4` the same as vec4).
// Shape letters: N images in this chunk, C channels, H×W input, KH×KW window, SH/SW stride,
// PH/PW padding, OH×OW output positions, OC output columns per im2col slice (a multiple of 4).

struct Params {
    n: u32,
    c: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    oh: u32,
    ow: u32,
    x_off: u32,
    cols_off: u32,
    oc: u32, // OC
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> cols: array<f32>;
@group(0) @binding(2) var<storage, read_write> cols4: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> x4: array<vec4<f32>>;

// The KW column row segments (n, r, oy) of im2col with r = (ci·KH + i)·KW + j, j = 0..KW-1:
// they read one input row (`src`; `inside` false when that row is padding) and write their OW
// outputs at `dst + j·OH·OW` (element indices); segment j's output 0 reads input column
// j - PW (`x0` for j = 0, may be negative).
struct ColRow {
    dst: u32,
    src: u32,
    inside: bool,
    x0: i32,
}

// a / d without integer division, which CPU rasterizers do lane by lane at tens of cycles
// each: a float estimate, refined once from the remainder, then corrected by one. Exact for
// every a and 0 < d < 2^20 (the first remainder stays within ±2^11·d).
fn udiv(a: u32, d: u32) -> u32 {
    let fd = f32(d);
    var q = u32(f32(a) / fd);
    q = u32(i32(q) + i32(f32(i32(a - q * d)) / fd));
    let r = i32(a - q * d);
    if r < 0 { q -= 1u; }
    if r >= i32(d) { q += 1u; }
    return q;
}

// The index arithmetic of segment group `e` = (n·C·KH + ci·KH + i)·OH + oy, done once per
// KW·OW outputs.
fn col_row(e: u32) -> ColRow {
    let t = udiv(e, p.oh);
    let oy = e - t * p.oh;
    let img = udiv(t, p.c * p.kh);
    let cki = t - img * p.c * p.kh;
    let ci = udiv(cki, p.kh);
    let i = cki - ci * p.kh;
    let y = i32(oy * p.sh + i) - i32(p.ph);
    var s: ColRow;
    s.dst = p.cols_off + ((img * p.c * p.kh + cki) * p.kw * p.oh + oy) * p.ow;
    s.inside = y >= 0 && y < i32(p.h);
    s.src = p.x_off + ((img * p.c + ci) * p.h + u32(max(y, 0))) * p.w;
    s.x0 = -i32(p.pw);
    return s;
}

// The output columns [start, end) of im2col slice `z`.
fn col_slice(z: u32) -> vec2<u32> {
    let start = z * p.oc;
    return vec2<u32>(start, min(start + p.oc, p.ow));
}

// x at column `xx` of the row starting at `src`, 0 outside [0, W).
fn pixel(src: u32, xx: i32) -> f32 {
    var v = 0.0;
    if xx >= 0 && xx < i32(p.w) { v = x[src + u32(xx)]; }
    return v;
}

// One invocation per group of KW column row segments and slice, looping over j and ox.
@compute @workgroup_size(64)
fn im2col(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 64u);
    if e >= p.n * p.c * p.kh * p.oh { return; }
    let s = col_row(e);
    let cs = col_slice(gid.z);
    for (var j = 0u; j < p.kw; j++) {
        let dst = s.dst + j * p.oh * p.ow;
        for (var ox = cs.x; ox < cs.y; ox++) {
            var v = 0.0;
            if s.inside { v = pixel(s.src, s.x0 + i32(j + ox * p.sw)); }
            cols[dst + ox] = v;
        }
    }
}

// `im2col` storing four columns at a time, for OW a multiple of 4 and a 16-byte aligned `cols`
// range: CPU rasterizers store lane by lane, so a vec4 store costs about one f32 store.
@compute @workgroup_size(64)
fn im2col4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 64u);
    if e >= p.n * p.c * p.kh * p.oh { return; }
    let s = col_row(e);
    let sw = i32(p.sw);
    let cs = col_slice(gid.z) / 4u;
    for (var j = 0u; j < p.kw; j++) {
        let dst = (s.dst + j * p.oh * p.ow) / 4u;
        let x0 = s.x0 + i32(j);
        for (var q = cs.x; q < cs.y; q++) {
            var v = vec4<f32>(0.0);
            if s.inside {
                let xx = x0 + i32(q * 4u) * sw;
                v = vec4<f32>(pixel(s.src, xx), pixel(s.src, xx + sw), pixel(s.src, xx + 2 * sw), pixel(s.src, xx + 3 * sw));
            }
            cols4[dst + q] = v;
        }
    }
}

// Quad `v` (4 consecutive columns) of the input row whose first quad is `src4`, 0 outside the
// row's W / 4 quads (W a multiple of 4).
fn quad(src4: u32, v: i32) -> vec4<f32> {
    var q = vec4<f32>(0.0);
    if v >= 0 && v < i32(p.w / 4u) { q = x4[src4 + u32(v)]; }
    return q;
}

// Elements `s`..`s`+3 of the eight a.x..a.w, b.x..b.w (0 <= s < 4).
fn window4(a: vec4<f32>, b: vec4<f32>, s: u32) -> vec4<f32> {
    let s1 = vec4<f32>(a.yzw, b.x);
    let s2 = vec4<f32>(a.zw, b.xy);
    let s3 = vec4<f32>(a.w, b.xyz);
    return select(select(select(a, s1, s == 1u), s2, s == 2u), s3, s == 3u);
}

// `im2col4` for horizontal stride 1, W a multiple of 4 and a 16-byte aligned `x` range: each
// output vec4 is a shifted window of two input quads, and consecutive outputs share one, so it
// takes one vec4 load where `im2col4` takes four scalar loads (CPU rasterizers load lane by lane).
@compute @workgroup_size(64)
fn im2col_s1(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 64u);
    if e >= p.n * p.c * p.kh * p.oh { return; }
    let s = col_row(e);
    let src4 = s.src / 4u;
    let cs = col_slice(gid.z) / 4u;
    for (var j = 0u; j < p.kw; j++) {
        let dst = (s.dst + j * p.oh * p.ow) / 4u;
        // Output 0 of this segment reads column x0: quad x0 >> 2 (floor), shifted by x0 & 3.
        let x0 = s.x0 + i32(j);
        let v0 = x0 >> 2u;
        let shift = u32(x0 & 3);
        if !s.inside {
            for (var q = cs.x; q < cs.y; q++) { cols4[dst + q] = vec4<f32>(0.0); }
            continue;
        }
        var a = quad(src4, v0 + i32(cs.x));
        for (var q = cs.x; q < cs.y; q++) {
            let b = quad(src4, v0 + i32(q) + 1);
            cols4[dst + q] = window4(a, b, shift);
            a = b;
        }
    }
}

@compute @workgroup_size(256)
fn col2im(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 256u);
    if e >= p.n * p.c * p.h * p.w { return; }
    let t = udiv(e, p.w);
    let xx = e - t * p.w;
    let plane = udiv(t, p.h);
    let y = t - plane * p.h;
    let img = udiv(plane, p.c);
    let ci = plane - img * p.c;
    let cl = p.oh * p.ow;
    let rows = p.c * p.kh * p.kw;
    if cl == 0u {
        x[p.x_off + e] = 0.0;
        return;
    }
    // Window offsets i with (ty - i) a multiple of SH and oy = (ty - i) / SH < OH, ascending:
    // start at the largest valid oy and step oy down by one as i steps up by SH (no division in
    // the loops; integer division is slow on CPU rasterizers).
    let ty = y + p.ph;
    let tx = xx + p.pw;
    let oy_hi = min(ty / p.sh, p.oh - 1u);
    let ox_hi = min(tx / p.sw, p.ow - 1u);
    let i0 = ty - oy_hi * p.sh;
    let j0 = tx - ox_hi * p.sw;
    let base = p.cols_off + img * rows * cl;
    var acc = 0.0;
    var oy = oy_hi;
    for (var i = i0; i < p.kh && i <= ty; i += p.sh) {
        var ox = ox_hi;
        for (var j = j0; j < p.kw && j <= tx; j += p.sw) {
            let r = (ci * p.kh + i) * p.kw + j;
            acc += cols[base + r * cl + oy * p.ow + ox];
            ox -= 1u;
        }
        oy -= 1u;
    }
    x[p.x_off + e] = acc;
}
