#!/usr/bin/env bash
# Where the wasm shell's concurrency limit spends its instructions (one-off probe; docs/benchmarks.md
# 6b): builds of the .wasm cut short after each step of a limited request, under callgrind in
# the `wasm-limited` chain of bench/features.py.
#
#   bench/probes/wasm_limit_steps.sh           # after `make bench-build` and
#                                              # `python3 bench/features.py --callgrind` (its inputs)
#
# - `wasm-step-noop`: the limit plugin's request hook returns at once (the second plugin's
#   HTTP context alone);
# - `wasm-step-metadata`: it reads the route's metadata and finds the setting, then returns;
# - `wasm-limited`: the module as built (dist/odmesh_filter.wasm).
# The cut builds come from a copy of the committed sources in target/probe-wasm-steps, with the
# checkout's filter/wasm/src/limit.rs edited there; nothing in the checkout changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=target/probe-wasm-steps
inputs=target/odmesh-features
[[ -f $inputs/wasm-limited.yaml ]] || { echo "run bench/features.py first (it writes $inputs)" >&2; exit 1; }
rm -rf "$work/src" && mkdir -p "$work/src"
git archive HEAD | tar -x -C "$work/src"   # the committed tree (the limit's file comes from the checkout below)
hook=$work/src/filter/wasm/src/limit.rs
build() { # name, python edit of limit.rs
  cp filter/wasm/src/limit.rs "$hook"
  python3 - "$hook" "$2" <<'EOF'
import sys
path, marker = sys.argv[1], sys.argv[2]
src = open(path).read()
assert src.count(marker) == 1, f"{marker!r} is not in limit.rs exactly once"
cut = "        if self.plugin.gauges.borrow().len() < usize::MAX { return Action::Continue; }\n"
open(path, "w").write(src.replace(marker, cut + marker))
EOF
  (cd "$work/src" && CARGO_TARGET_DIR=../target cargo build -q -j2 --profile wasm --target wasm32-wasip1 -p odmesh-filter-wasm)
  cp "$work/target/wasm32-wasip1/wasm/odmesh_filter_wasm.wasm" "$work/$1.wasm"
  echo "$1: $(sha256sum "$work/$1.wasm" | cut -c1-64)"
}
build wasm-step-noop "        // The route the request takes now (the mapping named its cluster): its limit, if any."
build wasm-step-metadata "        let now = now();
        let setting = &limited.setting;"
boot=$inputs/wasm-limited.yaml
python3 bench/probes/chain_callgrind.py --requests 1000 \
  --only wasm,wasm-step-noop,wasm-step-metadata,wasm-limited --policy "$inputs/policy.yaml" \
  --chain "wasm-step-noop=$boot:$work/wasm-step-noop.wasm" \
  --chain "wasm-step-metadata=$boot:$work/wasm-step-metadata.wasm" \
  --chain "wasm-limited=$boot:dist/odmesh_filter.wasm"
