"""The edge cases of the ops that came after the first table (imported by
scripts/torch_edge_cases.py, which documents the format): the gather `index_select`, dtype
casts, comparisons on F32 and I32, `torch.matmul` of any rank, gradient clipping, and the fused
transformer ops (causal softmax and causal attention)."""
import numpy as np
import torch

NAN, INF = float("nan"), float("inf")
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def f32(values, shape=None):
    t = torch.tensor(values, dtype=torch.float32)
    return t.reshape(shape) if shape is not None else t


def ramp(shape, lo=-2.0, hi=2.0):
    """Ordinary values of a shape, none repeated (as the main script's)."""
    n = int(np.prod(shape)) if shape else 1
    return torch.linspace(lo, hi, max(n, 1), dtype=torch.float32)[:n].reshape(shape) + 0.01 * torch.arange(n, dtype=torch.float32).reshape(shape)


def causal(scores):
    """Scores with every column past the row's index set to -inf (the causal mask)."""
    t = scores.shape[-1]
    return scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -INF)


def clip_grad_norm(grads, a):
    """PyTorch's clip_grad_norm_ on parameters whose gradients are `grads`: the norm it returns,
    then the clipped gradients."""
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.detach().clone()
    norm = torch.nn.utils.clip_grad_norm_(params, a["max_norm"])
    return [norm] + [p.grad for p in params]


COMPARE = {"gt": torch.gt, "lt": torch.lt, "ge": torch.ge, "le": torch.le, "ne": torch.ne, "eq_elem": torch.eq}

# op name -> (function of (inputs, args) returning a list of tensors, differentiable)
OPS = {
    **{name: ((lambda f: lambda x, a: [f(x[0], x[1]).float()])(f), False) for name, f in COMPARE.items() if name not in ("gt", "eq_elem")},
    # `to_dtype`: F32 -> I32 truncates toward zero, I32 -> F32 rounds to the nearest
    "to_dtype": (lambda x, a: [x[0].to(torch.int32 if a["dtype"] == "i32" else torch.float32)], False),
    # both sides cast to I32 on the device first: ids whose range tandem does not know
    "cast_compare": (lambda x, a: [COMPARE[a["cmp"]](x[0].to(torch.int32), x[1].to(torch.int32)).float()], False),
    "index_select_cast": (lambda x, a: [torch.nn.functional.embedding(x[1].to(torch.int32).long(), x[0])], True),
    "clip_grad_norm": (clip_grad_norm, False),
    "causal_softmax": (lambda x, a: [torch.softmax(causal(x[0] * a["scale"]), -1)], True),
    "causal_attention": (lambda x, a: [torch.nn.functional.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=True, scale=a["scale"])], True),
}

# PyTorch leaves F32 -> I32 undefined for NaN, ±inf and values outside the I32 range (tandem
# saturates and maps NaN to 0): only defined values here. -2^31 is exact in F32, 2147483520 the
# largest F32 below 2^31.
TO_I32 = [0.0, -0.0, 1e-45, -1e-45, 1e-30, 0.5, -0.5, 0.99999994, 1.0000001, -0.99999994, 1.5, -1.5, 2.5, -2.5,
          1e-7, -1e-7, 16777216.0, 16777218.0, -16777218.0, 123456792.0, 1e9, -1e9, 2147483520.0, -2147483520.0,
          -2147483648.0, 3.0, -3.0, 7.9999995, -7.9999995]
# the F32 on either side of a tie, ties to even, and the ends of the range
TO_F32 = [0, 1, -1, 16777216, 16777217, 16777218, 16777219, -16777217, -16777219, 33554435, 123456789, I32_MAX,
          I32_MIN, I32_MAX - 64, I32_MIN + 1, 2**30 + 64, 2**30 + 65, -(2**30) - 64, 7, -8]
# integers whose F32 images are equal (past 2^24) or nearly so, and the ends of the range
INTS = [0, -1, 1, 16777216, 16777217, -16777217, -16777216, 33554433, I32_MAX, I32_MAX - 1, I32_MIN, I32_MIN + 1, 65535, 65536, -65536]
# the same integers as exact F32 values (past 2^24 only the representable ones)
CAST_INTS = [0.0, -0.0, 1.0, -1.0, 0.7, -0.7, 16777216.0, 16777218.0, -16777218.0, 65535.0, 65536.0, -65536.0, -65537.0,
             2147483520.0, -2147483648.0, 1073741824.0, -1073741952.0]


