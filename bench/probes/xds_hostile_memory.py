#!/usr/bin/env python3
"""The control plane's memory under hostile delta-ADS streams (issue 28's done criterion).

    bench/probes/xds_hostile_memory.py [--control target/release/odmesh-control]
        [--streams 150] [--names 10000] [--load-assignments | --clusters]

Starts `odmesh-control` on a registry file of 100 VIPs, then `odmesh-xds-flood` with STREAMS
streams (one connection each), each subscribing NAMES random names, as load assignments
(default) or as clusters, until every name is answered. It then reads the control plane's
RSS and high-water mark from /proc, and its subscription gauges from /metrics, and prints
one JSON object, with how long the admin port took to answer `/healthz` and `/metrics`
(polled every 100 ms) while the flood ran. With `--envoy`, a real Envoy (the shipped
bootstrap) also sends first requests to never-asked VIPs, 10 at a time, for as long as the
flood runs, and their statuses and times are reported. A one-off probe: nothing here is asserted. Needs
target/release/{odmesh-control,odmesh-bench,odmesh-xds-flood}.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402

FLOOD = run.ROOT / "target/release/odmesh-xds-flood"
GAUGES = ("odmesh_xds_subscriptions", "odmesh_xds_cluster_subscriptions", "odmesh_xds_streams",
          "odmesh_xds_names_refused_total", "odmesh_xds_names_waiting_total")


def rss_and_peak(pid):
    """(VmRSS, VmHWM) of `pid`, in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def gauges(admin):
    text = run.http_get(f"http://127.0.0.1:{admin}/metrics") or ""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in GAUGES:
            out[name] = float(value)
    return out


class AdminSampler(threading.Thread):
    """Asks the admin port for `/healthz` and `/metrics` in turn every 100 ms until stopped;
    keeps each answer's time, and counts the asks that got no answer within 10 s."""

    def __init__(self, admin):
        super().__init__(daemon=True)
        self.admin, self.times, self.failed = admin, [], 0
        self.stopping = threading.Event()

    def run(self):
        paths = ("/healthz", "/metrics")
        i = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                url = f"http://127.0.0.1:{self.admin}{paths[i % 2]}"
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
                self.times.append(time.monotonic() - started)
            except Exception:
                self.failed += 1
            i += 1
            self.stopping.wait(0.1)

    def summary(self):
        self.stopping.set()
        self.join(timeout=15)
        t = sorted(self.times)
        if not t:
            return {"answered": 0, "failed": self.failed}
        at = lambda q: round(t[min(len(t) - 1, int(q * len(t)))] * 1000, 1)
        return {"answered": len(t), "failed": self.failed, "p50_ms": at(0.5),
                "p99_ms": at(0.99), "max_ms": round(t[-1] * 1000, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--control", type=Path, default=run.ROOT / "target/release/odmesh-control")
    ap.add_argument("--streams", type=int, default=150)
    ap.add_argument("--names", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=10000)
    ap.add_argument("--no-read", action="store_true",
                    help="the streams never read an answer; held for --hold seconds")
    ap.add_argument("--hold", type=float, default=30)
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--load-assignments", action="store_true", default=True)
    kind.add_argument("--clusters", action="store_true")
    ap.add_argument("--envoy", action="store_true",
                    help="a real Envoy routes first requests to new VIPs during the flood")
    args = ap.parse_args()
    run.CONTROL = args.control.resolve()
    if args.envoy:
        run.ENVOY = run.envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-hostile-"))
    registry = workdir / "registry.yaml"
    procs = run.Procs(workdir)
    try:
        upstream = ["--loopback", "--port", run.start_nginx(procs, workdir)] if args.envoy else []
        run.bench_json("gen-registry", "--vips", 100, "--instances", 3, "--prefix", "fr-",
                       "--out", registry, *upstream)
        cp = run.start_control(procs, registry)
        envoy = None
        if args.envoy:
            lst, adm = run.free_port(), run.free_port()
            envoy = run.start_envoy(procs, workdir, "envoy", run.odmesh_bootstrap(lst, adm, cp.xds),
                                    lst, adm)
        before = rss_and_peak(cp.pid)
        flood = [FLOOD, "--xds", f"127.0.0.1:{cp.xds}", "--streams", str(args.streams),
                 "--names", str(args.names), "--batch", str(args.batch),
                 "--ignore-stdin", "--seed", "1"]
        flood += (["--no-read", "--duration", str(args.hold)] if args.no_read
                  else ["--until-answered", "--duration", "600"])
        if not args.clusters:
            flood.append("--load-assignments")
        sampler = AdminSampler(cp.admin)
        sampler.start()
        started = time.monotonic()
        # The streams stay open while the control plane is read: the flood runs until every
        # name is answered, then the figures are taken before it exits.
        p = subprocess.Popen(flood, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        first = []
        if envoy:
            # New VIPs, 10 at a time, for as long as the flood runs (at most 100).
            for start in range(0, 100, 10):
                if p.poll() is not None:
                    break
                rows = run.bench_json("first-request", "--envoy", f"127.0.0.1:{envoy.listener}",
                                      "--prefix", "fr-", "--start", start, "--count", 10, lines=True)
                first += [(r["first_status"], r["first_us"], p.poll() is None) for r in rows]
        out, _ = p.communicate(timeout=900)
        report = json.loads(out.strip().splitlines()[-1])
        admin = sampler.summary()
        after = rss_and_peak(cp.pid)
        result = {
            "control": str(run.CONTROL),
            "control_sha256": run.sha256(run.CONTROL),
            "streams": args.streams,
            "names_per_stream": args.names,
            "batch": args.batch,
            "no_read": args.no_read,
            "type": "clusters" if args.clusters else "load assignments",
            "flood_seconds": round(time.monotonic() - started, 1),
            "flood": {k: report[k] for k in ("ended", "names_sent", "resources", "removed", "all_answered_seconds")},
            "rss_before_mib": round(before[0] / 2**20, 1),
            "rss_after_streams_closed_mib": round(after[0] / 2**20, 1),
            "rss_peak_mib": round(after[1] / 2**20, 1),
            "gauges_after": gauges(cp.admin),
            "admin_during_flood": admin,
            "envoy_first_requests": None if not envoy else {
                "count": len(first),
                "during_flood": sum(1 for _, _, during in first if during),
                "statuses": sorted({status for status, _, _ in first}),
                "first_ms_p50": round(sorted(us for _, us, _ in first)[len(first) // 2] / 1000, 2),
                "first_ms_max": round(max(us for _, us, _ in first) / 1000, 2),
            },
        }
        print(json.dumps(result, indent=1))
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
