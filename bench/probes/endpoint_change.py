#!/usr/bin/env python3
"""Probe: what one instance's change in a large VIP costs, in bytes to each subscribed proxy
and in control-plane CPU.

    bench/probes/endpoint_change.py CONTROL [--instances 1000] [--proxies 1000] [--eureka]
                                            [--leds-min-endpoints N]

One VIP of INSTANCES instances; PROXIES simulated proxies (`odmesh-bench xds-load`) each
subscribed to it; 4 changes of one instance's status (UP -> DOWN -> UP ...): through a
registry file that is rewritten (default), or with --eureka through the embedded registry, one
REST call. A VIP at or above --leds-min-endpoints (the control plane's default unless given;
0: never) sends its endpoints one by one, and each proxy subscribes its collection as Envoy
does; the bytes are then those of the collection's responses. Prints, per change, the load-assignment bytes each proxy received (the responses'
protobuf size), their sum over the proxies, the control plane's CPU seconds for the change
and the time to the last proxy; writes the raw figures to /tmp/endpoint-change-<time>.json.
Needs target/release/odmesh-bench.
"""

import argparse
import json
import shutil
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
    ap.add_argument("--proxies", type=int, default=1000)
    ap.add_argument("--eureka", action="store_true")
    ap.add_argument("--leds-min-endpoints", type=int)
    args = ap.parse_args()
    run.CONTROL = args.control.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-endpoint-change-"))
    procs = run.Procs(workdir)
    n = args.instances
    leds = [] if args.leds_min_endpoints is None else ["--leds-min-endpoints", str(args.leds_min_endpoints)]
    try:
        if args.eureka:
            cp = run.start_control(procs, None, extra=["--max-lease-duration", "3600", *leds])
            source = ["--eureka", f"127.0.0.1:{cp.eureka}", "--admin", f"127.0.0.1:{cp.admin}"]
        else:
            registry = workdir / "registry.yaml"
            run.bench_json("gen-registry", "--out", registry, "--vips", 1, "--instances", n)
            cp = run.start_control(procs, registry, extra=leds)
            source = ["--registry", registry]
        load = run.bench_json("xds-load", "--xds", f"127.0.0.1:{cp.xds}", "--control-pid", cp.pid,
                              "--control-log", cp.logpath, *source, "--vips", 1, "--instances", n,
                              "--change-every", n, "--proxies", args.proxies, "--subs", 1,
                              "--samples", 0, "--flips", 4)
    finally:
        procs.stop_all()
    out = Path(f"/tmp/endpoint-change-{int(time.time())}.json")
    load.update({"leds_min_endpoints": args.leds_min_endpoints, "control": str(args.control), "control_sha256": run.sha256(args.control),
                 "loadavg": open("/proc/loadavg").read().strip()})
    out.write_text(json.dumps(load, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)
    for i, f in enumerate(load["flips"]):
        cpu = f.get("cpu_seconds_to_last_proxy", f.get("cpu_seconds"))
        reached = f.get("reached_proxies", f.get("reached"))
        last = f["fanout_from_built_ms"]["max"] if "fanout_from_built_ms" in f else f["change_to_proxy_ms"]["max"]
        print(f"change {i}: {reached} proxies, {f['bytes_per_proxy']['p50']:.0f} bytes each (p50), "
              f"{f['bytes_total'] / 1e6:.2f} MB in all, control plane {cpu:.3f} CPU s, last proxy after {last:.0f} ms")
    print(f"first answer: {load['setup_endpoint_bytes_per_proxy']['p50']:.0f} endpoint bytes per proxy (p50), "
          f"cluster and endpoints in {load['setup_eds_ms']['p50']:.2f} ms (p50), {load['setup_eds_ms']['p99']:.2f} ms (p99)")
    print(f"load {load['loadavg']}; {out}")


if __name__ == "__main__":
    main()
