#!/usr/bin/env python3
"""What hedging, fault injection and concurrency limits cost the requests that use none of them,
and what the limit costs those that use it (issue 30; `make bench-features`): bench/chains.py's
chains, all to the same VIP `fr-000000`, side by side in alternating rounds of one run:

- `native`, `wasm`: the shipped bootstraps (the fault filter in the chain, switched off) for a
  calling service without hedging or faults (`odmesh`, as shipped): the baseline;
- `native-featured`, `wasm-featured`: the same bootstraps for the calling service `featured`,
  which hedges, injects faults (a 1 % abort) and limits concurrency on ten other VIPs: its
  route has virtual hosts for them (README, "Fault injection");
- `native-limited`, `wasm-limited`: the bootstraps for the calling service `limited`, whose
  route gives `fr-000000` itself a concurrency limit pinned at 1000 (so that the limiter runs on
  every request and refuses none);
- `native-before`, `wasm-before`: the bootstraps of `--before` (default 89cfe13, the last
  commit before issue 30: no fault filter), with today's modules;
- `native-again`, `wasm-again`: the shipped bootstraps again, in an Envoy of their own: how far
  two Envoys of one configuration differ in one run (the control).

    bench/features.py                                   # 20 rounds of 4 s
    bench/features.py --rounds 30 --out docs/bench/features.json
    bench/features.py --callgrind --out docs/bench/features-callgrind.json   # instructions

Writes its inputs (the policy, the bootstraps) into target/odmesh-features and runs
bench/chains.py with them from the repository's root (so the command it records names paths
relative to it); its options after `--` go to bench/chains.py. Standard library only.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path("target/odmesh-features")
NATIVE = "envoy/odmesh-native.yaml"
WASM = "envoy/odmesh.yaml"
MODULES = {NATIVE: "dist/libodmesh_filter.so", WASM: "dist/odmesh_filter.wasm"}
FEATURED = "featured"

POLICY_ENTRY = """  other-{n}:
    callers:
      featured:
        per_try_timeout: 100ms
        hedge: true
        fault: {{abort: {{status: 503, percent: 1}}}}
        concurrency_limit: {{}}
"""
LIMITED = "limited"
LIMITED_ENTRY = """  fr-000000:
    callers:
      limited:
        concurrency_limit: {initial_limit: 1000, min_limit: 1000, max_limit: 1000}
"""


def edit_once(text, old, new, what):
    if text.count(old) != 1:
        raise SystemExit(f"{what}: {old!r} is not there exactly once")
    return text.replace(old, new)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--before", default="89cfe13", help="the commit whose bootstraps are `-before`")
    ap.add_argument("--out", type=Path, help="bench/chains.py's --out")
    ap.add_argument("--callgrind", action="store_true",
                    help="instructions per request instead (bench/probes/chain_callgrind.py, same chains)")
    ap.add_argument("chains_args", nargs="*", help="more bench/chains.py options (after --)")
    args = ap.parse_args()
    (ROOT / WORK).mkdir(parents=True, exist_ok=True)
    policy = WORK / "policy.yaml"
    (ROOT / policy).write_text("vips:\n" + "".join(POLICY_ENTRY.format(n=n) for n in range(10)) + LIMITED_ENTRY)
    chains = []
    for shell, boot in (("native", NATIVE), ("wasm", WASM)):
        shipped = (ROOT / boot).read_text()
        featured = WORK / f"{shell}-featured.yaml"
        (ROOT / featured).write_text(edit_once(shipped, "  cluster: odmesh\n", f"  cluster: {FEATURED}\n", boot))
        before = WORK / f"{shell}-before.yaml"
        (ROOT / before).write_text(subprocess.run(["git", "-C", ROOT, "show", f"{args.before}:{boot}"],
                                         check=True, capture_output=True, text=True).stdout)
        again = WORK / f"{shell}-again.yaml"
        (ROOT / again).write_text(shipped)
        limited = WORK / f"{shell}-limited.yaml"
        (ROOT / limited).write_text(edit_once(shipped, "  cluster: odmesh\n", f"  cluster: {LIMITED}\n", boot))
        chains += ["--chain", f"{shell}-featured={featured}:{MODULES[boot]}",
                   "--chain", f"{shell}-limited={limited}:{MODULES[boot]}",
                   "--chain", f"{shell}-before={before}:{MODULES[boot]}",
                   "--chain", f"{shell}-again={again}:{MODULES[boot]}"]
    names = ",".join(f"{shell}{kind}" for shell in ("native", "wasm")
                     for kind in ("", "-featured", "-limited", "-before", "-again"))
    if args.callgrind:
        command = ["python3", "bench/probes/chain_callgrind.py", "--requests", "1000"]
    else:
        command = ["python3", "bench/chains.py", "--rounds", str(args.rounds),
                   "--seconds", str(args.seconds)]
    command += ["--only", names, "--policy", policy, *chains,
                *(["--out", os.path.relpath(args.out.resolve(), ROOT)] if args.out else []),
                *args.chains_args]
    print(" ".join(map(str, command)), flush=True)
    sys.exit(subprocess.run(command, cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
