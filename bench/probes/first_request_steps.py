#!/usr/bin/env python3
"""Where a first request's time goes, step by step, from Envoy's and the control plane's logs.

    bench/probes/first_request_steps.py [--vips 50] [--gap-ms 20] [--json out.json]

Starts nginx, `odmesh-control` (release, prewarm on, its xDS session at debug) and Envoy with
the shipped `envoy/odmesh.yaml` and debug logs with microsecond timestamps. `odmesh-bench
first-request` then sends each VIP a first request and 5 warm ones on a keep-alive connection
(as section 1 of docs/benchmarks.md). That Envoy stops and a new one of the same service starts;
the control plane sends it the same clusters ahead (prewarm), and the same probe runs again.

For every request the probe finds its lines by Envoy's stream id, and for a discovery the
lines naming its cluster, and prints the median of each step:

- unpredicted first request: the filter and `on_demand` (request in -> discovery forwarded),
  the hop to the main thread and on to the control plane, the control plane's answer, the
  answer's way back, Envoy creating the cluster, the load assignment, warming, the hop back to
  the worker, routing, the upstream connection, the upstream's answer, the response;
- predicted first request (its cluster was sent ahead): routing, the upstream connection, the
  upstream's answer, the response;
- warm request: the same steps on the live connection.

Debug logging slows every step (each line is formatted and written), so the sums are above the
client-measured figures of `bench/run.py --only first`; the shares are what this is for. A
one-off probe, cited in docs/benchmarks.md (1. and 7.); needs what bench/run.py needs.
"""

import argparse
import json
import re
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402

ENVOY_LOG = ["--log-level", "warn",
             "--component-log-level", "upstream:debug,config:debug,router:debug,http:debug,pool:debug",
             "--log-format", "%Y-%m-%dT%H:%M:%S.%fZ [%t] [%n] %v"]
CONTROL_LOG = "odmesh_control::session=debug"
WARM = 5
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
STREAM = re.compile(r'"StreamId":"(\d+)"')
ENVOY_LINE = re.compile(r"^(\S+Z) \[(\d+)\] \[(\w+)\] (.*)$")


def unix(ts):
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def envoy_lines(path):
    """(time, thread, logger, message) of each timestamped line; a header dump's lines are
    appended to the message they belong to."""
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        m = ENVOY_LINE.match(raw)
        if m:
            lines.append([unix(m[1]), m[2], m[3], m[4]])
        elif lines:
            lines[-1][3] += "\n" + raw
    return lines


def control_lines(path):
    out = []
    for raw in path.read_text(errors="replace").splitlines():
        ts = raw.split(" ", 1)[0]
        if ts.endswith("Z") and "T" in ts:
            out.append((unix(ts), raw))
    return out


def first_index(lines, start, pred):
    for i in range(start, len(lines)):
        if pred(lines[i]):
            return i
    raise LookupError


def requests(lines):
    """Per request (in order): its stream id, authority and the line index of each of its steps."""
    out = {}
    for i, (_, thread, logger, msg) in enumerate(lines):
        m = STREAM.search(msg)
        if not m:
            continue
        sid = m[1]
        if "request headers complete" in msg:
            authority = re.search(r"':authority', '([^']+)'", msg)
            out[sid] = {"thread": thread, "authority": authority[1] if authority else None, "req": i}
        elif sid in out:
            r = out[sid]
            for key, needle in (("route", "match for URL"), ("pool_ready", "pool ready"),
                                ("upstream", "upstream headers complete"), ("encode", "encoding headers via codec")):
                if needle in msg and key not in r:
                    r[key] = i
    return [r for r in sorted(out.values(), key=lambda r: r["req"]) if "encode" in r]


def discovery_steps(lines, control, r):
    """The steps of an unpredicted first request `r`, in ms."""
    cluster = f"{r['authority']}.vip"
    t = lambda i: lines[i][0]  # noqa: E731
    req = r["req"]
    fwd = first_index(lines, req, lambda l: f"on-demand discovery request for cluster {cluster} " in l[3])
    main = lines[first_index(lines, fwd,
                             lambda l: l[3].startswith(f"add/update cluster {cluster} starting warming"))][1]
    asked = next(ct for ct, line in control
                 if ct >= t(fwd) and "subscriptions changed" in line and f'first=Some("{cluster}")' in line)
    answered = next(ct for ct, line in control
                    if ct >= asked and "sending delta response" in line and 'resource_type="cluster"' in line)
    received = first_index(lines, fwd, lambda l: l[1] == main and l[0] >= answered
                           and f"Received DeltaDiscoveryResponse for {CLUSTER_TYPE}" in l[3])
    warming = first_index(lines, received, lambda l: l[3].startswith(f"add/update cluster {cluster} starting warming"))
    cla = first_index(lines, warming, lambda l: f"Received DeltaDiscoveryResponse for {CLA_TYPE}" in l[3])
    warm = first_index(lines, cla, lambda l: l[3].startswith(f"warming cluster {cluster} complete"))
    tls = first_index(lines, warm, lambda l: l[1] == r["thread"] and l[3].startswith(f"adding TLS cluster {cluster}"))
    ms = lambda a, b: (b - a) * 1000  # noqa: E731
    return {
        "request in -> discovery forwarded (filter, on_demand)": ms(t(req), t(fwd)),
        "worker -> main thread -> control plane has the request": ms(t(fwd), asked),
        "control plane answers": ms(asked, answered),
        "control plane -> Envoy's main thread has the Cluster": ms(answered, t(received)),
        "Envoy creates the cluster": ms(t(received), t(warming)),
        "the load assignment arrives": ms(t(warming), t(cla)),
        "warming completes": ms(t(cla), t(warm)),
        "main thread -> worker has the cluster": ms(t(warm), t(tls)),
        "worker routes the request": ms(t(tls), t(r["route"])),
        **routed_steps(lines, r),
    }


