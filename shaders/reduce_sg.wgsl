// reduce_sg.wgsl: the subgroup forms of reduce.wgsl's tree kernels, `tree_sg` and `tree4_sg`,
// compiled (appended to reduce.wgsl, whose bindings, shape letters and rules they share) only
// on devices with `Features::SUBGROUP`. A whole workgroup is one segment (G = 256): each
// subgroup, whatever its size (`subgroup_size` is the device's: 32 on NVIDIA, 64 on AMD, 8 on
// lavapipe), reduces its lanes with subgroup operations, then invocation 0 folds the subgroups'
// results in subgroup order from workgroup memory. Subgroup results are fixed for a given
// device, so results are deterministic there.
// NaN as the other kernels: subgroupMax/Min and max() may drop NaN, so the NaN test and the
// index are carried explicitly (argmax: the least index among NaNs if any, else among lanes
// equal to the maximum, which is the first NaN or the first maximum).

const NONE: u32 = 0xffffffffu;

// This subgroup's combination of its lanes' running results; every lane gets it.
fn subgroup_combine(a: Acc) -> Acc {
    if OP == 0u { return Acc(subgroupAdd(a.v), a.i); }
    let nan = is_nan(a.v);
    let any_nan = subgroupAny(nan);
    let quiet = bitcast<f32>(0x7fc00000u);
    if OP == 2u { return Acc(select(subgroupMin(a.v), quiet, any_nan), a.i); }
    let m = subgroupMax(a.v);
    if OP == 1u { return Acc(select(m, quiet, any_nan), a.i); }
    let first = subgroupMin(select(NONE, a.i, select(a.v == m, nan, any_nan)));
    return Acc(select(m, quiet, any_nan), first);
}

// Combines the workgroup's subgroups; invocation 0 writes the result.
fn subgroup_tree(lid: u32, s: Seg, a: Acc, sg: u32, sid: u32, nsg: u32) {
    let r = subgroup_combine(a);
    if sid == 0u {
        tv[sg] = r.v;
        ti[sg] = r.i;
    }
    workgroupBarrier();
    if lid == 0u && s.live {
        var b = Acc(tv[0], ti[0]);
        for (var k = 1u; k < nsg; k++) { b = fold(b, tv[k], ti[k]); }
        finish(s.k, b);
    }
}

// The builtins both entries take: a struct, so that the two signatures are written once.
struct SgIds {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) sid: u32,
    @builtin(num_subgroups) nsg: u32,
}

@compute @workgroup_size(256)
fn tree_sg(ids: SgIds) {
    let s = segment(ids.wid, ids.nwg, ids.lid);
    subgroup_tree(ids.lid, s, lane_fold(s), ids.sg, ids.sid, ids.nsg);
}

@compute @workgroup_size(256)
fn tree4_sg(ids: SgIds) {
    let s = segment(ids.wid, ids.nwg, ids.lid);
    subgroup_tree(ids.lid, s, lane_fold4(s), ids.sg, ids.sid, ids.nsg);
}
