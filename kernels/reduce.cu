// Reductions over the middle axis of a contiguous [O, L, I] view into [O, I] outputs.
//
// op:   `ReduceOp::code()`: 0 sum, 1 max, 2 min, 3 argmax (first index of the maximum).
// x:    input, O*L*I floats.
// out:  O*I outputs: floats, or int32 indices for argmax (the same 4-byte slots).
// Deterministic: no atomics; every output is produced by a fixed sequence of operations, so
// repeated runs give identical bits. An empty axis (L = 0) gives 0, -inf, +inf, index 0 like the
// CPU reference.

#define REDUCE_THREADS 256

struct Acc {
    float v;
    int i;
};

__device__ __forceinline__ Acc reduce_init(u32 op) {
    Acc a;
    a.v = op == 0 ? 0.0f : (op == 2 ? __int_as_float(0x7f800000) : __int_as_float(0xff800000));
    a.i = -1;
    return a;
}

// Folds element `v` at axis position `j` into `a`.
__device__ __forceinline__ Acc reduce_step(u32 op, Acc a, float v, int j) {
    switch (op) {
        case 0: a.v += v; break;
        case 1: a.v = fmaxf(a.v, v); break;
        case 2: a.v = fminf(a.v, v); break;
        default:
            if (a.i < 0 || v > a.v) {
                a.v = v;
                a.i = j;
            }
    }
    return a;
}

// Merges two partial results; for argmax the lower index wins a tie, so the result is the first
// maximum whatever the partition.
__device__ __forceinline__ Acc reduce_merge(u32 op, Acc a, Acc b) {
    switch (op) {
        case 0: a.v += b.v; break;
        case 1: a.v = fmaxf(a.v, b.v); break;
        case 2: a.v = fminf(a.v, b.v); break;
        default:
            if (b.i >= 0 && (a.i < 0 || b.v > a.v || (b.v == a.v && b.i < a.i))) {
                a = b;
            }
    }
    return a;
}

__device__ __forceinline__ void reduce_write(u32 op, float* out, u64 k, Acc a) {
    if (op == 3) {
        ((int*)out)[k] = a.i < 0 ? 0 : a.i;
    } else {
        out[k] = a.v;
    }
}

// I = 1: one block of REDUCE_THREADS per row (grid-stride over rows); threads take strided
// elements of the contiguous row, then a fixed shared-memory tree combines them.
extern "C" __global__ void reduce_rows_f32(u32 op, const float* x, float* out, u64 rows, u64 len) {
    __shared__ float vals[REDUCE_THREADS];
    __shared__ int idxs[REDUCE_THREADS];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = x + r * len;
        Acc a = reduce_init(op);
        for (u64 j = threadIdx.x; j < len; j += REDUCE_THREADS) {
            a = reduce_step(op, a, row[j], (int)j);
        }
        vals[threadIdx.x] = a.v;
        idxs[threadIdx.x] = a.i;
        __syncthreads();
        for (u32 half = REDUCE_THREADS / 2; half > 0; half /= 2) {
            if (threadIdx.x < half) {
                Acc mine = {vals[threadIdx.x], idxs[threadIdx.x]};
                Acc other = {vals[threadIdx.x + half], idxs[threadIdx.x + half]};
                mine = reduce_merge(op, mine, other);
                vals[threadIdx.x] = mine.v;
                idxs[threadIdx.x] = mine.i;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            Acc total = {vals[0], idxs[0]};
            reduce_write(op, out, r, total);
        }
        __syncthreads();
    }
}

// I > 1: one thread per output walks its column in order, so neighbouring threads read
// neighbouring addresses and the sum order equals the CPU reference's.
extern "C" __global__ void reduce_cols_f32(u32 op, const float* x, float* out, u64 outer, u64 len, u64 inner) {
    FOR_EACH(k, outer * inner) {
        const u64 o = k / inner;
        const u64 i = k % inner;
        Acc a = reduce_init(op);
        for (u64 j = 0; j < len; ++j) {
            a = reduce_step(op, a, x[(o * len + j) * inner + i], (int)j);
        }
        reduce_write(op, out, k, a);
    }
}
