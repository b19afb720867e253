#!/usr/bin/env python3
"""Following a real Eureka server: from a registration (and a cancellation) on it to Envoy routing
(and refusing) the VIP.

    bench/eureka_follow.py [--rounds 10] [--slow-rounds 4] [--out docs/bench/eureka-follow.json]

(`make bench-eureka-follow`.) Starts nginx (the upstream), a real Spring Cloud Netflix Eureka
server (`.tools/eureka-java/eureka-server.jar`, from scripts/install-eureka-java.sh), an
`odmesh-control --eureka URL` following it, and one Envoy from envoy/odmesh.yaml as shipped. Each
round registers a new instance of a new VIP on the Eureka server as a Eureka client does
(`POST /eureka/apps/{APP}`), and asks Envoy for that VIP every 20 ms until it routes (200); then
cancels it (`DELETE`) and asks until it is refused (503). Each change is made after a random
wait below the setting's longest timer (a seeded draw), so that it lands at any point of the
server's cache refresh and of odmesh's poll, as a service's change does: a round started as
soon as the last change showed would land just after a refresh every time, and measure only
the worst case. Three settings, each on a fresh Eureka
server and control plane:

  - Eureka's and odmesh's defaults: the server's read-only response cache, refreshed every 30 s,
    and odmesh polling the delta every 30 s (SLOW_ROUNDS rounds);
  - odmesh polling every second, the server's cache as it is (ROUNDS rounds);
  - odmesh polling every second, the server's cache refreshed every second
    (`eureka.server.response-cache-update-interval-ms=1000`) (ROUNDS rounds);
  - odmesh polling every second, the server reading from its read-write cache, which a write
    empties (`eureka.server.use-read-only-response-cache=false`) (ROUNDS rounds).

Writes the times (seconds) per round and their summary. Needs target/release/odmesh-control,
dist/odmesh_filter.wasm, Envoy, nginx and the Eureka server jar (`make bench-build`). Standard
library only; the helpers are bench/run.py's.
"""

import argparse
import json
import random
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402

SERVER_JAR = run.ROOT / ".tools/eureka-java/eureka-server.jar"
JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss512k"]
POLL = 0.02


def start_eureka(procs, name, extra):
    port = run.free_port()
    p = procs.start(name, ["java", *JVM, "-jar", SERVER_JAR, f"--server.port={port}",
                           "--eureka.server.enable-self-preservation=false", *extra])
    run.wait_for(f"{name} answering", lambda: run.http_get(f"http://127.0.0.1:{port}/eureka/apps") is not None,
                 timeout=180, every=0.2)
    p.port = port
    return p


def eureka_call(port, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}/eureka{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def registration(app, upstream):
    """What a Eureka client registers: an UP instance of `app` on the upstream's port."""
    now = str(int(time.time() * 1000))
    return {"instance": {
        "instanceId": f"{app}-1", "hostName": "127.0.0.1", "app": app.upper(), "ipAddr": "127.0.0.1",
        "status": "UP", "port": {"$": upstream, "@enabled": "true"},
        "securePort": {"$": 443, "@enabled": "false"}, "vipAddress": app, "secureVipAddress": app,
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90},
        "lastUpdatedTimestamp": now, "lastDirtyTimestamp": now}}


def status_through(envoy, vip):
    try:
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{envoy.listener}/", headers={"Host": vip}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def until(envoy, vip, want, limit):
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if status_through(envoy, vip) == want:
            return time.monotonic() - started
        time.sleep(POLL)
    raise RuntimeError(f"{vip} never answered {want} within {limit} s")


def setting(workdir, procs, label, up, rounds, interval, server_extra, phase, rng):
    eureka = start_eureka(procs, f"eureka-{label}", server_extra)
    admin, xds = run.free_port(), run.free_port()
    control = procs.start(f"control-{label}", [
        run.CONTROL, "--eureka", f"http://127.0.0.1:{eureka.port}/eureka", "--eureka-interval", interval,
        "--xds", f"127.0.0.1:{xds}", "--admin", f"127.0.0.1:{admin}", "--no-prewarm"], env={"NO_COLOR": "1"})
    run.wait_for("the control plane ready", lambda: json.loads(
        run.http_get(f"http://127.0.0.1:{admin}/readyz"))["registry"]["complete"], timeout=60, every=0.1)
    listener, envoy_admin = run.free_port(), run.free_port()
    envoy = run.start_envoy(procs, workdir, f"envoy-{label}", run.odmesh_bootstrap(listener, envoy_admin, xds),
                            listener, envoy_admin)
    rows = []
    for i in range(rounds):
        vip = f"{label}-{i:02d}"
        assert status_through(envoy, vip) == 503, "a VIP not registered yet"
        time.sleep(rng.uniform(0, phase))
        assert eureka_call(eureka.port, "POST", f"/apps/{vip.upper()}", registration(vip, up)) == 204
        routed = until(envoy, vip, 200, 120)
        time.sleep(rng.uniform(0, phase))
        assert eureka_call(eureka.port, "DELETE", f"/apps/{vip.upper()}/{vip}-1") == 200
        refused = until(envoy, vip, 503, 120)
        rows.append({"vip": vip, "registered_to_routed_s": round(routed, 3), "cancelled_to_refused_s": round(refused, 3)})
        run.log(f"{label} round {i}: routed {routed:.2f} s after the registration, refused {refused:.2f} s after the cancel")
    for p in (envoy, control, eureka):
        procs.stop(p)
    return {"rounds": rows, "odmesh_interval_s": float(interval), "server": server_extra,
            "random_wait_below_s": phase,
            "registered_to_routed_s": run.summary([r["registered_to_routed_s"] for r in rows]),
            "cancelled_to_refused_s": run.summary([r["cancelled_to_refused_s"] for r in rows])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--slow-rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=run.OUT / "eureka-follow.json")
    ap.add_argument("--seed", type=int, default=26)
    args = ap.parse_args()
    workdir, results = run.begin("eureka_follow", [run.CONTROL, run.WASM, SERVER_JAR])
    results["eureka_server_jar_sha256"] = run.sha256(SERVER_JAR)
    procs = run.Procs(workdir)
    rng = random.Random(args.seed)
    results["seed"] = args.seed
    try:
        up = run.start_nginx(procs, workdir)
        results["settings"] = {
            "defaults": setting(workdir, procs, "defaults", up, args.slow_rounds, "30", [], 30, rng),
            "poll_1s": setting(workdir, procs, "poll1", up, args.rounds, "1", [], 30, rng),
            "poll_1s_cache_1s": setting(workdir, procs, "cache1", up, args.rounds, "1",
                                        ["--eureka.server.response-cache-update-interval-ms=1000"], 1, rng),
            "poll_1s_no_read_only_cache": setting(workdir, procs, "rwcache", up, args.rounds, "1",
                                                  ["--eureka.server.use-read-only-response-cache=false",
                                                   "--eureka.server.response-cache-auto-expiration-in-seconds=5"],
                                                  1, rng),
        }
    finally:
        procs.stop_all()
    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    for name, s in results["settings"].items():
        r, c = s["registered_to_routed_s"], s["cancelled_to_refused_s"]
        print(f"{name:>26}: registered -> routed p50 {r['p50']:.2f} s, p99 {r['p99']:.2f} s; "
              f"cancelled -> refused p50 {c['p50']:.2f} s, p99 {c['p99']:.2f} s ({r['n']} rounds)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
