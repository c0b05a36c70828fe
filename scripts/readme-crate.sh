#!/usr/bin/env bash
# README.md's library example, built as a new user builds it: a crate of its own whose only
# dependency is tandem with README.md's own dependency line (its features; a path to this
# checkout in place of the version), and whose main.rs is README.md's first ```rust block.
# Offline, against this checkout's Cargo.lock (so the crates are those in ~/.cargo already),
# in target/ (so the dependencies built for the tests are reused). Building is the check: the
# same example runs as the crate documentation's first doc test.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
crate="$repo/target/readme-crate"

line=$(grep -E '^[[:space:]]*tandem = \{' "$repo/README.md" | head -n 1 | sed -e 's/[[:space:]]*#.*$//' -e 's/^[[:space:]]*//')
if [ -z "$line" ] || ! grep -q 'version = "[^"]*"' <<<"$line"; then
  echo "readme-crate.sh: README.md has no dependency line 'tandem = { version = ..., ... }'" >&2
  exit 1
fi
dependency=$(sed -e "s|version = \"[^\"]*\"|path = \"$repo\"|" <<<"$line")

rm -rf "$crate"
mkdir -p "$crate/src"
cat >"$crate/Cargo.toml" <<EOF
[package]
name = "readme-example"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$dependency

# Not a member of any workspace above it.
[workspace]

EOF
# This checkout's profiles, so that the dependencies built for the tests are reused rather than
# built again at another optimisation level.
awk '/^\[/ { keep = /^\[profile\./ } keep' "$repo/Cargo.toml" >>"$crate/Cargo.toml"
# The first block opened with exactly ```rust, without its fences (as tests/readme.rs reads it).
awk '/^```rust[[:space:]]*$/ && !seen { inside = 1; seen = 1; next } inside && /^```[[:space:]]*$/ { exit } inside { print }' \
  "$repo/README.md" >"$crate/src/main.rs"
if [ ! -s "$crate/src/main.rs" ]; then
  echo "readme-crate.sh: README.md has no \`\`\`rust block" >&2
  exit 1
fi
cp "$repo/Cargo.lock" "$crate/Cargo.lock"

echo "readme-crate.sh: building README.md's example with: $line"
CARGO_TARGET_DIR="$repo/target" cargo build -q --offline --manifest-path "$crate/Cargo.toml"
