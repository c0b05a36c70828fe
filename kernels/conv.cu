// im2col / col2im: the unfold that turns a 2-D convolution into a matmul, and its adjoint.
//
// Shapes: x is [N, C, H, W]; cols is [N, C*KH*KW, OH*OW] with row r = (ci*KH + i)*KW + j and
// column oy*OW + ox; `Window` gives the sizes, strides (sh, sw) and zero padding (ph, pw).
// Source pixel of (r, oy, ox): y = oy*sh + i - ph, x = ox*sw + j - pw.

// One thread per column element; positions in the padding read 0.
extern "C" __global__ void im2col_f32(const float* x, float* cols, Window s) {
    const u64 rows = (u64)s.c * s.kh * s.kw;
    const u64 cl = (u64)s.oh * s.ow;
    FOR_EACH(k, s.n * rows * cl) {
        const u64 col = k % cl;
        const u64 r = (k / cl) % rows;
        const u64 n = k / (cl * rows);
        const u64 ci = r / (s.kh * s.kw);
        const long long i = (r / s.kw) % s.kh;
        const long long j = r % s.kw;
        const long long y = (long long)(col / s.ow) * s.sh + i - s.ph;
        const long long xx = (long long)(col % s.ow) * s.sw + j - s.pw;
        float v = 0.0f;
        if (y >= 0 && y < s.h && xx >= 0 && xx < s.w) {
            v = x[((n * s.c + ci) * s.h + y) * s.w + xx];
        }
        cols[k] = v;
    }
}

// Gather form of the adjoint: one thread per input pixel sums every column entry that read it,
// so no two threads write one address and no atomics are needed. Overwrites x.
extern "C" __global__ void col2im_f32(const float* cols, float* x, Window s) {
    const u64 rows = (u64)s.c * s.kh * s.kw;
    const u64 cl = (u64)s.oh * s.ow;
    FOR_EACH(k, (u64)s.n * s.c * s.h * s.w) {
        const long long xx = k % s.w;
        const long long y = (k / s.w) % s.h;
        const u64 ci = (k / ((u64)s.w * s.h)) % s.c;
        const u64 n = k / ((u64)s.w * s.h * s.c);
        float acc = 0.0f;
        for (u32 i = 0; i < s.kh; ++i) {
            const long long ty = y + s.ph - i;
            if (ty < 0 || ty % s.sh != 0 || ty / s.sh >= s.oh) {
                continue;
            }
            const u64 oy = ty / s.sh;
            for (u32 j = 0; j < s.kw; ++j) {
                const long long tx = xx + s.pw - j;
                if (tx < 0 || tx % s.sw != 0 || tx / s.sw >= s.ow) {
                    continue;
                }
                const u64 ox = tx / s.sw;
                const u64 r = (ci * s.kh + i) * s.kw + j;
                acc += cols[(n * rows + r) * cl + oy * s.ow + ox];
            }
        }
        x[k] = acc;
    }
}
