#!/usr/bin/env python3
"""PyTorch's side of `tandem bench --log-format json`: the same figures, the same JSON keys, one
object per line, with device "pytorch-cpu". Medians over the same repetitions after one warm-up.

    /tmp/tandem-torch-venv/bin/python scripts/torch-bench.py [--threads 2] [--quick]

The pipeline-bubble figure has no PyTorch counterpart here and is not printed.
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MATMUL_SIZES = [256, 512, 1024, 2048]
STEP_BATCHES = [64, 1000]
DISPATCH_OPS, DISPATCH_LEN = 1000, 64
DEVICE = "pytorch-cpu"


# Shortest timed sample, seconds, as SAMPLE_S in src/cli/bench.rs.
SAMPLE_S = 0.04


def timed(reps, f):
    """Warm-up, then the median of `reps` samples, each the mean over as many runs as fill
    SAMPLE_S (judged by the warm-up run): tandem bench's method."""
    t = time.perf_counter()
    f()
    first = time.perf_counter() - t
    per_sample = min(max(int(-(-SAMPLE_S // max(first, 1e-6))), 1), 1000)
    runs = []
    for _ in range(max(reps, 1)):
        t = time.perf_counter()
        for _ in range(per_sample):
            f()
        runs.append((time.perf_counter() - t) / per_sample)
    return sorted(runs)[len(runs) // 2], first


class SeedCnn(nn.Module):
    """tandem's SeedModel::Cnn: conv 1->10 k5, ReLU, pool 2, conv 10->20 k5, ReLU, pool 2, 320->50, ReLU, 50->10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def emit(**fields):
    print(json.dumps(fields), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reps = dict(matmul=1, step=2, dispatch=2) if args.quick else dict(matmul=5, step=5, dispatch=5)
    torch.manual_seed(0)
    with torch.no_grad():
        for n in MATMUL_SIZES:
            a, b = torch.randn(n, n), torch.randn(n, n)
            s, _ = timed(reps["matmul"], lambda: a @ b)
            emit(bench="matmul", device=DEVICE, n=n, gflops=2 * n**3 / s / 1e9)
    for batch in STEP_BATCHES:
        model = SeedCnn()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.rand(batch, 1, 28, 28)
        y = torch.arange(batch) % 10

        def step():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss.item()

        s, first = timed(reps["step"], step)
        emit(bench="train-step", model="seed-cnn", device=DEVICE, batch=batch, median_ms=s * 1e3, first_step_ms=first * 1e3)
    with torch.no_grad():
        x, y = torch.ones(DISPATCH_LEN), torch.ones(DISPATCH_LEN)

        def adds():
            for _ in range(DISPATCH_OPS):
                x + y

        s, _ = timed(reps["dispatch"], adds)
        emit(bench="dispatch", device=DEVICE, us_per_op=s / DISPATCH_OPS * 1e6)


if __name__ == "__main__":
    main()
