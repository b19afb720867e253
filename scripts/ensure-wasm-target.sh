#!/usr/bin/env bash
# Adds the wasm32-wasip1 Rust target when it is missing (the filter is built for it).
set -euo pipefail
if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  rustup target add wasm32-wasip1
fi
