"""PyTorch's answers for every op of tandem's Tensor API (and each op's gradient) on special
values and special shapes, written as tests/fixtures/torch_edge_cases.json for
tests/edge_numerics.rs. Regenerate after adding an op (here and in that test's table):

    python scripts/torch_edge_cases.py --keep tests/fixtures/torch_edge_cases.json > new.json
    mv new.json tests/fixtures/torch_edge_cases.json

`--keep FILE` writes the cases FILE already has as they are there, bit for bit (and says on
stderr how many of them this host answers differently): PyTorch's vector paths answer some elements differently with other CPU instructions (the
fixture was first written on an AVX-512 host), so the diff shows the new op alone. Without it
every case is recomputed on this host.

Values are stored as the hex of their f32 bits, so NaN and -0 survive JSON. Each case is run in
float32 on the CPU. A gradient is that of sum_k sum(out_k * w_k) with fixed weights w_k (the
pattern WEIGHTS repeated), so that it is not 0 by symmetry. PyTorch answers some elements
differently in its scalar and vector paths (maximum(-0, 0) is -0 or 0, gelu(inf) is inf or NaN,
depending on the length): each element of an elementwise case is also computed alone (output and
gradient), and where the two differ the alone answer is recorded in `alternatives`; the test
accepts either.

Adding an op: an entry in OPS below (a function of the inputs and args, and whether it has a
gradient), its cases (in `cases()` or `composed_cases()`: inputs are float tensors or
("i32", values, shape); args a dict; non-finite float args become "nan"/"inf"/"-inf" in JSON),
and the same name in tests/edge_numerics.rs's OPS with its error bounds. A case where PyTorch
raises records the error; tandem must then fail too."""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

import torch_edge_more as more

WEIGHTS = [1.0, -0.5, 2.0, 0.25, -3.0]

F32 = np.float32
SPECIAL = [
    0.0, -0.0, float("inf"), float("-inf"), float("nan"),
    float(np.nextafter(F32(0), F32(1))),                    # smallest subnormal
    float(np.finfo(F32).tiny),                              # smallest normal
    float(np.nextafter(F32(1), F32(0))), float(np.nextafter(F32(1), F32(2))),  # 1 -/+ 1 ulp
    1e-30, -1e-30, 1e-7, -1e-7, 88.0, -88.0, 89.0, -89.0, 1e30, -1e30,
    float(np.finfo(F32).max), -float(np.finfo(F32).max),
    1.0, -1.0, 0.5, -2.0, 3.0,
]
NAN, INF = float("nan"), float("inf")


def f32(values, shape=None):
    t = torch.tensor(values, dtype=torch.float32)
    return t.reshape(shape) if shape is not None else t


def ramp(shape, lo=-2.0, hi=2.0):
    """Deterministic ordinary values of a shape (no ties between distinct positions)."""
    n = int(np.prod(shape)) if shape else 1
    return torch.linspace(lo, hi, max(n, 1), dtype=torch.float32)[:n].reshape(shape) + 0.01 * torch.arange(n, dtype=torch.float32).reshape(shape)


def bits(t):
    t = t.detach().contiguous().to(torch.float32).reshape(-1)
    return [format(v & 0xFFFFFFFF, "08x") for v in t.view(torch.int32).tolist()]


def weights(n):
    return torch.tensor([WEIGHTS[i % len(WEIGHTS)] for i in range(n)], dtype=torch.float32)