def cases(v):
    """(name, op, args, inputs) of the new cases; `v` the main script's special values."""
    yield "to_dtype i32 defined values", "to_dtype", {"dtype": "i32"}, [f32(TO_I32)]
    yield "to_dtype i32 empty", "to_dtype", {"dtype": "i32"}, [f32([], [0, 3])]
    yield "to_dtype f32 ties and ends", "to_dtype", {"dtype": "f32"}, [("i32", TO_F32, [4, 5])]
    yield "to_dtype f32 empty", "to_dtype", {"dtype": "f32"}, [("i32", [], [2, 0])]
    n = len(INTS)
    pa, pb = [a for a in INTS for _ in INTS], INTS * n
    c = len(CAST_INTS)
    ca, cb = [a for a in CAST_INTS for _ in CAST_INTS], CAST_INTS * c
    for op in COMPARE:
        yield f"{op} i32 pairs", op, {}, [("i32", pa, [n * n]), ("i32", pb, [n * n])]
        yield f"{op} i32 broadcast", op, {}, [("i32", INTS, [n, 1]), ("i32", INTS[:4], [4])]
        # one side I32, the other F32: compared as F32, as PyTorch promotes
        yield f"{op} i32 with f32", op, {}, [("i32", INTS, [n, 1]), f32([16777216.0, NAN, INF, -INF, -0.0, 2147483648.0, -2147483648.0])]
        yield f"{op} f32 with i32 empty", op, {}, [f32([], [0, 1]), ("i32", [1, 2], [2])]
        yield f"cast_compare {op}", "cast_compare", {"cmp": op}, [f32(ca), f32(cb)]
    yield from index_cases()
    yield from matmul_cases()
    yield from clip_cases(v)
    yield from transformer_cases()


def index_cases():
    """The gather: PyTorch copies rows exactly, whatever they hold."""
    table = f32([[1, NAN, -0.0], [INF, -INF, 0.0], [-0.0, 1e-45, -1e30], [3.4028235e38, -2, 0.5], [7, 8, 9]])
    yield "index_select special rows", "index_select", {}, [table, ("i32", [1, 0, 2, 3, 0, 1], [2, 3])]
    yield "index_select repeated ids", "index_select", {}, [table, ("i32", [2, 2, 2, 0, 2, 4, 4], [7])]
    yield "index_select one id", "index_select", {}, [table, ("i32", [3], [])]
    yield "index_select empty ids [2, 0]", "index_select", {}, [table, ("i32", [], [2, 0])]
    yield "index_select empty rows", "index_select", {}, [f32([], [5, 0]), ("i32", [4, 0, 4], [3])]
    yield "index_select negative id", "index_select", {}, [table, ("i32", [0, -1], [2])]
    yield "index_select_cast", "index_select_cast", {}, [table, f32([4, 1, 1, 0, 3.9, 2.5], [3, 2])]
    yield "index_select_cast out of range", "index_select_cast", {}, [table, f32([5, 0])]


def matmul_cases():
    """torch.matmul: 1-D operands, broadcast batch dimensions, special values, empty dims."""
    shapes = [([3], [3]), ([3], [3, 2]), ([2, 3], [3]), ([2, 2, 3], [3]), ([3], [2, 3, 4]), ([0], [0]), ([2, 0], [0]),
              ([0], [0, 4]), ([2, 1, 3, 4], [5, 4, 2]), ([1, 3, 4], [2, 4, 2]), ([2, 3, 4], [1, 4, 2]), ([3, 1, 2, 3], [2, 3, 2]),
              ([2, 1, 2, 3], [1, 2, 3, 2]), ([2, 2, 0], [0, 3]), ([0, 2, 3], [3, 2]), ([2, 0, 3], [2, 3, 2]), ([2, 3, 2], [2, 2, 0]),
              ([4, 1, 3], [3]), ([2, 3], [3, 4]), ([1, 1, 1], [1, 1, 1])]
    for sa, sb in shapes:
        yield f"matmul {sa} {sb}", "matmul", {}, [ramp(sa), ramp(sb, -1.0, 1.0)]
    for sa, sb in [([3], [2]), ([2, 3, 4], [3, 4, 5]), ([2, 3], [2, 3]), ([], [3]), ([3], []), ([4, 2, 3], [4])]:
        yield f"matmul bad {sa} {sb}", "matmul", {}, [ramp(sa), ramp(sb)]
    # NaN, inf and 0·inf in one row or column of one batch entry only; -0 products sum to +0
    a = ramp([2, 3, 3])
    a[0, 1, 2], a[1, 0, 0], a[1, 2, 1] = NAN, INF, 0.0
    a[1, 1] = f32([-0.0, -0.0, -0.0])
    b = ramp([3, 2], -1.0, 1.0)
    b[1, 0], b[2, 1] = 0.0, -INF
    yield "matmul special batched", "matmul", {}, [a, b]
    yield "matmul special broadcast", "matmul", {}, [a[:, None], b.expand(4, 3, 2).contiguous()]
    yield "matmul special vector", "matmul", {}, [f32([0.0, 1e30, -1e30, 2.0]), f32([[INF, 1], [1e10, 1], [1e10, 1], [NAN, 0]])]
    yield "matmul -0 products", "matmul", {}, [f32([[-0.0, 1.0], [-1.0, -0.0]]), f32([[1.0, -0.0], [0.0, 2.0]])]
    yield "matmul overflow", "matmul", {}, [f32([[3e38, 3e38], [1e20, -1e20]]), f32([[2.0], [1e20]])]


