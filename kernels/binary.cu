// Elementwise ops of two inputs: out[i] = op(a[la(i)], b[lb(i)]), broadcast through layouts.
//
// op:      `BinaryOp::code()`: 0 add, 1 sub, 2 mul, 3 div, 4 max, 5 min, 6 gt, 7 eq,
//          8 relu_backward (a where b > 0, else 0).
// a, la:   left operand and its strided layout (stride 0 broadcasts); shape = output shape.
// b, lb:   right operand and its layout, same shape.
// out:     contiguous output of `n` elements.
// max/min ignore a NaN operand like Rust's f32::max/min (fmaxf/fminf do the same).

__device__ __forceinline__ float binary_op(u32 op, float a, float b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return fmaxf(a, b);
        case 5: return fminf(a, b);
        case 6: return a > b ? 1.0f : 0.0f;
        case 7: return a == b ? 1.0f : 0.0f;
        case 8: return b > 0.0f ? a : 0.0f;
        default: return __int_as_float(0x7fffffff);
    }
}

extern "C" __global__ void binary_f32(u32 op, const float* a, Layout6 la, const float* b, Layout6 lb, float* out, u64 n) {
    FOR_EACH(i, n) {
        out[i] = binary_op(op, a[layout_at(la, i)], b[layout_at(lb, i)]);
    }
}
