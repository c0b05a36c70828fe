#!/usr/bin/env bash
# The one prepared check for a machine with an NVIDIA GPU: the H200 this project is lent (driver
# 580, CUDA 13 and NCCL libraries only as pip wheels in its Python, PyTorch, no Rust toolchain,
# no network) or a Tesla M60 server with CUDA 12. It runs binaries built and packed elsewhere:
#
#   scripts/gpu-check.sh --rehearse   here, with cargo: builds the test binaries and the CLI
#                                     (release, stripped, features cuda,nccl), packs them into
#                                     .gpu/ (ignored by git) and prints what a run would carry,
#                                     run, and how large it is. Touches no GPU.
#   scripts/gpu-check.sh              on the GPU machine, from the repository root that carries
#                                     .gpu/: runs the NVRTC, CUDA smoke and conformance tests
#                                     (CUDA, and every wgpu adapter such as the GPU's Vulkan one,
#                                     also under the forced hardware profile), `tandem bench`
#                                     (WGSL vs cuBLAS matmul up to 2048: GFLOP/s of each and
#                                     their ratio per size, and "WGSL matmul 2048 at X% of
#                                     cuBLAS (goal 60%)"; seed-CNN steps) and the
#                                     same seed-CNN step in that machine's PyTorch; with two GPUs
#                                     and Open MPI, the 2-process NCCL data-parallel check
#                                     (examples/dist_pipeline, packed when the rehearsal machine
#                                     has MPI); prints one table. About 8 minutes at most: each
#                                     step has a timeout.
#
# Libraries: cudarc (feature cuda-12080, dynamic loading) asks the loader for `libcuda.so.1`,
# then for `libnvrtc.so`, `libnvrtc.so.12`, `libcublas.so`, `libcublas.so.12`, `libcublasLt.so`,
# `libcublasLt.so.12` and `libnccl.so` (never `.so.13`, never NCCL's `.so.2`). CUDA 13's wheels
# (nvidia-*-cu13) ship only `libnvrtc.so.13`, `libcublas.so.13`, `libcublasLt.so.13` and
# `libnccl.so.2`, so the run links the unversioned names to them in a private folder on
# LD_LIBRARY_PATH; the calls tandem makes are unchanged in 13. CUDA 13 no longer compiles for
# sm_52 (tests/nvrtc.rs skips it there) but does for the H200's sm_90; on an M60 with CUDA 12 the
# `.so.12` names are found as they are.
#
# Installs nothing; never resets the GPU or changes its settings (nvidia-smi is only queried).
# Exit status: non-zero when a required step failed. Env: GPU_CHECK_BUDGET_S (480).
set -u
cd "$(dirname "$0")/.." || exit 2
pack=.gpu
bins=(nvrtc cuda_smoke conformance)

# --- --rehearse: build and pack here ----------------------------------------------------------
if [ "${1:-}" = --rehearse ]; then
  set -e
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
  # Symbols are most of a test binary's size; the 64 MiB a run may carry holds the stripped ones.
  export CARGO_PROFILE_RELEASE_STRIP=symbols
  features=cuda,nccl
  json=$(mktemp)
  args=()
  for b in "${bins[@]}"; do args+=(--test "$b"); done
  echo "gpu-check: building ${bins[*]} and the tandem CLI (release, --features $features)"
  cargo test --release --features "$features" --no-run "${args[@]}" --message-format=json >"$json"
  cargo build --release --features "$features" --bin tandem --message-format=json >>"$json"
  # The 2-process NCCL check needs the `mpi` feature, which links Open MPI: packed only where
  # it builds (libmpi and libclang installed); the GPU machine then needs Open MPI too.
  if command -v mpicc >/dev/null 2>&1; then
    echo "gpu-check: building examples/dist_pipeline (release, --features $features,mpi)"
    cargo build --release --features "$features,mpi" --example dist_pipeline --message-format=json >>"$json"
  else
    echo "gpu-check: no MPI here (mpicc); the 2-process NCCL check will not be packed"
  fi
  rm -rf "$pack"
  mkdir -p "$pack/bin"
  # Each target's executable, by target name, from cargo's own messages.
  python3 - "$json" "$pack/bin" <<'EOF'
import json, shutil, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe:
        shutil.copy2(exe, f"{sys.argv[2]}/{m['target']['name']}")
