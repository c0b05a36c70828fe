#!/usr/bin/env bash
# The one prepared check for a machine with an NVIDIA GPU: the H200 this project is lent (driver
# 580, CUDA 13 and NCCL libraries only as pip wheels in its Python, PyTorch, no Rust toolchain,
# no network) or a Tesla M60 server with CUDA 12. It runs binaries built and packed elsewhere:
#
#   scripts/gpu-check.sh --rehearse   here, with cargo: builds the test binaries and the CLI
#                                     (release, stripped, features cuda,nccl), packs them into
#                                     .gpu/ (ignored by git) and prints what a run would carry,
#                                     run, and how large it is. Touches no GPU.
#                                     The binaries travel as .gpu/bin.tar.xz (stripped, they are
#                                     over 64 MiB); the run unpacks them under $TMPDIR (/tmp).
#                                     Both need `xz`: without it either stops at once, saying so.
#   scripts/gpu-check.sh              on the GPU machine, from the repository root that carries
#                                     .gpu/: runs the NVRTC and CUDA smoke tests, the
#                                     conformance tests on CUDA alone (TANDEM_BACKENDS=cuda: no
#                                     wgpu adapter in that process), `tandem devices` (which
#                                     must show cuBLAS as cuda:0's matmul), single-process NCCL
#                                     (NCCL_DEBUG=WARN; once more with NCCL_CUMEM_ENABLE=0 when
#                                     it fails), the suites of each op family, halves, autocast,
#                                     offload and the GPT on cuda:0 (TANDEM_BACKENDS=cuda), those
#                                     of mixed precision with the GradScaler and ZeRO-3 in halves
#                                     on four logical devices of cuda:0 (TANDEM_TEST_DEVICES), a
#                                     failing test suite once more with CUDA_LAUNCH_BLOCKING=1
#                                     and one test thread (both rows in the table), the
#                                     conformance tests on every device (CUDA and
#                                     every wgpu adapter such as the GPU's Vulkan one, also under
#                                     the forced hardware profile), `tandem bench` (WGSL vs cuBLAS matmul up to 2048:
#                                     GFLOP/s of each and their ratio per size, and "WGSL matmul
#                                     2048 at X% of cuBLAS (goal 60%)"; the kernels autotuning
#                                     chose and each candidate's GFLOP/s against cuBLAS's;
#                                     seed-CNN steps), the same
#                                     seed-CNN step in that machine's PyTorch and, where mpirun
#                                     is, NCCL across processes (examples/dist_pipeline, packed
#                                     when the rehearsal machine has MPI, run only when mpirun is
#                                     Open MPI's and the packed binary's libmpi resolves) against
#                                     MPI host memory: 2 processes on 2 GPUs, or 1 process on a
#                                     single GPU (NCCL refuses two ranks on one GPU); prints one
#                                     table, also when a step fails or the script is cut short.
#                                     About 8 minutes at most: each step has a timeout, steps
#                                     past the budget are skipped, and the table is always printed.
#   scripts/gpu-check.sh --rehearse   then also runs here every step that needs no GPU (the
#                                     CUDA ones skip, saying why), as the run would.
#
# Libraries: tandem finds NVRTC, cuBLAS and NCCL of CUDA 12 or 13 itself (`libnvrtc.so.13` or
# `.12`, `libcublas.so.13` or `.12`, `libnccl.so.2`; see src/backend/cuda/libs.rs), in
# TANDEM_CUDA_LIBS, LD_LIBRARY_PATH, the pip wheels' folders and the system's. The run only adds
# the wheel folders this machine's Python knows to TANDEM_CUDA_LIBS, links nothing, and shows
# what was loaded in `tandem devices` (MATMUL, LIBRARIES). CUDA 13 no longer serves devices below
# compute capability 7.5 (tests/nvrtc.rs skips sm_52 under NVRTC 13): on the M60 tandem takes
# only CUDA 12's NVRTC and cuBLAS, and says so when only CUDA 13's are there; the H200's sm_90
# takes the driver's CUDA 13.
#
# Vulkan and EGL: wgpu loads `libvulkan.so.1` and `libEGL.so.1`; the GPU machine's image may lack
# these loaders (the driver only brings its ICD), so --rehearse packs Debian's libvulkan1,
# libegl1 and libglvnd0 into .gpu/gl/, and the run unpacks them into a private folder (never
# into /) when the machine has no `libvulkan.so.1`, pointing the loaders at the driver's files.
#
# Installs nothing; never resets the GPU or changes its settings (nvidia-smi is only queried).
# Exit status: non-zero when a required step failed. Env: GPU_CHECK_BUDGET_S (480): the seconds
# all steps together may take; no step is started with less than 15 s of it left.
# GPU_CHECK_PROFILE (release): the cargo profile --rehearse builds with (`dev` reuses a debug
# build's artifacts where a release build would take too long; its pack may be too large to
# carry). GPU_CHECK_FEATURES (cuda,nccl): the features the test binaries are built with.
# GPU_CHECK_SAVE=DIR: the step logs also go to DIR/gpu-check-logs.tgz (the device tool: $OUT).
set -u
cd "$(dirname "$0")/.." || exit 2
pack=.gpu
bins=(nvrtc cuda_smoke nccl conformance)
# The suites that also run every op family on cuda:0 against the CPU reference (halves and the
# ops on them with autocast, fused passes, transformer kernels, long axes, gathers, batched
# products, budgets, the GPT, every elementwise code and NaN past them, softplus) and the
# optimizer state offloaded to host memory (optim): run once with TANDEM_BACKENDS=cuda, so that
# only CUDA is under test.
cuda_suites=(halves half_ops fused transformer_kernels tensor_ops long_axes gather batched_matmul losses layers memory_budget gpt optim op_table)
bins+=("${cuda_suites[@]}")
# The suites whose strategies take their devices from TANDEM_TEST_DEVICES (tests/common's
# cycled_devices), run on four logical devices of cuda:0: bf16 and f16 with the GradScaler,
# data parallelism and ZeRO-3 in halves, the strategies that split the model (precision), and
# every builder's precision (builder_precision). The ZeRO-3 suites zero3_units and
# zero3_offload build CPU devices only; ZeRO-3 on CUDA is cuda_smoke's case.
device_suites=(precision builder_precision)
bins+=("${device_suites[@]}")
rehearsal=0

