#!/usr/bin/env bash
# Makes sure the Rust toolchain has what odmesh builds with: the wasm32-wasip1 target (the
# filter) and the rustfmt and clippy components (make lint). Installs only what is missing;
# a C compiler it cannot install, and checks for (scripts/check-prereqs.sh).
set -euo pipefail
"$(dirname "${BASH_SOURCE[0]}")/check-prereqs.sh" cc
if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  rustup target add wasm32-wasip1
fi
installed="$(rustup component list --installed)"
for component in rustfmt clippy; do
  if ! grep -q "^$component" <<<"$installed"; then
    rustup component add "$component"
  fi
done
