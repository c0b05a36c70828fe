// halves.wgsl: bfloat16 and IEEE binary16 values stored two per u32 word (element 2k in the low
// 16 bits of word k), so that every adapter can hold them; arithmetic stays f32.
//
// The conversions are integer code, not `pack2x16float`: WGSL lets that round to either
// neighbour and leaves overflow indeterminate, while these round to nearest even, overflow to
// inf and keep NaN a quiet NaN, the bits of the CPU reference (the `half` crate) and of PyTorch.
// OP (CastOp::code): 4 F32 -> bf16, 5 bf16 -> F32, 6 F32 -> f16, 7 f16 -> F32.
//
// Bindings: 0 `p` parameters; 1 `x` the input words; 2 `out` the output words.
// Shape letters: N elements of this chunk (an f32 word each, two per half word); W words of
// halves written by `copy_halves`.

struct Params {
    n: u32,       // N (casts); W (copy_halves)
    x_off: u32,   // first input word, relative to the bound range
    out_off: u32, // first output word, relative to the bound range
    lo: u32,      // copy_halves: the first element written, relative to the chunk's first word
    hi: u32,      // copy_halves: one past the last element written, likewise
    shift: u32,   // copy_halves: which half of the first source word is element `lo`'s source
}

override OP: u32 = 4u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

fn bf16_bits(w: u32) -> u32 {
    if (w & 0x7fffffffu) > 0x7f800000u { return (w >> 16u) | 0x40u; }
    return (w + 0x7fffu + ((w >> 16u) & 1u)) >> 16u;
}

fn f16_bits(w: u32) -> u32 {
    let sign = (w >> 16u) & 0x8000u;
    let exp = w & 0x7f800000u;
    let man = w & 0x007fffffu;
    if exp == 0x7f800000u { return sign | 0x7c00u | select(0u, 0x200u, man != 0u) | (man >> 13u); }
    let e = i32(exp >> 23u) - 112;
    if e >= 31 { return sign | 0x7c00u; }
    if e <= 0 {
        if 14 - e > 24 { return sign; }
        let m = man | 0x00800000u;
        let round = 1u << u32(13 - e);
        var h = m >> u32(14 - e);
        if (m & round) != 0u && (m & (3u * round - 1u)) != 0u { h += 1u; }
        return sign | h;
    }
    let h = sign | (u32(e) << 10u) | (man >> 13u);
    return select(h, h + 1u, (man & 0x1000u) != 0u && (man & 0x2fffu) != 0u);
}

fn half_bits(w: u32) -> u32 {
    if OP == 6u { return f16_bits(w); }
    return bf16_bits(w);
}

fn f32_bits(h: u32) -> u32 {
    if OP != 7u { return h << 16u; }
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0x1fu { return sign | 0x7f800000u | (m << 13u) | select(0u, 0x400000u, m != 0u); }
    if e == 0u {
        if m == 0u { return sign; }
        let top = firstLeadingBit(m);
        return sign | ((top + 103u) << 23u) | ((m << (23u - top)) & 0x7fffffu);
    }
    return sign | ((e + 112u) << 23u) | (m << 13u);
}

// Invocation k converts elements 2k and 2k + 1 into word k; past N the word's high half keeps
// what the output held (an element beyond the cast, or padding).
@compute @workgroup_size(256)
fn to_half(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = grid_index(gid, nwg, 256u);
    if 2u * k >= p.n { return; }
    let low = half_bits(x[p.x_off + 2u * k]);
    var high = out[p.out_off + k] >> 16u;
    if 2u * k + 1u < p.n { high = half_bits(x[p.x_off + 2u * k + 1u]); }
    out[p.out_off + k] = low | (high << 16u);
}

@compute @workgroup_size(256)
fn from_half(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = grid_index(gid, nwg, 256u);
    if 2u * k >= p.n { return; }
    let w = x[p.x_off + k];
    out[p.out_off + 2u * k] = f32_bits(w & 0xffffu);
    if 2u * k + 1u < p.n { out[p.out_off + 2u * k + 1u] = f32_bits(w >> 16u); }
}

fn source_half(s: u32) -> u32 {
    return (x[p.x_off + s / 2u] >> (16u * (s % 2u))) & 0xffffu;
}

// Word k of the chunk holds elements 2k and 2k + 1; those in lo..hi come from the source, the
// others keep their value.
@compute @workgroup_size(256)
fn copy_halves(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = grid_index(gid, nwg, 256u);
    if k >= p.n { return; }
    var w = out[p.out_off + k];
    for (var j = 0u; j < 2u; j++) {
        let e = 2u * k + j;
        if e >= p.lo && e < p.hi {
            let h = source_half(e - p.lo + p.shift);
            w = (w & ~(0xffffu << (16u * j))) | (h << (16u * j));
        }
    }
    out[p.out_off + k] = w;
}