def clip_cases(v):
    """clip_grad_norm_: returns the norm, scales every gradient by max_norm / (norm + 1e-6)
    when below 1; a NaN norm makes every gradient NaN, an infinite one zeroes the finite ones."""
    g1, g2 = ramp([2, 3]), ramp([4], 0.5, 3.0)
    for m in [1.0, 100.0, 0.0, INF, 1e-30]:
        yield f"clip_grad_norm({m})", "clip_grad_norm", {"max_norm": m}, [g1, g2]
    for what, bad in [("nan", NAN), ("inf", INF), ("-inf", -INF)]:
        g = g2.clone()
        g[1] = bad
        yield f"clip_grad_norm {what} gradient", "clip_grad_norm", {"max_norm": 1.0}, [g1, g]
    yield "clip_grad_norm special", "clip_grad_norm", {"max_norm": 2.0}, [v[5:]]
    yield "clip_grad_norm zeros", "clip_grad_norm", {"max_norm": 1.0}, [f32([0.0, -0.0, 0.0]), f32([], [0, 2])]
    yield "clip_grad_norm signed zeros clipped", "clip_grad_norm", {"max_norm": 0.5}, [f32([-0.0, 0.0, -3.0, 4.0])]
    # the squares of one tensor overflow (PyTorch's float32 norm is inf), or underflow to 0
    yield "clip_grad_norm squares overflow", "clip_grad_norm", {"max_norm": 1.0}, [f32([3e20, 4e20, -1.0])]
    yield "clip_grad_norm squares underflow", "clip_grad_norm", {"max_norm": 1.0}, [f32([1e-30, -1e-30, 0.0])]
    # Not here: tensors each of whose sums of squares is finite in F32 but whose total is not
    # (two of [1e19, 1e19]). PyTorch's norm of the per-tensor norms overflows in F32 (inf, so
    # every gradient becomes 0); tandem adds the per-tensor sums in f64 (one number per device,
    # for the parallel strategies) and clips to the finite norm 2e19.


def transformer_cases():
    """Causal softmax and attention: a masked score never counts, whatever it holds; NaN or an
    infinity among the visible scores of a row makes that row NaN (inf - inf), as the softmax."""
    yield "causal_softmax [2, 4, 4]", "causal_softmax", {"scale": 0.5}, [ramp([2, 4, 4])]
    s = ramp([5, 5], -3.0, 3.0)
    s[1, 0], s[2, 2], s[3, 1], s[4, 0] = INF, -INF, NAN, 1e30
    s[0, 3], s[1, 4] = NAN, INF  # masked: must not leak
    yield "causal_softmax special", "causal_softmax", {"scale": 1.0}, [s]
    yield "causal_softmax -0 and huge scale", "causal_softmax", {"scale": 1e30}, [f32([[-0.0, 1.0], [0.0, -0.0]])]
    yield "causal_softmax T = 1", "causal_softmax", {"scale": 0.125}, [f32([[[7.0]]])]
    yield "causal_softmax empty", "causal_softmax", {"scale": 1.0}, [f32([], [0, 3, 3])]
    yield "causal_softmax bad", "causal_softmax", {"scale": 1.0}, [ramp([2, 3])]
    q, k, w = ramp([2, 5, 3]), ramp([2, 5, 3], -1.0, 1.5), ramp([2, 5, 3], 0.5, -0.5)
    yield "causal_attention [2, 5, 3]", "causal_attention", {"scale": 3 ** -0.5}, [q, k, w]
    yield "causal_attention large scores", "causal_attention", {"scale": 40.0}, [q, k, w]
    # NaN in a value row and inf in a key row that every query sees. Not here: NaN or inf in a key
    # or value row that only later queries see. PyTorch's CPU path multiplies the masked weights
    # (0) by it, forward and backward, so 0 * NaN reaches every earlier row; tandem's fused
    # kernel never reads masked positions (as flash kernels on GPUs do).
    w2 = w.clone()
    w2[0, 0, 1] = NAN
    k2 = k.clone()
    k2[1, 0, 0] = INF
    yield "causal_attention special", "causal_attention", {"scale": 0.5}, [q, k2, w2]
    yield "causal_attention T = 1", "causal_attention", {"scale": 1.0}, [f32([[[1.0, -2.0]]]), f32([[[0.5, 0.5]]]), f32([[[3.0, -0.0]]])]
    # not here: q and k of different lengths, which PyTorch allows (the mask aligned top left)
    # and tandem refuses with a shape error
