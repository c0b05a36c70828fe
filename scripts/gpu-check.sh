#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU (H200 with a CUDA 12/13 driver, or a Tesla
# M60 server): builds with --features cuda, runs the NVRTC, CUDA smoke and conformance tests, the
# Vulkan conformance when a Vulkan loader exists, the benches when present, and a PyTorch seed-CNN
# step when torch imports; then prints one PASS/FAIL/SKIP table. Installs nothing, never resets
# the GPU or changes its settings (nvidia-smi is only queried). Finishes in about 8 minutes at
# most: every step has its own timeout. Exit status is non-zero when a required step failed.
#
# Usage: scripts/gpu-check.sh  (from anywhere; env: CARGO_TARGET_DIR, GPU_CHECK_BUDGET_S=480,
#        GPU_CHECK_BUILD_S=300 for the release build)
set -u
cd "$(dirname "$0")/.." || exit 2

log_dir=$(mktemp -d /tmp/gpu-check.XXXXXX)
budget=${GPU_CHECK_BUDGET_S:-480}
started=$(date +%s)
names=() results=() notes=() required_failed=0

# record NAME RESULT NOTE
record() {
  names+=("$1") results+=("$2") notes+=("$3")
  printf '== %-28s %s  %s\n' "$1" "$2" "$3"
}

# Seconds left of the overall budget, never below 10 so a step can still report.
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
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why="timed out after ${limit}s"
    record "$name" FAIL "$why, $took; log: $logf"
    tail -n 25 "$logf" | sed 's/^/    /'
    [ "$required" -eq 1 ] && required_failed=1
  fi
  return "$rc"
}

# --- environment: driver, GPU, libraries -------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null \
    || nvidia-smi -L 2>/dev/null)
  record "nvidia-smi" PASS "$(echo "$gpu" | tr '\n' ';')"
else
  record "nvidia-smi" SKIP "not installed (the CUDA tests still probe libcuda)"
fi

# libnvrtc / libcublas: the system's, a CUDA toolkit's, or a pip wheel's (nvidia-*-cu12).
extra=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && extra="$extra:$d"
done
if command -v python3 >/dev/null 2>&1; then
  for d in $(python3 - <<'EOF' 2>/dev/null
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for sub in ("cuda_nvrtc", "cublas"):
        for d in glob.glob(f"{r}/nvidia/{sub}/lib"):
            print(d)
EOF
  ); do extra="$extra:$d"; done
fi
export LD_LIBRARY_PATH="${extra#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cudarc (built for CUDA 12.8) looks for libnvrtc.so.12 / libcublas.so.12 or the unversioned
# names. A CUDA-13-only machine has .so.13; the calls tandem makes are unchanged in 13, so link
# the unversioned names to them in a private directory.
shim="$log_dir/lib"
mkdir -p "$shim"
for lib in nvrtc cublas cublasLt; do
  have12=$(ldconfig -p 2>/dev/null | grep -c "lib$lib.so.12 ")
  for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/lib$lib.so.12" ] && have12=1; done
  if [ "$have12" = 0 ]; then
    for d in ${LD_LIBRARY_PATH//:/ } /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64; do
      if [ -e "$d/lib$lib.so.13" ]; then
        ln -sf "$d/lib$lib.so.13" "$shim/lib$lib.so"
        echo "note: using $d/lib$lib.so.13 for lib$lib.so"
        break
      fi
    done
  fi
done
export LD_LIBRARY_PATH="$shim:$LD_LIBRARY_PATH"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# Offline machines build from the local registry when it holds every dependency.
offline=()
if cargo metadata --offline --format-version 1 >/dev/null 2>&1; then
  offline=(--offline)
fi

# --- build and tests ---------------------------------------------------------------------------
target_dir=${CARGO_TARGET_DIR:-target}
built=0
step build 1 "${GPU_CHECK_BUILD_S:-300}" cargo build "${offline[@]}" --release --features cuda --all-targets && built=1
# Later cargo steps would only repeat a failed build inside their own timeouts.
needs_build() {
  [ "$built" = 1 ] && return 0
  record "$1" SKIP "the build failed"
  return 1
}

tests=()
for t in conformance cuda_smoke nvrtc; do
  if [ -f "tests/$t.rs" ]; then
    tests+=(--test "$t")
  else
    record "test $t" SKIP "tests/$t.rs not in this tree"
  fi
done
if [ ${#tests[@]} -gt 0 ] && needs_build tests-cuda; then
  step tests-cuda 1 240 cargo test "${offline[@]}" --release --features cuda "${tests[@]}" -- --nocapture
  grep -hE "skipped|test result|peer matrix" "$log_dir/tests-cuda.log" | sed 's/^/    /' | head -40
fi

vulkan=$( (ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1') && echo yes || echo no)
if [ "$vulkan" = yes ] && [ -f tests/conformance.rs ]; then
  needs_build conformance-vulkan && WGPU_BACKEND=vulkan step conformance-vulkan 0 180 cargo test "${offline[@]}" --release --test conformance -- --nocapture
else
  record conformance-vulkan SKIP "vulkan loader: $vulkan; tests/conformance.rs: $([ -f tests/conformance.rs ] && echo yes || echo no)"
fi

# --- benches -----------------------------------------------------------------------------------
if [ -f benches/cuda_kernels.rs ]; then
  needs_build bench-cuda && step bench-cuda 0 150 cargo bench "${offline[@]}" --features cuda --bench cuda_kernels -- --quick
  grep -E "time:|thrpt:|^[a-z_0-9/]+ " "$log_dir/bench-cuda.log" | head -30 | sed 's/^/    /'
else
  record bench-cuda SKIP "benches/cuda_kernels.rs not in this tree"
fi
cli="$target_dir/release/tandem"
if [ -x "$cli" ] && timeout 20 "$cli" bench --help >/dev/null 2>&1; then
  step bench-cli 0 120 "$cli" bench --devices cuda:0
  tail -n 20 "$log_dir/bench-cli.log" | sed 's/^/    /'
else
  record bench-cli SKIP "no built tandem CLI with a 'bench' command"
fi

# --- PyTorch reference: one seed-CNN training step --------------------------------------------
if python3 -c 'import torch' >/dev/null 2>&1; then
  step torch-seed-cnn 0 120 python3 - <<'EOF'
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
    print(f"torch {torch.__version__} {dev}: seed-CNN step batch {batch}: median {times[len(times)//2]*1e3:.3f} ms, loss {loss.item():.4f}")
EOF
  grep "seed-CNN" "$log_dir/torch-seed-cnn.log" | sed 's/^/    /'
else
  record torch-seed-cnn SKIP "python3 cannot import torch"
fi

# --- summary -----------------------------------------------------------------------------------
echo
printf '%-28s %-5s %s\n' STEP RESULT NOTE
for i in "${!names[@]}"; do
  printf '%-28s %-5s %s\n' "${names[$i]}" "${results[$i]}" "${notes[$i]}"
done
grep -hE "seed-CNN step|time: " "$log_dir"/*.log 2>/dev/null | head -20
echo "logs: $log_dir; total $(($(date +%s) - started))s"
exit "$required_failed"
