#!/usr/bin/env python3
"""The CPU speed table of issue 16, tandem against PyTorch, measured side by side in one run.

Alternates `tandem bench --devices cpu` (with `--model gpt` for the GPT step) and PyTorch's
side (scripts/torch-bench.py, scripts/torch_gpt_bench.py) `--rounds` times, so that both see
the same machine load, and prints one markdown table: per figure the median over rounds of
each side's median, every round's value, and the ratio (time: tandem / PyTorch, so < 1 is
faster; throughput: tandem / PyTorch, so > 1 is faster). Also prints the pipeline-bubble and
dp-overlap figures (tandem only). The GPT step also runs in f32 and in bf16 on both sides
(`train-step gpt 16 f32|bf16` rows): tandem's as `tandem train --precision f32|bf16`, the median
`step_s` of steps 6-30, PyTorch's under `torch.autocast("cpu", torch.bfloat16)` for bf16; a line
after the table gives each side's bf16 / f32. Run from the repository root with a release build:

    cargo build --release
    /tmp/tandem-torch-venv/bin/python scripts/side-by-side.py [--rounds 3] [--threads 2]

tandem's AVX-512 kernels are always compiled in and chosen from the CPU's features at run time
(the `avx512` feature is a no-op kept for old manifests), so a tandem binary cannot be held to
AVX2 on an AVX-512 CPU: compare the AVX2 paths on a CPU without AVX-512. `--avx2` keeps PyTorch's
kernels (and a tandem built with `--features openblas`, OpenBLAS's) to AVX2.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def train_steps(cmd, env, precision):
    """tandem's GPT step in `precision` as `tandem train` runs it: a figure in `bench`'s form whose
    time is the median `step_s` of steps 6-30 (the first steps warm the allocator and caches)."""
    lines = run_json(cmd + ["--precision", precision], env)
    steps = [f["step_s"] for f in lines if "step" in f and f["step"] >= 6]
    ms = statistics.median(steps) * 1e3
    return [{"bench": "train-step", "model": "gpt", "batch": 16, "precision": precision, "median_ms": ms}]


def key(fig):
    """What a figure measures, without the device: matched across the two sides."""
    if fig["bench"] == "matmul":
        return ("matmul", fig["n"])
    if fig["bench"] == "train-step" and "precision" in fig:
        return ("train-step", fig["model"], fig["batch"], fig["precision"])
    if fig["bench"] == "train-step":
        return ("train-step", fig["model"], fig["batch"])
    if fig["bench"] == "pipeline-bubble":
        return ("pipeline-bubble", fig.get("model", "seed-cnn"), fig["micro_batches"])
    return (fig["bench"],)


def value(fig):
    """(number, unit, higher_is_better) of a figure."""
    if "gflops" in fig:
        return fig["gflops"], "GFLOP/s", True
    if "tokens_per_sec" in fig:
        return fig["tokens_per_sec"], "tokens/s", True
    if "us_per_op" in fig:
        return fig["us_per_op"], "µs/op", False
    if "median_ms" in fig:
        return fig["median_ms"], "ms", False
    return None


def order(k):
    """Sorts figures by name, then by size as a number."""
    return tuple(f"{x:012d}" if isinstance(x, int) else str(x) for x in k)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tandem", default=os.path.join(ROOT, "target", "release", "tandem"))
    ap.add_argument("--avx2", action="store_true",
                    help="PyTorch (and OpenBLAS) limited to AVX2 (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS); "
                         "tandem's own kernels follow the CPU's features")
    ap.add_argument("--only-gpt-precision", action="store_true", help="only the GPT step's f32 and bf16 rows")
    args = ap.parse_args()
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    if args.avx2:
        # OPENBLAS_CORETYPE: a tandem built with the openblas feature takes OpenBLAS's AVX2 kernels.
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2", OPENBLAS_CORETYPE="Haswell")
    py = sys.executable
    tandem, torch, extra = {}, {}, {}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        train = [args.tandem, "train", "--model", "gpt", "--data", "text", "--batch", "16", "--steps", "30", "--devices", "cpu",
                 "--log-format", "json"]
        gpt = [py, os.path.join(HERE, "torch_gpt_bench.py"), "--threads", str(args.threads)]
        sides = [
            (tandem, lambda: run_json([args.tandem, "bench", "--devices", "cpu", "--log-format", "json"], env)),
            (torch, lambda: run_json([py, os.path.join(HERE, "torch-bench.py"), "--threads", str(args.threads)], env)),
            (tandem, lambda: run_json([args.tandem, "bench", "--devices", "cpu", "--model", "gpt", "--log-format", "json"], env)),
            (torch, lambda: run_json(gpt, env)),
            (tandem, lambda: train_steps(train, env, "f32")),
            (torch, lambda: run_json(gpt + ["--reps", "25", "--precision", "f32"], env)),
            (tandem, lambda: train_steps(train, env, "bf16")),
            (torch, lambda: run_json(gpt + ["--reps", "25", "--precision", "bf16"], env)),
        ]
        # Alternate which side goes first, so neither always runs on a warmer machine.
        if r % 2 == 1:
            sides = [sides[i ^ 1] for i in range(len(sides))]
        if args.only_gpt_precision:
            sides = sides[4:]
        for store, run in sides:
            for fig in run():
                k = key(fig)
                if k[0] in ("pipeline-bubble", "dp-overlap"):
                    extra.setdefault(k, []).append(fig)
                elif value(fig) is not None and not fig.get("recompute", False):
                    store.setdefault(k, []).append(value(fig))
    print(f"| figure | tandem cpu | PyTorch cpu, {args.threads} threads | tandem / PyTorch |")
    print("|---|---|---|---|")
    for k in sorted(tandem, key=order):
        if k not in torch:
            continue
        t = [v for v, _, _ in tandem[k]]
        p = [v for v, _, _ in torch[k]]
        unit, higher = tandem[k][0][1], tandem[k][0][2]
        tm, pm = statistics.median(t), statistics.median(p)
        ratio = tm / pm
        what = "throughput" if higher else "time"
        cell = lambda xs, m: f"{m:.4g} {unit} ({', '.join(f'{x:.4g}' for x in xs)})"
        print(f"| {' '.join(map(str, k))} | {cell(t, tm)} | {cell(p, pm)} | {ratio:.2f} ({what}) |")
    for name, side in (("tandem", tandem), ("PyTorch", torch)):
        f32, bf16 = side.get(("train-step", "gpt", 16, "f32")), side.get(("train-step", "gpt", 16, "bf16"))
        if f32 and bf16:
            ratio = statistics.median(v for v, _, _ in bf16) / statistics.median(v for v, _, _ in f32)
            print(f"{name}: GPT step bf16 / f32 = {ratio:.2f}")
    for k in sorted(extra, key=order):
        figs = extra[k]
        if k[0] == "pipeline-bubble":
            m = [f["bubble_measured"] for f in figs]
            s = [f["bubble_of_split"] for f in figs]
            print(f"pipeline bubble {k[1]} m={k[2]}: measured {statistics.median(m):.3f} ({', '.join(f'{x:.3f}' for x in m)}), "
                  f"of the split {statistics.median(s):.3f}, theory {figs[0]['bubble_theoretical']:.3f}")
        else:
            h = [f["hidden_fraction"] for f in figs]
            ratio = [f["step_ms_1"] / f["step_ms_n"] for f in figs]
            print(f"dp-overlap: hidden fraction {statistics.median(h):.2f} ({', '.join(f'{x:.2f}' for x in h)}), "
                  f"step on 1 device / on 2: {statistics.median(ratio):.2f} ({', '.join(f'{x:.2f}' for x in ratio)})")


if __name__ == "__main__":
    main()
