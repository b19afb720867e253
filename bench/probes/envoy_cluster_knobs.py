#!/usr/bin/env python3
"""Probe: what Envoy's stats and cluster knobs cost per cluster, idle and with a connection.

    bench/probes/envoy_cluster_knobs.py [--clusters 500] [--workers 1] [VARIANT ...]

For each variant (default: all of VARIANTS; a comma joins several), one Envoy 1.40 with
CLUSTERS static clusters shaped like the ones odmesh serves (outlier detection, circuit
breakers, the `odmesh` metadata, HTTP protocol options with the 1 h idle timeout and the
retry policy; the endpoint inline instead of EDS) and the stats matcher of envoy/odmesh.yaml,
one nginx upstream. Reads `/memory` allocated once Envoy is ready (idle), then after one
request through every cluster on one client connection (each cluster then holds one upstream
HTTP/1 connection), and prints per cluster over the same Envoy with no cluster. Memory, not
time, is measured. Writes the raw figures to /tmp/envoy-cluster-knobs-<time>.json.
"""

import argparse
import copy
import http.client
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run  # noqa: E402

OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
VARIANTS = {
    "base": "as odmesh serves them, with the shipped stats matcher",
    "nomatcher": "no stats matcher",
    "deferred": "bootstrap deferred_stat_options.enable_deferred_creation_stats",
    "nohist": "the upstream_rq_time histogram rejected too",
    "bins": "histogram_bucket_settings for cluster.* with bins: 10",
    "nooutlier": "no outlier detection",
    "defcc": "bootstrap cluster_manager.enable_deferred_cluster_creation",
    "idle1": "idle_timeout 1 s (the connection closed before the second reading)",
    "bare": "no outlier detection, circuit breakers, metadata or protocol options",
    "nostats": "every per-cluster stat rejected",
}


def cluster(i, upstream, variant):
    name = f"c{i}.vip"
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
             "socket_address": {"address": "127.0.0.1", "port_value": upstream}}}}]}]},
         "circuit_breakers": {"thresholds": [{"max_connections": 1024, "max_pending_requests": 1024,
                                              "max_requests": 1024, "max_retries": 3}]},
         "outlier_detection": {"consecutive_5xx": 5, "interval": "10s", "base_ejection_time": "30s",
                               "max_ejection_percent": 50},
         "metadata": {"filter_metadata": {"odmesh": {
             "vip": f"c{i}", "kind": "vip", "protocol": "auto", "registered": True,
             "reason": f"VIP c{i} has no healthy endpoint: no instance of it is UP"}}},
         "typed_extension_protocol_options": {OPTIONS: {
             "@type": f"type.googleapis.com/{OPTIONS}",
             "use_downstream_protocol_config": {"http_protocol_options": {}, "http2_protocol_options": {}},
             "common_http_protocol_options": {"idle_timeout": "1s" if "idle1" in variant else "3600s"},
             "retry_policy": {
                 "retry_on": "connect-failure,refused-stream", "num_retries": 2,
                 "retry_back_off": {"base_interval": "0.025s", "max_interval": "0.25s"},
                 "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
                     "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
                 "host_selection_retry_max_attempts": 3}}}}
    if "nooutlier" in variant:
        c.pop("outlier_detection")
    if "bare" in variant:
        for k in ("outlier_detection", "circuit_breakers", "metadata", "typed_extension_protocol_options"):
            c.pop(k, None)
    return c


