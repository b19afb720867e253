#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (docs/fuzzing.md) for FUZZ_SECONDS each, one after another,
# from the committed seeds (fuzz/seeds/<target>) and the git-ignored corpus it keeps growing
# (fuzz/corpus/<target>), with the target's dictionary of keywords (fuzz/dicts/). Installs what it needs when missing: the nightly toolchain (rustup)
# and cargo-fuzz (cargo install, pinned). Exits non-zero, naming the input that failed and
# the command that reproduces it, if any target crashes, hangs or cannot run at all.
#
#   FUZZ_SECONDS=20 scripts/fuzz.sh                  # every target, 20 s each
#   FUZZ_TARGETS="eureka_xml" FUZZ_SECONDS=300 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
FUZZ_TARGETS="${FUZZ_TARGETS:-host_mapping eureka_json eureka_stream registry_yaml registration eureka_xml peer_batch tokens_file xds_session load_report policy_file prewarm_file limiter}"
CARGO_FUZZ_VERSION=0.13.2
export CARGO_BUILD_JOBS="${JOBS:-2}"
# Release build with debug assertions and overflow checks, AddressSanitizer on (the default).
BUILD_FLAGS=(--release --debug-assertions)

fail() {
  echo "fuzz: FAILED: $*" >&2
  exit 1
}

[[ "$FUZZ_SECONDS" =~ ^[1-9][0-9]*$ ]] || fail "FUZZ_SECONDS must be a whole number of seconds, not '$FUZZ_SECONDS'"

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz: installing the nightly toolchain (cargo fuzz needs it)"
  rustup toolchain install nightly --profile minimal || fail "cannot install the nightly toolchain"
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked ||
    fail "cannot install cargo-fuzz $CARGO_FUZZ_VERSION"
fi
echo "fuzz: $(cargo +nightly fuzz --version), $(rustc +nightly --version)"

start=$SECONDS
cargo +nightly fuzz build "${BUILD_FLAGS[@]}" || fail "the fuzz targets do not build"
echo "fuzz: built every target in $((SECONDS - start)) s"

logs=fuzz/target/logs
mkdir -p "$logs"
summary=()
failed=()
for target in $FUZZ_TARGETS; do
  [[ -d "fuzz/seeds/$target" ]] || fail "no seeds for target '$target' (fuzz/seeds/$target)"
  corpus="fuzz/corpus/$target"
  artifacts="fuzz/artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  case "$target" in
    eureka_json | eureka_stream | eureka_xml | registration | peer_batch) dict=eureka ;;
    *) dict="$target" ;;
  esac
  dict_flag=()
  [[ -f "fuzz/dicts/$dict.dict" ]] && dict_flag=(-dict="$PWD/fuzz/dicts/$dict.dict")
  log="$logs/$target.log"
  marker="$logs/$target.started"
  touch "$marker"
  echo "fuzz: $target for ${FUZZ_SECONDS} s (log: $log)"
  status=0
  # -timeout: an input that takes longer is a hang, reported like a crash.
  cargo +nightly fuzz run "${BUILD_FLAGS[@]}" "$target" "$corpus" "fuzz/seeds/$target" -- \
    -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "${dict_flag[@]}" >"$log" 2>&1 || status=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  corpus_size="$(find "$corpus" -type f | wc -l)"
  if [[ $status -ne 0 ]]; then
    crash="$(find "$artifacts" -type f -newer "$marker" -print -quit)"
    echo "---- $target: the last lines of its log ----" >&2
    tail -n 40 "$log" >&2
    echo "----" >&2
    if [[ -n "$crash" ]]; then
      echo "fuzz: $target FAILED on the input $crash" >&2
      echo "fuzz: reproduce with: cargo +nightly fuzz run ${BUILD_FLAGS[*]} $target $crash" >&2
      echo "fuzz: minimize with:  cargo +nightly fuzz tmin ${BUILD_FLAGS[*]} $target $crash" >&2
    else
      echo "fuzz: $target FAILED (exit $status) without a crashing input; see $log" >&2
    fi
    failed+=("$target")
    summary+=("$target: FAILED after ${runs:-?} runs")
  elif [[ -z "$runs" || "$runs" == 0 ]]; then
    failed+=("$target")
    summary+=("$target: FAILED: it ran no input; see $log")
  else
    summary+=("$target: ${FUZZ_SECONDS} s, $runs runs, 0 crashes, corpus $corpus_size inputs")
  fi
  rm -f "$marker"
done

echo "fuzz: summary (${FUZZ_SECONDS} s per target; $((SECONDS - start)) s in all, with the build)"
printf '  %s\n' "${summary[@]}"
if [[ ${#failed[@]} -ne 0 ]]; then
  fail "${failed[*]}"
fi
