// Row-wise indexing with int32 class labels, R rows of C columns.
//
// gather:  out[r] = x[r, idx[r]] from x [R, C]; out is [R].
// scatter: out[r, c] = (c == idx[r]) ? g[r] : 0 into out [R, C], overwritten; g is [R].
// A label outside 0..C reads 0 (gather) and writes nothing but zeros (scatter).

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
