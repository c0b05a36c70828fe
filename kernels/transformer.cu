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
// attention_tiled, attention_dq_tiled, attention_dkv_tiled: the same three, tiled as
//                    shaders/attention.wgsl (D <= TF_DMAX): a block of TF_BR threads owns TF_BR
//                    rows of one matrix (queries, or keys for dk/dv) and streams the other side
//                    through shared memory in tiles of TF_BC rows; args n (matrices), t, d.
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

// The tiled kernels: 2 x TF_BC x TF_DMAX floats of shared memory (16 KiB of sm_52's 48 KiB).
#define TF_BR 64
#define TF_BC 32
#define TF_DMAX 64

__device__ __forceinline__ u64 tf_min(u64 a, u64 b) {
    return a < b ? a : b;
}

// Rows j0.. (up to TF_BC, fewer at the end) of a and b, for the matrix at row `base`, into sa
// and sb. Every thread of the block calls it (it synchronizes).
__device__ __forceinline__ void tf_load_tile(const float* a, const float* b, float* sa, float* sb, u64 base, u64 j0,
                                             u64 t, u64 d) {
    const u64 n = tf_min(TF_BC, t - j0) * d;
    __syncthreads();
    for (u64 x = threadIdx.x; x < n; x += TF_BR) {
        sa[x] = a[(base + j0) * d + x];
        sb[x] = b[(base + j0) * d + x];
    }
    __syncthreads();
}

// Keys of the tile at j0 that query i sees (causal: up to its own index).
__device__ __forceinline__ u64 tf_seen(bool live, u64 i, u64 j0) {
    return live && i >= j0 ? tf_min(TF_BC, i + 1 - j0) : 0;
}

// The row block `wb` of the tiled kernels: its matrix's first row (`base`), its first owned row
// (`first`), and this thread's owned row: its index in the matrix (`own`), whether it exists
// (`live`: threads past T still join every barrier) and its row of all N*T (the last one when
// not live).
struct TfBlock {
    u64 base, first, own, row;
    bool live;
};

__device__ __forceinline__ TfBlock tf_block(u64 wb, u64 t) {
    const u64 blocks = (t + TF_BR - 1) / TF_BR;
    TfBlock b;
    b.base = wb / blocks * t;
    b.first = wb % blocks * TF_BR;
    b.own = b.first + threadIdx.x;
    b.live = b.own < t;
    b.row = b.base + (b.live ? b.own : t - 1);
    return b;
}

// Key tiles the block's query rows see: up to the one holding its last row.
__device__ __forceinline__ u64 tf_query_tiles(u64 first, u64 t) {
    return (tf_min(first + TF_BR, t) - 1) / TF_BC + 1;
}

// Grid-stride over (matrix, row block) pairs; the block index is the same for every thread,
// so the barriers inside stay uniform.
#define FOR_EACH_BLOCK(wb, n, t) for (u64 wb = blockIdx.x; wb < (n) * (((t) + TF_BR - 1) / TF_BR); wb += gridDim.x)

extern "C" __global__ void attention_tiled_f32(const float* q, const float* k, const float* v, float* o, float* lse,
                                               u64 n, u64 t, u64 d, float scale) {
    __shared__ float kt[TF_BC * TF_DMAX], vt[TF_BC * TF_DMAX];
    FOR_EACH_BLOCK(wb, n, t) {
        const TfBlock b = tf_block(wb, t);
        const u64 base = b.base, i = b.own, row = b.row;
        const bool live = b.live;
        float qr[TF_DMAX], acc[TF_DMAX];
        for (u64 e = 0; e < d; ++e) {
            qr[e] = q[row * d + e];
            acc[e] = 0.0f;
        }
        float m = tf_neg_inf(), l = 0.0f;
        const u64 tiles = tf_query_tiles(b.first, t);
        for (u64 j0 = 0; j0 < tiles * TF_BC; j0 += TF_BC) {
            tf_load_tile(k, v, kt, vt, base, j0, t, d);
            for (u64 jj = 0; jj < tf_seen(live, i, j0); ++jj) {
                float s = 0.0f;
                for (u64 e = 0; e < d; ++e) s += qr[e] * kt[jj * d + e];
                s *= scale;
                const float m_new = tf_nan_max(m, s);
                // exp(-inf - -inf) is NaN: nothing has accumulated before the first key.
                const float alpha = j0 + jj == 0 ? 0.0f : expf(m - m_new);
                const float p = expf(s - m_new);
                l = l * alpha + p;
                for (u64 e = 0; e < d; ++e) acc[e] = acc[e] * alpha + p * vt[jj * d + e];
                m = m_new;
            }
        }
        if (live) {
            for (u64 e = 0; e < d; ++e) o[row * d + e] = acc[e] / l;
            lse[row] = m + logf(l);
        }
    }
}