EOF
  rm -f "$json"
  for b in "${bins[@]}" tandem; do
    [ -x "$pack/bin/$b" ] || { echo "gpu-check: $b was not built" >&2; exit 1; }
  done
  { echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
    echo "features $features; built $(date -u +%FT%TZ) on $(uname -m) with $(rustc --version)"; } >"$pack/MANIFEST"
  bytes=$(du -cb "$pack" | tail -1 | cut -f1)
  echo
  echo "would carry: $pack/ ($((bytes / 1024 / 1024)) MiB of the 64 MiB a run may carry; the tracked tree travels anyway)"
  ls -l "$pack/bin" | tail -n +2 | awk '{printf "    %-14s %6.1f MiB\n", $9, $5 / 1048576}'
  echo "would run, on the GPU machine:  scripts/gpu-check.sh   (device tool: carry [\"$pack\"], timeout_s 540)"
  echo "    1. nvidia-smi; the CUDA 12 or 13 libraries found and the names linked for cudarc"
  echo "    2. $pack/bin/nvrtc        every kernels/*.cu through that NVRTC (sm_90/compute_90; _52 on CUDA 12)"
  echo "    3. $pack/bin/cuda_smoke   CUDA ops against the CPU reference, allocator, peer copies"
  echo "    4. $pack/bin/conformance  every op on cuda:0 and every wgpu adapter; again with TANDEM_WGPU_KERNELS=hardware"
  echo "    5. $pack/bin/tandem bench --devices cuda:0[,hardware wgpu adapters]  matmul 256-2048 (cuBLAS vs WGSL), seed-CNN steps"
  echo "    6. python3 + torch: the seed-CNN step at batch 64 and 1000 on that GPU"
  echo "    7. with 2 GPUs and mpirun: mpirun -np 2 $pack/bin/dist_pipeline --mode dp --devices cuda:0,cuda:1 --comm nccl, against --comm hierarchical"
  echo "    then one table of steps and figures"
  [ "$bytes" -le $((64 * 1024 * 1024)) ] || { echo "gpu-check: the pack is over 64 MiB" >&2; exit 1; }
  exit 0
fi

# --- the run on the GPU machine ---------------------------------------------------------------
if [ ! -x "$pack/bin/conformance" ]; then
  echo "gpu-check: no packed binaries in $pack/; run scripts/gpu-check.sh --rehearse where cargo is, then carry $pack" >&2
  exit 2
fi
log_dir=$(mktemp -d /tmp/gpu-check.XXXXXX)
budget=${GPU_CHECK_BUDGET_S:-480}
started=$(date +%s)
names=() results=() notes=() required_failed=0
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

# record NAME RESULT NOTE
record() {
  names+=("$1") results+=("$2") notes+=("$3")
  printf '== %-28s %s  %s\n' "$1" "$2" "$3"
}

# Seconds left of the overall budget, never below 10 so that a step can still report.
left() {
  local l=$((budget - ($(date +%s) - started)))
  [ "$l" -lt 10 ] && l=10
  echo "$l"
}

# step NAME REQUIRED(1|0) TIMEOUT_S COMMAND...: runs COMMAND with output in $log_dir/NAME.log.
step() {
  local name=$1 required=$2 limit=$3
  shift 3
  local l
  l=$(left)
  [ "$limit" -gt "$l" ] && limit=$l
  local logf="$log_dir/$name.log" t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$logf" 2>&1
  rc=$?
  local took=$(($(date +%s) - t0))s
  if [ "$rc" -eq 0 ]; then
    record "$name" PASS "$took"
  else
    local why="exit $rc"
    { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && why="timed out after ${limit}s"
    record "$name" FAIL "$why, $took; log: $logf"
    tail -n 25 "$logf" | sed 's/^/    /'
    [ "$required" -eq 1 ] && required_failed=1
  fi
  return "$rc"
}

record packed PASS "$(tr '\n' ';' <"$pack/MANIFEST")"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null \
    || nvidia-smi -L 2>/dev/null)
  record nvidia-smi PASS "$(echo "$gpu" | tr '\n' ';')"
else
  record nvidia-smi SKIP "not installed (the CUDA tests still probe libcuda)"
fi

# --- libraries: a CUDA toolkit's, or the pip wheels' (nvidia-*-cu12 or -cu13) -------------------
dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && dirs+=("$d")
done
if command -v python3 >/dev/null 2>&1; then
  while IFS= read -r d; do dirs+=("$d"); done < <(python3 - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + sys.path)
