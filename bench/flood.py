#!/usr/bin/env python3
"""Fairness under a flood: another proxy's first request while a raw client subscribes a million names.

    bench/flood.py [--vips 400] [--names 1000000] [--batch 10000] [--out docs/bench/flood.json]

(`make bench-flood`.) Starts nginx (the upstream), `odmesh-control` on a registry file of
1 + 3 × VIPS VIPs, and one Envoy from envoy/odmesh.yaml as shipped. Then, with
`odmesh-bench first-request` (a new connection, the first request to a VIP Envoy never asked for,
then warm ones), the first request to VIPS new VIPs in each of three phases:

  - quiet: nothing else running;
  - flood elsewhere: while `odmesh-xds-flood` floods a second `odmesh-control` on the same
    machine: what the flood's CPU costs the machine, without sharing anything with the
    control plane Envoy talks to;
  - flood: while it floods the control plane Envoy talks to.

Each flood subscribes NAMES random cluster names in requests of BATCH on a stream of its own,
and starts again on a new stream once every name is answered, until the phase's probes are
done: each new stream's first request is the heavy one (BATCH clusters to build, then all but
100 refused). The flood client runs at `nice 19`: a hostile client runs on another machine,
and its own CPU is not what is measured. The report has the three distributions, the floods'
own figures and the control plane's heavy jobs (`odmesh_xds_heavy_jobs_total`).
ODMESH_CONTROL=/path/to/odmesh-control measures another build (bench/run.py's variable). Needs
target/release/{odmesh-control,odmesh-bench,odmesh-xds-flood}, dist/odmesh_filter.wasm, Envoy
and nginx (`make bench-build`). Standard library only; the helpers are bench/run.py's.
"""

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402

FLOOD = run.ROOT / "target/release/odmesh-xds-flood"
PREFIX = "fl-"
HEAVY = "odmesh_xds_heavy_jobs_total"


class Flooder:
    """`odmesh-xds-flood` against `xds`, again on a new stream each time every name is answered,
    until stopped."""

    def __init__(self, workdir, label, xds, names, batch):
        self.cmd = ["nice", "-n", "19", str(FLOOD), "--xds", f"127.0.0.1:{xds}", "--names", str(names),
                    "--batch", str(batch), "--ignore-stdin", "--until-answered", "--progress-interval", "60"]
        self.workdir, self.label, self.runs = workdir, label, []
        self.stopped, self.proc, self.error = threading.Event(), None, None
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stopped.is_set():
            log = self.workdir / f"{self.label}-{len(self.runs)}.log"
            with open(log, "w") as err:
                self.proc = subprocess.Popen([*self.cmd, "--seed", str(len(self.runs) + 1)],
                                             stdout=subprocess.PIPE, stderr=err, text=True)
                out, _ = self.proc.communicate()
            if self.stopped.is_set():
                return
            if self.proc.returncode != 0 or not out.strip():
                self.error = f"odmesh-xds-flood exited {self.proc.returncode}: see {log}"
                return
            self.runs.append(json.loads(out.strip().splitlines()[-1]))

    def stop(self):
        self.stopped.set()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
        self.thread.join(30)
        if self.error:
            raise RuntimeError(self.error)
        return self.runs


def first_requests(envoy, start, count):
    """The first request to each of `count` never-asked VIPs from index `start`, in µs."""
    rows, _ = run.probe_first(envoy, start, count, prefix=PREFIX)
    return [r["first_us"] for r in rows]


def flooded_phase(workdir, label, envoy, start, count, target, args):
    """First requests while `target` is flooded; returns them and what the floods did."""
    heavy_before, cpu_before = run.control_metrics(target.admin).get(HEAVY, 0), run.cpu_seconds(target.pid)
    flooder = Flooder(workdir, label, target.xds, args.names, args.batch)
    began = time.monotonic()
    firsts = first_requests(envoy, start, count)
    probing = time.monotonic() - began
    runs = flooder.stop()
    return firsts, {
        "probing_seconds": probing,
        "floods_done": len(runs),
        "flood_all_answered_seconds": run.summary([r["all_answered_seconds"] for r in runs]),
        "flood_first_response_seconds": run.summary([r["first_response_seconds"] for r in runs]),
        "flooded_control_cpu_seconds": run.cpu_seconds(target.pid) - cpu_before,
        "heavy_jobs": run.control_metrics(target.admin).get(HEAVY, 0) - heavy_before,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vips", type=int, default=400)
    ap.add_argument("--names", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=run.OUT / "flood.json")
    args = ap.parse_args()
    workdir, results = run.begin("flood", [run.CONTROL, run.BENCH, FLOOD, run.WASM])
    results.update({"flood_sha256": run.sha256(FLOOD), "vips": args.vips, "names": args.names,
                    "batch": args.batch, "phases": {}})
    n = args.vips
    procs = run.Procs(workdir)
    try:
        up = run.start_nginx(procs, workdir)
        registry = workdir / "registry.yaml"
        run.bench_json("gen-registry", "--out", registry, "--vips", 1 + 3 * n, "--instances", 1,
                       "--prefix", PREFIX, "--loopback", "--port", up)
        cp = run.start_control(procs, registry)
        elsewhere = run.start_control(procs, registry, name="control-elsewhere")
        listener, admin = run.free_port(), run.free_port()
        envoy = run.start_envoy(procs, workdir, "envoy", run.odmesh_bootstrap(listener, admin, cp.xds),
                                listener, admin)
        first_requests(envoy, 0, 1)  # the wasm VM, the connections
        phases = results["phases"]
        run.log(f"quiet: the first request to {n} new VIPs")
        phases["quiet"] = {"first_us": first_requests(envoy, 1, n)}
        run.log(f"flood elsewhere: {n} more, while another control plane is flooded")
        firsts, floods = flooded_phase(workdir, "flood-elsewhere", envoy, 1 + n, n, elsewhere, args)
        phases["flood_elsewhere"] = {"first_us": firsts, **floods}
        run.log(f"flood: {n} more, while Envoy's control plane is flooded")
        firsts, floods = flooded_phase(workdir, "flood", envoy, 1 + 2 * n, n, cp, args)
        phases["flood"] = {"first_us": firsts, **floods}
        results["control_rss_end"] = run.rss_bytes(cp.pid)
    finally:
        procs.stop_all()
    for phase in results["phases"].values():
        phase["first_us_summary"] = run.summary(phase["first_us"])
    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")

    print(f"control {results['control_sha256'][:12]} ({results['control']}); {n} VIPs a phase")
    for name, phase in results["phases"].items():
        d = phase["first_us_summary"]
        line = (f"{name:>15}: first request p50 {d['p50'] / 1000:.2f} ms, p90 {d['p90'] / 1000:.2f} ms, "
                f"p99 {d['p99'] / 1000:.2f} ms, max {d['max'] / 1000:.2f} ms")
        if "floods_done" in phase:
            line += (f"; {phase['floods_done']} floods of {args.names} names in {phase['probing_seconds']:.1f} s, "
                     f"{phase['heavy_jobs']:.0f} heavy jobs, "
                     f"flooded control plane CPU {phase['flooded_control_cpu_seconds']:.1f} s")
        print(line)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
