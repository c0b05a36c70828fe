"""PyTorch side of the GPT parity check (tests/gpt.rs).

A nanoGPT-shaped model, written here from nanoGPT's description (pre-LayerNorm blocks, causal
self-attention through one c_attn projection, a tanh-GELU MLP, lm_head tied to wte, GPT-2
init), trained for 10 AdamW steps; tandem must reproduce the losses and the final weights.

    python scripts/gpt_parity.py make          # writes tests/fixtures/gpt_tiny.safetensors
    cargo test --test gpt parity               # trains in tandem, saves target/tmp/gpt_tiny_tandem_*.safetensors
    python scripts/gpt_parity.py check CKPT..  # loads each with strict=True, compares the val loss

Settings: AdamW with betas (0.9, 0.95) (nanoGPT's train.py), eps 1e-8, weight decay 0.1 on the
parameters of rank >= 2 and 0 on the others (nanoGPT's configure_optimizers), a constant lr,
gradient clipping to a global norm of 1.0, dropout 0, float32.
"""
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpt_tiny.safetensors"
CONFIG = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, dropout=0.0, bias=True)
TRAIN = dict(steps=10, batch=4, lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


class LayerNorm(nn.Module):
    """PyTorch's LayerNorm with the bias optional."""

    def __init__(self, c, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.n_head = cfg["n_head"]
        self.p = cfg["dropout"]
        self.c_attn = nn.Linear(c, 3 * c, bias=cfg["bias"])
        self.c_proj = nn.Linear(c, c, bias=cfg["bias"])
        self.resid_dropout = nn.Dropout(cfg["dropout"])

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        heads = lambda z: z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        # nanoGPT's path on torch >= 2 (softmax(q·kᵀ/√D + causal mask)·v, one kernel), which
        # keeps no mask buffer: its state_dict has no attn.bias
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.c_fc = nn.Linear(c, 4 * c, bias=cfg["bias"])
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * c, c, bias=cfg["bias"])
        self.dropout = nn.Dropout(cfg["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg["vocab_size"], c),
                wpe=nn.Embedding(cfg["block_size"], c),
                drop=nn.Dropout(cfg["dropout"]),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])]),
                ln_f=LayerNorm(c, cfg["bias"]),
            )
        )
        self.lm_head = nn.Linear(c, cfg["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg["n_layer"]))

    def forward(self, idx):
        t = idx.size(1)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t)))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def tokens(gen, shape, vocab):
    """Sequences with some structure to learn: mostly `next = 7·prev + 3 (mod V)`, else random."""
    *lead, n = shape
    out = torch.empty(*lead, n, dtype=torch.long)
    out[..., 0] = torch.randint(0, vocab, lead, generator=gen)
    for i in range(1, n):
        follow = (out[..., i - 1] * 7 + 3) % vocab
        noise = torch.randint(0, vocab, lead, generator=gen)
        out[..., i] = torch.where(torch.rand(lead, generator=gen) < 0.7, follow, noise)
    return out


def make():
    torch.manual_seed(1337)
    torch.use_deterministic_algorithms(True)
    cfg, tr = CONFIG, TRAIN
    model = GPT(cfg)
    init = {f"init.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(7)
    seq = tokens(gen, (tr["steps"], tr["batch"], cfg["block_size"] + 1), cfg["vocab_size"])
    val = tokens(gen, (tr["batch"], cfg["block_size"] + 1), cfg["vocab_size"])
    x, y = seq[..., :-1].contiguous(), seq[..., 1:].contiguous()
    val_x, val_y = val[:, :-1].contiguous(), val[:, 1:].contiguous()
    params = [p for p in model.parameters()]
    groups = [
        dict(params=[p for p in params if p.dim() >= 2], weight_decay=tr["weight_decay"]),
        dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0),
    ]
    opt = torch.optim.AdamW(groups, lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
    losses, norms = [], []
    for s in range(tr["steps"]):
        loss = loss_of(model, x[s], y[s])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"]).item())
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        val_loss = loss_of(model, val_x, val_y).item()
    final = {f"final.{k}": v.detach().clone().contiguous() for k, v in model.named_parameters()}
    tensors = dict(init, **final, x=x, y=y, val_x=val_x, val_y=val_y)
    tensors["losses"] = torch.tensor(losses, dtype=torch.float32)
    tensors["grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    tensors["val_loss"] = torch.tensor([val_loss], dtype=torch.float32)
    meta = {
        "config": json.dumps(cfg),
        "train": json.dumps(tr),
        "state_dict_names": json.dumps(list(model.state_dict().keys())),
        "state_dict_names_no_bias": json.dumps(list(GPT(dict(cfg, bias=False)).state_dict().keys())),
        "torch": torch.__version__,
    }
    save_file(tensors, str(FIXTURE), metadata=meta)
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
    print("losses", [round(l, 5) for l in losses])
    print("grad norms (clipped when > 1)", [round(n, 4) for n in norms])
    print("val loss", val_loss)


def check(paths):
    """Each tandem checkpoint loads into the reference with strict=True and gives, on the
    fixture's validation batch, the validation loss tandem recorded in its metadata."""
    fx = load_file(str(FIXTURE))
    ok = True
    for path in paths:
        with safe_open(path, "pt") as f:
            want = float(f.metadata()["val_loss"])
        model = GPT(CONFIG)
        model.load_state_dict(load_file(path), strict=True)
        assert model.lm_head.weight is model.transformer.wte.weight
        model.eval()
        with torch.no_grad():
            got = loss_of(model, fx["val_x"], fx["val_y"]).item()
        worst = max((v - fx[f"final.{k}"]).abs().max().item() for k, v in model.named_parameters())
        rel = abs(got - want) / abs(want)
        ok &= rel <= 1e-4
        print(f"{path}: strict load ok; val loss pytorch {got:.6f} tandem {want:.6f} (rel {rel:.1e}); "
              f"weights within {worst:.1e} of the reference's final ones; "
              f"the reference's own final val loss {fx['val_loss'].item():.6f}")
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"]:
        make()
    elif sys.argv[1:2] == ["check"] and len(sys.argv) > 2:
        check(sys.argv[2:])
    else:
        sys.exit(__doc__)
