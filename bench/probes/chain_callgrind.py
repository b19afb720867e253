#!/usr/bin/env python3
"""Envoy's instructions per request, by chain, under callgrind: the repeatable side of
bench/chains.py, whose time ratios move by a few hundredths from run to run on a shared machine.

    bench/probes/chain_callgrind.py [--requests 2000] [--only static,native] [--chain NAME=FILE ...]

The chains of bench/chains.py (`static`, `floor`, `native`, `wasm`, `wasm-empty`, and each
`--chain`, same bootstraps, same headers), behind the same nginx and `odmesh-control --registry`,
each in its own Envoy (`--concurrency 1`) under `valgrind --tool=callgrind`, one at a time. Each
Envoy's first request is sent until nginx answers it (the cluster discovered on demand; under
callgrind a first request may miss on_demand's 1 s and get a 503), then a warm-up (`--warmup`
requests), then the counts are zeroed (`callgrind_control --zero`), `--requests` requests are
sent (`h2load --h1`, 4 connections, keep-alive) and the counts dumped. The report: each chain's
instructions per request (every thread of Envoy) and its ratio to `static`; where they are, by
object (Envoy's binary, libc, the native module's own code, `???`: code callgrind places in no
object, some of Envoy's stripped binary and V8's compiled wasm), from the dump's self costs
(their sum is the dump's `totals:`, within 1% of its `summary:`, the total above); and for a chain with a native module, the
instructions per request inside each module hook and each Envoy callback it makes (inclusive:
callgrind names them, Envoy exporting the dynamic-module ABI though its binary is stripped),
for the cluster specifier (`envoy_dynamic_module_{on,callback}_cluster_specifier*`) and, for an
older module given by `--chain`, the HTTP filter (`..._http*`). Needs valgrind and h2load besides
what bench/chains.py needs; slow (Envoy runs ~50x slower under callgrind), so it sends few
requests. `--out` writes the figures (JSON).
"""

import argparse
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import chains  # noqa: E402
import run  # noqa: E402

# The module's hooks and the callbacks it makes, by the prefixes of their exported names.
HOOKS = ("envoy_dynamic_module_on_cluster_specifier", "envoy_dynamic_module_callback_cluster_specifier",
         "envoy_dynamic_module_on_http", "envoy_dynamic_module_callback_http")


def h2load(url, headers, n):
    cmd = ["h2load", "--h1", "-n", str(n), "-c", "4"]
    for h in headers:
        name, _, value = h.partition(": ")
        # h2load sends `:authority` as HTTP/1.1's Host.
        cmd += ["-H", f":authority: {value}" if name.lower() == "host" else h]
    out = subprocess.run(cmd + [url], check=True, capture_output=True, text=True).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    codes = re.search(r"status codes: (\d+) 2xx", out)
    if not done or done.group(1) != done.group(2) or int(done.group(2)) != n or not codes or int(codes.group(1)) != n:
        raise RuntimeError(f"h2load: not every request answered 2xx:\n{out}")


