#!/usr/bin/env python3
"""Where the Eureka follower's memory goes: a heap profile of `odmesh-control --eureka`.

    bench/probes/follower_heap.py [--instances 20000] [--full-fetches 2] [--control PATH]

Starts `odmesh-bench eureka-serve --instances N` (generated Spring-like instances, its delta
answering 404), runs `odmesh-control --eureka URL --eureka-interval 1` under valgrind's massif
until it has made `--full-fetches` full fetches after the first, stops it (SIGTERM), and
prints the peak snapshot's allocation sites (massif's tree, functions only) down to `--depth`
levels and above `--min-kib`, and the live heap of the last snapshot, per instance. Needs
target/release/odmesh-bench, the control plane (default target/release/odmesh-control) and
valgrind.
"""

import argparse
import json
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(admin):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    return {k: float(v) for k, v in (l.split(" ", 1) for l in text.splitlines() if l and not l.startswith("#"))}


def print_tree(snapshot, heap, n, depth, min_kib):
    for line in snapshot.splitlines():
        m = re.match(r"^( *)n\d+: (\d+) (.*)$", line)
        if not m or len(m.group(1)) > depth or int(m.group(2)) < min_kib * 1024:
            continue
        site = re.sub(r"0x[0-9A-F]+: |\(in /[^)]*\)", "", m.group(3)).strip()
        print(f"{'  ' * len(m.group(1))}{int(m.group(2)) / 1024:8.0f} KiB {100 * int(m.group(2)) / heap:5.1f}%  "
              f"{int(m.group(2)) / n:7.0f} B/inst  {site[:130]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=20000)
    ap.add_argument("--full-fetches", type=int, default=2)
    ap.add_argument("--control", default=str(ROOT / "target/release/odmesh-control"))
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--min-kib", type=int, default=500)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="odmesh-follower-heap-"))
    out = work / "massif.out"
    server = subprocess.Popen([str(ROOT / "target/release/odmesh-bench"), "eureka-serve", "--instances",
                               str(args.instances)], stdout=subprocess.PIPE, text=True)
    control = None
    try:
        url = json.loads(server.stdout.readline())["url"]
        admin = free_port()
        control = subprocess.Popen(["valgrind", "--tool=massif", f"--massif-out-file={out}", "--depth=14",
                                    "--threshold=0.5", args.control, "--eureka", url, "--eureka-interval", "1",
                                    "--eureka-request-timeout", "600", "--eureka-first-fetch-wait", "0",
                                    "--no-prewarm", "--xds", f"127.0.0.1:{free_port()}",
                                    "--admin", f"127.0.0.1:{admin}"],
                                   stdout=subprocess.DEVNULL, stderr=open(work / "control.log", "w"),
                                   env={"RUST_LOG": "warn", "NO_COLOR": "1"})
        deadline = time.time() + 1800
        while time.time() < deadline:
            m = metrics(admin)
            if m.get("odmesh_eureka_full_fetches_total", 0) >= 1 + args.full_fetches:
                break
            if control.poll() is not None:
                raise SystemExit(f"the control plane exited; see {work / 'control.log'}")
            time.sleep(0.5)
        else:
            raise SystemExit("not done in 30 minutes")
        control.send_signal(signal.SIGTERM)
        control.wait(timeout=600)
    finally:
        if control and control.poll() is None:
            control.kill()
        server.kill()
    snapshots = out.read_text().split("snapshot=")[1:]
    peak = next(s for s in snapshots if "heap_tree=peak" in s)
    n = args.instances
    for name, snap in [("peak", peak)]:
        heap = int(re.search(r"mem_heap_B=(\d+)", snap).group(1))
        extra = int(re.search(r"mem_heap_extra_B=(\d+)", snap).group(1))
        print(f"{name}: {heap / 2**20:.1f} MiB live heap ({heap / n:.0f} bytes per instance), "
              f"{extra / 2**20:.1f} MiB allocator overhead ({extra / n:.0f} per instance)")
        print_tree(snap, heap, n, args.depth, args.min_kib)
    # Between two fetches: the lowest live heap after the first fetch (once the heap first
    # reached half its peak) and before the peak (the last fetch's, or shutdown's drop after).
    series = [int(re.search(r"mem_heap_B=(\d+)", s).group(1)) for s in snapshots]
    top = max(range(len(series)), key=series.__getitem__)
    start = next(i for i, h in enumerate(series) if h >= series[top] / 2)
    low = min(series[start:top + 1])
    print(f"between fetches (lowest after the first fetch, before the peak): {low / 2**20:.1f} MiB live heap "
          f"({low / n:.0f} bytes per instance)")
    print(f"massif output: {out}")


if __name__ == "__main__":
    main()
