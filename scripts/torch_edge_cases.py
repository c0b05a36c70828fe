"""PyTorch's answers for every op of tandem's Tensor API (and each op's gradient) on special
values and special shapes, written as tests/fixtures/torch_edge_cases.json for
tests/edge_numerics.rs. Regenerate after adding an op (here and in that test's table):

    /tmp/tandem-torch-venv/bin/python scripts/torch_edge_cases.py > tests/fixtures/torch_edge_cases.json

Values are stored as the hex of their f32 bits, so NaN and -0 survive JSON. Each case is run in
float32 on the CPU. A gradient is that of sum_k sum(out_k * w_k) with fixed weights w_k (the
pattern WEIGHTS repeated), so that it is not 0 by symmetry. PyTorch answers some ±0 pairs
differently in its scalar and vector paths (maximum(-0, 0) is -0 or 0 depending on the length):
each element of an elementwise case is also computed alone, and a zero whose sign differs
between the two is recorded in `zero_sign_free` (its sign is not checked)."""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

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
}

UNARY = ["identity", "step", "neg", "exp", "log", "relu", "sqrt", "square", "tanh", "sigmoid", "recip", "abs"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "gt", "eq_elem", "relu_backward"]
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
    except (RuntimeError, IndexError) as e:
        return None, None, str(e).splitlines()[0]
    if not diff:
        return outs, None, None
    loss = sum((o * weights(o.numel()).reshape(o.shape)).sum() for o in outs)
    loss.backward()
    grads = [None if x.dtype != torch.float32 else (x.grad if x.grad is not None else torch.zeros_like(x)) for x in xs]
    return outs, grads, None


def zero_sign_free(op, args, inputs, outs):
    """Positions of zeros in the output of an elementwise op whose sign differs when that
    element is computed alone (PyTorch's scalar path) rather than in the whole tensor."""
    if op not in BINARY + UNARY + ["powf", "affine"] or len({tuple(x.shape) for x in inputs}) != 1:
        return []
    whole = outs[0].detach().reshape(-1)
    flat = [x.reshape(-1) for x in inputs]
    free = []
    for i in range(whole.numel()):
        alone = OPS[op][0]([x[i : i + 1] for x in flat], args)[0].detach()
        if whole[i] == 0 and alone[0] == 0 and torch.signbit(whole[i]) != torch.signbit(alone[0]):
            free.append(i)
    return free


def main():
    torch.set_num_threads(1)
    out = []
    names = set()
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
        case = {"name": name, "op": op, "args": args, "inputs": enc_in}
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
            free = zero_sign_free(op, args, inputs, outs)
            if free:
                case["zero_sign_free"] = free
        out.append(case)
    # one case per line, so that regenerating gives a readable diff
    head = {"generator": "scripts/torch_edge_cases.py", "torch": torch.__version__, "weights": WEIGHTS}
    sys.stdout.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"cases":[\n')
    sys.stdout.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in out))
    sys.stdout.write("\n]}\n")


if __name__ == "__main__":
    main()
