// Batched single-precision matmul, used only where cuBLAS cannot be loaded.
//
// C[b] = op(A[b]) * op(B[b]), C[b] is [M, N] row-major and contiguous, op(A) is [M, K], op(B) is
// [K, N]. With ta, A is stored [K, M]; with tb, B is stored [N, K]. A[b] starts at
// a_off + b*sa and B[b] at b_off + b*sb (a batch stride of 0 reuses one matrix).
// Tiles of TILE x TILE outputs per block, staged through shared memory; grid.z strides batches.

#define TILE 16

struct MatmulArgs {
    u64 batch, m, n, k;
    u64 a_off, b_off, sa, sb;
    u32 ta, tb;
};

extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, MatmulArgs s) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    const u64 row = (u64)blockIdx.y * TILE + threadIdx.y;
    const u64 col = (u64)blockIdx.x * TILE + threadIdx.x;
    for (u64 bi = blockIdx.z; bi < s.batch; bi += gridDim.z) {
        const float* ab = a + s.a_off + bi * s.sa;
        const float* bb = b + s.b_off + bi * s.sb;
        float acc = 0.0f;
        for (u64 t = 0; t < s.k; t += TILE) {
            const u64 ka = t + threadIdx.x;
            const u64 kb = t + threadIdx.y;
            as[threadIdx.y][threadIdx.x] =
                (row < s.m && ka < s.k) ? ab[s.ta ? ka * s.m + row : row * s.k + ka] : 0.0f;
            bs[threadIdx.y][threadIdx.x] =
                (kb < s.k && col < s.n) ? bb[s.tb ? col * s.k + kb : kb * s.n + col] : 0.0f;
            __syncthreads();
            for (int q = 0; q < TILE; ++q) {
                acc += as[threadIdx.y][q] * bs[q][threadIdx.x];
            }
            __syncthreads();
        }
        if (row < s.m && col < s.n) {
            c[(bi * s.m + row) * s.n + col] = acc;
        }
    }
}
