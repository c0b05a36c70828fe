#!/usr/bin/env bash
# Packs the crate as `cargo package` does and builds the packed copy (library and binary, the
# features docs.rs documents), so that a file the crate includes but the package leaves out
# (a shader, a kernel, a guide) fails here rather than for the first user of the published
# crate. The packed copy is unpacked under target/package-check; the build uses this checkout's
# target folder, whose dependencies are already built.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cargo package -q --no-verify --allow-dirty
version=$(cargo metadata -q --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tandem"))')
crate="target/package/tandem-$version.crate"
out=target/package-check
rm -rf "$out"
mkdir -p "$out"
tar -xzf "$crate" -C "$out"
for f in shaders/unary.wgsl kernels/unary.cu src/parallel/strategies.md README.md; do
  if [ ! -f "$out/tandem-$version/$f" ]; then
    echo "package-check.sh: the packed crate lacks $f" >&2
    exit 1
  fi
done
cargo build -q --manifest-path "$out/tandem-$version/Cargo.toml" --target-dir "$root/target" --features cuda,nccl
echo "package-check.sh: tandem-$version packs and its packed copy builds"
