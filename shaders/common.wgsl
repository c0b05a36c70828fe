// common.wgsl: the helpers several shader files share, bindingless functions only. WGSL has
// no includes: `shaders::source` appends this text to every module after its own file, so a
// module defines none of these names itself.

// NaN is read from the bits: the drivers may assume that no NaN reaches a float builtin or a
// comparison (WGSL allows it; Mesa's lavapipe folds `v != v` to false).
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

// The maximum where NaN wins, as the `max` reduction: a NaN `v` replaces `m`, and a NaN `m`
// stays (no number compares greater).
fn nan_max(m: f32, v: f32) -> f32 {
    if is_nan(v) || v > m { return v; }
    return m;
}

// The linear index of invocation `gid` in a grid of `nwg` workgroups of `wg` invocations along
// x: dispatches wider than the per-dimension limit of workgroups continue in rows along y.
fn grid_index(gid: vec3<u32>, nwg: vec3<u32>, wg: u32) -> u32 {
    return gid.y * nwg.x * wg + gid.x;
}