# op name -> (function of (inputs, args) returning a list of tensors, differentiable)
OPS = {
    "identity": (lambda x, a: [x[0].clone()], True),
    "step": (lambda x, a: [(x[0] > 0).float()], False),
    "neg": (lambda x, a: [-x[0]], True),
    "exp": (lambda x, a: [torch.exp(x[0])], True),
    "log": (lambda x, a: [torch.log(x[0])], True),
    "relu": (lambda x, a: [torch.relu(x[0])], True),
    "sqrt": (lambda x, a: [torch.sqrt(x[0])], True),
    "square": (lambda x, a: [torch.square(x[0])], True),
    "tanh": (lambda x, a: [torch.tanh(x[0])], True),
    "sigmoid": (lambda x, a: [torch.sigmoid(x[0])], True),
    "recip": (lambda x, a: [torch.reciprocal(x[0])], True),
    "abs": (lambda x, a: [torch.abs(x[0])], True),
    "powf": (lambda x, a: [torch.pow(x[0], a["p"])], True),
    "affine": (lambda x, a: [x[0] * a["mul"] + a["add"]], True),
    "add": (lambda x, a: [x[0] + x[1]], True),
    "sub": (lambda x, a: [x[0] - x[1]], True),
    "mul": (lambda x, a: [x[0] * x[1]], True),
    "div": (lambda x, a: [x[0] / x[1]], True),
    "maximum": (lambda x, a: [torch.maximum(x[0], x[1])], True),
    "minimum": (lambda x, a: [torch.minimum(x[0], x[1])], True),
    "gt": (lambda x, a: [(x[0] > x[1]).float()], False),
    "eq_elem": (lambda x, a: [(x[0] == x[1]).float()], False),
    "relu_backward": (lambda x, a: [torch.ops.aten.threshold_backward(x[0], x[1], 0.0)], True),
    "sum": (lambda x, a: [x[0].sum(a["axis"], keepdim=a["keepdim"])], True),
    "mean": (lambda x, a: [x[0].mean(a["axis"], keepdim=a["keepdim"])], True),
    "max": (lambda x, a: [torch.amax(x[0], a["axis"], keepdim=a["keepdim"])], True),
    "min": (lambda x, a: [torch.amin(x[0], a["axis"], keepdim=a["keepdim"])], True),
    "argmax": (lambda x, a: [torch.argmax(x[0], a["axis"])], False),
    "sum_all": (lambda x, a: [x[0].sum()], True),
    "mean_all": (lambda x, a: [x[0].mean()], True),
    "softmax": (lambda x, a: [torch.softmax(x[0], a["axis"])], True),
    "log_softmax": (lambda x, a: [torch.log_softmax(x[0], a["axis"])], True),
    "gather_rows": (lambda x, a: [x[0][torch.arange(x[0].shape[0]), x[1].long()]], True),
    "cross_entropy": (lambda x, a: [F.cross_entropy(x[0], x[1].long())], True),
    "mse_loss": (lambda x, a: [F.mse_loss(x[0], x[1])], True),
    "matmul": (lambda x, a: [torch.matmul(x[0], x[1])], True),
    "matmul_t": (lambda x, a: [torch.matmul(x[0].mT if a["ta"] else x[0], x[1].mT if a["tb"] else x[1])], True),
    "conv2d": (lambda x, a: [F.conv2d(x[0], x[1], None, a["stride"], a["pad"])], True),
    "conv2d_bias": (lambda x, a: [F.conv2d(x[0], x[1], x[2], a["stride"], a["pad"])], True),
    "conv2d_bias_relu": (lambda x, a: [torch.relu(F.conv2d(x[0], x[1], x[2], a["stride"], a["pad"]))], True),
    "max_pool2d": (lambda x, a: [F.max_pool2d(x[0], a["kernel"], a["stride"], a["pad"])], True),
    "reshape": (lambda x, a: [x[0].reshape(a["shape"])], True),
    "flatten": (lambda x, a: [x[0].reshape(x[0].shape[0], -1 if x[0].shape[0] else 0)], True),
    "flatten_all": (lambda x, a: [x[0].reshape(-1)], True),
    "permute": (lambda x, a: [x[0].permute(a["perm"])], True),
    "t": (lambda x, a: [x[0].transpose(-2, -1)], True),
    "broadcast_to": (lambda x, a: [x[0].broadcast_to(a["shape"])], True),
    "sum_to": (lambda x, a: [x[0].sum_to_size(a["shape"])], True),
    "narrow": (lambda x, a: [x[0].narrow(a["dim"], a["start"], a["len"])], True),
    "split": (lambda x, a: list(torch.split(x[0], a["sizes"], 0)), True),
    "cat": (lambda x, a: [torch.cat(x, a["dim"])], True),
    # a round trip through the CPU: bit-exact
    "to": (lambda x, a: [x[0].clone()], True),
    # composed ops (src/tensor/compose.rs, losses.rs) and the layers' forward functions
    "sin": (lambda x, a: [torch.sin(x[0])], True),
    "cos": (lambda x, a: [torch.cos(x[0])], True),
    "erf": (lambda x, a: [torch.erf(x[0])], True),
    "gelu": (lambda x, a: [F.gelu(x[0])], True),
    "gelu_tanh": (lambda x, a: [F.gelu(x[0], approximate="tanh")], True),
    "silu": (lambda x, a: [F.silu(x[0])], True),
    "softplus": (lambda x, a: [F.softplus(x[0])], True),
    "mul_scalar": (lambda x, a: [x[0] * a["s"]], True),
    "add_scalar": (lambda x, a: [x[0] + a["s"]], True),
    "clamp": (lambda x, a: [torch.clamp(x[0], a["min"], a["max"])], True),
    "where": (lambda x, a: [torch.where(x[1] != 0, x[0], x[2])], True),
    "masked_fill": (lambda x, a: [x[0].masked_fill(x[1] != 0, a["value"])], True),
    "var": (lambda x, a: [torch.var(x[0], a["axis"], correction=a["correction"], keepdim=a["keepdim"])], True),
    "std": (lambda x, a: [torch.std(x[0], a["axis"], correction=a["correction"], keepdim=a["keepdim"])], True),
    "mean_axes": (lambda x, a: [x[0].mean(a["axes"], keepdim=True)], True),
    "stack": (lambda x, a: [torch.stack(x, a["dim"])], True),
    "unsqueeze": (lambda x, a: [x[0].unsqueeze(a["dim"])], True),
    "squeeze": (lambda x, a: [x[0].squeeze(a["dim"])], True),
    "arange": (lambda x, a: [torch.arange(a["start"], a["end"], a["step"], dtype=torch.float32)], False),
    "one_hot": (lambda x, a: [F.one_hot(x[0].long(), a["classes"]).float()], False),
    "triu": (lambda x, a: [torch.triu(x[0], a["diagonal"])], True),
    "tril": (lambda x, a: [torch.tril(x[0], a["diagonal"])], True),
    "index_select": (lambda x, a: [F.embedding(x[1].long(), x[0])], True),
    "avg_pool2d": (lambda x, a: [F.avg_pool2d(x[0], a["kernel"], a["stride"], a["pad"])], True),
    "adaptive_avg_pool2d": (lambda x, a: [F.adaptive_avg_pool2d(x[0], a["size"])], True),
    "cross_entropy_with": (lambda x, a: [F.cross_entropy(x[0], x[1].long(), ignore_index=a["ignore_index"], label_smoothing=a["label_smoothing"])], True),
    "nll_loss": (lambda x, a: [F.nll_loss(x[0], x[1].long(), ignore_index=a["ignore_index"])], True),
    "bce_with_logits": (lambda x, a: [F.binary_cross_entropy_with_logits(x[0], x[1])], True),
    "l1_loss": (lambda x, a: [F.l1_loss(x[0], x[1])], True),
    "huber_loss": (lambda x, a: [F.huber_loss(x[0], x[1], delta=a["delta"])], True),
    "layer_norm": (lambda x, a: [F.layer_norm(x[0], x[1].shape, x[1], x[2], 1e-5)], True),
    # a fresh BatchNorm (weight 1, bias 0, running mean 0, running variance 1)
    "batch_norm": (lambda x, a: [F.batch_norm(x[0], torch.zeros(x[0].shape[1]), torch.ones(x[0].shape[1]), None, None, a["train"], 0.1, 1e-5)], True),
    **more.OPS,
}

