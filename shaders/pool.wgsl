// pool.wgsl: 2-D max pooling and its gradient.
//
// forward: one invocation per output, out = max over the window (padding excluded), argmax =
// y*W + x of the first maximum in its plane, or -1 (and out 0) when the window is all padding.
// backward: one invocation per input pixel, summing grad_out over the windows covering it whose
// argmax is this pixel, in output order: deterministic, no atomics.
// backward_tiled: windows that tile the input exactly (stride = window, no padding, H = OH*KH,
// W = OW*KW) cover every pixel once, so one invocation per output writes its whole window:
// grad_out at the argmax, 0 elsewhere. A quarter of the invocations and divisions for 2×2.
// Bindings: 0 `p` parameters; 1 `x` input or grad_x [N*C, H, W]; 2 `out` output or grad_out
// [N*C, OH, OW]; 3 `arg` argmax (i32) [N*C, OH, OW].
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

@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = gid.y * nwg.x * 256u + gid.x;
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
            if at < 0 || v > best || v != v {
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
    let e = gid.y * nwg.x * 256u + gid.x;
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
    let o = gid.y * nwg.x * 256u + gid.x;
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
