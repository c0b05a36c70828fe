#!/usr/bin/env bash
# GPT-2 medium's shape (355M) fine-tunes from a Hugging Face folder on four logical CPU devices
# under a 2 GiB per-device --memory-limit its unsharded f32 state (5.29 GiB) does not fit:
# tests/gpt2_medium.rs, #[ignore]d because it takes minutes and about 14 GB of host memory.
# Extra arguments go to cargo (--release for a faster run); its figures are in
# src/nn/models/finetune.md.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test "$@" --features "${TANDEM_FEATURES:-cuda,nccl,mpi}" --test gpt2_medium -- --ignored --nocapture
