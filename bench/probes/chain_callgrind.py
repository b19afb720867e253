#!/usr/bin/env python3
"""Envoy's instructions per request, by chain, under callgrind: the repeatable side of
bench/wasm_floor.py, whose ratios swing by ±0.05 from run to run on a shared machine.

    bench/probes/chain_callgrind.py [--requests 2000] [--filter NAME=FILE ...]

Each chain of bench/wasm_floor.py (`static`, `header-route`, and each `--filter`, default the
native module) runs in its own Envoy (`--concurrency 1`) under `valgrind --tool=callgrind`,
with nginx upstream. After a warm-up the counts are zeroed (`callgrind_control --zero`), a fixed
number of requests is sent (`h2load --h1`, 4 connections, keep-alive), and the counts dumped.
Envoy's binary is stripped, but it exports the dynamic-module callbacks, so callgrind names
them: the report gives each chain's total instructions per request and, for a native module,
the instructions per request inside each callback the module calls (inclusive) and inside the
module's own code. Needs valgrind and h2load besides what bench/run.py needs; slow (Envoy runs
~50x slower under callgrind), so it sends few requests. A one-off probe, cited in
docs/benchmarks.md ("Two shells").
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402
import wasm_floor  # noqa: E402


def wait_ready(admin, deadline_s=300):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if run.http_get(f"http://127.0.0.1:{admin}/ready").strip() == "LIVE":
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Envoy under callgrind not ready within {deadline_s} s")


def h2load(url, headers, n):
    cmd = ["h2load", "--h1", "-n", str(n), "-c", "4"]
    for h in headers:
        cmd += ["-H", h]
    out = subprocess.run(cmd + [url], check=True, capture_output=True, text=True).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    if not done or done.group(1) != done.group(2) or int(done.group(2)) != n:
        raise RuntimeError(f"h2load: not every request succeeded:\n{out}")


def inclusive(outfile):
    """{function: inclusive Ir} from callgrind_annotate, and the total Ir."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(outfile)],
                          check=True, capture_output=True, text=True).stdout
    total = int(re.search(r"^([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text, re.M).group(1).replace(",", ""))
    funcs = {}
    for m in re.finditer(r"^\s*([\d,]+) \([\d. ]+%\)\s+\S*:(\S+)", text, re.M):
        funcs.setdefault(m.group(2), int(m.group(1).replace(",", "")))
    return total, funcs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--filter", action="append", default=[], metavar="NAME=FILE")
    args = ap.parse_args()
    filters = [f.split("=", 1) for f in args.filter] or [["native", str(run.ROOT / "dist/libodmesh_filter.so")]]
    run.ENVOY = run.envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-chain-callgrind-"))
    run.log(f"work folder (logs, callgrind output): {workdir}")
    chains = [("static", None, True), (wasm_floor.HEADER_ROUTE, wasm_floor.HEADER_ROUTE, False)]
    chains += [(label, str(Path(path).resolve()), False) for label, path in filters]
    procs = run.Procs(workdir)
    results = {}
    try:
        upstream = run.start_nginx(procs, workdir)
        for label, module, static_route in chains:
            lst, adm = run.free_port(), run.free_port()
            cfg = workdir / f"envoy-{label}.yaml"
            cfg.write_text(wasm_floor.bootstrap(lst, adm, upstream, module, static_route))
            out = workdir / f"callgrind-{label}.out"
            envoy = procs.start(f"envoy-{label}", [
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
                run.ENVOY, "-c", cfg, "--concurrency", "1", "--disable-hot-restart", "--log-level", "warn"])
            wait_ready(adm)
            url = f"http://127.0.0.1:{lst}/"
            headers = [":authority: fr-000000"]  # h2load sends it as the Host of HTTP/1.1
            if module == wasm_floor.HEADER_ROUTE:
                headers.append("x-odmesh-cluster: fr-000000.vip")
            h2load(url, headers, 200)  # warm-up: connections, first-use allocations
            subprocess.run(["callgrind_control", "--zero", str(envoy.pid)], check=True, capture_output=True)
            h2load(url, headers, args.requests)
            subprocess.run(["callgrind_control", "--dump=measured", str(envoy.pid)], check=True, capture_output=True)
            dumps = sorted(workdir.glob(f"callgrind-{label}.out.*"))
            if not dumps:
                raise RuntimeError(f"{label}: callgrind wrote no dump")
            results[label] = inclusive(dumps[-1])
            procs.stop(envoy)
            run.log(f"{label}: {results[label][0] / args.requests:,.0f} instructions per request")
    finally:
        procs.stop_all()

    n = args.requests
    base = results["static"][0]
    print(f"\n{'Envoy':<14} {'instructions/request':>22} {'/ static':>9}   ({n} requests each, h2load --h1 -c4)")
    for label, (total, _) in results.items():
        print(f"{label:<14} {total / n:>22,.0f} {total / base:>9.3f}")
    for label, (total, funcs) in results.items():
        ours = {f: ir for f, ir in funcs.items()
                if f.startswith("envoy_dynamic_module_callback_http") or f.startswith("envoy_dynamic_module_on_http")}
        if not ours:
            continue
        print(f"\n{label}: inside the module's hooks and the callbacks they make (inclusive, per request)")
        for f, ir in sorted(ours.items(), key=lambda kv: -kv[1]):
            print(f"  {ir / n:>10,.0f}  {f}")


if __name__ == "__main__":
    main()