UNARY = ["identity", "step", "neg", "exp", "log", "relu", "sqrt", "square", "tanh", "sigmoid", "recip", "abs",
         "sin", "cos", "erf", "gelu", "gelu_tanh", "silu", "softplus"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "gt", "lt", "ge", "le", "ne", "eq_elem", "relu_backward"]
POWERS = [0.0, 1.0, 2.0, 3.0, 4.0, -1.0, -2.0, -3.0, 0.5, -0.5, 1.5, 2.5, -1.5, 1e-7]
# length one in every broadcast position, both ways round
BROADCASTS = [([2, 3, 4], s) for s in ([1, 3, 4], [2, 1, 4], [2, 3, 1], [1, 1, 1], [4], [3, 1], [1], [])]
BROADCASTS += [(b, a) for a, b in BROADCASTS] + [([0, 3], [3]), ([0], [1]), ([2, 0], [2, 1]), ([1], [1])]
# rows for the reductions: NaN first, middle, last; infinities; signed zeros; ties; huge. Sums
# are exact or the same in any order, so that no summation order is prescribed.
ROWS = [[1, NAN, 3], [NAN, 1, 3], [1, 3, NAN], [INF, -INF, 1], [-INF, -INF, -INF], [-0.0, 0.0, -0.0],
        [-0.0, -0.0, -0.0], [2, 5, 5], [1e30, 1e-30, 1e30], [3.4028235e38, 1.0, 3.4028235e38], [1e-45, 0.0, -1e-45]]
# whole tensors for sum_all / mean_all, same rule
ALL = {"small specials": [0.0, -0.0, 1e-45, 1.1754944e-38, 1e-30, -1e-30, 1e-7, -1e-7, 0.5, 0.25],
       "overflow": [3.4028235e38, 3.4028235e38], "cancelling maxima": [3.4028235e38, -3.4028235e38],
       "infinities": [INF, -INF], "inf": [INF, 1.0], "nan": [NAN, 1.0], "negative zeros": [-0.0, -0.0]}
SOFTMAX_ROWS = [[0, 0, 0], [INF, 0, 0], [-INF, 0, 0], [NAN, 0, 0], [-INF, -INF, -INF], [88, 89, -89],
                [1e30, 0, -1e30], [3.4028235e38, 3.4028235e38, 0], [1e-45, -0.0, 1e-7], [-88, -89, -1e30]]


