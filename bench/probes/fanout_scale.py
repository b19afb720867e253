#!/usr/bin/env python3
"""Section 4's fan-out (file source and embedded Eureka registry) with one control-plane build.

    bench/probes/fanout_scale.py LABEL CONTROL FILE_VIPS EUREKA_VIPS [--proxies 1000]
    bench/probes/fanout_scale.py after target/release/odmesh-control 1000,10000 1000,10000

Runs `bench_scale` and `bench_scale_eureka` of bench/run.py with the sizes given (comma
lists; empty for none), 1,000 proxies, 300 answer samples and 4 changes, against the binary
CONTROL (so two builds can alternate under the same load), without the Envoy, nginx and wasm
that the other sections need. Prints fan-out p50 / p99 per size and the CPU seconds each
change cost, and writes the raw figures to /tmp/fanout-LABEL-<time>.json. Needs
target/release/odmesh-bench.
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


def sizes(text):
    return [int(v) for v in text.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("label")
    ap.add_argument("control", type=Path)
    ap.add_argument("file_vips", type=sizes)
    ap.add_argument("eureka_vips", type=sizes)
    ap.add_argument("--proxies", type=int, default=1000)
    args = ap.parse_args()
    run.CONTROL = args.control.resolve()
    cfg = dict(run.FULL, scale_vips=args.file_vips, scale_eureka_vips=args.eureka_vips,
               scale_proxies=args.proxies, scale_samples=300, scale_flips=4)
    results = {"label": args.label, "control": str(run.CONTROL),
               "loadavg_start": open("/proc/loadavg").read().strip()}
    workdir = Path(tempfile.mkdtemp(prefix=f"odmesh-fanout-{args.label}-"))
    if cfg["scale_vips"]:
        run.bench_scale(cfg, workdir, results)
    if cfg["scale_eureka_vips"]:
        run.bench_scale_eureka(cfg, workdir, results)
    results["loadavg_end"] = open("/proc/loadavg").read().strip()
    out = Path(f"/tmp/fanout-{args.label}-{int(time.time())}.json")
    out.write_text(json.dumps(results, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)

    def ms(d):
        return f"{d['p50']:.0f} / {d['p99']:.0f} ms"

    for s in results.get("scale", []):
        cpu = [round(f["cpu_seconds_to_last_proxy"], 2) for f in s["flips"]]
        print(f"{args.label} file {s['vips']}: fan-out from applied {ms(s['fanout_from_applied_ms'])}, "
              f"from parsed {ms(s['fanout_from_loaded_ms'])}, CPU s to last proxy {cpu}")
    for s in results.get("scale_eureka", []):
        if "failed" in s:
            print(f"{args.label} eureka {s['vips']}: failed")
            continue
        cpu = [round(f["cpu_seconds"], 2) for f in s["flips"]]
        print(f"{args.label} eureka {s['vips']}: change to proxy {ms(s['change_to_proxy_ms'])}, CPU s per change {cpu}")
    print(f"{args.label} load {results['loadavg_start']} -> {results['loadavg_end']}; {out}")


if __name__ == "__main__":
    main()
