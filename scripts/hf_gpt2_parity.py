#!/usr/bin/env python3
"""GPT-2 in the Hugging Face layout, both ways, against an implementation that is not tandem's.

    python3 scripts/hf_gpt2_parity.py make DIR    # a GPT-2 folder, its token ids and logits
    python3 scripts/hf_gpt2_parity.py check DIR   # a folder tandem wrote, against its logits

`make` writes DIR/model/ as `save_pretrained` does (config.json from transformers'
`GPT2Config(...).save_pretrained`; model.safetensors of random weights in transformers' names
and Conv1D layout, metadata {"format": "pt"}), DIR/ids.json (two rows of the token ids
DIR/ids.json held, a text's, or fixed ids) and DIR/logits.safetensors, the reference logits. `check` reads DIR/out/ (a folder
tandem wrote), DIR/ids.json and DIR/tandem_logits.safetensors and compares (max |diff| <=
1e-4). With PyTorch installed, the model and the logits are transformers' GPT2LMHeadModel's
(and `check` loads the folder with `from_pretrained`, which must not warn); without it, a
float64 NumPy forward of GPT-2 written here from the paper's definition computes them, and
`check` loads the configuration with `GPT2Config.from_pretrained`.
tests/hf_gpt2.rs runs both when transformers, safetensors and numpy import.
"""
import json
import logging
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

TOL = 1e-4
# A small GPT-2 of the real vocabulary: long enough a context for the text below.
SHAPE = dict(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=50257)


def torch_or_none():
    try:
        import torch  # noqa: F401

        return torch
    except ImportError:
        return None


def ids_of_text(root, block):
    """Two rows of `block` ids: DIR/ids.json's tokens of a text where the caller wrote them
    (tests/hf_gpt2.rs writes GPT-2's tokens of a text), else fixed ids."""
    path = os.path.join(root, "ids.json")
    if os.path.exists(path):
        with open(path) as f:
            ids = json.load(f)
    else:
        ids = [(i * 7919 + 13) % SHAPE["vocab_size"] for i in range(2 * block)]
    ids = (ids * (2 * block // len(ids) + 1))[: 2 * block]
    return [ids[:block], ids[block:]]


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def numpy_logits(w, cfg, ids):
    """GPT2LMHeadModel's forward in float64; `w` in transformers' names, Conv1D weights [in, out]."""
    w = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in w.items()}
    ids = np.asarray(ids)
    bsz, t = ids.shape
    c, nh = cfg["n_embd"], cfg["n_head"]
    d, eps = c // nh, cfg["layer_norm_epsilon"]
    x = w["wte.weight"][ids] + w["wpe.weight"][:t]
    mask = np.triu(np.ones((t, t), dtype=bool), 1)
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(bsz, t, nh, d).transpose(0, 2, 1, 3) for a in np.split(qkv, 3, axis=-1))
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
        att = np.where(mask, -np.inf, att)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(bsz, t, c)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        x = x + gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]) @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    return x @ w["wte.weight"].T


def random_weights(cfg, rng):
    c, v, n = cfg.n_embd, cfg.vocab_size, cfg.n_positions
    w = {"transformer.wte.weight": (v, c), "transformer.wpe.weight": (n, c), "transformer.ln_f.weight": (c,), "transformer.ln_f.bias": (c,)}
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        for name, shape in [("ln_1", (c,)), ("ln_2", (c,))]:
            w[p + name + ".weight"], w[p + name + ".bias"] = shape, shape
        for name, (i_, o) in [("attn.c_attn", (c, 3 * c)), ("attn.c_proj", (c, c)), ("mlp.c_fc", (c, 4 * c)), ("mlp.c_proj", (4 * c, c))]:
            w[p + name + ".weight"], w[p + name + ".bias"] = (i_, o), (o,)
    out = {}
    for k, shape in w.items():
        if k.endswith("ln_1.weight") or k.endswith("ln_2.weight") or k.endswith("ln_f.weight"):
            out[k] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[k] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out


def make(root):
    from transformers import GPT2Config

    cfg = GPT2Config(**SHAPE)
    model_dir = os.path.join(root, "model")
    ids = ids_of_text(root, SHAPE["n_positions"])
    torch = torch_or_none()
    if torch is not None:
        from transformers import GPT2LMHeadModel

        torch.manual_seed(0)
        model = GPT2LMHeadModel(cfg).eval()
        model.save_pretrained(model_dir)
        with torch.no_grad():
            logits = model(torch.tensor(ids)).logits.double().numpy()
        how = "transformers' GPT2LMHeadModel"
    else:
        cfg.save_pretrained(model_dir)
        w = random_weights(cfg, np.random.default_rng(0))
        save_file(w, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
        logits = numpy_logits(w, cfg.to_dict(), ids)
        how = "the NumPy forward (no PyTorch)"
    with open(os.path.join(root, "ids.json"), "w") as f:
        json.dump(ids, f)
    save_file({"logits": logits.astype(np.float32)}, os.path.join(root, "logits.safetensors"))
    print(f"made {model_dir}; logits {logits.shape} by {how}", file=sys.stderr)


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = []

    def emit(self, record):
        self.seen.append(record.getMessage())


def check(root):
    from transformers import GPT2Config
    from transformers.utils import logging as hf_logging

    out = os.path.join(root, "out")
    with open(os.path.join(root, "ids.json")) as f:
        ids = json.load(f)
    got = load_file(os.path.join(root, "tandem_logits.safetensors"))["logits"].astype(np.float64)
    caught = Warnings()
    hf_logging.get_logger("transformers").addHandler(caught)
    torch = torch_or_none()
    if torch is not None:
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(out).eval()
        with torch.no_grad():
            want = model(torch.tensor(ids)).logits.double().numpy()
    else:
        cfg = GPT2Config.from_pretrained(out)
        want = numpy_logits(load_file(os.path.join(out, "model.safetensors")), cfg.to_dict(), ids)
    warned = [m for m in caught.seen if "PyTorch was not found" not in m]
    if warned:
        sys.exit(f"loading {out} warned: {warned}")
    diff = float(np.abs(got - want).max())
    print(f"{out}: max |tandem - reference| = {diff:.3g}", file=sys.stderr)
    if not diff <= TOL:
        sys.exit(f"logits differ by {diff} > {TOL}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit(__doc__)
    (make if sys.argv[1] == "make" else check)(sys.argv[2])