def cases():
    """(name, op, args, inputs) for every case; inputs are float tensors or ("i32", list, shape)."""
    v = f32(SPECIAL)
    n = len(SPECIAL)
    for op in UNARY:
        yield f"{op} special", op, {}, [v]
        yield f"{op} empty", op, {}, [f32([], [0, 3])]
    for p in POWERS:
        yield f"powf({p}) special", "powf", {"p": p}, [v]
    # negative integer powers whose |x|^|p| would be subnormal, though the result is finite
    tiny = f32([2e-13, -2e-13, 1e-19, 6e-20, -6e-20])
    for p in [-1.0, -2.0, -3.0]:
        yield f"powf({p}) tiny bases", "powf", {"p": p}, [tiny]
    for m, a in [(2.0, 1.0), (0.0, 0.0), (-1.0, 0.5), (1e30, 0.0), (1.0, 1e-7)]:
        yield f"affine({m}, {a}) special", "affine", {"mul": m, "add": a}, [v]
    pairs_a = v.repeat_interleave(n)
    pairs_b = v.repeat(n)
    for op in BINARY:
        yield f"{op} special pairs", op, {}, [pairs_a, pairs_b]
        for sa, sb in BROADCASTS:
            yield f"{op} broadcast {sa} {sb}", op, {}, [ramp(sa), ramp(sb, -1.5, 2.5)]
    rows = f32(ROWS)
    for op in ["sum", "mean", "max", "min"]:
        for axis in [1, 0, -1]:
            yield f"{op} special rows axis {axis}", op, {"axis": axis, "keepdim": axis == 0}, [rows]
        for shape, axis in [([2, 0], 1), ([0, 3], 0), ([0, 3], 1), ([1], 0), ([1, 1], 1), ([3, 1, 2], 1)]:
            yield f"{op} {shape} axis {axis}", op, {"axis": axis, "keepdim": False}, [ramp(shape)]
    for axis in [1, 0]:
        yield f"argmax special rows axis {axis}", "argmax", {"axis": axis}, [rows]
    yield "argmax [1] axis 0", "argmax", {"axis": 0}, [ramp([1])]
    yield "argmax [2, 0] axis 1", "argmax", {"axis": 1}, [ramp([2, 0])]
    for op in ["sum_all", "mean_all"]:
        for what, values in ALL.items():
            yield f"{op} {what}", op, {}, [f32(values)]
        for shape in [[0], [2, 0], [1], [1, 1]]:
            yield f"{op} {shape}", op, {}, [ramp(shape)]
    sm = f32(SOFTMAX_ROWS)
    for op in ["softmax", "log_softmax"]:
        yield f"{op} special rows", op, {"axis": 1}, [sm]
        yield f"{op} special columns", op, {"axis": 0}, [sm.t().contiguous()]
        for shape, axis in [([0, 3], 1), ([2, 0], 0), ([1, 1], 1), ([2, 1], 1)]:
            yield f"{op} {shape} axis {axis}", op, {"axis": axis}, [ramp(shape)]
    labels = [i % 3 for i in range(len(SOFTMAX_ROWS))]
    yield "cross_entropy special rows", "cross_entropy", {}, [sm, ("i32", labels, [len(labels)])]
    yield "cross_entropy 0 rows", "cross_entropy", {}, [f32([], [0, 3]), ("i32", [], [0])]
    yield "cross_entropy 1 row 1 class", "cross_entropy", {}, [ramp([1, 1]), ("i32", [0], [1])]
    yield "gather_rows special rows", "gather_rows", {}, [sm, ("i32", labels, [len(labels)])]
    yield "gather_rows 0 rows", "gather_rows", {}, [f32([], [0, 3]), ("i32", [], [0])]
    yield "mse_loss special", "mse_loss", {}, [v, v.flip(0)]
    yield "mse_loss empty", "mse_loss", {}, [f32([], [0]), f32([], [0])]
    sp = f32([[1, INF, 0], [NAN, 1, 2], [1e30, 1e30, -1]])
    yield "matmul special", "matmul", {}, [sp, f32([[1, 0], [0, 2], [1e30, 1]])]
    for sa, sb in [([0, 3], [3, 2]), ([2, 0], [0, 2]), ([2, 3], [3, 0]), ([1, 1], [1, 1]), ([2, 1, 3], [3, 2]), ([2, 2, 3], [2, 3, 1])]:
        yield f"matmul {sa} {sb}", "matmul", {}, [ramp(sa), ramp(sb, -1.0, 1.0)]
    for ta in [False, True]:
        for tb in [False, True]:
            yield f"matmul_t {ta} {tb}", "matmul_t", {"ta": ta, "tb": tb}, [sp, sp.flip(0)]
    img = ramp([2, 2, 5, 5])
    img[0, 0, 1, 1], img[0, 1, 3, 2], img[1, 0, 4, 4], img[1, 1, 0, 0] = NAN, INF, -INF, -0.0
    w, b = ramp([3, 2, 3, 3], -1.0, 1.0), f32([0.5, -0.25, 1e30])
    for stride, pad in [((1, 1), (0, 0)), ((2, 1), (1, 1)), ((1, 2), (2, 0))]:
        a = {"stride": list(stride), "pad": list(pad)}
        yield f"conv2d {stride} {pad}", "conv2d", a, [img, w]
        yield f"conv2d_bias {stride} {pad}", "conv2d_bias", a, [img, w, b]
        yield f"conv2d_bias_relu {stride} {pad}", "conv2d_bias_relu", a, [img, w, b]
    # OH*OW = 16, a multiple of 4: the products that add the bias and ReLU in their epilogue
    img6 = ramp([2, 2, 6, 6])
    img6[0, 0, 2, 2], img6[1, 1, 0, 5], img6[1, 0, 5, 0] = NAN, INF, -INF
    for op in ["conv2d", "conv2d_bias", "conv2d_bias_relu"]:
        yield f"{op} 6x6 to 4x4", op, {"stride": [1, 1], "pad": [0, 0]}, [img6, w] + ([b] if op != "conv2d" else [])
    yield "conv2d 1x1 on 1x1", "conv2d", {"stride": [1, 1], "pad": [0, 0]}, [ramp([1, 1, 1, 1]), ramp([1, 1, 1, 1])]
    windows = f32([1, NAN, 3, 4, -INF, -INF, -INF, -INF, 5, 6, 7, NAN, -0.0, 0.0, 0.0, -0.0], [1, 1, 4, 4])
    for kernel, stride, pad in [((2, 2), (2, 2), (0, 0)), ((2, 2), (1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1)), ((1, 1), (1, 1), (0, 0))]:
        a = {"kernel": list(kernel), "stride": list(stride), "pad": list(pad)}
        yield f"max_pool2d {kernel} {stride} {pad}", "max_pool2d", a, [windows]
        yield f"max_pool2d {kernel} {stride} {pad} on the image", "max_pool2d", a, [img]
    z = f32([0.0, -0.0, NAN, INF, -INF, 1e-45], [2, 3])
    yield "reshape signed zeros", "reshape", {"shape": [3, 2]}, [z]
    yield "reshape empty", "reshape", {"shape": [3, 0]}, [f32([], [0, 3])]
    yield "flatten", "flatten", {}, [ramp([2, 3, 2])]
    yield "flatten empty", "flatten", {}, [f32([], [0, 3])]
    yield "flatten_all", "flatten_all", {}, [z]
    yield "permute", "permute", {"perm": [2, 0, 1]}, [ramp([2, 3, 4])]
    yield "permute empty", "permute", {"perm": [1, 0]}, [f32([], [0, 3])]
    yield "t signed zeros", "t", {}, [z]
    yield "t batched", "t", {}, [ramp([2, 3, 4])]
    for src, dst in [([1], [3]), ([3], [2, 3]), ([2, 1], [2, 3]), ([1, 1], [0, 1]), ([2, 3], [2, 3])]:
        yield f"broadcast_to {src} {dst}", "broadcast_to", {"shape": dst}, [ramp(src)]
    for src, dst in [([2, 3], [3]), ([2, 3], [2, 1]), ([2, 3], [1, 1]), ([0, 3], [3]), ([2, 3], [2, 3])]:
        yield f"sum_to {src} {dst}", "sum_to", {"shape": dst}, [ramp(src)]
    yield "sum_to special", "sum_to", {"shape": [3]}, [z]
    for dim, start, ln in [(0, 1, 1), (1, 0, 2), (1, 3, 0), (0, 0, 0)]:
        yield f"narrow {dim} {start} {ln}", "narrow", {"dim": dim, "start": start, "len": ln}, [ramp([2, 3])]
    yield "split", "split", {"sizes": [1, 0, 2]}, [ramp([3, 2])]
    yield "cat 0", "cat", {"dim": 0}, [z, f32([], [0, 3]), ramp([1, 3])]
    yield "cat 1", "cat", {"dim": 1}, [z, ramp([2, 1])]
    yield "to special", "to", {}, [v]
    yield "to empty", "to", {}, [f32([], [0, 3])]
    yield from composed_cases(v, rows, sm, img, z)
    yield from more.cases(v)


