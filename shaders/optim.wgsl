// optim.wgsl: fused optimizer updates of one parameter tensor in place, PyTorch semantics.
//
// sgd:          g = grad + wd*p; p -= lr*g
// sgd_momentum: as sgd, then buf = first ? g : momentum*buf + (1-dampening)*g;
//               g = nesterov ? g + momentum*buf : buf; p -= lr*g
// adam:         g = grad (+ wd*p unless decoupled; decoupled: p *= 1 - lr*wd);
//               m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g²;
//               p -= lr * (m/bc1) / (sqrt(v/bc2) + eps), bc1 = 1-b1^step, bc2 = 1-b2^step
// Bindings: 0 `p` parameters; 1 `param`; 2 `grad`; 3 state 0 (momentum buffer, or Adam's m);
// 4 state 1 (Adam's v). All [N], updated in place where written.
// Shape letters: N elements in this chunk.

struct Params {
    n: u32,
    off: u32,      // element offset of the chunk in every bound range
    flags: u32,    // bit 0 nesterov, bit 1 first step (sgd); bit 0 decoupled (adam)
    lr: f32,
    wd: f32,
    momentum: f32, // sgd momentum, or adam beta1
    dampening: f32, // sgd dampening, or adam beta2
    eps: f32,
    bc1: f32,
    bc2: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read_write> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> s0: array<f32>;
@group(0) @binding(4) var<storage, read_write> s1: array<f32>;

@compute @workgroup_size(256)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    let e = p.off + i;
    param[e] -= p.lr * (grad[e] + p.wd * param[e]);
}

@compute @workgroup_size(256)
fn sgd_momentum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    let e = p.off + i;
    var g = grad[e] + p.wd * param[e];
    var buf = g;
    if (p.flags & 2u) == 0u { buf = p.momentum * s0[e] + (1.0 - p.dampening) * g; }
    s0[e] = buf;
    if (p.flags & 1u) != 0u { g = g + p.momentum * buf; } else { g = buf; }
    param[e] -= p.lr * g;
}

@compute @workgroup_size(256)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    let e = p.off + i;
    var w = param[e];
    var g = grad[e];
    if (p.flags & 1u) != 0u { w *= 1.0 - p.lr * p.wd; } else { g += p.wd * w; }
    let m = p.momentum * s0[e] + (1.0 - p.momentum) * g;
    let v = p.dampening * s1[e] + (1.0 - p.dampening) * g * g;
    s0[e] = m;
    s1[e] = v;
    param[e] = w - p.lr * (m / p.bc1) / (sqrt(v / p.bc2) + p.eps);
}
