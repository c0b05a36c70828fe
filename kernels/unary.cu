// Elementwise ops of one input: out[i] = op(x[layout(i)]).
//
// op:     `UnaryOp::code()`, named by the `UNARY_*` constants generated from
//         backend/op_table.rs and prepended to the file; p0, p1: `UnaryOp::params()`
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
        case UNARY_IDENTITY: return x;
        case UNARY_NEG: return -x;
        case UNARY_EXP: return expf(x);
        case UNARY_LOG: return logf(x);
        case UNARY_RELU: return x < 0.0f ? 0.0f : x;
        case UNARY_STEP: return x > 0.0f ? 1.0f : 0.0f;
        case UNARY_SQRT: return sqrtf(x);
        case UNARY_RECIP: return 1.0f / x;
        case UNARY_SQUARE: return x * x;
        case UNARY_ABS: return fabsf(x);
        case UNARY_TANH: return tanhf(x);
        case UNARY_SIGMOID: return 1.0f / (1.0f + expf(-x));
        case UNARY_AFFINE: return x * p0 + p1;
        case UNARY_POWF: return pow_torch(x, p0);
        case UNARY_SIN: return sinf(x);
        case UNARY_COS: return cosf(x);
        case UNARY_ERF: return erff(x);
        case UNARY_SOFTPLUS: return x > 20.0f ? x : log1pf(expf(x));
        // a code no case names: NaN, as on every backend
        default: return __int_as_float(0x7fffffff);
    }
}

extern "C" __global__ void unary_f32(u32 op, float p0, float p1, const float* x, Layout6 lx, float* out, u64 n) {
    FOR_EACH(i, n) {
        out[i] = unary_op(op, x[layout_at(lx, i)], p0, p1);
    }
}
