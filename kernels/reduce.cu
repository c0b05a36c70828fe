// Reductions over the middle axis of a contiguous [O, L, I] view into [O, I] outputs.
//
// op:   `ReduceOp::code()`: 0 sum, 1 max, 2 min, 3 argmax (first index of the maximum).
// x:    input, O*L*I floats.
// out:  O*I outputs: floats, or int32 indices for argmax (the same 4-byte slots).
// Both kernels are block reductions: the threads of a block split the reduced axis (strided, so
// neighbouring threads read neighbouring addresses), then a fixed shared-memory tree merges
// their partial results. Deterministic: no atomics; every output is produced by a fixed sequence
// of operations, so repeated runs give identical bits. NaN as PyTorch: max and min are NaN when
// any element is, argmax is the first NaN's index if any, else the first maximum's. An empty
// axis (L = 0) gives 0, -inf, +inf, index 0 like the CPU reference.

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

// `v != v` is NaN's test: NVRTC compiles without fast-math here (see nvrtc.rs's options).
__device__ __forceinline__ bool reduce_isnan(float v) {
    return v != v;
}

// Whether argmax candidate (v, j) beats the best so far `a`: NaN beats any number, and between
// equals (two NaNs, or two equal values) the lower index wins.
__device__ __forceinline__ bool reduce_beats(float v, int j, Acc a) {
    if (a.i < 0) return true;
    if (reduce_isnan(a.v)) return reduce_isnan(v) && j < a.i;
    if (reduce_isnan(v)) return true;
    return v > a.v || (v == a.v && j < a.i);
}

// Folds element `v` at axis position `j` into `a`; a NaN, once taken, stays (a comparison
// with it is false).
__device__ __forceinline__ Acc reduce_step(u32 op, Acc a, float v, int j) {
    switch (op) {
        case 0: a.v += v; break;
        case 1: if (reduce_isnan(v) || v > a.v) a.v = v; break;
        case 2: if (reduce_isnan(v) || v < a.v) a.v = v; break;
        default:
            if (reduce_beats(v, j, a)) {
                a.v = v;
                a.i = j;
            }
    }
    return a;
}

// Merges two partial results; for argmax `reduce_beats` makes the result the first NaN or the
// first maximum whatever the partition.
__device__ __forceinline__ Acc reduce_merge(u32 op, Acc a, Acc b) {
    if (op == 3) {
        return b.i >= 0 && reduce_beats(b.v, b.i, a) ? b : a;
    }
    return reduce_step(op, a, b.v, b.i);
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

// I > 1: a block of COLS_X × COLS_Y threads per COLS_X consecutive outputs of one outer row
// (grid-stride over those tiles): the COLS_X threads of a row read neighbouring addresses, the
// COLS_Y rows of threads take every COLS_Y-th element of the axis, and a shared-memory tree
// merges the rows.
#define COLS_X 32
#define COLS_Y 8

extern "C" __global__ void reduce_cols_f32(u32 op, const float* x, float* out, u64 outer, u64 len, u64 inner) {
    __shared__ float vals[COLS_Y][COLS_X];
    __shared__ int idxs[COLS_Y][COLS_X];
    const u32 tx = threadIdx.x, ty = threadIdx.y;
    const u64 tiles = (inner + COLS_X - 1) / COLS_X;
    for (u64 t = blockIdx.x; t < outer * tiles; t += gridDim.x) {
        const u64 o = t / tiles;
        const u64 i = (t % tiles) * COLS_X + tx;
        Acc a = reduce_init(op);
        if (i < inner) {
            for (u64 j = ty; j < len; j += COLS_Y) {
                a = reduce_step(op, a, x[(o * len + j) * inner + i], (int)j);
            }
        }
        vals[ty][tx] = a.v;
        idxs[ty][tx] = a.i;
        __syncthreads();
        for (u32 half = COLS_Y / 2; half > 0; half /= 2) {
            if (ty < half) {
                Acc mine = {vals[ty][tx], idxs[ty][tx]};
                Acc other = {vals[ty + half][tx], idxs[ty + half][tx]};
                mine = reduce_merge(op, mine, other);
                vals[ty][tx] = mine.v;
                idxs[ty][tx] = mine.i;
            }
            __syncthreads();
        }
        if (ty == 0 && i < inner) {
            Acc total = {vals[0][tx], idxs[0][tx]};
            reduce_write(op, out, o * inner + i, total);
        }
        __syncthreads();
    }
}