seen = set()
for r in sorted(p for p in roots if p and os.path.isdir(os.path.join(p, "nvidia"))):
    # cu12 wheels: nvidia/<lib>/lib; cu13 wheels: nvidia/cu13/lib and nvidia/<lib>/lib.
    for pat in ("libnvrtc.so*", "libcublas.so*", "libnccl.so*"):
        for hit in glob.glob(os.path.join(r, "nvidia", "**", pat), recursive=True):
            d = os.path.dirname(hit)
            if d not in seen:
                seen.add(d)
                print(d)
EOF
  )
fi
shim="$log_dir/lib"
mkdir -p "$shim"
linked=()
# link NAME: when no directory has a name cudarc asks for, points lib$NAME.so at the newest
# versioned file found (.so.13 for NVRTC and cuBLAS, .so.2 for NCCL).
link() {
  local lib=$1 d f
  for d in "${dirs[@]}"; do
    [ -e "$d/lib$lib.so" ] || [ -e "$d/lib$lib.so.12" ] && return 0
  done
  ldconfig -p 2>/dev/null | grep -qE "lib$lib\.so(\.12)? " && return 0
  for d in "${dirs[@]}" /usr/lib/x86_64-linux-gnu; do
    for f in "$d/lib$lib.so.13" "$d/lib$lib.so.2"; do
      if [ -e "$f" ]; then
        ln -sf "$f" "$shim/lib$lib.so"
        linked+=("lib$lib.so -> $f")
        return 0
      fi
    done
  done
}
for lib in nvrtc cublas cublasLt nccl; do link "$lib"; done
joined=$(IFS=:; echo "${dirs[*]:-}")
export LD_LIBRARY_PATH="$shim${joined:+:$joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
record libraries PASS "dirs: ${joined:-none}; linked: ${linked[*]:-none}"

# --- tests -------------------------------------------------------------------------------------
step nvrtc 1 90 "$pack/bin/nvrtc" --nocapture
step cuda-smoke 1 120 "$pack/bin/cuda_smoke" --nocapture
grep -hE "skipped|peer matrix" "$log_dir/cuda-smoke.log" | head -10 | sed 's/^/    /'
"$pack/bin/tandem" devices >"$log_dir/devices.log" 2>&1
sed 's/^/    /' "$log_dir/devices.log"
step conformance 1 150 "$pack/bin/conformance" --nocapture
grep -hE "^running on|skipping" "$log_dir/conformance.log" | sort -u | sed 's/^/    /'
# The GPU's own wgpu adapters (Vulkan, GL): what `tandem devices` calls discrete, integrated or
# other (software adapters are lavapipe and llvmpipe, tested where the code is built).
hw=$(awk '/ wgpu / && / (discrete|integrated|other) / { for (i = 1; i <= NF; i++) if ($i ~ /^wgpu:[0-9]+$/) { print $i; break } }' \
  "$log_dir/devices.log" | paste -sd, -)
if [ -n "$hw" ]; then
  TANDEM_WGPU_KERNELS=hardware step conformance-hardware-profile 1 120 "$pack/bin/conformance"
else
  record conformance-hardware-profile SKIP "no hardware wgpu adapter (tandem devices above)"
fi

# --- 2 processes, one GPU each, through NCCL: the same losses as through MPI host memory ------
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ ! -x "$pack/bin/dist_pipeline" ]; then
  record nccl-2-processes SKIP "examples/dist_pipeline not packed (no MPI where --rehearse ran)"
elif [ "${gpus:-0}" -lt 2 ]; then
  record nccl-2-processes SKIP "needs two GPUs, found ${gpus:-0}"
elif ! command -v mpirun >/dev/null 2>&1; then
  record nccl-2-processes SKIP "no mpirun (install Open MPI)"
else
  dp=(mpirun --allow-run-as-root --oversubscribe -np 2 "$pack/bin/dist_pipeline" --mode dp --devices cuda:0,cuda:1 --steps 10)
  if step nccl-2-processes 1 90 "${dp[@]}" --comm nccl && step hierarchical-2-processes 1 90 "${dp[@]}" --comm hierarchical; then
    step nccl-matches-mpi 1 20 python3 - "$log_dir/nccl-2-processes.log" "$log_dir/hierarchical-2-processes.log" <<'EOF'
