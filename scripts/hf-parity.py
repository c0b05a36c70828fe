#!/usr/bin/env python3
"""transformers' side of tandem's GPT-2 parity: logits and 10 AdamW steps (tests/hf_parity.rs).

    python scripts/hf-parity.py make DIR small  # GPT-2 small's shape, in a scratch folder
    python scripts/hf-parity.py make DIR tiny   # the committed fixture: tests/fixtures/hf_tiny
    python scripts/hf-parity.py load DIR        # DIR/tuned, a folder tandem wrote, into transformers

`make` builds `GPT2LMHeadModel(GPT2Config(...))` from `torch.manual_seed(0)` (dropout 0, f32),
writes it with `save_pretrained` to DIR (config.json, model.safetensors), and writes
DIR/reference.safetensors: the token windows `x`, `y` ([10, B, T]), the initial model's
`logits` of `x[0]` ([B, T, V]), the `losses` of 10 AdamW steps, one batch each, and
`final.NAME`, a few parameters after them, with the settings of tandem's `--optimizer adamw`
(betas 0.9, 0.999, eps 1e-8, decoupled weight decay, here 0.1, on parameters of rank >= 2 and
none on biases and LayerNorms), no clipping. The tokens are DIR/ids.json's where the caller
wrote them (tests/hf_parity.rs writes GPT-2's BPE tokens of a text), else the UTF-8 bytes of
the text below (the tiny shape's vocabulary is 256).

`load` reads DIR/tuned with `GPT2LMHeadModel.from_pretrained(..., output_loading_info=True)`,
fails on any missing, unexpected or mismatched key or warning, and compares transformers' logits
of DIR/tuned_ids.json's rows with DIR/tuned_logits.safetensors (max |diff| <= 1e-4).
Needs torch, transformers, safetensors and numpy (CI has no torch: the tiny fixture is committed).
"""
import json
import os
import sys

import numpy as np
from hf_gpt2_parity import Warnings  # its strict load's warning catcher (this folder is on sys.path)

TOL = 1e-4
STEPS = 10
TRAIN = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
# Parameters whose values after the steps are kept: decayed (wpe) and not (the rest).
FINAL = ["transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias", "transformer.h.0.attn.c_attn.bias"]
SHAPES = {
    "small": (dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257), 2, 64),
    "tiny": (dict(n_layer=2, n_head=4, n_embd=64, n_positions=32, vocab_size=256), 4, 32),
}
# Real text (Dickens, A Tale of Two Cities; and a little in other scripts) for the token windows.
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter "
    "of despair, we had everything before us, we had nothing before us, we were all going direct "
    "to Heaven, we were all going direct the other way - in short, the period was so far like the "
    "present period, that some of its noisiest authorities insisted on its being received, for "
    "good or for evil, in the superlative degree of comparison only.\n\n"
    "There were a king with a large jaw and a queen with a plain face, on the throne of England; "
    "there were a king with a large jaw and a queen with a fair face, on the throne of France. In "
    "both countries it was clearer than crystal to the lords of the State preserves of loaves and "
    "fishes, that things in general were settled for ever.\n\n"
    "Ein Fuchs läuft über die Straße; 東京の狐 🦊 runs\tacross\n\nthe road, 42 times. "
)


def windows(ids, batch, block):
    """`STEPS` batches of `batch` windows of `block` + 1 tokens, spread over `ids`."""
    need = block + 1
    ids = (ids * (need // len(ids) + 2))
    room = len(ids) - need
    rows = [ids[(k * 37) % room:][:need] for k in range(STEPS * batch)]
    w = np.array(rows, dtype=np.int64).reshape(STEPS, batch, need)
    return np.ascontiguousarray(w[:, :, :-1]), np.ascontiguousarray(w[:, :, 1:])


def make(root, shape):
    import torch
    import torch.nn.functional as F
    from safetensors.numpy import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    sizes, batch, block = SHAPES[shape]
    ids_path = os.path.join(root, "ids.json")
    if os.path.exists(ids_path):
        with open(ids_path) as f:
            ids = json.load(f)
    else:
        ids = list(TEXT.encode("utf-8"))
    assert max(ids) < sizes["vocab_size"], "a token id past the vocabulary"
    x, y = windows(ids, batch, block)
    torch.manual_seed(0)
    last = sizes["vocab_size"] - 1
    cfg = GPT2Config(**sizes, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=last, eos_token_id=last)
    model = GPT2LMHeadModel(cfg).float().train()
    model.save_pretrained(root)
    gen = os.path.join(root, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    with torch.no_grad():
        logits = model(torch.from_numpy(x[0])).logits.numpy()
    params = [p for p in model.parameters()]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": TRAIN["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]), eps=TRAIN["eps"])
    losses = []
    for s in range(STEPS):
        out = model(torch.from_numpy(x[s])).logits
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.from_numpy(y[s]).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    meta = {"train": json.dumps(dict(TRAIN, steps=STEPS)), "config": json.dumps(sizes), "made_by": "scripts/hf-parity.py make"}
    tensors = {"x": x, "y": y, "logits": logits.astype(np.float32), "losses": np.array(losses, dtype=np.float32)}
    state = model.state_dict()
    tensors.update({f"final.{n}": state[n].detach().numpy().copy() for n in FINAL})
    save_file(tensors, os.path.join(root, "reference.safetensors"), metadata=meta)
    print(f"made {root} ({shape}); losses {losses}", file=sys.stderr)


def load(root):
    import torch
    from safetensors.numpy import load_file
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    folder = os.path.join(root, "tuned")
    caught = Warnings()
    hf_logging.get_logger("transformers").addHandler(caught)
    model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad or caught.seen:
        sys.exit(f"loading {folder}: {bad} {caught.seen}")
    with open(os.path.join(root, "tuned_ids.json")) as f:
        ids = json.load(f)
    with torch.no_grad():
        want = model.eval()(torch.tensor(ids)).logits.double().numpy()
    got = load_file(os.path.join(root, "tuned_logits.safetensors"))["logits"].astype(np.float64)
    diff = float(np.abs(got - want).max())
    print(f"{folder}: loads with no missing or unexpected keys; max |tandem - transformers| logits {diff:.3g}", file=sys.stderr)
    if not diff <= TOL:
        sys.exit(f"logits differ by {diff} > {TOL}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make" and sys.argv[3] in SHAPES:
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "load":
        load(sys.argv[2])
    else:
        sys.exit(__doc__)