# --- --rehearse: build and pack here ----------------------------------------------------------
if [ "${1:-}" = --rehearse ]; then
  # Checked before the build, which takes minutes: the pack is made with xz.
  if ! command -v xz >/dev/null 2>&1; then
    echo "gpu-check: xz is not installed here, and --rehearse packs the binaries with it into" \
      "$pack/bin.tar.xz; install xz-utils (apt-get install xz-utils) and run again" >&2
    exit 1
  fi
  set -e
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
  # Symbols are most of a test binary's size; the 64 MiB a run may carry holds the stripped ones.
  export CARGO_PROFILE_RELEASE_STRIP=symbols
  features=${GPU_CHECK_FEATURES:-cuda,nccl}
  json=$(mktemp)
  args=()
  for b in "${bins[@]}"; do args+=(--test "$b"); done
  profile=${GPU_CHECK_PROFILE:-release}
  echo "gpu-check: building ${bins[*]} and the tandem CLI ($profile, --features $features)"
  cargo test --profile "$profile" --features "$features" --no-run "${args[@]}" --message-format=json >"$json"
  cargo build --profile "$profile" --features "$features" --bin tandem --message-format=json >>"$json"
  # NCCL across processes needs the `mpi` feature, which links Open MPI: packed only where it
  # builds (libmpi and libclang installed); the GPU machine then needs Open MPI too.
  if command -v mpicc >/dev/null 2>&1; then
    echo "gpu-check: building examples/dist_pipeline ($profile, --features $features,mpi)"
    cargo build --profile "$profile" --features "${features%,mpi},mpi" --example dist_pipeline --message-format=json >>"$json"
  else
    echo "gpu-check: no MPI here (mpicc); NCCL across processes will not be packed"
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
  # A `dev` build is not stripped by the profile (that would rebuild every dependency).
  [ "$profile" = release ] || strip --strip-all "$pack"/bin/* 2>/dev/null || true
  # wgpu's loaders, for a GPU machine whose image has none (the run unpacks them privately).
  mkdir -p "$pack/gl"
  if ! (cd "$pack/gl" && apt-get download libvulkan1 libegl1 libglvnd0 >/dev/null 2>&1); then
    echo "gpu-check: could not download the Vulkan/EGL loaders (apt-get download); the run will use the GPU machine's own" >&2
    rm -rf "$pack/gl"
  fi
  for b in "${bins[@]}" tandem; do
    [ -x "$pack/bin/$b" ] || { echo "gpu-check: $b was not built" >&2; exit 1; }
  done
  { echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
    echo "features $features; profile $profile; built $(date -u +%FT%TZ) on $(uname -m) with $(rustc --version)"
    # The newest glibc symbol version the binaries need: the GPU machine's glibc must have it.
    echo "needs $(for f in "$pack"/bin/*; do objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'; done | sort -uV | tail -1)"
  } >"$pack/MANIFEST"
  # Stripped, the binaries are still over the 64 MiB a run carries; xz packs them to about a
  # quarter, and the run unpacks them (below) before its first step.
  tar cf - -C "$pack" bin | xz -T0 -6 >"$pack/bin.tar.xz"
  rm -rf "$pack/bin"
  bytes=$(du -cb "$pack" | tail -1 | cut -f1)
  # What travels besides: tracked and untracked-not-ignored files.
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
  echo
  echo "would carry: $pack/ $((bytes / 1024)) KiB + the working tree $((tree / 1024)) KiB = $(((bytes + tree) / 1048576)) MiB of the 64 MiB a run may carry"
  find "$pack" -type f -printf '%P %s\n' | sort | awk '{printf "    %-44s %6.2f MiB\n", $1, $2 / 1048576}'
  echo "would run, on the GPU machine:  GPU_CHECK_SAVE=\$OUT scripts/gpu-check.sh   (device tool: carry [\"$pack\"], timeout_s 600)"
  echo "    1. nvidia-smi; the pip wheels' CUDA folders put on TANDEM_CUDA_LIBS;"
  echo "       the packed Vulkan/EGL loaders unpacked into a private folder if the machine has none"
  echo "    2. $pack/bin/nvrtc        every kernels/*.cu through that NVRTC (sm_90/compute_90; _52 on CUDA 12)"
  echo "    3. $pack/bin/cuda_smoke   CUDA ops against the CPU reference, allocator, peer copies"
  echo "    4. $pack/bin/conformance  with TANDEM_BACKENDS=cuda: every op on cuda:0 alone, no wgpu adapter opened"
  echo "    5. $pack/bin/tandem devices: each device's matmul path and libraries; cuda:0 must use cuBLAS"
  echo "    6. $pack/bin/nccl         NCCL in one process (NCCL_DEBUG=WARN; retried with NCCL_CUMEM_ENABLE=0)"
  echo "   6b. with TANDEM_BACKENDS=cuda: ${cuda_suites[*]} (each op family, halves, budgets, the GPT, offload on cuda:0)"
  echo "   6c. with TANDEM_TEST_DEVICES=cuda:0 four times: ${device_suites[*]} (autocast, GradScaler, ZeRO-3 in halves)"
  echo "       each failing suite once more with CUDA_LAUNCH_BLOCKING=1 --test-threads 1"
  echo "    7. $pack/bin/conformance  every op on cuda:0 and every wgpu adapter; again with TANDEM_WGPU_KERNELS=hardware"
  echo "    8. $pack/bin/tandem bench, once on cuda:0 and once on each hardware wgpu adapter: matmul 256-2048 (cuBLAS vs WGSL), seed-CNN steps"
  echo "    9. python3 + torch: the seed-CNN step at batch 64 and 1000 on that GPU"
  if tar tJf "$pack/bin.tar.xz" bin/dist_pipeline >/dev/null 2>&1; then
    echo "   10. only where mpirun is Open MPI's and libmpi resolves: NCCL across processes vs MPI host memory, same losses:"
    echo "       2 GPUs: mpirun -np 2 $pack/bin/dist_pipeline --mode dp --devices cuda:0,cuda:1 --comm nccl|hierarchical"
    echo "       1 GPU (the H200): mpirun -np 1 ... --devices cuda:0; NCCL refuses 2 ranks on one GPU, so no -np 2 there"
  else
    echo "   10. (NCCL across processes: not packed, no MPI here; skipped)"
  fi
  echo "    then one table of steps and figures; at most GPU_CHECK_BUDGET_S=480 s of steps"
  # 8 MiB of room, for the logs and files that grow in the tree before the run.
  if [ $((bytes + tree)) -gt $((56 * 1024 * 1024)) ]; then
    echo "gpu-check: the pack and the tree are over 56 MiB (64 MiB travel, less room)" >&2
    [ "$profile" = release ] && exit 1
    echo "gpu-check: ($profile build: run here only, not to be carried)" >&2
  fi
  echo
  echo "gpu-check: running here every step that needs no GPU, as the GPU machine would"
  set +e
  rehearsal=1
fi

# --- the run on the GPU machine ---------------------------------------------------------------
# The binaries are unpacked outside the tree, so that nothing unpacked is carried by a later run.
bin=$pack/bin
if [ -f "$pack/bin.tar.xz" ]; then
  if ! command -v xz >/dev/null 2>&1; then
    echo "gpu-check: xz is not installed on this machine, and the binaries travel packed with it" \
      "($pack/bin.tar.xz); install xz-utils here, or unpack the archive where xz is and carry $pack/bin instead" >&2
    exit 2
  fi
  bin=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-bin.XXXXXX")/bin
  tar xJf "$pack/bin.tar.xz" -C "${bin%/bin}" || { echo "gpu-check: could not unpack $pack/bin.tar.xz" >&2; exit 2; }
fi
if [ ! -x "$bin/conformance" ]; then
  echo "gpu-check: no packed binaries in $pack/; run scripts/gpu-check.sh --rehearse where cargo is, then carry $pack" >&2
  exit 2
fi
log_dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
# The test binaries name this build's CLI and target/tmp, which do not exist on the GPU machine.
mkdir -p "$log_dir/tmp"
export TANDEM_TEST_BIN=$bin/tandem TANDEM_TEST_TMPDIR=$log_dir/tmp
budget=${GPU_CHECK_BUDGET_S:-480}
started=$(date +%s)
names=() results=() notes=() required_failed=0
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

# record NAME RESULT NOTE
record() {
  names+=("$1") results+=("$2") notes+=("$3")
  printf '== %-28s %s  %s\n' "$1" "$2" "$3"
}

# Seconds left of the overall budget.
left() {
  echo $((budget - ($(date +%s) - started)))
}

# step NAME REQUIRED(1|0) TIMEOUT_S COMMAND...: runs COMMAND with output in $log_dir/NAME.log,
# for at most TIMEOUT_S and what is left of the budget; skipped when under 15 s are left, so the
# run always reaches its table. Returns the command's status (1 when skipped).
step() {
  local name=$1 required=$2 limit=$3
  shift 3
  local l logf="$log_dir/$name.log" t0 rc took why
  l=$(left)
  if [ "$l" -lt 15 ]; then
    : >"$logf"
    record "$name" SKIP "the ${budget}s budget is spent"
    [ "$required" -eq 1 ] && required_failed=1
    return 1
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$logf" 2>&1
  rc=$?
  took=$(($(date +%s) - t0))s
  if [ "$rc" -eq 0 ]; then
    record "$name" PASS "$took"
  else
    why="exit $rc"
    { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && why="timed out after ${limit}s"
    record "$name" FAIL "$why, $took; log: $logf"
    tail -n 25 "$logf" | sed 's/^/    /'
    [ "$required" -eq 1 ] && required_failed=1
  fi
  return "$rc"
}

# skips NAME: adds the tests' own skip lines to the row just recorded for NAME (a test that skips
# passes, so without this the table would hide that nothing ran). Where nvidia-smi lists a GPU, a
# CUDA or NCCL test that skips for want of the device or the library fails the step instead.
skips() {
  local s last=$((${#names[@]} - 1))
  s=$(grep -hoE "skipp(ed:|ing) .*" "$log_dir/$1.log" 2>/dev/null | sort -u | head -3 | paste -sd';' -)
  [ -n "$s" ] || return 0
  notes[last]+="; $s"
  if [ "$gpus" -ge 1 ] && grep -qiE "skipp(ed:|ing) .*(no CUDA device|cuda backend is not available|NCCL library|libnccl)" "$log_dir/$1.log"; then
    results[last]=FAIL
    required_failed=1
    printf '== %-28s FAIL  its CUDA/NCCL tests skipped although nvidia-smi lists %s GPU(s)\n' "$1" "$gpus"
  fi
}

# suite NAME REQUIRED TIMEOUT_S BINARY ARGS...: a test binary as step NAME, its skip lines added;
# when it fails, once more as NAME-blocking with CUDA_LAUNCH_BLOCKING=1 and one test thread (any
# --test-threads of ARGS dropped), so that an asynchronous CUDA error is reported by the launch
# that caused it and no two tests overlap. Both rows stay in the table; the re-run is a
# diagnosis, so the first failure counts whatever it gives. Returns the first run's status.
suite() {
  local name=$1 required=$2 limit=$3 rc a drop=0 last
  shift 3
  step "$name" "$required" "$limit" "$@"
  rc=$?
  skips "$name"
  last=$((${#names[@]} - 1))
  [ "$rc" -eq 0 ] || [ "${results[last]}" != FAIL ] && return "$rc"
  local args=()
  for a in "$@"; do
    if [ "$drop" -eq 1 ]; then drop=0; continue; fi
    case $a in
      --test-threads) drop=1 ;;
      --test-threads=*) ;;
      *) args+=("$a") ;;
    esac
  done
  CUDA_LAUNCH_BLOCKING=1 step "$name-blocking" 0 $((limit * 2)) "${args[@]}" --test-threads 1
  last=$((${#names[@]} - 1))
  notes[last]="re-run of $name with CUDA_LAUNCH_BLOCKING=1 --test-threads 1: ${notes[last]}"
  return "$rc"
}

# --- the table ---------------------------------------------------------------------------------
# Printed once, by the EXIT trap set up before the steps, so that it also appears when a step
# fails, when the script is killed, or when it stops on an error of its own; defined here, ahead
# of the steps, because bash reads a script as it runs it.
table() {
[ -n "${table_done:-}" ] && return
table_done=1
# Figures: WGSL (each hardware wgpu adapter: the tiled kernels, 128x128 tiles from 1024 on)
# against cuBLAS (cuda:0) per matmul size with the goal of issue 16 (WGSL at 2048 at least 60% of
# cuBLAS), then the seed-CNN step per device and PyTorch's.
touch "$log_dir/bench.log" "$log_dir/torch-seed-cnn.log"
python3 - "$log_dir/bench.log" "${hw:-}" "$log_dir/torch-seed-cnn.log" "${cuda0_matmul:-cuBLAS}" >"$log_dir/figures.txt" 2>&1 <<'EOF' \
  || echo "(the figures could not be read: $log_dir/bench.log)" >>"$log_dir/figures.txt"
import json, sys
gflops, steps, tuned = {}, {}, []
for line in open(sys.argv[1]):
    try:
        f = json.loads(line)
    except ValueError:
        continue
    if not isinstance(f, dict):
        continue
    if f.get("bench") == "matmul":
        gflops[(f["device"], f["n"])] = f["gflops"]
    elif f.get("bench") == "train-step" and f.get("model") == "seed-cnn":
        steps[(f["device"], f["batch"])] = f["median_ms"]
    elif f.get("bench") == "autotune":
        tuned.append(f)
cublas = {n: g for (d, n), g in gflops.items() if d == "cuda:0"}
# cuda:0's figures are cuBLAS's only where `tandem devices` said so (step cublas).
ref = "cuBLAS" if sys.argv[4] == "cuBLAS" else "cuda:0 tiled kernel"
hw = [d for d in sys.argv[2].split(",") if d]
if not hw:
    print(f"no hardware wgpu adapter: no WGSL figure ({ref} GFLOP/s: %s)" % (", ".join(f"n={n} {g:.0f}" for n, g in sorted(cublas.items())) or "none"))
else:
    print(f"{'device':<10} {'n':>5} {'WGSL GFLOP/s':>13} {ref + ' GFLOP/s':>15} {'ratio':>6}")
    for d in hw:
        for n in sorted(n for (dd, n) in gflops if dd == d):
            w, c = gflops[(d, n)], cublas.get(n)
            print(f"{d:<10} {n:>5} {w:>13.1f} {c or float('nan'):>15.1f} {w / c if c else float('nan'):>6.2f}")
    for d in hw:
        w, c = gflops.get((d, 2048)), cublas.get(2048)
        if w is None or not c:
            print(f"WGSL matmul 2048 on {d}: no figure (WGSL {w}, {ref} {c})")
        else:
            print(f"WGSL matmul 2048 at {100 * w / c:.0f}% of {ref} (goal 60% of cuBLAS) on {d}")
    # Autotuning's choices (issue 31): per square shape class the bench's matmuls reached, each
    # candidate's GFLOP/s from its best time (the class's sizes are the bench's n) against cuBLAS.
    for f in tuned:
        dims = dict((w[0], int(w[1:])) for w in f["class"].split() if w[0] in "mnk" and w[1:].isdigit())
        n = dims.get("m")
        if f["device"] not in hw or dims.get("n") != n or dims.get("k") != n or n not in cublas:
            continue
        each = ", ".join(f"{k} {2 * n ** 3 / us / 1e3:.0f}" for k, us in f["times_us"])
        print(f"autotune {f['device']} n={n}: {f['kernel']} chosen ({each} GFLOP/s, {f['clock']} clock) vs {ref} {cublas[n]:.0f}")
print()
print(f"{'seed-CNN step':<22} {'batch':>5} {'median ms':>10}")
for (d, b), ms in sorted(steps.items()):
    print(f"{'tandem ' + d:<22} {b:>5} {ms:>10.3f}")
for line in open(sys.argv[3]):
    if line.startswith("torch ") and "median" in line:
        head, ms = line.rsplit("median", 1)
        b = head.split("batch")[1].strip(" :")
        print(f"{head.split(':')[0]:<22} {b:>5} {float(ms.split()[0]):>10.3f}")
EOF
{
  echo
  printf '%-28s %-5s %s\n' STEP RESULT NOTE
  for i in "${!names[@]}"; do
    printf '%-28s %-5s %s\n' "${names[$i]}" "${results[$i]}" "${notes[$i]}"
  done
  echo
  cat "$log_dir/figures.txt"
  echo "logs: $log_dir; total $(($(date +%s) - started))s"
} | tee "$log_dir/summary.txt"
if [ -n "${GPU_CHECK_SAVE:-}" ]; then
  tar czf "$GPU_CHECK_SAVE/gpu-check-logs.tgz" -C "$log_dir" --exclude=./gl --exclude=./lib . && echo "logs saved: $GPU_CHECK_SAVE/gpu-check-logs.tgz"
fi
}

trap table EXIT
trap 'record interrupted FAIL "the check was stopped by a signal during the step after the last row"; exit 130' INT TERM

# GPUs the driver lists: 0 without nvidia-smi.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
record packed PASS "$(paste -sd';' "$pack/MANIFEST")"
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null \
    || nvidia-smi -L 2>/dev/null)
  record nvidia-smi PASS "$(echo "$gpu" | paste -sd';' -)"
else
  record nvidia-smi SKIP "not installed (the CUDA tests still probe libcuda)"
fi

# --- libraries: a CUDA toolkit's, or the pip wheels' (nvidia-*-cu12 or -cu13) -------------------
dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
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
joined=$(IFS=:; echo "${dirs[*]:-}")
# tandem searches these itself (src/backend/cuda/libs.rs); nothing is linked or renamed.
export TANDEM_CUDA_LIBS="${joined}${TANDEM_CUDA_LIBS:+:$TANDEM_CUDA_LIBS}"
record libraries PASS "TANDEM_CUDA_LIBS: ${joined:-none}"

# --- Vulkan/EGL loaders: the machine's, else the packed ones unpacked under $log_dir -------------
if ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1 '; then
  record loaders PASS "the machine's libvulkan.so.1"
elif compgen -G "$pack/gl/*.deb" >/dev/null && command -v dpkg >/dev/null 2>&1; then
  for f in "$pack"/gl/*.deb; do dpkg -x "$f" "$log_dir/gl"; done
  export LD_LIBRARY_PATH="$log_dir/gl/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
  # The driver's ICD and EGL vendor files, where the loaders would not look for them.
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
  [ -e "$icd" ] && export VK_DRIVER_FILES=${VK_DRIVER_FILES:-$icd} VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-$icd}
  [ -e "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-$egl}
  record loaders PASS "packed ones in $log_dir/gl; ICD: ${VK_DRIVER_FILES:-where the loader looks}"
else
  record loaders SKIP "no libvulkan.so.1 and none packed (or no dpkg): wgpu sees only what the machine has"
fi

# --- tests -------------------------------------------------------------------------------------
# nccl_step NAME TIMEOUT COMMAND...: NCCL with NCCL_DEBUG=WARN, so its own reason is in the log;
# when that fails, once more with NCCL_CUMEM_ENABLE=0 (a sandbox may refuse the cuMem
# allocations NCCL makes by default) as NAME-nocumem, which is then the required one.
nccl_step() {
  local name=$1 limit=$2
  shift 2
  NCCL_DEBUG=WARN step "$name" 0 "$limit" "$@" && return 0
  NCCL_DEBUG=WARN NCCL_CUMEM_ENABLE=0 step "$name-nocumem" 1 "$limit" "$@"
}

suite nvrtc 1 90 "$bin/nvrtc" --nocapture
suite cuda-smoke 1 120 "$bin/cuda_smoke" --nocapture
grep -hE "skipped|peer matrix" "$log_dir/cuda-smoke.log" | head -10 | sed 's/^/    /'
# CUDA alone first: no Vulkan or GL driver is loaded in this process, so what fails here is CUDA's.
TANDEM_BACKENDS=cuda suite conformance-cuda 1 90 "$bin/conformance" --nocapture
step devices 1 60 "$bin/tandem" devices
sed 's/^/    /' "$log_dir/devices.log"
# cuBLAS is required: matmul on the tiled kernel instead would pass every test and mislabel the
# bench's cuBLAS figures.
cuda0=$(awk '$1 == "cuda:0" || $2 == "cuda:0"' "$log_dir/devices.log")
if [ -n "$cuda0" ]; then
  if grep -qE 'cuBLAS [0-9]' <<<"$cuda0" && ! grep -q 'tiled kernel' <<<"$cuda0"; then
    record cublas PASS "$(grep -oE 'cuBLAS [0-9.]+ \([^)]*\)' <<<"$cuda0"); $(grep -oE 'NVRTC [^;]*(; kernels as [^;]*)?' <<<"$cuda0")"
  else
    record cublas FAIL "cuda:0 does not use cuBLAS: $(grep -oE 'tiled kernel.*' <<<"$cuda0")"
    cuda0_matmul=tiled
    required_failed=1
  fi
elif [ "$gpus" -ge 1 ]; then
  record cublas FAIL "nvidia-smi lists $gpus GPU(s) but tandem devices shows no cuda:0"
  required_failed=1
else
  record cublas SKIP "no CUDA device"
fi
nccl_step nccl 60 "$bin/nccl" --nocapture; skips "${names[-1]}"
grep -hE "^NCCL|skipped|NCCL WARN" "$log_dir/${names[-1]}.log" | head -10 | sed 's/^/    /'
for suite in "${cuda_suites[@]}"; do
  TANDEM_BACKENDS=cuda suite "cuda-$suite" 1 60 "$bin/$suite" --test-threads 4 --nocapture
done
for suite in "${device_suites[@]}"; do
  if [ -n "$cuda0" ]; then
    TANDEM_TEST_DEVICES=cuda:0,cuda:0,cuda:0,cuda:0 suite "cuda-$suite" 1 120 "$bin/$suite" --test-threads 4 --nocapture
  else
    record "cuda-$suite" SKIP "no cuda:0 in tandem devices (its devices come from TANDEM_TEST_DEVICES)"
  fi
done
suite conformance 1 150 "$bin/conformance" --nocapture
grep -hE "^running on|skipping" "$log_dir/conformance.log" | sort -u | sed 's/^/    /'
# The GPU's own wgpu adapters (Vulkan, GL): what `tandem devices` calls discrete, integrated or
# other (software adapters are lavapipe and llvmpipe, tested where the code is built).
hw=$(awk '/ wgpu / && / (discrete|integrated|virtualgpu|other) / { for (i = 1; i <= NF; i++) if ($i ~ /^wgpu:[0-9]+$/) { print $i; break } }' \
  "$log_dir/devices.log" | paste -sd, -)
if [ -n "$hw" ]; then
  TANDEM_WGPU_KERNELS=hardware suite conformance-hardware-profile 1 120 "$bin/conformance"
else
  record conformance-hardware-profile SKIP "no hardware wgpu adapter (tandem devices above)"
fi

# --- benches: WGSL vs cuBLAS matmul, seed-CNN steps, then PyTorch's ----------------------------
# One step per device, so that a slow adapter costs only its own figures; JSON lines are written
# as they are measured, so a step that times out still leaves the figures it reached.
[ -n "$cuda0" ] || record bench-cuda0 SKIP "no cuda:0 in tandem devices"
for d in ${cuda0:+cuda:0} ${hw//,/ }; do
  # A cache of its own: the hardware adapters tune afresh (TANDEM_AUTOTUNE is on there).
  TANDEM_CACHE_DIR="$log_dir/cache" step "bench-${d/:/}" 0 120 "$bin/tandem" bench --log-format json --devices "$d"
  cat "$log_dir/bench-${d/:/}.log" >>"$log_dir/bench.log"
done
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

# --- NCCL across processes (Nccl::across) against MPI host memory: the same losses ------------
# One process per GPU: NCCL refuses two ranks on one GPU, so a single GPU runs one process (its
# own NCCL communicator of one rank, made through MPI like any other).
# The packed binary links Open MPI: another mpirun (MPICH, Intel MPI) cannot start its ranks.
unresolved=
[ -x "$bin/dist_pipeline" ] && unresolved=$(ldd "$bin/dist_pipeline" 2>&1 | awk '/not found/ { print $1 }' | paste -sd, -)
if [ ! -x "$bin/dist_pipeline" ]; then
  record nccl-processes SKIP "examples/dist_pipeline not packed (no MPI where --rehearse ran)"
elif ! command -v mpirun >/dev/null 2>&1; then
  record nccl-processes SKIP "no mpirun (Open MPI) here; NCCL in one process was checked (step nccl)"
elif ! mpirun --version 2>&1 | grep -q "Open MPI"; then
  record nccl-processes SKIP "mpirun is not Open MPI's ($(mpirun --version 2>&1 | head -1)); the packed binary links Open MPI"
elif [ -n "$unresolved" ]; then
  record nccl-processes SKIP "dist_pipeline's libraries do not resolve here: $unresolved (ldd)"
elif [ "${gpus:-0}" -lt 1 ]; then
  record nccl-processes SKIP "nvidia-smi lists no GPU (mpirun is Open MPI's, libmpi resolves)"
else
  if [ "$gpus" -ge 2 ]; then np=2 devs=cuda:0,cuda:1; else np=1 devs=cuda:0; fi
  dp=(mpirun --allow-run-as-root --oversubscribe -np "$np" "$bin/dist_pipeline" --mode dp --devices "$devs" --steps 10)
  if nccl_step "nccl-$np-processes" 90 "${dp[@]}" --comm nccl && step "hierarchical-$np-processes" 1 90 "${dp[@]}" --comm hierarchical; then
    nccl_log=$log_dir/nccl-$np-processes.log
    [ -s "$log_dir/nccl-$np-processes-nocumem.log" ] && nccl_log=$log_dir/nccl-$np-processes-nocumem.log
    step nccl-matches-mpi 1 20 python3 - "$nccl_log" "$log_dir/hierarchical-$np-processes.log" <<'EOF'
import json, sys
def losses(path):
    out = []
    for line in open(path):
        try:
            out.append(json.loads(line)["loss"])
        except (ValueError, KeyError, TypeError):
            pass
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("nccl:", a, "\nmpi: ", b)
assert len(a) == len(b) == 10, (len(a), len(b))
assert all(abs(x - y) <= 1e-4 + 1e-3 * abs(y) for x, y in zip(a, b)), "losses differ"
EOF
  fi
fi

exit "$required_failed"
