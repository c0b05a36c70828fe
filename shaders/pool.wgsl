// pool.wgsl: 2-D max pooling and its gradient.
//
// forward: one invocation per output, out = max over the window (padding excluded), argmax =
// y*W + x of the first maximum in its plane, or -1 (and out 0) when the window is all padding.
// backward: one invocation per input pixel, summing grad_out over the windows covering it whose
// argmax is this pixel, in output order: deterministic, no atomics.
// backward_tiled: windows that tile the input exactly (stride = window, no padding, H = OH*KH,
// W = OW*KW) cover every pixel once, so one invocation per output writes its whole window:
// grad_out at the argmax, 0 elsewhere. A quarter of the invocations and divisions for 2×2.
// forward_2x2, backward_2x2: the 2×2, stride-2 case of those (W a multiple of 4), two outputs
// per invocation through vec4/vec2 views: CPU rasterizers access storage lane by lane, so
// fewer, wider accesses halve the time.
// Bindings: 0 `p` parameters; 1 `x` input or grad_x [N*C, H, W]; 2 `out` output or grad_out
// [N*C, OH, OW]; 3 `arg` argmax (i32) [N*C, OH, OW]; `x4`, `out2`, `arg2` the same as vectors.
// Shape letters: P = N*C planes in this chunk, H×W input, KH×KW window, SH/SW stride, PH/PW
// padding, OH×OW output.

struct Params {
    planes: u32, // P
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
    out_off: u32,
    arg_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> arg: array<i32>;
@group(0) @binding(1) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out2: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> arg2: array<vec2<i32>>;

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = grid_index(gid, nwg, 256u);
    if o >= p.planes * p.oh * p.ow { return; }
    let ox = o % p.ow;
    let oy = (o / p.ow) % p.oh;
    let plane = o / (p.ow * p.oh);
    let base = p.x_off + plane * p.h * p.w;
    var best = 0.0;
    var at = -1;
    for (var i = 0u; i < p.kh; i++) {
        let y = i32(oy * p.sh + i) - i32(p.ph);
        if y < 0 || y >= i32(p.h) { continue; }
        for (var j = 0u; j < p.kw; j++) {
            let xx = i32(ox * p.sw + j) - i32(p.pw);
            if xx < 0 || xx >= i32(p.w) { continue; }
            let pos = y * i32(p.w) + xx;
            let v = x[base + u32(pos)];
            if at < 0 || v > best || is_nan(v) {
                best = v;
                at = pos;
            }
        }
    }
    out[p.out_off + o] = best;
    arg[p.arg_off + o] = at;
}

@compute @workgroup_size(256)
fn backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = grid_index(gid, nwg, 256u);
    if e >= p.planes * p.h * p.w { return; }
    let xx = e % p.w;
    let y = (e / p.w) % p.h;
    let plane = e / (p.w * p.h);
    let pos = i32(y * p.w + xx);
    // Windows oy with oy*SH - PH <= y < oy*SH - PH + KH.
    let ty = y + p.ph;
    let tx = xx + p.pw;
    let oy0 = select(0u, (ty + 1u - p.kh + p.sh - 1u) / p.sh, ty + 1u > p.kh);
    let ox0 = select(0u, (tx + 1u - p.kw + p.sw - 1u) / p.sw, tx + 1u > p.kw);
    let oy1 = min(ty / p.sh + 1u, p.oh);
    let ox1 = min(tx / p.sw + 1u, p.ow);
    let ob = plane * p.oh * p.ow;
    var acc = 0.0;
    for (var oy = oy0; oy < oy1; oy++) {
        for (var ox = ox0; ox < ox1; ox++) {
            let o = ob + oy * p.ow + ox;
            if arg[p.arg_off + o] == pos { acc += out[p.out_off + o]; }
        }
    }
    x[p.x_off + e] = acc;
}

@compute @workgroup_size(256)
fn backward_tiled(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = grid_index(gid, nwg, 256u);
    if o >= p.planes * p.oh * p.ow { return; }
    let q = o / p.ow;
    let ox = o - q * p.ow;
    let plane = q / p.oh;
    let oy = q - plane * p.oh;
    let g = 0.0 + out[p.out_off + o];
    let at = arg[p.arg_off + o];
    let base = p.x_off + plane * p.h * p.w;
    for (var i = 0u; i < p.kh; i++) {
        let row = (oy * p.kh + i) * p.w + ox * p.kw;
        for (var j = 0u; j < p.kw; j++) {
            let pos = row + j;
            x[base + pos] = select(0.0, g, i32(pos) == at);
        }
    }
}

// The running maximum of a window in scan order: the first maximum, and a NaN wins (as in the
// scalar kernels and the CPU reference).
struct Best {
    v: f32,
    at: i32,
}

fn better(b: Best, v: f32, at: i32) -> Best {
    if v > b.v || is_nan(v) { return Best(v, at); }
    return b;
}

// The pair of outputs (`q` = pair index in the row) of row `row` (= plane·OH + oy): the vec4
// index of their top input row and the input position of its first pixel in the plane.
struct Pair {
    top: u32,
    pos: i32,
    out: u32,
}

fn pair(o2: u32) -> Pair {
    let ow2 = p.ow / 2u;
    let row = o2 / ow2;
    let q = o2 - row * ow2;
    let plane = row / p.oh;
    let oy = row - plane * p.oh;
    let pos = (2u * oy) * p.w + 4u * q;
    return Pair((p.x_off + plane * p.h * p.w + pos) / 4u, i32(pos), row * ow2 + q);
}

@compute @workgroup_size(256)
fn forward_2x2(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o2 = grid_index(gid, nwg, 256u);
    if o2 >= p.planes * p.oh * (p.ow / 2u) { return; }
    let s = pair(o2);
    let w = i32(p.w);
    let a = x4[s.top];
    let b = x4[s.top + p.w / 4u];
    let l = better(better(better(Best(a.x, s.pos), a.y, s.pos + 1), b.x, s.pos + w), b.y, s.pos + w + 1);
    let r = better(better(better(Best(a.z, s.pos + 2), a.w, s.pos + 3), b.z, s.pos + w + 2), b.w, s.pos + w + 3);
    out2[p.out_off / 2u + s.out] = vec2<f32>(l.v, r.v);
    arg2[p.arg_off / 2u + s.out] = vec2<i32>(l.at, r.at);
}

@compute @workgroup_size(256)
fn backward_2x2(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o2 = grid_index(gid, nwg, 256u);
    if o2 >= p.planes * p.oh * (p.ow / 2u) { return; }
    let s = pair(o2);
    let g = out2[p.out_off / 2u + s.out];
    let at = arg2[p.arg_off / 2u + s.out] - vec2<i32>(s.pos);
    let w = i32(p.w);
    let zero = vec4<f32>(0.0);
    x4[s.top] = select(zero, vec4<f32>(g.x, g.x, g.y, g.y), vec4<i32>(at.x, at.x - 1, at.y - 2, at.y - 3) == vec4<i32>(0));
    x4[s.top + p.w / 4u] = select(zero, vec4<f32>(g.x, g.x, g.y, g.y), vec4<i32>(at.x - w, at.x - w - 1, at.y - w - 2, at.y - w - 3) == vec4<i32>(0));
}
