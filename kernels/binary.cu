// Elementwise ops of two inputs: out[i] = op(a[la(i)], b[lb(i)]), broadcast through layouts.
//
// op:      `BinaryOp::code()`, named by the `BINARY_*` constants generated from
//          backend/op_table.rs and prepended to the file; relu_backward is 0 where b <= 0,
//          else a (a NaN b passes a, as PyTorch's).
// a, la:   left operand and its strided layout (stride 0 broadcasts); shape = output shape.
// b, lb:   right operand and its layout, same shape.
// out:     contiguous output of `n` elements.
// max/min are torch.maximum/minimum: NaN if either operand is NaN (fmaxf/fminf would drop
// it), +0 above -0.

__device__ __forceinline__ float maximum(float a, float b) {
    if (isnan(a) || isnan(b)) {
        return __int_as_float(0x7fc00000);
    }
    if (a == b) {
        return __int_as_float(__float_as_int(a) & __float_as_int(b));
    }
    return a > b ? a : b;
}

__device__ __forceinline__ float minimum(float a, float b) {
    if (isnan(a) || isnan(b)) {
        return __int_as_float(0x7fc00000);
    }
    if (a == b) {
        return __int_as_float(__float_as_int(a) | __float_as_int(b));
    }
    return a < b ? a : b;
}

__device__ __forceinline__ float binary_op(u32 op, float a, float b) {
    switch (op) {
        case BINARY_ADD: return a + b;
        case BINARY_SUB: return a - b;
        case BINARY_MUL: return a * b;
        case BINARY_DIV: return a / b;
        case BINARY_MAX: return maximum(a, b);
        case BINARY_MIN: return minimum(a, b);
        case BINARY_GT: return a > b ? 1.0f : 0.0f;
        case BINARY_EQ: return a == b ? 1.0f : 0.0f;
        case BINARY_RELU_BACKWARD: return b <= 0.0f ? 0.0f : a;
        // a code no case names: NaN, as on every backend
        default: return __int_as_float(0x7fffffff);
    }
}

extern "C" __global__ void binary_f32(u32 op, const float* a, Layout6 la, const float* b, Layout6 lb, float* out, u64 n) {
    FOR_EACH(i, n) {
        out[i] = binary_op(op, a[layout_at(la, i)], b[layout_at(lb, i)]);
    }
}
