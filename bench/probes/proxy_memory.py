#!/usr/bin/env python3
"""The control plane's memory per connected proxy, with one control-plane build.

    bench/probes/proxy_memory.py CONTROL [--proxies 2000] [--subs 30] [--vips 1000] [--eureka]
                                         [--heaptrack] [--flag=--some-control-flag=value ...]

Starts CONTROL on a generated registry of VIPS × 10 instances (a registry file, or with
--eureka its embedded registry filled over REST), connects PROXIES simulated proxies with
`odmesh-bench xds-load` (SUBS clusters each and their load assignments, ACKed as Envoy does),
and prints the RSS before and after they connect, per proxy. With --heaptrack the control plane
runs under heaptrack and the file of its allocations is printed (read it with
`heaptrack_print --print-peaks 1 FILE`). Needs target/release/odmesh-bench; writes the raw
figures to /tmp/proxy-memory-<time>.json.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402


def stop_child(pid):
    """heaptrack's child, the control plane, which stopping heaptrack leaves running."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + 10
    while time.time() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("control", type=Path)
    ap.add_argument("--proxies", type=int, default=2000)
    ap.add_argument("--subs", type=int, default=30)
    ap.add_argument("--vips", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--eureka", action="store_true")
    ap.add_argument("--heaptrack", action="store_true")
    ap.add_argument("--flag", action="append", default=[], help="one more control-plane flag (repeatable)")
    args = ap.parse_args()
    run.CONTROL = args.control.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-proxy-memory-"))
    procs = run.Procs(workdir)
    extra = list(args.flag)
    heapfile = None
    pid = None
    try:
        if args.heaptrack:
            # heaptrack starts the control plane as its child: find its pid by name below.
            heapfile = workdir / "control.heaptrack"
            real = run.CONTROL
            wrapper = workdir / "control-under-heaptrack"
            wrapper.write_text(f"#!/bin/sh\nexec heaptrack -o {heapfile} {real} \"$@\"\n")
            wrapper.chmod(0o755)
            run.CONTROL = wrapper
        registry = None
        source = []
        if args.eureka:
            extra += ["--max-lease-duration", "3600"]
        else:
            registry = workdir / "registry.yaml"
            run.bench_json("gen-registry", "--out", registry, "--vips", args.vips, "--instances", 10)
        cp = run.start_control(procs, registry, extra=extra)
        pid = None if args.heaptrack else cp.pid
        if args.heaptrack:
            found = subprocess.run(["pgrep", "-f", f"^{real} .*--xds 127.0.0.1:{cp.xds} "],
                                   capture_output=True, text=True).stdout.split()
            pid = int(found[0])
        if args.eureka:
            source = ["--eureka", f"127.0.0.1:{cp.eureka}", "--admin", f"127.0.0.1:{cp.admin}"]
        else:
            source = ["--registry", registry]
        load = run.bench_json("xds-load", "--xds", f"127.0.0.1:{cp.xds}", "--control-pid", pid,
                              "--control-log", cp.logpath, *source, "--vips", args.vips, "--instances", 10,
                              "--proxies", args.proxies, "--subs", args.subs, "--samples", args.samples,
                              "--flips", 0)
    finally:
        procs.stop_all()
        if pid and args.heaptrack:
            stop_child(pid)
    before = load["rss_idle"]["rss_bytes"] if not args.eureka else load["registered"]["rss_bytes"]
    after = load["rss_connected"]["rss_bytes"]
    per = (after - before) / args.proxies
    result = {"control": str(args.control), "flags": args.flag, "proxies": args.proxies, "subs": args.subs,
              "vips": args.vips, "eureka": args.eureka, "rss_before": before, "rss_connected": after,
              "bytes_per_proxy": per, "answer_cds_ms": load["answer_cds_ms"], "answer_eds_ms": load["answer_eds_ms"],
              "loadavg": open("/proc/loadavg").read().strip()}
    out = Path(f"/tmp/proxy-memory-{int(time.time())}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"{args.proxies} proxies x {args.subs}: RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB, "
          f"{per / 1024:.1f} KB per proxy; answer p50/p99 cluster {load['answer_cds_ms']['p50']:.2f}/"
          f"{load['answer_cds_ms']['p99']:.2f} ms, load assignment {load['answer_eds_ms']['p50']:.2f}/"
          f"{load['answer_eds_ms']['p99']:.2f} ms; {out}")
    if heapfile:
        found = sorted(workdir.glob("control.heaptrack*"))
        kept = [shutil.copy(f, Path("/tmp") / f.name) for f in found]
        print("heaptrack:", *kept)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
