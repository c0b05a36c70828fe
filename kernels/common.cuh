// Shared by every kernel family: the runtime compiler prepends this file to each `.cu` source, so
// each family compiles as one translation unit without include paths.
//
// Layout6: a strided operand padded to 6 dimensions with leading unit dimensions (the Rust side
// fills it from `Layout::padded`). Element `i` of the row-major output lives at
// `offset + sum(idx[d] * strides[d])`; a stride of 0 broadcasts. `contiguous` != 0 means the
// operand is plain row-major from `offset`, and kernels skip the index arithmetic.
//
// Window: geometry of a 2-D convolution or pooling window over [N, C, H, W] input producing
// [OH, OW] positions per plane (`WindowSpec` on the Rust side).

typedef unsigned int u32;
typedef unsigned long long u64;

struct Layout6 {
    u32 shape[6];
    u32 strides[6];
    u32 offset;
    u32 contiguous;
};

struct Window {
    u32 n, c, h, w;
    u32 kh, kw;
    u32 sh, sw;
    u32 ph, pw;
    u32 oh, ow;
};

// Buffer position of the i-th row-major element of `l.shape`.
__device__ __forceinline__ u64 layout_at(const Layout6& l, u64 i) {
    if (l.contiguous) {
        return l.offset + i;
    }
    u64 pos = l.offset;
    for (int d = 5; d >= 0; --d) {
        const u64 n = l.shape[d];
        pos += (i % n) * l.strides[d];
        i /= n;
    }
    return pos;
}

// Grid-stride loop over [0, n): any n works with any grid size.
#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n); i += (u64)blockDim.x * gridDim.x)