def routed_steps(lines, r, from_request=False):
    t = lambda k: lines[r[k]][0]  # noqa: E731
    ms = lambda a, b: (b - a) * 1000  # noqa: E731
    steps = {"request in -> routed": ms(t("req"), t("route"))} if from_request else {}
    steps.update({
        "routed -> upstream connection ready": ms(t("route"), t("pool_ready")),
        "upstream answers": ms(t("pool_ready"), t("upstream")),
        "response to the client": ms(t("upstream"), t("encode")),
    })
    return steps


def medians(rows):
    keys = list(rows[0])
    return {k: statistics.median(row[k] for row in rows) for k in keys} | {
        "total": statistics.median(sum(row.values()) for row in rows)}


def by_occurrence(reqs, vips):
    """The requests to `vips`, grouped by their place among the requests to the same VIP: [0] the
    first request to each VIP, [1] every second one, and so on."""
    count, out = {}, {}
    for r in reqs:
        if r["authority"] in vips:
            n = count[r["authority"]] = count.get(r["authority"], -1) + 1
            out.setdefault(n, []).append(r)
    return out


def probe(envoy, vips, gap_ms):
    """`first-request` on `vips`: one new connection each, its first request and WARM more."""
    rows = run.bench_json("first-request", "--envoy", f"127.0.0.1:{envoy.listener}", "--prefix", "fr-",
                          "--start", 1, "--count", len(vips), "--gap-ms", gap_ms, "--warm", WARM, lines=True)
    if any(row["first_status"] != 200 or row["warm_status"] != 200 for row in rows):
        raise RuntimeError("a request was not answered 200")
    return [(row["first_us"] - statistics.median(row["warm_us"])) / 1000 for row in rows]


def checked(groups, vips, probes):
    """`groups` (by_occurrence), after checking that the log holds every request of `probes`
    probes of `vips`."""
    expected = probes * (1 + WARM)
    if sorted(groups) != list(range(expected)) or any(len(g) != len(vips) for g in groups.values()):
        raise RuntimeError(f"Envoy's log does not hold the {expected} requests to each of the {len(vips)} VIPs")
    return groups


def start_envoy(procs, workdir, name, control):
    lst, adm = run.free_port(), run.free_port()
    return run.start_envoy(procs, workdir, name, run.odmesh_bootstrap(lst, adm, control.xds), lst, adm,
                           log_args=ENVOY_LOG)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vips", type=int, default=50)
    ap.add_argument("--gap-ms", type=int, default=20)
    ap.add_argument("--json", help="also write every request's steps here")
    args = ap.parse_args()
    run.ENVOY = run.envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-first-steps-"))
    run.log(f"work folder (logs): {workdir}")
    procs = run.Procs(workdir)
    try:
        upstream = run.start_nginx(procs, workdir)
        reg = workdir / "registry.yaml"
        # VIP 0 warms the wasm VM and the xDS stream; the rest are measured.
        run.bench_json("gen-registry", "--out", reg, "--vips", 1 + args.vips, "--instances", 1,
                       "--prefix", "fr-", "--loopback", "--port", upstream)
        control = run.start_control(procs, reg, extra=["--prewarm-history", workdir / "prewarm.json"],
                                    rust_log=CONTROL_LOG)
        vips = {f"fr-{i:06}" for i in range(1, 1 + args.vips)}
        results, client = {}, {}
        # A new Envoy of a new service: every VIP is discovered on demand.
        envoy = start_envoy(procs, workdir, "envoy-unpredicted", control)
        run.probe_first(envoy, 0, 1)
        client["unpredicted"] = probe(envoy, vips, args.gap_ms)
        procs.stop(envoy)
        lines = envoy_lines(envoy.logpath)
        first = checked(by_occurrence(requests(lines), vips), vips, 1)[0]
        control_log = control_lines(control.logpath)
        results["unpredicted"] = [discovery_steps(lines, control_log, r) for r in first]

        # The same service's next Envoy: every VIP is sent ahead. Probed twice: the second time
        # each VIP's cluster and upstream connection are warm, and only the client's
        # connection is new.
        envoy = start_envoy(procs, workdir, "envoy-predicted", control)
        run.wait_warm(envoy)
        active = run.envoy_stats(envoy, "cluster_manager.active_clusters")["cluster_manager.active_clusters"]
        if active < len(vips):
            raise RuntimeError(f"the restarted Envoy holds {active} clusters, not the {len(vips)} sent ahead")
        client["predicted"] = probe(envoy, vips, args.gap_ms)
        client["warm VIP, new client connection"] = probe(envoy, vips, args.gap_ms)
        procs.stop(envoy)
        lines = envoy_lines(envoy.logpath)
        groups = checked(by_occurrence(requests(lines), vips), vips, 2)
        steps = lambda rs: [routed_steps(lines, r, from_request=True) for r in rs]  # noqa: E731
        results["predicted"] = steps(groups[0])
        results["warm VIP, new client connection"] = steps(groups[1 + WARM])
        results["warm"] = steps(r for n in range(1, 1 + WARM) for r in groups[n])

        for label, rows in results.items():
            print(f"\n{label}: median of {len(rows)} requests, ms")
            for step, value in medians(rows).items():
                print(f"  {value:7.3f}  {step}")
        print("\nmeasured by the client, added over the warm requests on the same connection, p50:")
        for label, added in client.items():
            print(f"  {statistics.median(added):7.3f}  {label}")
        results["client"] = client
        if args.json:
            Path(args.json).write_text(json.dumps(results, separators=(",", ":")))
    finally:
        procs.stop_all()


if __name__ == "__main__":
    main()
