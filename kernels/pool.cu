// 2-D max pooling and its gradient, per plane of [N, C, H, W] (P = N*C planes).
//
// x:      [P, H, W] input; out: [P, OH, OW] maxima (0 where a window is all padding).
// argmax: [P, OH, OW] int32 source position y*W + x within the plane, or -1 for all padding.
//         A NaN in the window wins (the last NaN), as in the CPU reference.
// grad_out: [P, OH, OW]; grad_x: [P, H, W], overwritten.

extern "C" __global__ void max_pool2d_f32(const float* x, float* out, int* argmax, Window s) {
    FOR_EACH(k, (u64)s.n * s.c * s.oh * s.ow) {
        const long long ox = k % s.ow;
        const long long oy = (k / s.ow) % s.oh;
        const u64 p = k / ((u64)s.ow * s.oh);
        const float* plane = x + p * s.h * s.w;
        float best = __int_as_float(0xff800000);
        int at = -1;
        for (u32 i = 0; i < s.kh; ++i) {
            const long long y = oy * s.sh + i - s.ph;
            if (y < 0 || y >= s.h) {
                continue;
            }
            for (u32 j = 0; j < s.kw; ++j) {
                const long long xx = ox * s.sw + j - s.pw;
                if (xx < 0 || xx >= s.w) {
                    continue;
                }
                const int pos = (int)(y * s.w + xx);
                const float v = plane[pos];
                if (at < 0 || v > best || isnan(v)) {
                    best = v;
                    at = pos;
                }
            }
        }
        out[k] = at < 0 ? 0.0f : best;
        argmax[k] = at;
    }
}

// Gather form: one thread per input pixel sums the gradients of the outputs whose window covers
// it and chose it, in output order (the CPU reference's order), without atomics.
extern "C" __global__ void max_pool2d_backward_f32(const float* grad_out, const int* argmax, float* grad_x, Window s) {
    FOR_EACH(k, (u64)s.n * s.c * s.h * s.w) {
        const long long xx = k % s.w;
        const long long y = (k / s.w) % s.h;
        const u64 p = k / ((u64)s.w * s.h);
        const int pos = (int)(y * s.w + xx);
        // Outputs whose window covers row y: oy*sh <= y + ph <= oy*sh + kh - 1.
        const long long ty = y + s.ph;
        const long long tx = xx + s.pw;
        long long oy0 = ty - (long long)s.kh + 1;
        oy0 = oy0 <= 0 ? 0 : (oy0 + s.sh - 1) / s.sh;
        long long ox0 = tx - (long long)s.kw + 1;
        ox0 = ox0 <= 0 ? 0 : (ox0 + s.sw - 1) / s.sw;
        const long long oy1 = min(ty / (long long)s.sh, (long long)s.oh - 1);
        const long long ox1 = min(tx / (long long)s.sw, (long long)s.ow - 1);
        float acc = 0.0f;
        for (long long oy = oy0; oy <= oy1; ++oy) {
            for (long long ox = ox0; ox <= ox1; ++ox) {
                const u64 o = (p * s.oh + oy) * s.ow + ox;
                if (argmax[o] == pos) {
                    acc += grad_out[o];
                }
            }
        }
        grad_x[k] = acc;
    }
}
