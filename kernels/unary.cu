// Elementwise ops of one input: out[i] = op(x[layout(i)]).
//
// op:     `UnaryOp::code()` (0 identity .. 13 powf, 14 sin, 15 cos, 16 erf); p0, p1: `UnaryOp::params()`
//         (affine: x * p0 + p1; powf: x ^ p0).
// x, lx:  input buffer and the strided layout it is read through (shape = output shape).
// out:    contiguous output of `n` elements, n = product of lx.shape.
// Semantics match `backend/cpu/kernels.rs::unary` (IEEE single precision, no fast math),
// which are PyTorch's: relu keeps NaN and -0; powf is C's powf but sqrt for p = ±0.5.
// sinf/cosf reduce every finite argument exactly (their slow path) without fast math, which
// nvrtc.rs never enables; sin(±inf) is NaN and erff(-0) = -0, as PyTorch's.

__device__ __forceinline__ float pow_torch(float x, float p) {
    if (p == 0.5f) {
        return sqrtf(x);
    }
    if (p == -0.5f) {
        return 1.0f / sqrtf(x);
    }
    return powf(x, p);
}

__device__ __forceinline__ float unary_op(u32 op, float x, float p0, float p1) {
    switch (op) {
        case 0: return x;
        case 1: return -x;
        case 2: return expf(x);
        case 3: return logf(x);
        case 4: return x < 0.0f ? 0.0f : x;
        case 5: return x > 0.0f ? 1.0f : 0.0f;
        case 6: return sqrtf(x);
        case 7: return 1.0f / x;
        case 8: return x * x;
        case 9: return fabsf(x);
        case 10: return tanhf(x);
        case 11: return 1.0f / (1.0f + expf(-x));
        case 12: return x * p0 + p1;
        case 13: return pow_torch(x, p0);
        case 14: return sinf(x);
        case 15: return cosf(x);
        case 16: return erff(x);
        default: return __int_as_float(0x7fffffff);
    }
}

extern "C" __global__ void unary_f32(u32 op, float p0, float p1, const float* x, Layout6 lx, float* out, u64 n) {
    FOR_EACH(i, n) {
        out[i] = unary_op(op, x[layout_at(lx, i)], p0, p1);
    }
}
