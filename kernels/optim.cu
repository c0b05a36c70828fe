// Fused optimizer updates over N parameters, in place, with PyTorch's semantics.
//
// p: parameters [N]; g: gradients [N] (read only).
// sgd:  buf [N] momentum buffer (untouched when momentum == 0); first != 0 on the first step,
//       when the buffer is initialised to the gradient.
//       g' = g + wd*p; if momentum: buf = first ? g' : momentum*buf + (1-dampening)*g';
//       g' = nesterov ? g' + momentum*buf : buf; p -= lr*g'.
// adam: m, v [N] first and second moments; bc1 = 1 - beta1^step, bc2 = 1 - beta2^step
//       (computed on the host in double precision). decoupled != 0 is AdamW:
//       p *= 1 - lr*wd instead of g += wd*p. Then m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
//       p -= lr * (m/bc1) / (sqrt(v/bc2) + eps).

extern "C" __global__ void sgd_f32(float* p, const float* g, float* buf, u64 n, float lr, float momentum,
                                   float dampening, u32 nesterov, float wd, u32 first) {
    FOR_EACH(i, n) {
        float d = g[i];
        if (wd != 0.0f) {
            d += wd * p[i];
        }
        if (momentum != 0.0f) {
            const float b = first ? d : momentum * buf[i] + (1.0f - dampening) * d;
            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        p[i] -= lr * d;
    }
}

extern "C" __global__ void adam_f32(float* p, const float* g, float* m, float* v, u64 n, float lr, float beta1,
                                    float beta2, float eps, float wd, u32 decoupled, float bc1, float bc2) {
    FOR_EACH(i, n) {
        float d = g[i];
        float w = p[i];
        if (wd != 0.0f) {
            if (decoupled) {
                w *= 1.0f - lr * wd;
            } else {
                d += wd * w;
            }
        }
        const float mi = beta1 * m[i] + (1.0f - beta1) * d;
        const float vi = beta2 * v[i] + (1.0f - beta2) * d * d;
        m[i] = mi;
        v[i] = vi;
        p[i] = w - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}
