// The fused transformer kernels (`FusedOp`), the same algorithms as shaders/transformer.wgsl.
//
// Shape letters: R rows of C values (LayerNorm); N matrices (batch x heads) of T rows (tokens);
// D values per row of q, k, v (head size); B = ceil(R / 256) row blocks of LayerNorm partials.
// layer_norm:        x [R, C], w [C], b [C] -> y [R, C], mean [R], rstd [R] = 1/sqrt(var + eps)
// layer_norm_dx:     g, x [R, C], w [C], mean, rstd [R] -> dx [R, C]
//                    dx = rstd (g w - mean(g w) - xhat mean(g w xhat)), xhat = (x - mean) rstd
// layer_norm_dwb:    g, x, mean, rstd -> dwp, dbp [B, C]: sums of g xhat and g over each block
//                    of 256 rows, in row order (the caller adds the blocks in order)
// causal_softmax:    x [N, T, T] -> y = softmax(x scale + causal) per row, 0 above the diagonal
// causal_softmax_dx: g, y [N, T, T] -> dx = scale y (g - sum g y), 0 above the diagonal
// attention:         q, k, v [N, T, D] -> o [N, T, D], lse [N, T]; online softmax over keys
// attention_dq:      + o, lse, g -> dq [N, T, D], delta [N, T] = sum g o
// attention_dkv:     q, k, v, delta, lse, g -> dk, dv [N, T, D]
// Row kernels take one block of 256 threads per row (grid-stride over rows); the reductions
// are fixed shared-memory trees and no kernel uses atomics, so results repeat bit for bit.
// NaN propagates through the maxima as PyTorch's (NVRTC compiles without fast-math).

#define TF_THREADS 256

__device__ __forceinline__ float tf_neg_inf() {
    return __int_as_float(0xff800000);
}

__device__ __forceinline__ float tf_nan_max(float m, float v) {
    return (v != v || v > m) ? v : m;
}

// Sum (or NaN-propagating max) of `v` over the block, returned to every thread. Called by every
// thread of the block.
__device__ float tf_block_reduce(float v, bool is_max) {
    __shared__ float red[TF_THREADS];
    const u32 lid = threadIdx.x;
    red[lid] = v;
    __syncthreads();
    for (u32 s = TF_THREADS / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = is_max ? tf_nan_max(red[lid], red[lid + s]) : red[lid] + red[lid + s];
        __syncthreads();
    }
    const float r = red[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void layer_norm_f32(const float* x, const float* w, const float* b, float* y, float* mean,
                                          float* rstd, u64 rows, u64 cols, float eps) {
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * cols;
        float s = 0.0f;
        for (u64 j = threadIdx.x; j < cols; j += TF_THREADS) s += xr[j];
        const float m = tf_block_reduce(s, false) / (float)cols;
        float q = 0.0f;
        for (u64 j = threadIdx.x; j < cols; j += TF_THREADS) {
            const float c = xr[j] - m;
            q += c * c;
        }
        const float r = 1.0f / sqrtf(tf_block_reduce(q, false) / (float)cols + eps);
        for (u64 j = threadIdx.x; j < cols; j += TF_THREADS) y[row * cols + j] = (xr[j] - m) * r * w[j] + b[j];
        if (threadIdx.x == 0) {
            mean[row] = m;
            rstd[row] = r;
        }
    }
}

extern "C" __global__ void layer_norm_dx_f32(const float* g, const float* x, const float* w, const float* mean,
                                             const float* rstd, float* dx, u64 rows, u64 cols) {
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const u64 at = row * cols;
        const float m = mean[row], r = rstd[row];
        float sa = 0.0f, sc = 0.0f;
        for (u64 j = threadIdx.x; j < cols; j += TF_THREADS) {
            const float gw = g[at + j] * w[j];
            sa += gw;
            sc += gw * ((x[at + j] - m) * r);
        }
        const float a = tf_block_reduce(sa, false) / (float)cols;
        const float c = tf_block_reduce(sc, false) / (float)cols;
        for (u64 j = threadIdx.x; j < cols; j += TF_THREADS) {
            const float xhat = (x[at + j] - m) * r;
            dx[at + j] = r * (g[at + j] * w[j] - a - xhat * c);
        }
    }
}

extern "C" __global__ void layer_norm_dwb_f32(const float* g, const float* x, const float* mean, const float* rstd,
                                              float* dwp, float* dbp, u64 rows, u64 cols, u64 blocks) {
    FOR_EACH(k, blocks * cols) {
        const u64 blk = k / cols, j = k % cols;
        const u64 end = (blk + 1) * TF_THREADS < rows ? (blk + 1) * TF_THREADS : rows;
        float sw = 0.0f, sb = 0.0f;
        for (u64 r = blk * TF_THREADS; r < end; ++r) {
            const float gv = g[r * cols + j];
            sw += gv * ((x[r * cols + j] - mean[r]) * rstd[r]);
            sb += gv;
        }
        dwp[k] = sw;
        dbp[k] = sb;
    }
}