def bootstrap(n, admin, listener, upstream, variant):
    shipped = yaml.safe_load((run.ROOT / "envoy/odmesh.yaml").read_text())
    stats = {}
    if "nomatcher" not in variant:
        stats["stats_matcher"] = copy.deepcopy(shipped["stats_config"]["stats_matcher"])
    if "nohist" in variant:
        stats["stats_matcher"]["exclusion_list"]["patterns"].append(
            {"safe_regex": {"regex": r"^cluster\..+\.s?vip\.upstream_rq_time$"}})
    if "nostats" in variant:
        stats["stats_matcher"] = {"exclusion_list": {"patterns": [{"safe_regex": {"regex": r"^cluster\..+\.s?vip\..*"}}]}}
    if "bins" in variant:
        stats["histogram_bucket_settings"] = [{"match": {"prefix": "cluster."}, "bins": 10, "buckets": [
            0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000,
            3600000]}]
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "probe",
           "route_config": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [
               {"match": {"prefix": "/"}, "route": {"cluster_header": "x-cluster", "timeout": "0s"}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}
    b = {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
         "stats_config": stats,
         "static_resources": {
             "clusters": [cluster(i, upstream, variant) for i in range(n)],
             "listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listener}},
                            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                            "typed_config": hcm}]}]}]}}
    if "deferred" in variant:
        b["deferred_stat_options"] = {"enable_deferred_creation_stats": True}
    if "defcc" in variant:
        b["cluster_manager"] = {"enable_deferred_cluster_creation": True}
    return b


def allocated(admin):
    return int(json.loads(run.http_get(f"http://127.0.0.1:{admin}/memory"))["allocated"])


def measure(procs, workdir, n, workers, upstream, variant):
    admin, listener = run.free_port(), run.free_port()
    cfg = workdir / f"envoy-{variant}-{n}.json"
    cfg.write_text(json.dumps(bootstrap(n, admin, listener, upstream, variant)))
    p = procs.start(f"envoy-{variant}-{n}", [run.ENVOY, "-c", cfg, "--concurrency", workers,
                                             "--disable-hot-restart", "-l", "error", "--base-id", run.free_port()])
    try:
        run.wait_for("envoy ready", lambda: run.http_get(f"http://127.0.0.1:{admin}/ready") == "LIVE\n",
                     timeout=120, every=0.1)
        time.sleep(2)  # let the workers finish taking the clusters
        idle = allocated(admin)
        used = None
        if n:
            client = http.client.HTTPConnection("127.0.0.1", listener, timeout=10)
            for i in range(n):
                client.request("GET", "/", headers={"x-cluster": f"c{i}.vip"})
                r = client.getresponse()
                r.read()
                if r.status != 200:
                    raise RuntimeError(f"{variant}: c{i}.vip answered {r.status}")
            client.close()
            time.sleep(4 if "idle1" in variant else 2)
            used = allocated(admin)
        return idle, used
    finally:
        procs.stop(p)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", type=int, default=500)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("variants", nargs="*", default=list(VARIANTS))
    args = ap.parse_args()
    run.ENVOY = run.envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-cluster-knobs-"))
    procs = run.Procs(workdir)
    out = {"envoy": str(run.ENVOY), "envoy_sha256": run.sha256(run.ENVOY), "clusters": args.clusters,
           "workers": args.workers, "loadavg": open("/proc/loadavg").read().strip(), "variants": {}}
    try:
        upstream = run.start_nginx(procs, workdir)
        base_idle, _ = measure(procs, workdir, 0, args.workers, upstream, "base")
        out["no_cluster_allocated"] = base_idle
        for variant in args.variants:
            idle, used = measure(procs, workdir, args.clusters, args.workers, upstream, variant)
            per_idle = (idle - base_idle) / args.clusters / 1024
            per_used = (used - base_idle) / args.clusters / 1024
            out["variants"][variant] = {"allocated_idle": idle, "allocated_used": used,
                                        "kb_per_cluster_idle": per_idle, "kb_per_cluster_used": per_used}
            print(f"{variant:28} idle {per_idle:5.1f} KB  with a connection {per_used:5.1f} KB per cluster"
                  f"   ({', '.join(VARIANTS.get(v, v) for v in variant.split(','))})", flush=True)
    finally:
        procs.stop_all()
    path = Path(f"/tmp/envoy-cluster-knobs-{int(time.time())}.json")
    path.write_text(json.dumps(out, indent=1))
    print(f"load {out['loadavg']}; {path}")
    os.system(f"rm -rf {workdir}")


if __name__ == "__main__":
    main()