def inclusive(outfile):
    """{function: inclusive Ir} from callgrind_annotate, and the total Ir."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(outfile)],
                          check=True, capture_output=True, text=True).stdout
    total = int(re.search(r"^([\d,]+) (?:\(100\.0%\)\s+)?PROGRAM TOTALS", text, re.M).group(1).replace(",", ""))
    funcs = {}
    for m in re.finditer(r"^\s*([\d,]+) (?:\([\d. ]+%\)\s+)?\S*:(\S+)", text, re.M):
        funcs.setdefault(m.group(2), int(m.group(1).replace(",", "")))
    return total, funcs


def by_object(outfile):
    """{object file: self Ir} from a callgrind dump: every cost line's Ir to the object of the
    function it is in, except the line after a `calls=` (the call's inclusive cost)."""
    names, obj, after_call = {}, "?", False
    out = defaultdict(int)
    ir_at = None
    with open(outfile) as f:
        for line in f:
            if line.startswith("events:"):
                ir_at = line.split()[1:].index("Ir")
            elif line.startswith(("ob=", "cob=")):
                # An object's name comes once, with its number, in whichever line names it first.
                m = re.match(r"c?ob=(?:\((\d+)\))?\s*(.*)", line.rstrip("\n"))
                if m.group(1) and m.group(2):
                    names[m.group(1)] = m.group(2)
                if line.startswith("ob="):
                    obj = ("#" + m.group(1)) if m.group(1) else m.group(2)
            elif line.startswith("calls="):
                after_call = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if after_call:
                    after_call = False
                    continue
                fields = line.split()
                # The position (a line number, with --dump-instr=no), then the events.
                if ir_at is not None and len(fields) > 1 + ir_at:
                    out[obj] += int(fields[1 + ir_at])
    return {names.get(o[1:], o) if o.startswith("#") else o: ir for o, ir in out.items()}


def short(obj):
    return Path(obj).name if obj not in ("???", "?") else "???"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200, help="requests before the counts are zeroed")
    ap.add_argument("--only", help="these chains only (comma-separated; static always runs)")
    ap.add_argument("--chain", action="append", default=[], metavar="NAME=FILE", help="as bench/chains.py's")
    ap.add_argument("--out", type=Path, help="write the figures here (JSON)")
    ap.add_argument("--policy", type=Path, help="the control plane's policy file, as bench/chains.py's")
    args = ap.parse_args()
    workdir, results = run.begin("chain-callgrind", [run.CONTROL, chains.WASM_MODULE, chains.NATIVE_MODULE])
    results["commit"] = chains.git_commit()
    results["requests"] = args.requests
    procs = run.Procs(workdir)
    counts = {}
    try:
        upstream = run.start_nginx(procs, workdir)
        cp = run.start_control(procs, chains.write_registry(workdir, upstream), extra=chains.control_extra(workdir, args.policy))
        todo = chains.only(chains.chains(workdir, upstream, cp.xds, args.chain), args.only)
        results["chains"] = {c.name: c.describe() for c in todo}
        for c in todo:
            out = workdir / f"callgrind-{c.name}.out"
            envoy = chains.start_envoy(procs, workdir, c, [
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"], ready_timeout=600)
            chains.first_request(envoy, timeout=300)
            url = f"http://127.0.0.1:{envoy.listener}/"
            h2load(url, c.headers, args.warmup)
            subprocess.run(["callgrind_control", "--zero", str(envoy.pid)], check=True, capture_output=True)
            t0 = time.time()
            h2load(url, c.headers, args.requests)
            took = time.time() - t0
            subprocess.run(["callgrind_control", "--dump=measured", str(envoy.pid)], check=True, capture_output=True)
            dumps = sorted(workdir.glob(f"callgrind-{c.name}.out.*"), key=lambda p: p.stat().st_mtime)
            if not dumps:
                raise RuntimeError(f"{c.name}: callgrind wrote no dump")
            total, funcs = inclusive(dumps[-1])
            counts[c.name] = {"total": total, "funcs": funcs, "objects": by_object(dumps[-1]), "seconds": took}
            procs.stop(envoy)
            run.log(f"{c.name}: {total / args.requests:,.0f} instructions per request ({took:.0f} s under callgrind)")
    finally:
        procs.stop_all()

    n = args.requests
    base = counts["static"]["total"]
    results["per_request"] = {}
    print(f"\n{'chain':<16} {'instructions/request':>21} {'/ static':>9}   ({n} requests each, h2load --h1 -c4)")
    for name, cnt in counts.items():
        print(f"{name:<16} {cnt['total'] / n:>21,.0f} {cnt['total'] / base:>9.3f}")
    print("\nBy object, self instructions per request (objects under 100 left out; `???`: code callgrind "
          "places in no object: some of Envoy's stripped binary, and V8's compiled wasm)")
    for name, cnt in counts.items():
        per = defaultdict(float)
        for o, ir in cnt["objects"].items():
            per[short(o)] += ir / n
        shown = {o: v for o, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 100}
        print(f"  {name:<14} " + ", ".join(f"{o} {v:,.0f}" for o, v in shown.items()))
        ours = {f: ir / n for f, ir in cnt["funcs"].items() if f.startswith(HOOKS)}
        results["per_request"][name] = {"instructions": cnt["total"] / n, "ratio_to_static": cnt["total"] / base,
                                        "by_object": dict(per), "module_hooks_inclusive": ours,
                                        "seconds_under_callgrind": cnt["seconds"]}
    for name, cnt in counts.items():
        ours = results["per_request"][name]["module_hooks_inclusive"]
        if not ours:
            continue
        print(f"\n{name}: inside the module's hooks and the callbacks they make (inclusive, per request)")
        for f, ir in sorted(ours.items(), key=lambda kv: -kv[1]):
            print(f"  {ir:>10,.0f}  {f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        run.log(f"wrote {run.recorded(args.out)}")


if __name__ == "__main__":
    main()
