// unary.wgsl: elementwise ops of one input, out[i] = op(x[pos(i)]).
//
// One invocation per output element of this dispatch's chunk. The op is the override
// constant `OP`, `UnaryOp::code()`, fixed per pipeline; the cases name the codes by the
// `UNARY_*` constants generated from backend/op_table.rs and appended to the module. `p.p0`
// and `p.p1` are the op's parameters (Affine: mul, add; Powf: p).
// sin and cos reduce their argument themselves (Payne-Hanek), exact for every finite f32.
// Bindings: 0 `p` parameters; 1 `x` input (f32; `x4` the same as vec4); 2 `out` output (f32,
// contiguous; `out4` the same as vec4).
// Shape letters: N elements in the chunk, D0..D5 the layout's dimensions padded to rank 6.
// Offsets are relative to the bound range and wrap modulo 2^32, so a chunk may bind `x` from
// an aligned position before its first element.

struct Params {
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
    n: u32,      // N
    start: u32,  // linear index of the chunk's first element in the whole output
    x_off: u32,  // layout offset of x minus the bound range's first element
    out_off: u32,
    p0: f32,
    p1: f32,
    rank: u32,   // dimensions in use after merging, 1..6: D(6-rank)..D5
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read_write> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out4: array<vec4<f32>>;

override OP: u32 = 0u;

// Below 0, -inf included, NaN and -0 excluded; from the bits, as common.wgsl's `is_nan`.
fn is_negative(v: f32) -> bool {
    let b = bitcast<u32>(v);
    return b > 0x80000000u && b <= 0xff800000u;
}

fn with_sign_of(v: f32, s: f32) -> f32 {
    return bitcast<f32>((bitcast<u32>(v) & 0x7fffffffu) | (bitcast<u32>(s) & 0x80000000u));
}

// ln(v) from the exponent and mantissa bits: the builtin `log` flushes subnormals and is
// several ulp off near 1 on Mesa. v = 2^e * m with m in [sqrt(1/2), sqrt(2)), then
// ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^9
// (the next term is below 2e-9 relative); m - 1 is exact, so ln stays relative near 1.
fn ln(v: f32) -> f32 {
    var b = bitcast<u32>(v);
    if b == 0u || b == 0x80000000u { return bitcast<f32>(0xff800000u); }
    if b >= 0x80000000u { return bitcast<f32>(0x7fc00000u); }
    if b >= 0x7f800000u { return v; }
    var e = 0;
    if b < 0x00800000u {
        // a subnormal is its integer mantissa times 2^-149: normalize through u32 -> f32
        b = bitcast<u32>(f32(b));
        e = -149;
    }
    e += i32(b >> 23u) - 127;
    var m = bitcast<f32>((b & 0x007fffffu) | 0x3f800000u);
    if m > 1.41421356 {
        m *= 0.5;
        e += 1;
    }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let series = 1.0 + z * (1.0 / 3.0 + z * (0.2 + z * (1.0 / 7.0 + z * (1.0 / 9.0))));
    return f32(e) * 0.693147181 + 2.0 * s * series;
}

// exp(y) - 1 for |y| <= 1, relatively accurate near 0 (Kahan): the rounding of exp(y) is undone
// by dividing by ln of that same rounded value.
fn expm1(y: f32) -> f32 {
    let u = exp(y);
    if u == 1.0 { return y; }
    return (u - 1.0) * y / ln(u);
}

// tanh(|v|) = -expm1(-2|v|) / (2 + expm1(-2|v|)) near 0, (1 - e) / (1 + e), e = exp(-2|v|),
// further out (finite for any |v|), with v's sign: tanh(-0) = -0, tanh(1e-30) = 1e-30.
fn tanh_accurate(v: f32) -> f32 {
    let a = abs(v);
    var t: f32;
    if a < 0.5 {
        let m = expm1(-2.0 * a);
        t = -m / (2.0 + m);
    } else {
        let e = exp(-2.0 * a);
        t = (1.0 - e) / (1.0 + e);
    }
    return with_sign_of(t, v);
}

// PyTorch's pow(x, q) for a scalar q (`kernels.rs::powf`): C's pow, but q = ±0.5 is
// sqrt / 1 / sqrt. WGSL's `pow` is undefined for x <= 0, so |x|^q is built here and given
// the sign: a negative x needs an integer q (else NaN) and keeps its sign for odd q.
fn powf(x: f32, q: f32) -> f32 {
    if q == 0.0 { return 1.0; }
    if is_nan(x) { return x; }
    if q == 0.5 { return sqrt(x); }
    if q == -0.5 { return 1.0 / sqrt(x); }
    let a = abs(x);
    let neg = bitcast<u32>(x) >= 0x80000000u;
    let whole = floor(q) == q;
    let finite_nonzero = a > 0.0 && bitcast<u32>(a) < 0x7f800000u;
    if neg && !whole && finite_nonzero { return bitcast<f32>(0x7fc00000u); }
    var r: f32;
    if a == 0.0 {
        r = select(bitcast<f32>(0x7f800000u), 0.0, q > 0.0);
    } else if !finite_nonzero {
        r = select(0.0, a, q > 0.0);
    } else if a == 1.0 {
        r = 1.0;
    } else if whole && abs(q) <= 3.0 {
        // small integer powers by multiplication, as PyTorch's x*x and x*x*x; a negative one
        // as a power of 1/|x|, which stays normal where |x|^|q| would be subnormal (flushed
        // to 0 by some GPUs, giving inf for a finite result)
        let b = select(a, 1.0 / a, q < 0.0);
        r = select(select(b * b * b, b * b, abs(q) == 2.0), b, abs(q) == 1.0);
    } else {
        r = exp(q * ln(a));
    }
    let odd = whole && abs(q) < 16777216.0 && fract(q * 0.5) != 0.0;
    return select(r, -r, neg && odd);
}

// erf as `backend::erf` computes it (the CPU reference, in f64): an odd Taylor polynomial
// below 0.5, where 1 - erfc would cancel, else 1 - erfc by Numerical Recipes' Chebyshev fit
// (relative error of erfc under 1.2e-7). WGSL has no erf builtin.
fn erf(v: f32) -> f32 {
    let a = abs(v);
    var r: f32;
    if a < 0.5 {
        let z = a * a;
        r = a * (1.1283791671 + z * (-0.3761263890 + z * (0.1128379167 + z * (-0.0268661706
            + z * (0.0052239776 + z * (-0.0008548327 + z * 0.0001205533))))));
    } else {
        let t = 1.0 / (1.0 + 0.5 * a);
        let poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
            + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
        r = 1.0 - t * exp(-a * a + poly);
    }
    // odd, and erf(-0) = -0
    return with_sign_of(r, v);
}

// Bits of 2/π after a zero word: bit k of 2/π (weight 2^-k) is bit 31 + k of the sequence,
// counted from the first word's top; returns the 32 bits from bit `t` on (t < 224).
fn two_over_pi_bits(t: u32) -> u32 {
    var w = array<u32, 8>(0u, 0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu);
    let i = t >> 5u;
    let s = t & 31u;
    return (w[i] << s) | select(0u, w[i + 1u] >> (32u - s), s != 0u);
}

// The 64-bit product of two u32 as (high, low) words, from 16-bit halves.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xffffu;
    let ah = a >> 16u;
    let bl = b & 0xffffu;
    let bh = b >> 16u;
    let lo = al * bl;
    let m1 = ah * bl;
    let m2 = al * bh;
    let t = (lo >> 16u) + (m1 & 0xffffu) + (m2 & 0xffffu);
    return vec2<u32>(ah * bh + (m1 >> 16u) + (m2 >> 16u) + (t >> 16u), (lo & 0xffffu) | (t << 16u));
}

