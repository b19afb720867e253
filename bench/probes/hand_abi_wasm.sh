#!/usr/bin/env bash
# Builds the filter as it was before the proxy-wasm SDK shell replaced it: the hand-written
# proxy-wasm ABI of commit 702a260 (filter/src/abi.rs, glue.rs, contexts.rs), so that
# bench/chains.py can measure it beside today's chains in the same run (docs/benchmarks.md,
# "6. Request chains"). Prints the path of the built .wasm.
#   bench/probes/hand_abi_wasm.sh [COMMIT] [OUT]
set -euo pipefail
commit="${1:-702a260}"
out="${2:-/tmp/odmesh-hand-abi.wasm}"
top="$(cd "$(dirname "$0")/../.." && pwd)"
tree="$(mktemp -d /tmp/odmesh-hand-abi.XXXXXX)"
trap 'git -C "$top" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git -C "$top" worktree add --detach "$tree" "$commit" >/dev/null
# Its own target folder, so today's build is left alone.
cargo build -q -j"${JOBS:-2}" --manifest-path "$tree/Cargo.toml" --target wasm32-wasip1 \
  --profile wasm -p odmesh-filter --target-dir "$tree/target"
cp "$tree/target/wasm32-wasip1/wasm/odmesh_filter.wasm" "$out"
echo "$out"
