"""PyTorch side of examples/custom_model.rs's parity check (issue 13).

The example's network, written here in PyTorch with the same attribute names, is trained for 10
AdamW steps from fixed weights on a fixed batch: BatchNorm in training mode, dropout 0, label
smoothing 0.1, two parameter groups (weight decay 0.05 on tensors of rank >= 2, none on biases and
norms), linear warmup then cosine decay of the learning rate, and global-norm clipping at 1.0.
Then one forward in eval mode (BatchNorm's running statistics). tests/custom_model.rs repeats all
of it in tandem on every device and compares.

    python scripts/custom_model_parity.py make tests/fixtures/custom_model   # writes the fixture
    python scripts/custom_model_parity.py check CKPT.safetensors OUT_DIR      # strict load + eval loss

`make` writes init.safetensors (the weights and buffers; num_batches_tracked as float32, tandem's
dtype for it), data.safetensors (x, y) and expected.safetensors (the final state, `eval_logits`)
plus expected.json (per-step losses, gradient norms before clipping, learning rates)."""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

# The fixture's widths (the example trains wider: 16, 32, 128, 256); the architecture is the same.
C1, C2, D, HIDDEN = 8, 16, 32, 64
STEPS, WARMUP, LR, MIN_LR, DECAY, CLIP, SMOOTHING, BATCH = 10, 3, 3e-3, 3e-4, 0.05, 1.0, 0.1, 32


class ConvBn(nn.Module):
    def __init__(self, cin, cout, k, stride, pad):
        super().__init__()
        # No bias before BatchNorm (ResNet's practice): training-mode BatchNorm subtracts the
        # channel mean, so a bias's gradient is zero but for rounding, and AdamW, which divides
        # by the gradient's own scale, would turn that rounding into steps of ~lr that no two
        # implementations reproduce.
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Residual(nn.Module):
    """Pre-LayerNorm residual MLP block: x + fc2(dropout(gelu(fc1(ln(x)))))."""

    def __init__(self, d, hidden, p):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.fc2(self.drop(F.gelu(self.fc1(self.ln(x)))))


class Head(nn.Module):
    def __init__(self, d, classes):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, classes)

    def forward(self, x):
        return self.fc(self.ln(x))


class Net(nn.Module):
    def __init__(self, c1=C1, c2=C2, d=D, hidden=HIDDEN, p=0.0):
        super().__init__()
        self.conv1 = ConvBn(1, c1, 5, 2, 2)  # 28x28 -> 14x14
        self.conv2 = ConvBn(c1, c2, 3, 2, 1)  # 14x14 -> 7x7
        self.fc = nn.Linear(c2 * 49, d)
        self.block1 = Residual(d, hidden, p)
        self.block2 = Residual(d, hidden, p)
        self.head = Head(d, 10)

    def forward(self, x):
        x = self.conv2(self.conv1(x)).flatten(1)
        return self.head(self.block2(self.block1(self.fc(x))))


def lr_at(step):
    """nanoGPT's get_lr: linear warmup over WARMUP steps, then cosine down to MIN_LR at STEPS."""
    if step < WARMUP:
        return LR * (step + 1) / (WARMUP + 1)
    ratio = (step - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def state(model):
    return {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}


def make(out):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = Net()
    x = torch.randn(BATCH, 1, 28, 28)
    y = torch.randint(0, 10, (BATCH,))
    save_file(state(model), f"{out}/init.safetensors")
    save_file({"x": x, "y": y.to(torch.int32)}, f"{out}/data.safetensors")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": DECAY}, {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    model.train()
    losses, norms, lrs = [], [], []
    for step in range(STEPS):
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = F.cross_entropy(model(x), y, label_smoothing=SMOOTHING)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    expected = state(model)
    expected["eval_logits"] = logits.contiguous()
    save_file(expected, f"{out}/expected.safetensors")
    with open(f"{out}/expected.json", "w") as f:
        json.dump({"losses": losses, "grad_norms": norms, "lrs": lrs, "eval_loss": F.cross_entropy(logits, y).item()}, f, indent=1)
    print(f"losses {losses[0]:.6f} .. {losses[-1]:.6f}; eval loss {F.cross_entropy(logits, y).item():.6f}")


def check(ckpt, data_dir):
    """Loads a tandem checkpoint with strict=True (every name, shape) and prints the eval loss;
    fails when the checkpoint records tandem's own eval loss (metadata `eval_loss`, written by
    tests/custom_model.rs) and PyTorch's differs from it by more than 1e-4 relative."""
    weights = load_file(ckpt)
    with safe_open(ckpt, "pt") as f:
        tandem_loss = (f.metadata() or {}).get("eval_loss")
    model = Net()
    own = model.state_dict()
    converted = {k: v.to(own[k].dtype) if k in own else v for k, v in weights.items()}
    model.load_state_dict(converted, strict=True)
    model.eval()
    data = load_file(f"{data_dir}/data.safetensors")
    with torch.no_grad():
        loss = F.cross_entropy(model(data["x"]), data["y"].long()).item()
    report = {"checkpoint": ckpt, "strict_load": True, "eval_loss": loss}
    if tandem_loss is not None:
        report["tandem_eval_loss"] = float(tandem_loss)
        report["pass"] = abs(loss - float(tandem_loss)) <= 1e-4 * abs(loss)
    print(json.dumps(report))
    if not report.get("pass", True):
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