struct Reduced {
    q: u32,  // quadrant: a = (4k + q + f) π/2
    r: f32,  // f π/2, |f| <= 1/2
}

// Payne-Hanek reduction of a finite a > π/4 (the drivers' builtins lose the result for large
// arguments). a = m 2^e with an integer m < 2^24; bits of 2/π above weight 2^(1-e) only add
// multiples of 4 to a·2/π, so 96 bits of 2/π from there on, times m, give a·2/π mod 4 to 2^-70:
// the top 2 bits of the low 96 bits of the product are q, the other 94 the fraction.
fn reduce_half_pi(a: f32) -> Reduced {
    let b = bitcast<u32>(a);
    let m = (b & 0x007fffffu) | 0x00800000u;
    // the first bit wanted, k = e - 1 with e = exponent - 150, is bit 30 + e of the sequence
    let t = (b >> 23u) - 120u;
    let r0 = mul_wide(m, two_over_pi_bits(t + 64u));
    let r1 = mul_wide(m, two_over_pi_bits(t + 32u));
    let r2 = mul_wide(m, two_over_pi_bits(t));
    var w0 = r0.y;
    var w1 = r1.y + r0.x;
    var w2 = r2.y + r1.x + select(0u, 1u, w1 < r0.x);
    var q = w2 >> 30u;
    // a fraction of 1/2 or more: the next quadrant and the negated (96-bit) remainder
    let neg = (w2 & 0x20000000u) != 0u;
    if neg {
        q = (q + 1u) & 3u;
        w0 = ~w0 + 1u;
        w1 = ~w1 + select(0u, 1u, w0 == 0u);
        w2 = ~w2 + select(0u, 1u, w0 == 0u && w1 == 0u);
    }
    // the fraction's top 32 significant bits, then their weight
    let fh = w2 & 0x3fffffffu;
    var top: u32;
    var scale: i32;
    if fh != 0u {
        let z = countLeadingZeros(fh);
        top = (fh << z) | (w1 >> (32u - z));
        scale = -30 - i32(z);
    } else {
        let z = countLeadingZeros(w1);
        top = select(w1, (w1 << z) | (w0 >> (32u - z)), z > 0u && z < 32u);
        scale = -62 - i32(z);
    }
    let r = ldexp(f32(top), scale) * 1.57079632679;
    return Reduced(q, select(r, -r, neg));
}

