#!/usr/bin/env bash
# Checks for what odmesh's scripts cannot install themselves, and says what to install:
#   cc    a C compiler: the `ring` crate (TLS) compiles C, and Rust links through `cc`;
#   node  Node.js 20 or later: scripts/wasi-run.mjs runs the filter's wasm tests under
#         `node:wasi` (preview1, behind a flag before 20), and the eureka-js-client tests run
#         on it. Debian 12's own nodejs is 18.
# Usage: scripts/check-prereqs.sh cc node   (exits 1, with a line for each thing missing)
# Uses only shell builtins besides what it checks, so a test can run it with a PATH of its own.
set -uo pipefail

missing=0
fail() {
  echo "check-prereqs: $*" >&2
  missing=1
}

for need in "$@"; do
  case "$need" in
    cc)
      compiler="${CC:-cc}"
      if ! command -v "$compiler" >/dev/null; then
        fail "no C compiler ('$compiler' not found): the ring crate and linking need one." \
          "Install one, e.g. 'apt-get install build-essential' (Debian) or 'dnf install gcc', or set CC."
      fi
      ;;
    node)
      if ! command -v node >/dev/null; then
        fail "Node.js 20 or later is needed (not found): install it from https://nodejs.org" \
          "or your distribution (Debian 12's nodejs is 18; NodeSource has 20)."
      else
        version="$(node -p 'process.versions.node' 2>/dev/null)"
        major="${version%%.*}"
        if [[ ! "$major" =~ ^[0-9]+$ ]] || ((major < 20)); then
          fail "Node.js 20 or later is needed, found '${version:-unknown}': node:wasi preview1" \
            "(scripts/wasi-run.mjs) needs 20. Install it from https://nodejs.org or NodeSource."
        fi
      fi
      ;;
    *)
      fail "unknown prerequisite '$need' (known: cc, node)"
      ;;
  esac
done
exit "$missing"
