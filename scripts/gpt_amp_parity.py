"""PyTorch side of the mixed-precision parity check (tests/precision.rs).

From the GPT parity fixture's initial weights and batches (scripts/gpt_parity.py), trains the
same nanoGPT-shaped model for its 10 AdamW steps three ways on the CPU: float32, under
`torch.autocast("cpu", dtype=torch.bfloat16)`, and under float16 autocast with
`torch.amp.GradScaler` (unscaled before clipping, as PyTorch's AMP recipe does). Writes the
losses to tests/fixtures/gpt_tiny_amp.safetensors; tandem's `--precision bf16|f16` must follow
them within the bound tests/precision.rs states.

    python scripts/gpt_amp_parity.py make
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt_parity import CONFIG, FIXTURE, GPT, TRAIN, loss_of  # noqa: E402

OUT = FIXTURE.with_name("gpt_tiny_amp.safetensors")


def train(dtype):
    fx = load_file(str(FIXTURE))
    torch.manual_seed(0)
    model = GPT(CONFIG)
    model.load_state_dict({k[len("init."):]: v for k, v in fx.items() if k.startswith("init.")}, strict=True)
    tr = TRAIN
    params = list(model.parameters())
    groups = [
        dict(params=[p for p in params if p.dim() >= 2], weight_decay=tr["weight_decay"]),
        dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0),
    ]
    opt = torch.optim.AdamW(groups, lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], foreach=False)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    losses = []
    for s in range(tr["steps"]):
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = loss_of(model, fx["x"][s], fx["y"][s])
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"])
        scaler.step(opt)
        scaler.update()
        losses.append(loss.float().item())
    return losses


def make():
    torch.use_deterministic_algorithms(True)
    runs = {"f32": train(None), "bf16": train(torch.bfloat16), "f16": train(torch.float16)}
    tensors = {f"losses_{k}": torch.tensor(v, dtype=torch.float32) for k, v in runs.items()}
    save_file(tensors, str(OUT), metadata={"torch": torch.__version__, "train": json.dumps(TRAIN)})
    print(f"wrote {OUT}")
    for k, v in runs.items():
        worst = max(abs(a - b) / b for a, b in zip(v, runs["f32"]))
        print(f"{k:>4}: {[round(x, 5) for x in v]} (worst relative to f32 {worst:.1e})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"]:
        make()
    else:
        sys.exit(__doc__)