# arguments of sin and cos where a short reduction by 2π loses the result: near multiples of
# π/2 and up to the largest finite
LARGE = [100.0, 1e4, 65536.0, 1e5, 102943.0, 1e6, 16777215.0, 3e7, 1.6e8, 1e10, 6.2831853e11, 1e20, 1e38,
         -1e5, -3e7, -1e20, 355.0, 710.0, 1.5707964, 3.1415927, 4.712389, 6.2831855, 7.8539815e5]


def composed_cases(v, rows, sm, img, z):
    """Cases of the ops composed from primitives and of the layers' forward functions."""
    for op in ["sin", "cos"]:
        yield f"{op} large arguments", op, {}, [f32(LARGE + [-x for x in LARGE[:5]])]
    yield "erf subnormals and near 0.5", "erf", {}, [f32([1e-40, -1e-40, 1e-38, 0.49999997, 0.5, 0.50000006, 3.9, 4.0, 10.0, -0.5])]
    # softplus is x itself above its threshold 20 (PyTorch's default), log1p(exp(x)) at and below
    yield "softplus across the threshold", "softplus", {}, [f32([19.999998, 20.0, 20.000002, 15.0, 25.0, -15.0, -20.0, -87.0,
                                                                 -103.0, -104.0, -110.0, 1e-3, -1e-3, 0.6931472])]
    for s in [2.0, -1.0, 0.0, 1e30, -0.0]:
        yield f"mul_scalar({s}) special", "mul_scalar", {"s": s}, [v]
    for s in [0.0, -0.0, 1.0, -1e30]:
        yield f"add_scalar({s}) special", "add_scalar", {"s": s}, [v]
    for lo, hi in [(-1.0, 1.0), (None, 0.0), (0.0, None), (-INF, INF), (2.0, 2.0), (-0.0, 0.0)]:
        yield f"clamp({lo}, {hi}) special", "clamp", {"min": lo, "max": hi}, [v]
    yield "clamp empty", "clamp", {"min": 0.0, "max": 1.0}, [f32([], [0, 3])]
    n = len(SPECIAL)
    yield "where special", "where", {}, [v, v.flip(0), v.roll(3)]
    yield "where broadcast", "where", {}, [ramp([3]), f32([1, 0], [2, 1]), f32([-0.0])]
    yield "where empty", "where", {}, [f32([], [0, 3]), f32([1, 0, NAN]), f32([], [0, 1])]
    for value in [1.5, -0.0, INF, NAN]:
        yield f"masked_fill({value}) special", "masked_fill", {"value": value}, [v, v.roll(5)]
    yield "masked_fill broadcast", "masked_fill", {"value": -INF}, [ramp([2, 3]), f32([0, 1, 0])]
    # without the last two rows: PyTorch's backward overflows its float mean at 3.4e38 and its
    # std underflows at 1e-45, giving infinite gradients where the exact ones are finite
    var_rows = rows[:9]
    for op in ["var", "std"]:
        for correction in [0, 1]:
            for axis in [1, 0]:
                yield f"{op}({correction}) special rows axis {axis}", op, {"axis": axis, "correction": correction, "keepdim": axis == 0}, [var_rows]
            for shape, axis in [([2, 0], 1), ([0, 3], 0), ([1], 0), ([2, 1], 1), ([3, 1, 2], 0), ([2, 3], -1)]:
                yield f"{op}({correction}) {shape} axis {axis}", op, {"axis": axis, "correction": correction, "keepdim": False}, [ramp(shape)]
        yield f"{op}(1) constant rows", op, {"axis": 1, "correction": 1, "keepdim": False}, [f32([[3, 3, 3], [-0.0, 0.0, -0.0], [0.1, 0.1, 0.1], [-7e20, -7e20, -7e20]])]
    for axes in [[0, 2], [-1], [1, 0]]:
        yield f"mean_axes {axes}", "mean_axes", {"axes": axes}, [ramp([2, 3, 4])]
    yield "mean_axes special rows", "mean_axes", {"axes": [0, 1]}, [rows]
    yield "mean_axes empty", "mean_axes", {"axes": [0]}, [f32([], [0, 3])]
    for dim in [0, 1, 2]:
        yield f"stack {dim}", "stack", {"dim": dim}, [z, ramp([2, 3]), z.flip(0)]
    yield "stack empty", "stack", {"dim": 1}, [f32([], [0, 3]), f32([], [0, 3])]
    yield "stack bad shapes", "stack", {"dim": 0}, [z, ramp([3, 2])]
    for dim in [0, 2, -1, -3]:
        yield f"unsqueeze {dim}", "unsqueeze", {"dim": dim}, [z]
    yield "unsqueeze out of range", "unsqueeze", {"dim": 4}, [z]
    for shape, dim in [([1, 3], 0), ([2, 1], -1), ([0, 1], 1), ([1], 0)]:
        yield f"squeeze {shape} {dim}", "squeeze", {"dim": dim}, [ramp(shape)]
    for start, end, step in [(0.0, 5.0, 1.0), (0.0, 1.0, 0.1), (5.0, 0.0, -1.5), (0.0, 0.0, 1.0), (-1e-7, 1e-7, 5e-8), (1.0, 0.0, 1.0), (0.0, 1.0, 0.0)]:
        # as tandem receives them: f32
        start, end, step = (float(F32(t)) for t in (start, end, step))
        yield f"arange({start}, {end}, {step})", "arange", {"start": start, "end": end, "step": step}, []
    yield "one_hot", "one_hot", {"classes": 3}, [("i32", [0, 2, 1, 2], [2, 2])]
    yield "one_hot empty", "one_hot", {"classes": 4}, [("i32", [], [0])]
    yield "one_hot out of range", "one_hot", {"classes": 3}, [("i32", [0, 3], [2])]
    yield "one_hot negative", "one_hot", {"classes": 3}, [("i32", [-1], [1])]
    for op in ["triu", "tril"]:
        for d in [-1, 0, 1, 5]:
            yield f"{op}({d}) special", op, {"diagonal": d}, [f32(SPECIAL[:24], [4, 6])]
        yield f"{op}(0) batched", op, {"diagonal": 0}, [ramp([2, 3, 4])]
        yield f"{op}(0) empty", op, {"diagonal": 0}, [f32([], [0, 3])]
        yield f"{op}(0) rank 1", op, {"diagonal": 0}, [ramp([3])]
    # special rows, repeated ids, casts and the other new ops: in torch_edge_more.py
    table = f32([[1, 0.0, 1e30], [0.5, 1e-45, -2], [-1e30, 3, 0], [7, -7, 0.25]])
    yield "index_select", "index_select", {}, [table, ("i32", [2, 0, 2, 3, 1, 1], [2, 3])]
    yield "index_select no ids", "index_select", {}, [table, ("i32", [], [0])]
    yield "index_select out of range", "index_select", {}, [table, ("i32", [4], [1])]
    for kernel, stride, pad in [(2, 2, 0), (3, 1, 1), (1, 1, 0), (5, 5, 2)]:
        yield f"avg_pool2d {kernel} {stride} {pad}", "avg_pool2d", {"kernel": kernel, "stride": stride, "pad": pad}, [img]
    for size in [[1, 1], [2, 3], [5, 5], [3, 2]]:
        yield f"adaptive_avg_pool2d {size}", "adaptive_avg_pool2d", {"size": size}, [img]
    labels = [i % 3 for i in range(len(SOFTMAX_ROWS))]
    ignored = [-100 if i % 4 == 1 else i % 3 for i in range(len(SOFTMAX_ROWS))]
    for ig, ls in [(-100, 0.0), (-100, 0.1), (1, 0.0), (1, 0.25), (-100, 1.0)]:
        t = ignored if ig == -100 else labels
        yield f"cross_entropy_with({ig}, {ls}) special rows", "cross_entropy_with", {"ignore_index": ig, "label_smoothing": ls}, [sm, ("i32", t, [len(t)])]
    yield "cross_entropy_with all ignored", "cross_entropy_with", {"ignore_index": -100, "label_smoothing": 0.1}, [ramp([3, 4]), ("i32", [-100] * 3, [3])]
    yield "cross_entropy_with [N, C, d]", "cross_entropy_with", {"ignore_index": 0, "label_smoothing": 0.2}, [ramp([2, 3, 4]), ("i32", [0, 1, 2, 1, 2, 2, 0, 1], [2, 4])]
    yield "cross_entropy_with bad target", "cross_entropy_with", {"ignore_index": -100, "label_smoothing": 0.0}, [ramp([2, 3]), ("i32", [0, 3], [2])]
    logp = torch.log_softmax(sm.nan_to_num(0.0, 0.0, 0.0), 1)
    logp[0, 0], logp[1, 1] = -INF, NAN
    for ig in [-100, 1]:
        yield f"nll_loss({ig})", "nll_loss", {"ignore_index": ig}, [logp, ("i32", labels, [len(labels)])]
    yield "nll_loss all ignored", "nll_loss", {"ignore_index": 2}, [ramp([2, 3]), ("i32", [2, 2], [2])]
    yield "nll_loss 0 rows", "nll_loss", {"ignore_index": -100}, [f32([], [0, 3]), ("i32", [], [0])]
    probs = f32([[0.0, 1.0, 0.5, 0.25, 1.0][i % 5] for i in range(n)])
    yield "bce_with_logits special", "bce_with_logits", {}, [v, probs]
    finite = [x for x in SPECIAL if np.isfinite(x)]
    yield "bce_with_logits finite", "bce_with_logits", {}, [f32(finite), probs[: len(finite)]]
    yield "bce_with_logits infinities", "bce_with_logits", {}, [f32([INF, -INF, INF, -INF]), f32([1.0, 0.0, 0.0, 1.0])]
    yield "bce_with_logits inf with y = 0", "bce_with_logits", {}, [f32([INF, 2.0]), f32([0.0, 0.5])]
    yield "bce_with_logits empty", "bce_with_logits", {}, [f32([], [0]), f32([], [0])]
    for op, a in [("l1_loss", {}), ("huber_loss", {"delta": 1.0}), ("huber_loss", {"delta": 0.5})]:
        yield f"{op} {a} special", op, a, [v, v.roll(7)]
        yield f"{op} {a} ordinary", op, a, [ramp([2, 5]), ramp([2, 5], 1.0, -1.0)]
        yield f"{op} {a} empty", op, a, [f32([], [0]), f32([], [0])]
    ln_x = f32([[1, 2, 3, 4], [5, 5, 5, 5], [NAN, 1, 2, 3], [INF, 1, 2, 3], [1e-30, -1e-30, 0, -0.0], [1e15, -1e15, 3, 1e15]])
    yield "layer_norm special rows", "layer_norm", {}, [ln_x, f32([1, -0.5, 2, 0]), f32([0, 0.25, -0.0, 1])]
    yield "layer_norm [2, 2, 3]", "layer_norm", {}, [ramp([2, 2, 3]), ramp([2, 3], 0.5, 1.5), ramp([2, 3], -0.1, 0.1)]
    yield "layer_norm empty", "layer_norm", {}, [f32([], [0, 3]), f32([1, 1, 1]), f32([0, 0, 0])]
    for train in [True, False]:
        yield f"batch_norm train={train} [N, C]", "batch_norm", {"train": train}, [f32([[1, NAN, 3], [2, 1, -0.0], [4, 2, 0.0]])]
        yield f"batch_norm train={train} [N, C, H, W]", "batch_norm", {"train": train}, [ramp([2, 3, 2, 2])]
    yield "batch_norm train=True one value per channel", "batch_norm", {"train": True}, [ramp([1, 3])]


