#!/usr/bin/env bash
# Seed-CNN parity with PyTorch: 10 full-batch steps from the same weights and data must give
# PyTorch's losses within 1e-4 relative and its final weights within 1e-3. Installs torch from
# PyPI into a virtual environment (several GB; not run in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TANDEM_TORCH_VENV:-/tmp/tandem-torch-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import torch, safetensors' 2>/dev/null || "$venv/bin/pip" install -q torch safetensors numpy
out=$(mktemp -d)
"$venv/bin/python" scripts/torch_parity.py make "$out"
cargo run --release -q -- train --model seed-cnn --data "$out/data.safetensors" --init "$out/init.safetensors" \
  --steps 10 --batch 1000 --lr 0.01 --momentum 0.9 --devices "${DEVICES:-cpu}" --log-format json \
  --save "$out/tandem_final.safetensors" > "$out/tandem_log.jsonl"
"$venv/bin/python" scripts/torch_parity.py compare "$out"
