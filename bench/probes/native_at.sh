#!/usr/bin/env bash
# Builds the native module of another commit beside its own bootstrap, so that bench/chains.py
# (and bench/probes/chain_callgrind.py) can run that commit's native chain beside today's in the
# same run: say the module as an HTTP filter, before commit ce73175 made it the route's cluster
# specifier. Writes OUT/odmesh-native.yaml (the commit's envoy/odmesh-native.yaml) and
# OUT/libodmesh_filter.so, and prints the `--chain` value for them:
#   bench/chains.py --chain native-ca74098=$(bench/probes/native_at.sh ca74098)
#   bench/probes/native_at.sh [COMMIT] [OUT]
set -euo pipefail
commit="${1:-ca74098}"
out="${2:-/tmp/odmesh-native-$commit}"
top="$(cd "$(dirname "$0")/../.." && pwd)"
tree="$(mktemp -d /tmp/odmesh-native-at.XXXXXX)"
trap 'git -C "$top" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git -C "$top" worktree add --detach "$tree" "$commit" >/dev/null
# Its own target folder, so today's build is left alone.
cargo build -q -j"${JOBS:-2}" --manifest-path "$tree/Cargo.toml" --release -p odmesh-filter-native \
  --target-dir "$tree/target"
mkdir -p "$out"
cp "$tree/target/release/libodmesh_filter_native.so" "$out/libodmesh_filter.so"
cp "$tree/envoy/odmesh-native.yaml" "$out/odmesh-native.yaml"
echo "$out/odmesh-native.yaml:$out/libodmesh_filter.so"