extern "C" __global__ void attention_dq_tiled_f32(const float* q, const float* k, const float* v, const float* o,
                                                  const float* lse, const float* g, float* dq, float* delta, u64 n,
                                                  u64 t, u64 d, float scale) {
    __shared__ float kt[TF_BC * TF_DMAX], vt[TF_BC * TF_DMAX];
    FOR_EACH_BLOCK(wb, n, t) {
        const TfBlock b = tf_block(wb, t);
        const u64 base = b.base, i = b.own, row = b.row;
        const bool live = b.live;
        float qr[TF_DMAX], gr[TF_DMAX], acc[TF_DMAX];
        float dl = 0.0f;
        for (u64 e = 0; e < d; ++e) {
            qr[e] = q[row * d + e];
            gr[e] = g[row * d + e];
            acc[e] = 0.0f;
            dl += gr[e] * o[row * d + e];
        }
        const float ls = lse[row];
        const u64 tiles = tf_query_tiles(b.first, t);
        for (u64 j0 = 0; j0 < tiles * TF_BC; j0 += TF_BC) {
            tf_load_tile(k, v, kt, vt, base, j0, t, d);
            for (u64 jj = 0; jj < tf_seen(live, i, j0); ++jj) {
                float s = 0.0f, gv = 0.0f;
                for (u64 e = 0; e < d; ++e) {
                    s += qr[e] * kt[jj * d + e];
                    gv += gr[e] * vt[jj * d + e];
                }
                const float ds = expf(s * scale - ls) * (gv - dl);
                for (u64 e = 0; e < d; ++e) acc[e] += ds * scale * kt[jj * d + e];
            }
        }
        if (live) {
            delta[row] = dl;
            for (u64 e = 0; e < d; ++e) dq[row * d + e] = acc[e];
        }
    }
}

// Per key row j over the query tiles from the one holding the block's first key to the end.
extern "C" __global__ void attention_dkv_tiled_f32(const float* q, const float* k, const float* v, const float* delta,
                                                   const float* lse, const float* g, float* dk, float* dv, u64 n,
                                                   u64 t, u64 d, float scale) {
    __shared__ float qt[TF_BC * TF_DMAX], gt[TF_BC * TF_DMAX], lt[TF_BC], dt[TF_BC];
    FOR_EACH_BLOCK(wb, n, t) {
        const TfBlock b = tf_block(wb, t);
        const u64 base = b.base, first = b.first, j = b.own, row = b.row;
        const bool live = b.live;
        float kr[TF_DMAX], vr[TF_DMAX], dkr[TF_DMAX], dvr[TF_DMAX];
        for (u64 e = 0; e < d; ++e) {
            kr[e] = k[row * d + e];
            vr[e] = v[row * d + e];
            dkr[e] = 0.0f;
            dvr[e] = 0.0f;
        }
        for (u64 i0 = first / TF_BC * TF_BC; i0 < t; i0 += TF_BC) {
            const u64 rows = tf_min(TF_BC, t - i0);
            // The previous tile's readers of lt and dt finish first; tf_load_tile's closing
            // barrier orders these writes before the reads below.
            __syncthreads();
            if (threadIdx.x < rows) {
                lt[threadIdx.x] = lse[base + i0 + threadIdx.x];
                dt[threadIdx.x] = delta[base + i0 + threadIdx.x];
            }
            tf_load_tile(q, g, qt, gt, base, i0, t, d);
            const u64 lo = live && j < i0 + TF_BC ? (j > i0 ? j : i0) - i0 : rows;
            for (u64 ii = lo; ii < rows; ++ii) {
                float s = 0.0f, gv = 0.0f;
                for (u64 e = 0; e < d; ++e) {
                    s += qt[ii * d + e] * kr[e];
                    gv += gt[ii * d + e] * vr[e];
                }
                const float p = expf(s * scale - lt[ii]);
                const float ds = p * (gv - dt[ii]);
                for (u64 e = 0; e < d; ++e) {
                    dkr[e] += ds * scale * qt[ii * d + e];
                    dvr[e] += p * gt[ii * d + e];
                }
            }
        }
        if (live) {
            for (u64 e = 0; e < d; ++e) {
                dk[row * d + e] = dkr[e];
                dv[row * d + e] = dvr[e];
            }
        }
    }
}
