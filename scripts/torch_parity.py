"""PyTorch side of the seed-CNN parity check: writes the initial weights, the data, the losses of
10 full-batch SGD-momentum steps and the final weights, for tandem to reproduce."""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def main(out):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = MyModel()
    x = torch.randn(1000, 1, 28, 28)
    y = torch.randint(0, 10, (1000,))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/init.safetensors")
    save_file({"x": x, "y": y}, f"{out}/data.safetensors")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(10):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/torch_final.safetensors")
    with open(f"{out}/torch_losses.json", "w") as f:
        json.dump(losses, f)


def compare(out):
    from safetensors.torch import load_file

    torch_losses = json.load(open(f"{out}/torch_losses.json"))
    steps = [json.loads(l) for l in open(f"{out}/tandem_log.jsonl") if '"step"' in l]
    tandem_losses = [s["loss"] for s in steps]
    ok = True
    print(f"{'step':>4} {'pytorch':>12} {'tandem':>12} {'rel diff':>10}")
    for i, (a, b) in enumerate(zip(torch_losses, tandem_losses)):
        rel = abs(a - b) / abs(a)
        ok &= rel <= 1e-4
        print(f"{i + 1:>4} {a:>12.7f} {b:>12.7f} {rel:>10.2e}")
    ok &= len(tandem_losses) == len(torch_losses)
    a, b = load_file(f"{out}/torch_final.safetensors"), load_file(f"{out}/tandem_final.safetensors")
    for k in sorted(a):
        diff = (a[k] - b[k]).abs().max().item()
        scale = a[k].abs().max().item()
        ok &= diff <= 1e-3 * max(scale, 1e-3)
        print(f"{k:>14}: max |diff| {diff:.2e} (max |w| {scale:.3f})")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "make":
        main(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2]))
