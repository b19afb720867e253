#!/usr/bin/env python3
"""Readers of the whole embedded registry against its writers (issue 28's read amplification).

    bench/probes/registry_readers.py [--control target/release/odmesh-control]
        [--instances 20000] [--readers 16] [--seconds 20]

Starts `odmesh-control --serve-eureka`, registers INSTANCES instances over REST, then for
SECONDS runs at once: READERS clients reading `GET /eureka/apps` (JSON) in a loop, one client
changing one instance's metadata in a loop, and one client timing a heartbeat every 20 ms.
Prints one JSON object: heartbeat p50/p99/max, answers the readers got, metadata changes
made, and the control plane's RSS before and at its peak. A one-off probe: nothing is
asserted. Standard library only; the helpers are bench/run.py's.
"""

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402

from xds_hostile_memory import rss_and_peak  # noqa: E402


def instance(n):
    return {"instance": {
        "instanceId": f"i-{n}", "app": f"APP{n % 500}", "hostName": f"host-{n}",
        "ipAddr": f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}", "status": "UP",
        "port": {"$": 8080, "@enabled": "true"}, "vipAddress": f"app{n % 500}",
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo",
                           "name": "MyOwn"},
        "leaseInfo": {"durationInSecs": 300, "renewalIntervalInSecs": 30},
        "metadata": {"zone": "a"},
    }}


def call(conn, method, path, body=None):
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    payload = r.read()
    return r.status, payload


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--control", type=Path, default=run.ROOT / "target/release/odmesh-control")
    ap.add_argument("--instances", type=int, default=20000)
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    run.CONTROL = args.control.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-readers-"))
    procs = run.Procs(workdir)
    try:
        cp = run.start_control(procs, None, extra=["--registry-warmup", "0s"])
        conn = http.client.HTTPConnection("127.0.0.1", cp.eureka, timeout=30)
        for n in range(args.instances):
            status, _ = call(conn, "POST", f"/eureka/apps/APP{n % 500}", instance(n))
            assert status == 204, status
        before = rss_and_peak(cp.pid)
        stop = time.monotonic() + args.seconds
        answers = [0] * args.readers
        beats = []
        changes = [0]

        def reader(i):
            c = http.client.HTTPConnection("127.0.0.1", cp.eureka, timeout=60)
            while time.monotonic() < stop:
                status, _ = call(c, "GET", "/eureka/apps")
                answers[i] += status == 200

        def writer():
            c = http.client.HTTPConnection("127.0.0.1", cp.eureka, timeout=60)
            while time.monotonic() < stop:
                status, _ = call(c, "PUT", f"/eureka/apps/APP1/i-1/metadata?k={changes[0]}")
                changes[0] += status == 200

        def heartbeat():
            c = http.client.HTTPConnection("127.0.0.1", cp.eureka, timeout=60)
            while time.monotonic() < stop:
                t = time.monotonic()
                call(c, "PUT", "/eureka/apps/APP2/i-2")
                beats.append((time.monotonic() - t) * 1000)
                time.sleep(0.02)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(args.readers)]
        threads += [threading.Thread(target=writer), threading.Thread(target=heartbeat)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = rss_and_peak(cp.pid)
        beats.sort()
        print(json.dumps({
            "control": str(run.CONTROL),
            "control_sha256": run.sha256(run.CONTROL),
            "instances": args.instances, "readers": args.readers, "seconds": args.seconds,
            "heartbeat_ms": {"n": len(beats), "p50": round(run.pct(beats, 50), 1),
                             "p99": round(run.pct(beats, 99), 1), "max": round(beats[-1], 1)},
            "reader_answers": sum(answers), "metadata_changes": changes[0],
            "rss_before_mib": round(before[0] / 2**20, 1),
            "rss_peak_mib": round(after[1] / 2**20, 1),
        }, indent=1))
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