// Columns above the diagonal count as -inf, so a row whose max is NaN or +-inf is NaN throughout.
extern "C" __global__ void causal_softmax_f32(const float* x, float* y, u64 rows, u64 t, float scale) {
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const u64 i = row % t;
        const float* xr = x + row * t;
        float m = tf_neg_inf();
        for (u64 j = threadIdx.x; j <= i; j += TF_THREADS) m = tf_nan_max(m, xr[j] * scale);
        m = tf_block_reduce(m, true);
        float s = 0.0f;
        for (u64 j = threadIdx.x; j <= i; j += TF_THREADS) s += expf(xr[j] * scale - m);
        s = tf_block_reduce(s, false);
        for (u64 j = threadIdx.x; j < t; j += TF_THREADS) {
            const float z = j <= i ? xr[j] * scale : tf_neg_inf();
            y[row * t + j] = expf(z - m) / s;
        }
    }
}

extern "C" __global__ void causal_softmax_dx_f32(const float* g, const float* y, float* dx, u64 rows, u64 t, float scale) {
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const u64 i = row % t, at = row * t;
        float s = 0.0f;
        for (u64 j = threadIdx.x; j <= i; j += TF_THREADS) s += g[at + j] * y[at + j];
        const float dot = tf_block_reduce(s, false);
        for (u64 j = threadIdx.x; j < t; j += TF_THREADS) dx[at + j] = j <= i ? scale * y[at + j] * (g[at + j] - dot) : 0.0f;
    }
}

// One thread per query row; the output row accumulates in `o`, rescaled when the max grows.
extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, float* o, float* lse, u64 rows,
                                         u64 t, u64 d, float scale) {
    FOR_EACH(row, rows) {
        const u64 base = row - row % t;
        const float* qr = q + row * d;
        float* orow = o + row * d;
        float m = tf_neg_inf(), l = 0.0f;
        for (u64 e = 0; e < d; ++e) orow[e] = 0.0f;
        for (u64 j = 0; j <= row % t; ++j) {
            const float* kr = k + (base + j) * d;
            const float* vr = v + (base + j) * d;
            float s = 0.0f;
            for (u64 e = 0; e < d; ++e) s += qr[e] * kr[e];
            s *= scale;
            const float m_new = tf_nan_max(m, s);
            // exp(-inf - -inf) is NaN: nothing has accumulated before the first key.
            const float alpha = j == 0 ? 0.0f : expf(m - m_new);
            const float p = expf(s - m_new);
            l = l * alpha + p;
            for (u64 e = 0; e < d; ++e) orow[e] = orow[e] * alpha + p * vr[e];
            m = m_new;
        }
        for (u64 e = 0; e < d; ++e) orow[e] = orow[e] / l;
        lse[row] = m + logf(l);
    }
}

// exp(q_i . k_j scale - lse_i) and g_i . v_j for query row `qi`, key row `kj`.
__device__ __forceinline__ void tf_prob(const float* q, const float* k, const float* v, const float* g, const float* lse,
                                        u64 qi, u64 kj, u64 d, float scale, float* p, float* dp) {
    float s = 0.0f, gv = 0.0f;
    for (u64 e = 0; e < d; ++e) {
        s += q[qi * d + e] * k[kj * d + e];
        gv += g[qi * d + e] * v[kj * d + e];
    }
    *p = expf(s * scale - lse[qi]);
    *dp = gv;
}

extern "C" __global__ void attention_dq_f32(const float* q, const float* k, const float* v, const float* o,
                                            const float* lse, const float* g, float* dq, float* delta, u64 rows, u64 t,
                                            u64 d, float scale) {
    FOR_EACH(row, rows) {
        const u64 base = row - row % t;
        float dl = 0.0f;
        for (u64 e = 0; e < d; ++e) dl += g[row * d + e] * o[row * d + e];
        delta[row] = dl;
        for (u64 e = 0; e < d; ++e) dq[row * d + e] = 0.0f;
        for (u64 j = 0; j <= row % t; ++j) {
            float p, dp;
            tf_prob(q, k, v, g, lse, row, base + j, d, scale, &p, &dp);
            const float ds = p * (dp - dl);
            for (u64 e = 0; e < d; ++e) dq[row * d + e] += ds * scale * k[(base + j) * d + e];
        }
    }
}

extern "C" __global__ void attention_dkv_f32(const float* q, const float* k, const float* v, const float* delta,
                                             const float* lse, const float* g, float* dk, float* dv, u64 rows, u64 t,
                                             u64 d, float scale) {
    FOR_EACH(row, rows) {
        const u64 base = row - row % t;
        for (u64 e = 0; e < d; ++e) {
            dk[row * d + e] = 0.0f;
            dv[row * d + e] = 0.0f;
        }
        for (u64 i = row % t; i < t; ++i) {
            float p, dp;
            tf_prob(q, k, v, g, lse, base + i, row, d, scale, &p, &dp);
            const float ds = p * (dp - delta[base + i]);
            for (u64 e = 0; e < d; ++e) {
                dk[row * d + e] += ds * scale * q[(base + i) * d + e];
                dv[row * d + e] += p * g[(base + i) * d + e];
            }
        }
    }
}