// sin(|v| + shift π/2) for finite v: the reduced argument's sine or cosine by minimax
// polynomials on [-π/4, π/4] (about 1 ulp; 3 ulp with the reduction); NaN for ±inf.
fn sin_quadrant(v: f32, shift: u32) -> f32 {
    let a = bitcast<f32>(bitcast<u32>(v) & 0x7fffffffu);
    if bitcast<u32>(a) >= 0x7f800000u { return bitcast<f32>(0x7fc00000u); }
    var q = shift;
    var r = a;
    if a > 0.785398163 {
        let red = reduce_half_pi(a);
        q += red.q;
        r = red.r;
    }
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    let y = select(c, s, (q & 1u) == 0u);
    return select(y, -y, (q & 2u) != 0u);
}

// odd: sin(-0) = -0
fn sin_accurate(v: f32) -> f32 {
    let y = sin_quadrant(v, 0u);
    return select(y, -y, bitcast<u32>(v) >= 0x80000000u);
}

// PyTorch's softplus (beta 1, threshold 20): v above 20, else max(v, 0) + ln(1 + u) with
// u = e^-|v| in (0, 1], as 2 atanh(s), s = u / (2 + u) <= 1/3, by its series to s^17 (the next
// term is below 2e-10 relative). No cancellation: the shader compilers reassociate, so Kahan's
// log1p (which divides by (1 + u) - 1) would not survive them.
fn softplus(v: f32) -> f32 {
    if v > 20.0 { return v; }
    let u = exp(-abs(v));
    let s = u / (2.0 + u);
    let z = s * s;
    let series = 1.0 + z * (1.0 / 3.0 + z * (0.2 + z * (1.0 / 7.0 + z * (1.0 / 9.0 + z * (1.0 / 11.0
        + z * (1.0 / 13.0 + z * (1.0 / 15.0 + z * (1.0 / 17.0))))))));
    return max(v, 0.0) + 2.0 * s * series;
}

fn apply(v: f32) -> f32 {
    // NaN in, NaN out, whatever the driver's builtins do with it; but step(NaN) = 0, NaN^0 = 1.
    if is_nan(v) && OP != UNARY_STEP && OP != UNARY_POWF { return v; }
    switch OP {
        case UNARY_IDENTITY: { return v; }
        case UNARY_NEG: { return -v; }
        case UNARY_EXP: { return exp(v); }
        case UNARY_LOG: { return ln(v); }
        case UNARY_RELU: { return select(v, 0.0, is_negative(v)); }
        case UNARY_STEP: { let b = bitcast<u32>(v); return select(0.0, 1.0, b >= 1u && b <= 0x7f800000u); }
        case UNARY_SQRT: { return sqrt(v); }
        case UNARY_RECIP: { return 1.0 / v; }
        case UNARY_SQUARE: { return v * v; }
        case UNARY_ABS: { return abs(v); }
        case UNARY_TANH: { return tanh_accurate(v); }
        case UNARY_SIGMOID: { return 1.0 / (1.0 + exp(-v)); }
        case UNARY_AFFINE: { return v * p.p0 + p.p1; }
        case UNARY_SIN: { return sin_accurate(v); }
        case UNARY_COS: { return sin_quadrant(v, 1u); }
        case UNARY_ERF: { return erf(v); }
        case UNARY_POWF: { return powf(v, p.p0); }
        case UNARY_SOFTPLUS: { return softplus(v); }
        // a code no case names: NaN, as on every backend
        default: { return bitcast<f32>(0x7fc00000u); }
    }
}

@compute @workgroup_size(256)
fn contig(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    out[p.out_off + i] = apply(x[p.x_off + p.start + i]);
}

// `contig` four elements per invocation, for chunks of a multiple of 4 elements at 16-byte
// aligned offsets: CPU rasterizers load and store storage buffers lane by lane, so one vec4 per
// lane costs little more than one f32 and the op runs about twice as fast.
@compute @workgroup_size(256)
fn contig4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n / 4u { return; }
    let v = x4[(p.x_off + p.start) / 4u + i];
    out4[p.out_off / 4u + i] = vec4<f32>(apply(v.x), apply(v.y), apply(v.z), apply(v.w));
}

@compute @workgroup_size(256)
fn strided(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = grid_index(gid, nwg, 256u);
    if i >= p.n { return; }
    var rem = p.start + i;
    var pos = p.x_off;
    // One division per dimension but the outermost, whose coordinate is what remains.
    let outer = 6 - i32(p.rank);
    for (var d = 5; d > outer; d--) {
        let dim = p.shape[d / 4][d % 4];
        let q = rem / dim;
        pos += (rem - q * dim) * p.strides[d / 4][d % 4];
        rem = q;
    }
    pos += rem * p.strides[outer / 4][outer % 4];
    out[p.out_off + i] = apply(x[pos]);
}