def run(op, args, inputs):
    """(outputs, gradients or None, error) of one case."""
    f, diff = OPS[op]
    xs = []
    for x in inputs:
        if isinstance(x, tuple):
            xs.append(torch.tensor(x[1], dtype=torch.int32).reshape(x[2]))
        else:
            xs.append(x.clone().requires_grad_(diff))
    try:
        outs = f(xs, args)
    except (RuntimeError, IndexError, ValueError) as e:
        return None, None, str(e).splitlines()[0]
    if not diff:
        return outs, None, None
    loss = sum((o * weights(o.numel()).reshape(o.shape)).sum() for o in outs)
    loss.backward()
    grads = [None if x.dtype != torch.float32 else (x.grad if x.grad is not None else torch.zeros_like(x)) for x in xs]
    return outs, grads, None


ELEMENTWISE = UNARY + BINARY + ["powf", "affine", "mul_scalar", "add_scalar", "clamp", "where", "masked_fill"]


def same(a, b):
    """Equal bits, any NaN equal to any NaN."""
    return bool(((a.isnan() & b.isnan()) | (a.view(torch.int32) == b.view(torch.int32))).all())


def alternatives(op, args, inputs, outs, grads):
    """PyTorch's answers where its scalar path (an element computed alone) differs from its
    vector path (gelu(inf) is inf alone, NaN in a vector; maximum(-0, 0) is either zero), as
    {position: bits} for the output and for each input's gradient; the test accepts either."""
    if op not in ELEMENTWISE or any(isinstance(x, tuple) for x in inputs) or len({tuple(x.shape) for x in inputs}) != 1:
        return {}
    flat = [x.reshape(-1) for x in inputs]
    whole = outs[0].detach().reshape(-1)
    w = weights(whole.numel())
    alt = {"outputs": {}, "grads": [{} for _ in inputs]}
    for i in range(whole.numel()):
        xs = [x[i : i + 1].clone().requires_grad_(grads is not None) for x in flat]
        y = OPS[op][0](xs, args)[0]
        if not same(y.detach(), whole[i : i + 1]):
            alt["outputs"][str(i)] = bits(y)[0]
        if grads is None:
            continue
        (y * w[i]).sum().backward()
        for j, x in enumerate(xs):
            g = x.grad if x.grad is not None else torch.zeros_like(x)
            if not same(g, grads[j].reshape(-1)[i : i + 1]):
                alt["grads"][j][str(i)] = bits(g)[0]
    if not any(alt["grads"]):
        del alt["grads"]
    if not alt["outputs"]:
        del alt["outputs"]
    return alt


