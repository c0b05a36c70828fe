#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine (Mesa's lavapipe Vulkan
# driver and llvmpipe GL, NVRTC from the PyPI wheel, the GPT-2 tests' Python references),
# checks formatting and lints, the library without the command line and the documentation,
# then runs the whole suite (doc tests included) with the CUDA backend and its NCCL
# communicator compiled in, then the device suites again under the forced hardware profile. Extra arguments go to both `cargo test` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  echo "test.sh: installing Mesa's software Vulkan/GL drivers (lavapipe, llvmpipe)"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri >/dev/null
fi

# Open MPI and libclang for the `mpi` feature (rsmpi's bindgen needs libclang; tests/mpi.rs
# runs mpirun).
if ! command -v mpirun >/dev/null 2>&1 || ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
  echo "test.sh: installing Open MPI and libclang (for the mpi feature)"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev libclang-dev >/dev/null
fi

nvrtc_dir() {
  python3 - <<'PY' 2>/dev/null
import glob, os, sys
for p in sys.path:
    hits = glob.glob(os.path.join(p, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    if hits:
        print(os.path.dirname(hits[0])); break
PY
}
dir=$(nvrtc_dir || true)
if [ -z "$dir" ]; then
  echo "test.sh: installing NVRTC 12 from PyPI (nvidia-cuda-nvrtc-cu12)"
  python3 -m pip install -q 'nvidia-cuda-nvrtc-cu12>=12.0,<13'
  dir=$(nvrtc_dir)
fi
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The references of the GPT-2 tests: OpenAI's tiktoken for the BPE (tests/gpt2_tokenizer.rs),
# transformers' GPT2Config, safetensors and NumPy for the Hugging Face layout (tests/hf_gpt2.rs;
# no PyTorch). Under CI=true those tests fail without them.
if ! python3 -c "import tiktoken, transformers, safetensors, numpy" 2>/dev/null; then
  echo "test.sh: installing the GPT-2 references from PyPI (tiktoken, transformers, safetensors, numpy)"
  python3 -m pip install -q tiktoken transformers safetensors numpy
fi

# Formatting (rustfmt.toml) and lints, before the long runs, so that a slip fails in a minute.
cargo fmt --check
cargo clippy -q --features cuda,nccl,mpi --all-targets -- -D warnings

# The library without the command line: it must build, and pull in none of the CLI's crates.
cargo check -q --lib --no-default-features --features wgpu
if cargo tree -q --no-default-features --features wgpu -e normal | grep -Eq '^[^a-z]*(clap|indicatif|signal-hook) '; then
  echo "test.sh: the library without the cli feature depends on a CLI crate" >&2
  exit 1
fi

# The documentation: the crate docs and the guides (markdown beside their modules) must build
# without a warning (broken intra-doc links, unclosed HTML tags, bare URLs), with the default
# features (as docs.rs builds them) and with every backend. Their examples are doc tests, which
# the `cargo test` below runs.
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc -q --no-deps
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc -q --no-deps --features cuda,nccl,mpi
# README.md's library example builds in a new crate with README.md's dependency line.
bash scripts/readme-crate.sh

# The crate as `cargo package` packs it (what crates.io and docs.rs get) builds on its own:
# every shader, kernel and guide it includes is in the package. The build shares this
# checkout's target folder, so only tandem itself is compiled again.
bash scripts/package-check.sh

# The mpi feature adds tests/mpi.rs (mpirun -np 2 and 3, shared memory and TCP) and the
# dist_train example it launches.
cargo test --features cuda,nccl,mpi "$@"

# The CPU's GEMM kernels are chosen at run time, never at build time: the same debug binary,
# built with the AVX-512 kernels in, must run on a CPU without AVX-512 (a Haswell, emulated by
# qemu's user mode) and report the AVX2+FMA path there.
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "test.sh: installing qemu-user (to run the binary on an emulated CPU without AVX-512)"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq qemu-user >/dev/null
fi
haswell=$(TANDEM_BACKENDS=cpu qemu-x86_64 -cpu Haswell target/debug/tandem devices 2>/dev/null || true)
if ! grep -q "AVX2+FMA" <<<"$haswell"; then
  echo "test.sh: on an emulated Haswell, 'tandem devices' does not report the AVX2+FMA GEMM path:" >&2
  echo "$haswell" >&2
  exit 1
fi
# The AVX-512 kernels belong to the library whatever its features: a build with README's
# dependency line (no default features) has the gemm crate's x86-v4 kernels, and reports the
# AVX-512 path on a CPU with AVX-512F and AVX2+FMA on one without. qemu 7.2's user mode emulates
# no AVX-512 (`-cpu Skylake-Server` reports none), so the host's own CPU decides which to expect.
if ! cargo tree -q --no-default-features --features wgpu -e features -i gemm | grep -q 'gemm feature "x86-v4"'; then
  echo "test.sh: without default features the gemm crate's AVX-512 (x86-v4) kernels are not compiled in" >&2
  exit 1
fi
if [ "$(uname -m)" = x86_64 ]; then
  # Reuses every dependency (the same features); only tandem itself builds again. The build
  # replaces target/debug/tandem, which later cargo runs build back.
  cargo build -q --no-default-features --features wgpu,cli --bin tandem
  mkdir -p target/tmp && cp target/debug/tandem target/tmp/tandem-lean
  lean_reports() { # CPU (words), expected path, how to run the binary ...
    local cpu=$1 expect=$2 out
    shift 2
    out=$(TANDEM_BACKENDS=cpu "$@" target/tmp/tandem-lean devices 2>/dev/null || true)
    if ! grep -q "gemm crate, $expect kernels" <<<"$out"; then
      echo "test.sh: built without default features, 'tandem devices' on $cpu does not report the $expect GEMM path:" >&2
      echo "$out" >&2
      exit 1
    fi
  }
  if grep -qw avx512f /proc/cpuinfo; then lean_reports "this host (AVX-512F)" AVX-512 env; else lean_reports "this host (no AVX-512F)" AVX2+FMA env; fi
  lean_reports "an emulated Haswell" AVX2+FMA qemu-x86_64 -cpu Haswell
fi

# The optional OpenBLAS path of the CPU backend (feature `openblas`, loaded at run time): its
# products against an f64 oracle, forced and by rule, and pinned kernels on the gemm crate.
if ! ls /usr/lib/*/libopenblas.so.0 /usr/lib/*/openblas*/libopenblas.so.0 >/dev/null 2>&1; then
  echo "test.sh: installing OpenBLAS (libopenblas0, for the openblas feature's tests)"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenblas0-pthread >/dev/null
fi
cargo test --features cuda,nccl,mpi,openblas --test openblas "$@"

# PyTorch parity, the PyTorch side: the checkpoints the GPT and custom-model parity tests saved
# (target/tmp) must load into the reference modules with strict=True and give tandem's loss.
# Runs wherever torch and safetensors import (or $TANDEM_TORCH_VENV/bin/python exists).
torch_py=""
if [ -n "${TANDEM_TORCH_VENV:-}" ] && [ -x "$TANDEM_TORCH_VENV/bin/python" ]; then
  torch_py="$TANDEM_TORCH_VENV/bin/python"
elif python3 -c 'import torch, safetensors' >/dev/null 2>&1; then
  torch_py=python3
fi
if [ -z "$torch_py" ]; then
  echo "test.sh: skipping the PyTorch side of the parity checks (torch and safetensors do not import; set TANDEM_TORCH_VENV)"
else
  shopt -s nullglob
  gpt=(target/tmp/gpt_tiny_tandem_*.safetensors)
  custom=(target/tmp/custom_model_tandem_*.safetensors)
  if [ ${#gpt[@]} -gt 0 ]; then "$torch_py" scripts/gpt_parity.py check "${gpt[@]}"; fi
  for ckpt in "${custom[@]}"; do "$torch_py" scripts/custom_model_parity.py check "$ckpt" tests/fixtures/custom_model; done
  shopt -u nullglob
  # GPT-2 small's shape against transformers (logits, 10 AdamW steps, the folder loaded back):
  # tests/hf_parity.rs, about 7 minutes on 2 cores.
  if "$torch_py" -c 'import transformers' >/dev/null 2>&1; then
    TANDEM_TORCH_PYTHON="$torch_py" cargo test --features cuda,nccl,mpi --test hf_parity "$@"
  fi
fi

# Second pass: the suites that run kernels on every device, with every wgpu adapter forced to
# the hardware GPU profile (tiled matmuls, no subgroup or uniform-operand kernels), so that the
# path real GPUs take is tested here on lavapipe and llvmpipe. mixed_devices runs every parallel
# strategy on CPU, Vulkan and GL. Measured: about 2 minutes more (2 cores). TANDEM_HARDWARE_PASS=0
# skips it.
if [ "${TANDEM_HARDWARE_PASS:-1}" != 0 ]; then
  echo "test.sh: second pass with TANDEM_WGPU_KERNELS=hardware"
  TANDEM_WGPU_KERNELS=hardware cargo test --features cuda,nccl,mpi \
    --test conformance --test fused --test tensor_ops --test edge_numerics --test long_axes \
    --test mixed_devices --test transformer_kernels "$@"
fi
