#!/usr/bin/env python3
"""Where Envoy's CPU goes with one filter shell in the chain: a `perf record` of Envoy under load.

    bench/probes/chain_profile.py [--filter dist/libodmesh_filter.so] [--seconds 10]
    bench/probes/chain_profile.py --filter header-route     # the same chain without a filter

Starts nginx and one Envoy (`--concurrency 1`) with the chain of bench/wasm_floor.py (the
filter, a `cluster_header` route, a static cluster named like the VIP; `header-route`: no
filter, the client sends the cluster header itself), puts `wrk -t1 -c32` on it and samples Envoy with `perf record -e cpu-clock` (software clock: these machines have
no hardware counters). Prints the share of samples per shared object (how much is the filter's
own library) and the top symbols. A one-off probe, cited in docs/benchmarks.md ("Two
shells"); needs `perf` (Debian's linux-perf) besides what bench/run.py needs.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402
import wasm_floor  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--filter", default=str(run.ROOT / "dist/libodmesh_filter.so"))
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    run.ENVOY = run.envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-chain-profile-"))
    run.log(f"work folder (logs, perf.data): {workdir}")
    procs = run.Procs(workdir)
    try:
        upstream = run.start_nginx(procs, workdir)
        lst, adm = run.free_port(), run.free_port()
        header_route = args.filter == wasm_floor.HEADER_ROUTE
        module = args.filter if header_route else str(Path(args.filter).resolve())
        envoy = run.start_envoy(procs, workdir, "envoy", wasm_floor.bootstrap(lst, adm, upstream, module, False),
                                lst, adm)
        url = f"http://127.0.0.1:{lst}/"
        headers = ["-H", "Host: fr-000000"] + (["-H", "x-odmesh-cluster: fr-000000.vip"] if header_route else [])
        status = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *headers, url],
                                capture_output=True, text=True).stdout
        if status != "200":
            raise RuntimeError(f"a request got {status}, not 200")
        data = workdir / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-g",
                                 "-p", str(envoy.pid), "-o", str(data), "--", "sleep", str(args.seconds)])
        wrk = subprocess.run(["wrk", "-t1", "-c32", f"-d{args.seconds}s", *headers, url],
                             check=True, capture_output=True, text=True).stdout
        if perf.wait(args.seconds + 30) != 0:
            raise RuntimeError("perf record failed")
        requests, rps = run.parse_wrk(wrk)
        print(f"{args.filter}: {requests} requests, {rps:.0f}/s")
        for sort, limit in (("dso", 12), ("dso,symbol", args.top)):
            out = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", sort,
                                  "--stdio", "-g", "none", "--percent-limit", "0.3"],
                                 check=True, capture_output=True, text=True).stdout
            rows = [line for line in out.splitlines() if line.strip() and not line.startswith("#")]
            print(f"\nsamples by {sort}:")
            print("\n".join(rows[:limit]))
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