def plain(v):
    """Arguments as JSON has them: a non-finite float as the string "nan", "inf" or "-inf"."""
    if isinstance(v, float) and not np.isfinite(v):
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def kept_cases():
    """The cases of the fixture named by `--keep FILE`, by name: PyTorch's vector paths answer
    some elements differently with other CPU instructions (AVX-512 or AVX2), so a fixture
    regenerated on another host to add an op keeps the cases it already has as they are."""
    if "--keep" not in sys.argv:
        return {}
    with open(sys.argv[sys.argv.index("--keep") + 1]) as f:
        return {c["name"]: c for c in json.load(f)["cases"]}


def main():
    torch.set_num_threads(1)
    out = []
    names = set()
    keep = kept_cases()
    changed = 0
    for name, op, args, inputs in cases():
        assert name not in names, name
        names.add(name)
        outs, grads, err = run(op, args, inputs)
        enc_in = []
        for x in inputs:
            if isinstance(x, tuple):
                enc_in.append({"shape": x[2], "i32": x[1]})
            else:
                enc_in.append({"shape": list(x.shape), "f32": bits(x)})
        case = {"name": name, "op": op, "args": {k: plain(x) for k, x in args.items()}, "inputs": enc_in}
        if err is not None:
            case["error"] = err
        else:
            case["outputs"] = []
            for o in outs:
                if o.dtype == torch.float32:
                    case["outputs"].append({"shape": list(o.shape), "f32": bits(o)})
                else:
                    case["outputs"].append({"shape": list(o.shape), "i32": o.tolist() if o.dim() else [o.item()]})
            if grads is not None:
                case["grads"] = [None if g is None else {"shape": list(g.shape), "f32": bits(g)} for g in grads]
            alt = alternatives(op, args, inputs, outs, grads)
            if alt:
                case["alternatives"] = alt
        if name in keep:
            changed += keep[name] != json.loads(json.dumps(case))
            case = keep[name]
        out.append(case)
    if keep:
        print(f"kept {sum(n in keep for n in names)} cases of the old fixture ({changed} of them differ on this host), "
              f"added {sum(n not in keep for n in names)}", file=sys.stderr)
    # one case per line, so that regenerating gives a readable diff
    head = {"generator": "scripts/torch_edge_cases.py", "torch": torch.__version__, "weights": WEIGHTS}
    sys.stdout.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"cases":[\n')
    sys.stdout.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in out))
    sys.stdout.write("\n]}\n")


if __name__ == "__main__":
    main()
