#!/usr/bin/env python3
"""Probe: a first request to VIPs of many instances, their endpoints one by one (LEDS) or in
one load assignment, through a stock Envoy.

    bench/probes/large_vip_first_request.py CONTROL [--instances 1000] [--vips 10] [--rounds 2]

VIPS + 1 VIPs of INSTANCES instances each, every instance a port of its own on 127.0.0.1, all
served by one nginx. Per round and mode (alternating: `--leds-min-endpoints 1`, then 0): a
control plane and a fresh Envoy (envoy/odmesh.yaml as shipped, one worker); one VIP to warm
the filter and the connections, then `odmesh-bench first-request` on VIPS new VIPs (every
answer must be a 200). Prints per mode the first request's p50 and max, and Envoy's allocated
bytes per VIP discovered; writes the raw figures to /tmp/large-vip-first-<time>.json. Needs
target/release/odmesh-bench, nginx and Envoy (make envoy).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("control", type=Path)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--vips", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    run.CONTROL = args.control.resolve()
    run.ENVOY = run.envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-large-vip-first-"))
    procs = run.Procs(workdir)
    results = {"leds": [], "whole": []}
    try:
        ports = set()
        while len(ports) < args.instances:
            ports.add(run.free_port())
        ports = sorted(ports)
        run.start_nginx(procs, workdir, ports)
        registry = workdir / "registry.yaml"
        lines = ["instances:"]
        for v in range(args.vips + 1):
            for p in ports:
                lines += [f"  - app: fr-{v:06}", "    ip: 127.0.0.1", f"    port: {p}"]
        registry.write_text("\n".join(lines) + "\n")
        for rnd in range(args.rounds):
            for mode, minimum in (("leds", "1"), ("whole", "0")):
                cp = run.start_control(procs, registry, name=f"control-{mode}-{rnd}",
                                       extra=["--leds-min-endpoints", minimum])
                lst, adm = run.free_port(), run.free_port()
                envoy = run.start_envoy(procs, workdir, f"envoy-{mode}-{rnd}",
                                        run.odmesh_bootstrap(lst, adm, cp.xds), lst, adm)
                _, m0 = run.probe_first(envoy, 0, 1)
                rows, m1 = run.probe_first(envoy, 1, args.vips)
                results[mode].append({
                    "first_us": [r["first_us"] for r in rows],
                    "allocated_per_vip": (m1["allocated"] - m0["allocated"]) / args.vips,
                })
                procs.stop(envoy)
                procs.stop(cp)
    finally:
        procs.stop_all()
    out = Path(f"/tmp/large-vip-first-{int(time.time())}.json")
    results.update({"instances": args.instances, "vips": args.vips, "control": str(args.control),
                    "control_sha256": run.sha256(args.control), "envoy": str(run.ENVOY),
                    "loadavg": open("/proc/loadavg").read().strip()})
    out.write_text(json.dumps(results, indent=1))
    for mode in ("leds", "whole"):
        first = sorted(us for r in results[mode] for us in r["first_us"])
        per_vip = [r["allocated_per_vip"] / 1024 for r in results[mode]]
        print(f"{mode}: first request p50 {run.pct(first, 50) / 1000:.2f} ms, max {first[-1] / 1000:.2f} ms "
              f"({len(first)} VIPs of {args.instances}); Envoy allocated per VIP "
              f"{', '.join(f'{k:.0f}' for k in per_vip)} KB")
    print(f"load {results['loadavg']}; {out}")


if __name__ == "__main__":
    main()
