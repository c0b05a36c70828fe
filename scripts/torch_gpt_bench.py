"""PyTorch's CPU time for the GPT training step that `tandem bench --model gpt` measures.

A nanoGPT-shaped model (pre-LN blocks, causal self-attention composed as matmul + masked
softmax + matmul, tanh GELU, tied lm_head), AdamW (betas 0.9/0.999, eps 1e-8, weight decay
0.01 on parameters of rank >= 2), batch 16 of block 64 over the built-in corpus's 44
characters, 2 threads. Prints one JSON object in `tandem bench`'s form, the activation bytes
counted as the bytes of every distinct tensor autograd saves for backward. With `--precision
bf16` the forward and the loss run under `torch.autocast("cpu", torch.bfloat16)` (the step of
`tandem train --precision bf16`: F32 master weights, bf16 products), and the figure names its
precision (as it does with `--precision f32`).

    /tmp/tandem-torch-venv/bin/python scripts/torch_gpt_bench.py [--threads 2] [--reps 10] [--precision f32|bf16]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, c, h, block):
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.register_buffer("mask", torch.ones(block, block).triu(1).bool(), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.h
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, d).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, c, h, block):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = Attention(c, h, block)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, block) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()


def saved_bytes(model, x, y):
    """Bytes of the distinct tensors autograd keeps for one forward's backward (parameters
    excluded, as tandem's count)."""
    params = {p.data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    return sum(seen.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=44)
    ap.add_argument("--precision", choices=["f32", "bf16"], default=None)
    a = ap.parse_args()
    half = a.precision == "bf16"
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Gpt(4, 4, 128, a.block, a.vocab)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    x = torch.randint(0, a.vocab, (a.batch, a.block))
    y = torch.randint(0, a.vocab, (a.batch, a.block))
    act = saved_bytes(model, x, y)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=half):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        return loss.item()

    step()
    times = []
    for _ in range(a.reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    fig = {
        "bench": "train-step", "model": "gpt", "device": f"torch-cpu-{a.threads}t", "batch": a.batch, "block_size": a.block,
        "median_ms": med * 1e3, "tokens_per_sec": a.batch * a.block / med, "activation_bytes": act,
    }
    if a.precision:
        fig["precision"] = a.precision
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
