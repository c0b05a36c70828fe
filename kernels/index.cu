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
// Shape letters: R rows, C columns (classes, embedding width), V table rows, N ids.

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
