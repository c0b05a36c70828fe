// Indexing with int32 labels and ids, and the 32-bit dtype casts.
//
// gather:  out[r] = x[r, idx[r]] from x [R, C]; out is [R].
// scatter: out[r, c] = (c == idx[r]) ? g[r] : 0 into out [R, C], overwritten; g is [R].
// A label outside 0..C reads 0 (gather) and writes nothing but zeros (scatter).
// gather_rows: out[i, :] = table[ids[i], :] from table [V, C] and ids [N]; out is [N, C]; an id
// outside 0..V reads a row of zeros.
// scatter_add_rows: out[v, :] = sum of g[i, :] over the plan's ids i of row v (row_ptr [V + 1]
// then order [N], see `row_plan`), from +0 in ascending order; out is [V, C], overwritten; g is
// [N, C]. One thread per output element adds in one fixed order: no atomics, the same bits on
// every run and as the CPU reference. Plan entries outside their range are clamped or skipped.
// cast_32: n raw 32-bit words converted as CastOp::code says (0 F32 -> I32 toward zero,
// saturating, NaN -> 0; 1 I32 -> F32 nearest; 2 the high half x >> 16, 3 the low half x & 0xFFFF
// of an I32, each as an exact F32).
// cast_to_half: n F32 values to bfloat16 (op 4) or IEEE binary16 (op 6) bits, rounding to
// nearest even (NaN stays a quiet NaN, f16 overflows to inf); cast_from_half: n bfloat16 (op 5)
// or binary16 (op 7) bits to F32, exactly. Halves are stored as 16-bit words; all arithmetic is
// on the bits (no cuda_fp16.h, and sm_52 has no fast half math to use), so every device and
// the CPU reference (the `half` crate) give the same bits.
// Shape letters: R rows, C columns (classes, embedding width), V table rows, N ids or values.

extern "C" __global__ void gather_f32(const float* x, const int* idx, float* out, u64 rows, u64 cols) {
    FOR_EACH(r, rows) {
        const int c = idx[r];
        out[r] = (c >= 0 && (u64)c < cols) ? x[r * cols + c] : 0.0f;
    }
}

// One thread per output element, so the whole [R, C] output is written without a separate fill.
extern "C" __global__ void scatter_f32(const float* g, const int* idx, float* out, u64 rows, u64 cols) {
    FOR_EACH(k, rows * cols) {
        const u64 r = k / cols;
        const int c = idx[r];
        out[k] = (c >= 0 && (u64)c == k % cols) ? g[r] : 0.0f;
    }
}

extern "C" __global__ void gather_rows_f32(const float* table, const int* ids, float* out, u64 n, u64 cols, u64 table_rows) {
    FOR_EACH(k, n * cols) {
        const int v = ids[k / cols];
        out[k] = (v >= 0 && (u64)v < table_rows) ? table[(u64)v * cols + k % cols] : 0.0f;
    }
}

extern "C" __global__ void scatter_add_rows_f32(const float* g, const int* plan, float* out, u64 n, u64 cols, u64 table_rows) {
    const int* order = plan + table_rows + 1;
    const long long ids = (long long)n;
    FOR_EACH(k, table_rows * cols) {
        const u64 v = k / cols, d = k % cols;
        const long long lo = min(max((long long)plan[v], 0LL), ids);
        const long long hi = min(max((long long)plan[v + 1], lo), ids);
        float acc = 0.0f;
        for (long long j = lo; j < hi; ++j) {
            const int i = order[j];
            if (i >= 0 && (long long)i < ids) {
                acc += g[(u64)i * cols + d];
            }
        }
        out[k] = acc;
    }
}

__device__ __forceinline__ int to_i32(float f) {
    // Every comparison with NaN is false, so NaN falls through to 0.
    if (f >= 2147483648.0f) return 2147483647;
    if (f >= -2147483648.0f) return (int)f;
    if (f < 0.0f) return -2147483647 - 1;
    return 0;
}

extern "C" __global__ void cast_32(const u32* x, u32* out, u64 n, u32 op) {
    FOR_EACH(k, n) {
        const u32 w = x[k];
        u32 r;
        switch (op) {
            case 0: r = (u32)to_i32(__uint_as_float(w)); break;
            case 1: r = __float_as_uint(__int2float_rn((int)w)); break;
            case 2: r = __float_as_uint((float)((int)w >> 16)); break;
            default: r = __float_as_uint((float)(w & 0xFFFFu)); break;
        }
        out[k] = r;
    }
}

typedef unsigned short u16;

__device__ __forceinline__ u32 bf16_bits(u32 w) {
    if ((w & 0x7fffffffu) > 0x7f800000u) return (w >> 16) | 0x40u;
    return (w + 0x7fffu + ((w >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ u32 f16_bits(u32 w) {
    const u32 sign = (w >> 16) & 0x8000u, exp = w & 0x7f800000u, man = w & 0x007fffffu;
    if (exp == 0x7f800000u) return sign | 0x7c00u | (man ? 0x200u : 0u) | (man >> 13);
    const int e = (int)(exp >> 23) - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00u;
    if (e <= 0) {
        if (14 - e > 24) return sign;
        const u32 m = man | 0x00800000u;
        const u32 round = 1u << (13 - e);
        u32 h = m >> (14 - e);
        if ((m & round) && (m & (3u * round - 1u))) h += 1u;
        return sign | h;
    }
    const u32 h = sign | ((u32)e << 10) | (man >> 13);
    return ((man & 0x1000u) && (man & 0x2fffu)) ? h + 1u : h;
}

__device__ __forceinline__ u32 f16_to_f32_bits(u32 h) {
    const u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    if (e == 0u) {
        if (m == 0u) return sign;
        const u32 p = 31u - __clz(m);
        return sign | ((p + 103u) << 23) | ((m << (23u - p)) & 0x7fffffu);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

extern "C" __global__ void cast_to_half(const u32* x, u16* out, u64 n, u32 op) {
    FOR_EACH(k, n) {
        out[k] = (u16)(op == 6 ? f16_bits(x[k]) : bf16_bits(x[k]));
    }
}

extern "C" __global__ void cast_from_half(const u16* x, u32* out, u64 n, u32 op) {
    FOR_EACH(k, n) {
        const u32 h = x[k];
        out[k] = op == 7 ? f16_to_f32_bits(h) : h << 16;
    }
}