import json, sys
def losses(path):
    out = []
    for line in open(path):
        try:
            out.append(json.loads(line)["loss"])
        except (ValueError, KeyError):
            pass
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("nccl:", a, "\nmpi: ", b)
assert len(a) == len(b) == 10, (len(a), len(b))
assert all(abs(x - y) <= 1e-4 + 1e-3 * abs(y) for x, y in zip(a, b)), "losses differ"
EOF
  fi
fi

# --- benches: WGSL vs cuBLAS matmul, seed-CNN steps, then PyTorch's ----------------------------
step bench 0 150 "$pack/bin/tandem" bench --log-format json --devices "cuda:0${hw:+,$hw}"
grep -iE "matmul|step|seed" "$log_dir/bench.log" | head -30 | sed 's/^/    /'
# WGSL (each hardware wgpu adapter: the tiled kernels, 128x128 tiles from 1024 on) against
# cuBLAS (cuda:0) per matmul size, and the goal of issue 16: WGSL at 2048 at least 60% of cuBLAS.
python3 - "$log_dir/bench.log" "${hw:-}" >"$log_dir/matmul.txt" 2>&1 <<'EOF' || echo "(no matmul figures: $log_dir/bench.log)" >>"$log_dir/matmul.txt"
import json, sys
gflops = {}
for line in open(sys.argv[1]):
    try:
        f = json.loads(line)
    except ValueError:
        continue
    if isinstance(f, dict) and f.get("bench") == "matmul":
        gflops[(f["device"], f["n"])] = f["gflops"]
cublas = {n: g for (d, n), g in gflops.items() if d == "cuda:0"}
hw = [d for d in sys.argv[2].split(",") if d]
if not hw:
    print("no hardware wgpu adapter: no WGSL figure (cuBLAS GFLOP/s: %s)" % ", ".join(f"n={n} {g:.0f}" for n, g in sorted(cublas.items())))
    sys.exit(0)
print(f"{'device':<10} {'n':>5} {'WGSL GFLOP/s':>13} {'cuBLAS GFLOP/s':>15} {'ratio':>6}")
for d in hw:
    for n in sorted(n for (dd, n) in gflops if dd == d):
        w, c = gflops[(d, n)], cublas.get(n)
        print(f"{d:<10} {n:>5} {w:>13.1f} {c or float('nan'):>15.1f} {w / c if c else float('nan'):>6.2f}")
for d in hw:
    w, c = gflops.get((d, 2048)), cublas.get(2048)
    if w is None or not c:
        print(f"WGSL matmul 2048 on {d}: no figure (WGSL {w}, cuBLAS {c})")
    else:
        print(f"WGSL matmul 2048 at {100 * w / c:.0f}% of cuBLAS (goal 60%) on {d}")
EOF
sed 's/^/    /' "$log_dir/matmul.txt"
if python3 -c 'import torch' >/dev/null 2>&1; then
  step torch-seed-cnn 0 90 python3 - <<'EOF'
import time, torch, torch.nn as nn, torch.nn.functional as F
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, 5); self.conv2 = nn.Conv2d(10, 20, 5)
        self.fc1 = nn.Linear(320, 50); self.fc2 = nn.Linear(50, 10)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        return self.fc2(F.relu(self.fc1(x.view(-1, 320))))
for batch in (64, 1000):
    model = MyModel().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 1, 28, 28, device=dev); y = torch.randint(0, 10, (batch,), device=dev)
    times = []
    for i in range(30):
        if dev == "cuda": torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
        if dev == "cuda": torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times = sorted(times[5:])
    print(f"torch {torch.__version__} {dev}: seed-CNN step batch {batch}: median {times[len(times)//2]*1e3:.3f} ms")
EOF
else
  record torch-seed-cnn SKIP "python3 cannot import torch"
fi

# --- the table ---------------------------------------------------------------------------------
echo
printf '%-28s %-5s %s\n' STEP RESULT NOTE
for i in "${!names[@]}"; do
  printf '%-28s %-5s %s\n' "${names[$i]}" "${results[$i]}" "${notes[$i]}"
done
echo
grep -hiE "seed-CNN|step batch" "$log_dir/bench.log" "$log_dir/torch-seed-cnn.log" 2>/dev/null | head -30
cat "$log_dir/matmul.txt" 2>/dev/null
echo "logs: $log_dir; total $(($(date +%s) - started))s"
exit "$required_failed"
