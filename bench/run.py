#!/usr/bin/env python3
"""odmesh benchmarks: runs every measurement against real processes and writes the report.

    bench/run.py --quick     # under 5 minutes, smaller counts (make bench-quick)
    bench/run.py             # the full set (make bench)
    bench/run.py --only first,overhead,memory,discovered,scale,gcp,eureka,peers,follow,filter

Needs (make bench builds them): target/release/odmesh-control, target/release/odmesh-bench,
dist/odmesh_filter.wasm, Envoy ($ENVOY), nginx, wrk; `go` for the gcp section (skipped without it). Writes docs/bench/latest.md, latest.json
and the SVG plots (--quick: under docs/bench/quick/). Standard library only.

ODMESH_WASM=/path/to/filter.wasm runs Envoy with another build of the filter (an A/B of two
builds); the report names the filter's size and sha256.
"""

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "target/release/odmesh-bench"
CONTROL = Path(os.environ.get("ODMESH_CONTROL", ROOT / "target/release/odmesh-control"))
WASM = Path(os.environ.get("ODMESH_WASM", ROOT / "dist/odmesh_filter.wasm")).resolve()
OUT = ROOT / "docs/bench"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import svg  # noqa: E402


def envoy_binary():
    env = os.environ.get("ENVOY")
    if env and Path(env).is_file():
        return env
    p = ROOT / ".tools/envoy-1.40.0/envoy/_bin/envoy"
    if p.is_file():
        return str(p)
    found = shutil.which("envoy")
    if found:
        return found
    sys.exit("no Envoy: run `make envoy` or set ENVOY")


def recorded(path):
    """`path` as a report records it: relative to the repository root when it is inside it,
    else only its file name, so that no report names a folder of one machine."""
    p = Path(os.path.abspath(path))  # links not followed: .tools/ may link elsewhere
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return f"(outside the repository) {p.name}"


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, p):
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))]


def summary(values):
    return {"n": len(values), "p50": pct(values, 50), "p90": pct(values, 90), "p99": pct(values, 99),
            "max": max(values) if values else float("nan")}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what, cond, timeout=60, every=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if cond():
                return
        except Exception:
            pass
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


class Procs:
    """Child processes of one run; each stopped by its own pid."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.children = []

    def start(self, name, cmd, env=None):
        logf = open(self.workdir / f"{name}.log", "w")
        p = subprocess.Popen([str(c) for c in cmd], stdout=logf, stderr=subprocess.STDOUT,
                             env={**os.environ, **(env or {})}, cwd=ROOT)
        p.logpath = self.workdir / f"{name}.log"
        self.children.append(p)
        return p

    def stop(self, p):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p in self.children:
            self.children.remove(p)

    def stop_all(self):
        for p in list(self.children):
            self.stop(p)


def bench_json(*args, lines=False, cpus=None):
    """odmesh-bench ARGS's JSON output; `cpus`: run it on those CPUs only (taskset's list)."""
    pin = ["taskset", "-c", cpus] if cpus else []
    done = subprocess.run([*pin, str(BENCH), *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"odmesh-bench {' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = done.stdout
    if lines:
        return [json.loads(l) for l in out.splitlines() if l.strip()]
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Processes: nginx, control plane, Envoy in its configurations


def start_nginx(procs, workdir, ports=None):
    """nginx answering `ok` on a free port (returned), or on every one of `ports` (127.0.0.1)."""
    port = free_port()
    listens = f"    listen 127.0.0.1:{port} reuseport;" if ports is None else \
        "\n".join(f"    listen 127.0.0.1:{p};" for p in ports)
    port = port if ports is None else ports[-1]
    d = workdir / "nginx"
    d.mkdir(exist_ok=True)
    conf = d / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {{
{listens}
    location / {{ return 200 "ok\\n"; }}
  }}
}}
""")
    p = procs.start("nginx", ["nginx", "-p", d, "-c", conf, "-e", d / "error.log"])
    wait_for("nginx", lambda: http_get(f"http://127.0.0.1:{port}/") == "ok\n")
    return port


def control_flags():
    """The flags the control plane's `--help` lists."""
    out = subprocess.run([CONTROL, "--help"], capture_output=True, text=True).stdout
    return set(w.rstrip(",") for w in out.split() if w.startswith("--"))


def start_control(procs, registry, name="control", extra=(), rust_log=None):
    """odmesh-control on `registry` (a file), or with registry=None its embedded Eureka registry;
    `extra`: more flags; `rust_log`: more `RUST_LOG` directives. Without a `--prewarm-history` in `extra`, prewarm is off: a proxy then
    gets only what it asks for, as the sections measuring discovery need."""
    if not any(a in ("--prewarm-history", "--no-prewarm") for a in extra):
        extra = [*extra, "--no-prewarm"]
    # Every simulated proxy of a benchmark connects from 127.0.0.1: one address may hold as
    # much as all of them (in builds that bound an address at all: an A/B may run older ones).
    known = control_flags()
    for flag, value in (("--xds-max-connections-per-source", "10000"),
                        ("--xds-max-subscriptions-per-source", "1000000"),
                        ("--xds-max-names-per-source", "4000000")):
        if flag not in extra and flag in known:
            extra = [*extra, flag, value]
    xds, admin, eureka = free_port(), free_port(), free_port()
    source = ["--registry", registry] if registry else ["--serve-eureka", f"127.0.0.1:{eureka}"]
    # The embedded registry logs every registration at info; at a million that is the log's whole size.
    log_level = "info" if registry else "warn"
    directives = f"{log_level},odmesh_control::model=debug,odmesh_control::cache=debug"
    if rust_log:
        directives += f",{rust_log}"
    p = procs.start(name, [CONTROL, *source, "--xds", f"127.0.0.1:{xds}", "--admin", f"127.0.0.1:{admin}", *extra],
                    env={"NO_COLOR": "1", "RUST_LOG": directives})
    wait_for("control plane ready", lambda: http_get(f"http://127.0.0.1:{admin}/readyz") is not None,
             timeout=600, every=0.1)
    p.xds, p.admin, p.eureka = xds, admin, eureka
    return p


# The shipped bootstraps' example access log (docs/envoy.md, "The access log"): its key and
# every line under it, list items included.
ACCESS_LOG = re.compile(r"^(?P<indent> *)access_log:\n(?:(?P=indent)(?:- |  ).*\n)*", re.M)


def without_access_log(y):
    """The bootstrap without the example access log: the benchmarks measure the chains as they
    were measured before it (a line per request would also fill Envoy's log under load)."""
    return ACCESS_LOG.sub("", y)


def odmesh_bootstrap(listener, admin, xds, push_all=False, service=None):
    """envoy/odmesh.yaml as shipped (without its example access log), with this run's ports and
    the wasm path made absolute; `service`: another node.cluster (the calling service the
    prewarm history is kept for)."""
    y = without_access_log(Path(os.environ.get("ODMESH_BOOTSTRAP", ROOT / "envoy/odmesh.yaml")).read_text())
    y = y.replace("port_value: 9901", f"port_value: {admin}")
    y = y.replace("port_value: 15001", f"port_value: {listener}")
    y = y.replace("port_value: 15006", "port_value: 0")  # the inbound listener: any free port
    y = y.replace("port_value: 18000", f"port_value: {xds}")
    y = y.replace("filename: dist/odmesh_filter.wasm", f"filename: {WASM}")
    if push_all and "cds_config:" not in y:
        y = y.replace("dynamic_resources:\n", "dynamic_resources:\n  cds_config: {ads: {}, resource_api_version: V3}\n", 1)
    if service:
        assert y.count("\n  cluster: odmesh\n") == 1, "the bootstrap's node.cluster moved"
        y = y.replace("\n  cluster: odmesh\n", f"\n  cluster: {service}\n")
    return y


def static_bootstrap(listener, admin, upstream_port, wasm):
    """The baseline: the same listener with a plain static route (and optionally the wasm filter)."""
    route = "route: {cluster_header: x-odmesh-cluster}" if wasm else "route: {cluster: upstream}"
    cluster = "fr-000000.vip" if wasm else "upstream"
    wasm_filter = f"""
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: odmesh
                root_id: odmesh
                configuration: {{"@type": type.googleapis.com/google.protobuf.StringValue, value: "{{}}"}}
                vm_config:
                  vm_id: odmesh
                  runtime: envoy.wasm.runtime.v8
                  code: {{local: {{filename: {WASM}}}}}""" if wasm else ""
    return f"""
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  clusters:
  - name: {cluster}
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: {cluster}
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream_port}}}}}}}
  listeners:
  - name: egress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: egress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                {route}
          http_filters:{wasm_filter}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"""


def start_envoy(procs, workdir, name, bootstrap, listener, admin, workers=1, log_args=("--log-level", "warn")):
    cfg = workdir / f"{name}.yaml"
    cfg.write_text(bootstrap)
    p = procs.start(name, [ENVOY, "-c", cfg, "--concurrency", str(workers), "--disable-hot-restart", *log_args])
    p.listener, p.admin_port = listener, admin
    wait_for(f"{name} ready", lambda: http_get(f"http://127.0.0.1:{admin}/ready").strip() == "LIVE",
             timeout=300)
    return p


def envoy_memory(p):
    m = json.loads(http_get(f"http://127.0.0.1:{p.admin_port}/memory"))
    return {"allocated": int(m["allocated"]), "heap_size": int(m["heap_size"]), "rss": rss_bytes(p.pid)}


def envoy_stats(p, flt):
    out = {}
    for line in http_get(f"http://127.0.0.1:{p.admin_port}/stats?filter={flt}").splitlines():
        k, _, v = line.partition(": ")
        try:
            out[k] = int(v)
        except ValueError:
            pass
    return out


# ---------------------------------------------------------------------------------------------
# 1 + 3a. First-request latency, and Envoy memory with clusters discovered on demand


def probe_first(envoy, start, count, prefix="fr-"):
    """`odmesh-bench first-request` on `count` VIPs from index `start` through `envoy`; every
    answer must be a 200. Returns its rows and Envoy's memory half a second later."""
    rows = bench_json("first-request", "--envoy", f"127.0.0.1:{envoy.listener}", "--prefix", prefix,
                      "--start", start, "--count", count, lines=True)
    bad = [r for r in rows if r["first_status"] != 200 or r["warm_status"] != 200]
    if bad:
        raise RuntimeError(f"first-request: non-200 answers: {bad[:3]}")
    time.sleep(0.5)
    return rows, envoy_memory(envoy)


def wait_warm(envoy):
    """Waits until no cluster of `envoy` is warming (those sent ahead have their endpoints)."""
    wait_for("clusters warm", lambda: envoy_stats(envoy, "cluster_manager.warming_clusters").get(
        "cluster_manager.warming_clusters", 0) == 0, timeout=300)


def bench_first(cfg, workdir, results):
    """First requests to new VIPs, then (prewarm) to the same VIPs from a restarted Envoy of the
    same service, which the control plane sends them ahead."""
    procs = Procs(workdir)
    try:
        up = start_nginx(procs, workdir)
        n, reps = cfg["first_vips"], cfg["first_reps"]
        reg = workdir / "first.yaml"
        bench_json("gen-registry", "--out", reg, "--vips", 1 + 20 + n, "--instances", 1,
                   "--prefix", "fr-", "--loopback", "--port", up)
        cp = start_control(procs, reg, extra=["--prewarm-history", workdir / "first-prewarm.json"])
        runs, predicted, new_connection, mem, mem_pushed = [], [], [], [], []
        for rep in range(reps):
            # Each rep is a service of its own: nothing in the history for it yet.
            service = f"bench-first-{rep}"
            lst, adm = free_port(), free_port()
            envoy = start_envoy(procs, workdir, f"envoy-first-{rep}",
                                odmesh_bootstrap(lst, adm, cp.xds, service=service), lst, adm)
            wait_for("ADS connected", lambda: envoy_stats(envoy, "control_plane.connected_state").get(
                "control_plane.connected_state") == 1)
            m_start = envoy_memory(envoy)
            _, m0 = probe_first(envoy, 0, 1)  # wasm VM, connections, warmed
            _, m20 = probe_first(envoy, 1, 20)
            rows, mn = probe_first(envoy, 21, n)
            runs.extend(rows)
            mem.append({"start": m_start, "after_1": m0, "after_21": m20, f"after_{21 + n}": mn,
                        "per_cluster_20": {k: (m20[k] - m0[k]) / 20 for k in m0},
                        f"per_cluster_{n}": {k: (mn[k] - m20[k]) / n for k in m0}})
            procs.stop(envoy)

            # The same service's proxy restarts: its 1 + 20 + n clusters come ahead.
            lst, adm = free_port(), free_port()
            envoy = start_envoy(procs, workdir, f"envoy-predicted-{rep}",
                                odmesh_bootstrap(lst, adm, cp.xds, service=service), lst, adm)
            active = envoy_stats(envoy, "cluster_manager.active_clusters")["cluster_manager.active_clusters"]
            if active < 1 + 20 + n:
                raise RuntimeError(f"prewarm: the restarted Envoy holds {active} clusters, not {1 + 20 + n} and more")
            wait_warm(envoy)
            p_start = envoy_memory(envoy)
            _, p21 = probe_first(envoy, 0, 21)  # the same warm-up as above
            rows, pn = probe_first(envoy, 21, n)
            predicted.extend(rows)
            # The same VIPs again: cluster and upstream connection warm, only the client's
            # connection is new, as it is for every first request above.
            rows, _ = probe_first(envoy, 21, n)
            new_connection.extend(rows)
            mem_pushed.append({"start": p_start, "after_21": p21, f"after_{21 + n}": pn,
                               "clusters": active - 1,  # without the static odmesh_xds
                               f"connections_per_cluster_{n}": {k: (pn[k] - p21[k]) / n for k in pn}})
            procs.stop(envoy)
        added = [r["first_us"] - statistics.median(r["warm_us"]) for r in runs]
        added_pred = [r["first_us"] - statistics.median(r["warm_us"]) for r in predicted]
        added_conn = [r["first_us"] - statistics.median(r["warm_us"]) for r in new_connection]
        results["first_request"] = {
            "vips": n, "reps": reps,
            "first_us": summary([r["first_us"] for r in runs]),
            "warm_us": summary([statistics.median(r["warm_us"]) for r in runs]),
            "added_us": summary(added),
            "added_samples_us": added,
            "predicted_first_us": summary([r["first_us"] for r in predicted]),
            "predicted_warm_us": summary([statistics.median(r["warm_us"]) for r in predicted]),
            "predicted_added_us": summary(added_pred),
            "new_connection_first_us": summary([r["first_us"] for r in new_connection]),
            "new_connection_added_us": summary(added_conn),
        }
        results["memory_on_demand"] = {
            "runs": mem,
            "per_cluster_20_allocated": statistics.median(m["per_cluster_20"]["allocated"] for m in mem),
            "per_cluster_20_rss": statistics.median(m["per_cluster_20"]["rss"] for m in mem),
            f"per_cluster_{n}_allocated": statistics.median(m[f"per_cluster_{n}"]["allocated"] for m in mem),
            f"per_cluster_{n}_rss": statistics.median(m[f"per_cluster_{n}"]["rss"] for m in mem),
            "baseline": mem[0]["start"],
            # Prewarmed: the restarted Envoy's memory with every cluster pushed and no upstream
            # connection yet, against the fresh Envoy's baseline; then what the connections add.
            "prewarmed_runs": mem_pushed,
            "prewarmed_per_cluster_allocated": statistics.median(
                (m["start"]["allocated"] - mem[0]["start"]["allocated"]) / m["clusters"] for m in mem_pushed),
            f"prewarmed_connection_per_cluster_{n}_allocated": statistics.median(
                m[f"connections_per_cluster_{n}"]["allocated"] for m in mem_pushed),
        }
        fr = results["first_request"]["added_us"]
        fp = results["first_request"]["predicted_added_us"]
        log(f"first request: added p50 {fr['p50']:.0f} us p90 {fr['p90']:.0f} p99 {fr['p99']:.0f}; "
            f"predicted: p50 {fp['p50']:.0f} us p90 {fp['p90']:.0f} p99 {fp['p99']:.0f}; "
            f"warm VIP on a new connection: p50 {results['first_request']['new_connection_added_us']['p50']:.0f} us; "
            f"on-demand memory {results['memory_on_demand']['per_cluster_20_allocated'] / 1024:.1f} KB/cluster; "
            f"prewarmed {results['memory_on_demand']['prewarmed_per_cluster_allocated'] / 1024:.1f} KB/cluster "
            f"+ {results['memory_on_demand'][f'prewarmed_connection_per_cluster_{n}_allocated'] / 1024:.1f} KB with its connection")
    finally:
        procs.stop_all()


# ---------------------------------------------------------------------------------------------
# 2 + 5b. Per-request overhead: static route vs wasm only vs full odmesh chain


def parse_wrk(out):
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return reqs, rps


def bench_overhead(cfg, workdir, results):
    procs = Procs(workdir)
    try:
        up = start_nginx(procs, workdir)
        reg = workdir / "overhead.yaml"
        bench_json("gen-registry", "--out", reg, "--vips", 1, "--instances", 1, "--prefix", "fr-",
                   "--loopback", "--port", up)
        cp = start_control(procs, reg)
        envoys = {}
        for name in ["static", "wasm", "odmesh"]:
            lst, adm = free_port(), free_port()
            if name == "odmesh":
                boot = odmesh_bootstrap(lst, adm, cp.xds)
            else:
                boot = static_bootstrap(lst, adm, up, wasm=(name == "wasm"))
            envoys[name] = start_envoy(procs, workdir, f"envoy-{name}", boot, lst, adm)
            subprocess.run(["curl", "-s", "-o", "/dev/null", "-H", "Host: fr-000000",
                            f"http://127.0.0.1:{lst}/"], check=True)
        rows = {k: [] for k in envoys}
        order = list(envoys)
        for rnd in range(cfg["overhead_rounds"]):
            for name in order[rnd % 3:] + order[:rnd % 3]:
                e = envoys[name]
                c0 = cpu_seconds(e.pid)
                out = subprocess.run(["wrk", "-t1", "-c32", f"-d{cfg['overhead_seconds']}s", "-H", "Host: fr-000000",
                                      f"http://127.0.0.1:{e.listener}/"], check=True, capture_output=True,
                                     text=True).stdout
                c1 = cpu_seconds(e.pid)
                reqs, rps = parse_wrk(out)
                rows[name].append({"requests": reqs, "rps": rps, "cpu_us_per_req": (c1 - c0) / reqs * 1e6,
                                   "loadavg": open("/proc/loadavg").read().split()[0]})
        med = {k: {"cpu_us_per_req": statistics.median(r["cpu_us_per_req"] for r in v),
                   "rps": statistics.median(r["rps"] for r in v)} for k, v in rows.items()}
        base = med["static"]
        results["overhead"] = {
            "rounds": rows, "median": med,
            "cpu_ratio_odmesh": base["cpu_us_per_req"] / med["odmesh"]["cpu_us_per_req"],
            "rps_ratio_odmesh": med["odmesh"]["rps"] / base["rps"],
            "cpu_ratio_wasm": base["cpu_us_per_req"] / med["wasm"]["cpu_us_per_req"],
            "rps_ratio_wasm": med["wasm"]["rps"] / base["rps"],
            # Ratios within each round (the three windows ran back to back), then their median:
            # steadier than the ratio of medians when the machine's load drifts.
            "paired_cpu_ratio_odmesh": statistics.median(
                a["cpu_us_per_req"] / b["cpu_us_per_req"] for a, b in zip(rows["static"], rows["odmesh"])),
            "paired_cpu_ratio_wasm": statistics.median(
                a["cpu_us_per_req"] / b["cpu_us_per_req"] for a, b in zip(rows["static"], rows["wasm"])),
            "wasm_share_of_odmesh_cpu": (med["wasm"]["cpu_us_per_req"] - base["cpu_us_per_req"])
            / med["odmesh"]["cpu_us_per_req"],
            "wasm": {"path": recorded(WASM), "bytes": WASM.stat().st_size,
                     "sha256": hashlib.sha256(WASM.read_bytes()).hexdigest()},
        }
        o = results["overhead"]
        log(f"overhead: static {base['cpu_us_per_req']:.1f} us/req, wasm {med['wasm']['cpu_us_per_req']:.1f}, "
            f"odmesh {med['odmesh']['cpu_us_per_req']:.1f}; cpu ratio {o['cpu_ratio_odmesh']:.2f}, "
            f"rps ratio {o['rps_ratio_odmesh']:.2f}")
    finally:
        procs.stop_all()


# ---------------------------------------------------------------------------------------------
# 3b. Push all: every cluster up front


def bench_push_all(cfg, workdir, results):
    """Every cluster pushed up front (the alternative odmesh is measured against), and at the
    first size each cluster variant of `push-all --variant` (what a cluster option costs)."""
    out = []
    runs = [(n, "odmesh") for n in cfg["push_all_vips"]]
    runs += [(cfg["push_all_vips"][0], v) for v in cfg["push_all_variants"]]
    for n, variant in runs:
        procs = Procs(workdir)
        try:
            reg = workdir / f"pushall-{n}.yaml"
            bench_json("gen-registry", "--out", reg, "--vips", n, "--instances", 1, "--prefix", "pa-",
                       "--loopback", "--port", 9)
            port = free_port()
            srv = procs.start(f"push-all-{n}-{variant}", [BENCH, "push-all", "--registry", reg, "--listen",
                                                          f"127.0.0.1:{port}", "--variant", variant])
            wait_for("push-all ready", lambda: "ready" in srv.logpath.read_text(), timeout=120)
            lst, adm = free_port(), free_port()
            t0 = time.time()
            envoy = start_envoy(procs, workdir, f"envoy-pushall-{n}-{variant}", odmesh_bootstrap(lst, adm, port, push_all=True),
                                lst, adm)

            def warm():
                s = envoy_stats(envoy, "cluster_manager")
                return s.get("cluster_manager.active_clusters", 0) >= n + 1 and \
                    s.get("cluster_manager.warming_clusters", 1) == 0
            wait_for(f"{n} clusters warm", warm, timeout=600, every=0.1)
            warm_s = time.time() - t0
            time.sleep(1)
            m = envoy_memory(envoy)
            out.append({"vips": n, "variant": variant, "warm_seconds": warm_s, "memory": m})
            log(f"push-all {n} ({variant}): warm in {warm_s:.1f} s, allocated {m['allocated'] / 2**20:.0f} MiB, "
                f"rss {m['rss'] / 2**20:.0f} MiB")
        finally:
            procs.stop_all()
    base = results.get("memory_on_demand", {}).get("baseline")
    for row in out:
        if base:
            row["per_cluster"] = {k: (row["memory"][k] - base[k]) / row["vips"] for k in base}
    results["memory_push_all"] = out


def bench_discovered(cfg, workdir, results):
    """Envoy memory per cluster discovered on demand, with its live upstream connection, at
    1k and 10k clusters and 1 and 4 workers; beside it the floor: the same clusters sent ahead
    (prewarm) to a restarted Envoy of the same service, before any connection."""
    out = []
    for workers in cfg["discovered_workers"]:
        for n in cfg["discovered_vips"]:
            procs = Procs(workdir)
            try:
                up = start_nginx(procs, workdir)
                reg = workdir / f"discovered-{n}.yaml"
                bench_json("gen-registry", "--out", reg, "--vips", 1 + n, "--instances", 1,
                           "--prefix", "dm-", "--loopback", "--port", up)
                cp = start_control(procs, reg, name=f"control-discovered-{workers}-{n}", extra=[
                    "--prewarm-history", workdir / f"discovered-{workers}-{n}.json",
                    "--prewarm-max-clusters", str(2 * n), "--xds-max-names", str(2 * n)])
                service = f"bench-memory-{workers}-{n}"
                lst, adm = free_port(), free_port()
                boot = odmesh_bootstrap(lst, adm, cp.xds, service=service)
                envoy = start_envoy(procs, workdir, f"envoy-discovered-{workers}-{n}", boot, lst, adm, workers)
                m_base = envoy_memory(envoy)
                probe = ["first-request", "--envoy", f"127.0.0.1:{lst}", "--prefix", "dm-", "--warm", "1", "--gap-ms", "0"]
                bench_json(*probe, "--start", 0, "--count", 1, lines=True)  # the filter's VM, the first connections
                time.sleep(0.5)
                m1 = envoy_memory(envoy)
                t0 = time.time()
                rows = bench_json(*probe, "--start", 1, "--count", n, lines=True)
                took = time.time() - t0
                bad = [r for r in rows if r["first_status"] != 200]
                if bad:
                    raise RuntimeError(f"discovered memory: non-200 answers: {bad[:3]}")
                time.sleep(1)
                mn = envoy_memory(envoy)
                procs.stop(envoy)
                # The same service restarts: the n + 1 clusters come ahead, no connection yet.
                envoy = start_envoy(procs, workdir, f"envoy-pushed-{workers}-{n}", boot, lst, adm, workers)
                wait_warm(envoy)
                time.sleep(1)
                active = envoy_stats(envoy, "cluster_manager.active_clusters")["cluster_manager.active_clusters"] - 1
                if active < n + 1:
                    raise RuntimeError(f"prewarm: {active} clusters sent ahead, not {n + 1}")
                mp = envoy_memory(envoy)
                row = {"workers": workers, "vips": n, "discover_seconds": took,
                       "memory": {"base": m_base, "after_1": m1, "after_n": mn, "pushed": mp},
                       "per_cluster_discovered": {k: (mn[k] - m1[k]) / n for k in mn},
                       "per_cluster_pushed": {k: (mp[k] - m_base[k]) / active for k in mp},
                       "pushed_clusters": active}
                out.append(row)
                log(f"memory, {workers} worker(s), {n} clusters: discovered {row['per_cluster_discovered']['allocated'] / 1024:.1f} KB "
                    f"per cluster with its connection ({took:.0f} s); sent ahead {row['per_cluster_pushed']['allocated'] / 1024:.1f} KB")
            finally:
                procs.stop_all()
    results["memory_discovered"] = out


# ---------------------------------------------------------------------------------------------
# 4. Control-plane scale


def xds_load(cfg, cp, n, *source):
    """odmesh-bench xds-load against control plane `cp` (a registry of `n` VIPs), with `source`'s arguments."""
    return bench_json("xds-load", "--xds", f"127.0.0.1:{cp.xds}", "--control-pid", cp.pid,
                      "--control-log", cp.logpath, *source, "--vips", n, "--instances", 10,
                      "--proxies", cfg["scale_proxies"], "--samples", cfg["scale_samples"],
                      "--flips", cfg["scale_flips"])


def bench_scale(cfg, workdir, results):
    out = []
    for n in cfg["scale_vips"]:
        procs = Procs(workdir)
        try:
            reg = workdir / f"scale-{n}.yaml"
            gen = bench_json("gen-registry", "--out", reg, "--vips", n, "--instances", 10)
            parse = bench_json("parse-registry", reg)
            if n <= 10000:  # the JSON form is ~4x the bytes; at 1M instances it needs ~6 GB to parse
                js = workdir / f"scale-{n}.json"
                bench_json("gen-registry", "--out", js, "--vips", n, "--instances", 10, "--json")
                parse["eureka_json"] = bench_json("parse-registry", js)
                js.unlink()
            log(f"scale {n}: registry {gen['bytes'] / 2**20:.0f} MiB parsed in {parse['parse_seconds']:.2f} s, "
                f"snapshot {parse['snapshot_seconds']:.2f} s")
            t0 = time.time()
            cp = start_control(procs, reg)
            ready_s = time.time() - t0
            load = xds_load(cfg, cp, n, "--registry", reg)
            load.update({"registry_bytes": gen["bytes"], "parse": parse, "ready_seconds": ready_s})
            out.append(load)
            log(f"scale {n}: rss {load['rss_connected']['rss_bytes'] / 2**20:.0f} MiB, answer p50 "
                f"{load['answer_cds_ms']['p50']:.3f} ms p99 {load['answer_cds_ms']['p99']:.3f} ms, fan-out p99 "
                f"{load['fanout_from_applied_ms']['p99']:.1f} ms (from parsed {load['fanout_from_loaded_ms']['p99']:.1f} ms)")
        finally:
            procs.stop_all()
    results["scale"] = out


def bench_scale_eureka(cfg, workdir, results):
    """Section 4 again through the default source: the embedded Eureka registry, filled and changed over REST."""
    out = []
    for n in cfg["scale_eureka_vips"]:
        procs = Procs(workdir)
        try:
            # xds-load registers 1-hour leases and sends no heartbeats: the default bound (300 s) refuses them.
            cp = start_control(procs, None, name=f"control-eureka-{n}", extra=["--max-lease-duration", "3600"])
            try:
                load = xds_load(cfg, cp, n, "--eureka", f"127.0.0.1:{cp.eureka}", "--admin", f"127.0.0.1:{cp.admin}")
            except RuntimeError as e:
                # One size failing (say, out of memory) must not lose the others' figures.
                log(f"scale (embedded registry) {n}: failed: {e}")
                out.append({"vips": n, "failed": str(e)[-500:]})
                continue
            out.append(load)
            r = load["registered"]
            log(f"scale (embedded registry) {n}: {r['registrations_per_second']:.0f} registrations/s, rss "
                f"{load['rss_connected']['rss_bytes'] / 2**20:.0f} MiB, change to proxy p50 "
                f"{load['change_to_proxy_ms']['p50']:.0f} ms p99 {load['change_to_proxy_ms']['p99']:.0f} ms")
        finally:
            procs.stop_all()
    results["scale_eureka"] = out
    # The registry on its own, in-process, up to the largest size (10 instances per VIP):
    # registrations/s and RSS at 10k, 100k, 1M; an eviction round and the reads at that size.
    most = max(cfg["scale_eureka_vips"], default=0) * 10
    if most >= 10000:
        load = bench_json("registry-load", "--instances", most)
        results["registry_load"] = load
        rates = ", ".join(f"{c['registrations_per_second']:.0f}/s at {c['instances']}" for c in load["checkpoints"])
        log(f"registry-load: {rates}; {load['checkpoints'][-1]['bytes_per_instance']:.0f} bytes per instance")


def bench_peers(cfg, workdir, results):
    """Section 4 for peered embedded registries: how long a registration on one node takes to be
    served by its peer, under a steady registration load on the first (`odmesh-bench replication-lag`)."""
    out = []
    for rate in cfg["peers_rates"]:
        procs = Procs(workdir)
        try:
            eureka = [free_port(), free_port()]
            peers = [a for port in eureka for a in ("--peer", f"http://127.0.0.1:{port}/eureka")]
            nodes = []
            for i, port in enumerate(eureka):
                xds, admin = free_port(), free_port()
                p = procs.start(f"peer-{rate}-{i}", [CONTROL, "--serve-eureka", f"127.0.0.1:{port}", "--xds",
                                                     f"127.0.0.1:{xds}", "--admin", f"127.0.0.1:{admin}",
                                                     "--no-prewarm", "--registry-warmup", "0",
                                                     "--max-lease-duration", "3600", *peers],
                                env={"NO_COLOR": "1", "RUST_LOG": "warn"})
                wait_for("peer ready", lambda a=admin: http_get(f"http://127.0.0.1:{a}/readyz") is not None,
                         timeout=60, every=0.1)
                p.admin = admin
                nodes.append(p)
            cpu0 = [cpu_seconds(p.pid) for p in nodes]
            lag = bench_json("replication-lag", "--origin", f"127.0.0.1:{eureka[0]}", "--peer",
                             f"127.0.0.1:{eureka[1]}", "--rate", rate, "--seconds", cfg["peers_seconds"])
            lag["cpu_seconds"] = [cpu_seconds(p.pid) - c for p, c in zip(nodes, cpu0)]
            lag["rss_bytes"] = [rss_bytes(p.pid) for p in nodes]
            out.append(lag)
            log(f"peers at {rate}/s asked: {lag['registrations_per_s']:.0f}/s sent, lag p50 "
                f"{lag['lag_ms_p50']:.2f} ms p99 {lag['lag_ms_p99']:.2f} ms max {lag['lag_ms_max']:.1f} ms "
                f"({lag['probes']} probes)")
        finally:
            procs.stop_all()
    results["peers"] = out


# ---------------------------------------------------------------------------------------------
# 4, beside go-control-plane

GCP = ROOT / "target/release/odmesh-gcp"


def start_gcp(procs, dump, name):
    """bench/gcp (go-control-plane) serving `dump`; its log stamps the dump's reloads."""
    xds = free_port()
    p = procs.start(name, [GCP, "-dump", dump, "-listen", f"127.0.0.1:{xds}"])
    wait_for("go-control-plane serving", lambda: "serving" in p.logpath.read_text(), timeout=120, every=0.1)
    p.xds = xds
    return p


def bench_gcp(cfg, workdir, results):
    """xds-load against go-control-plane (bench/gcp: a LinearCache per type behind a MuxCache,
    serving `xds-dump`'s resources of the registry) and against odmesh-control's file source,
    alternating, `gcp_runs` times each at every count of `gcp_proxies`. Writes
    docs/bench/gcp-<commit>.json (quick: under quick/) with the command and the binaries' sha256."""
    go = shutil.which("go")
    if not go:
        log("gcp: skipped: no `go` on PATH (bench/gcp is a Go program)")
        return
    subprocess.run([go, "build", "-o", GCP, "."], cwd=ROOT / "bench/gcp", check=True)
    # One descriptor per simulated proxy in xds-load and in the server, inherited by both.
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(cfg["gcp_proxies"]) + 1000
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))
    n = cfg["gcp_vips"]
    reg, dump = workdir / f"gcp-{n}.yaml", workdir / f"gcp-{n}.bin"
    # The server on one core and the load generator on the other, so that neither's CPU is the
    # other's limit (the generator decodes and ACKs every proxy's responses).
    pinned = {"server": "0", "load": "1"} if (os.cpu_count() or 1) >= 2 else None
    runs = []
    for proxies in cfg["gcp_proxies"]:
        for r in range(cfg["gcp_runs"]):
            for server in ("gcp", "odmesh"):
                procs = Procs(workdir)
                try:
                    bench_json("gen-registry", "--out", reg, "--vips", n, "--instances", 10)
                    bench_json("xds-dump", "--registry", reg, "--out", dump)
                    name = f"{server}-{proxies}-{r}"
                    # 10,000 proxies from one address: above odmesh's default bounds (not what is measured).
                    bounds = ["--xds-max-connections", "20000", "--xds-max-connections-per-source", "20000"]
                    cp = (start_gcp(procs, dump, name) if server == "gcp"
                          else start_control(procs, reg, name=name, extra=bounds))
                    args = ["xds-load", "--xds", f"127.0.0.1:{cp.xds}", "--control-pid", cp.pid,
                            "--control-log", cp.logpath, "--registry", reg, "--vips", n, "--instances", 10,
                            "--proxies", proxies, "--subs", 30, "--samples", cfg["gcp_samples"],
                            "--flips", cfg["gcp_flips"]] + (["--dump", dump] if server == "gcp" else [])
                    if pinned:
                        subprocess.run(["taskset", "-a", "-p", "-c", pinned["server"], str(cp.pid)],
                                       check=True, capture_output=True)
                    load_before = open("/proc/loadavg").read().strip()
                    try:
                        load = bench_json(*args, cpus=pinned and pinned["load"])
                    except RuntimeError as e:
                        log(f"gcp: {name}: failed: {e}")
                        runs.append({"server": server, "proxies": proxies, "run": r, "failed": str(e)[-500:]})
                        continue
                    load.update({"server": server, "run": r, "loadavg_before": load_before, "cpus": pinned,
                                 "loadavg_after": open("/proc/loadavg").read().strip(),
                                 "command": (f"taskset -c {pinned['load']} " if pinned else "") + "odmesh-bench " + " ".join(recorded(a) if isinstance(a, Path) else str(a) for a in args)})
                    runs.append(load)
                    per = (load["rss_connected"]["rss_bytes"] - load["rss_idle"]["rss_bytes"]) / proxies
                    log(f"gcp: {name}: answer p50/p99 {load['answer_cds_ms']['p50']:.3f}/{load['answer_cds_ms']['p99']:.3f} ms "
                        f"(+CLA {load['answer_eds_ms']['p50']:.3f}/{load['answer_eds_ms']['p99']:.3f}), "
                        f"RSS {load['rss_idle']['rss_bytes'] / 2**20:.0f}→{load['rss_connected']['rss_bytes'] / 2**20:.0f} MiB "
                        f"({per / 1024:.1f} KiB/proxy), fan-out from rename p50/p99 "
                        f"{load['fanout_from_rename_ms']['p50']:.0f}/{load['fanout_from_rename_ms']['p99']:.0f} ms, "
                        f"from built {load['fanout_from_built_ms']['p50']:.0f}/{load['fanout_from_built_ms']['p99']:.0f} ms")
                finally:
                    procs.stop_all()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    record = {"command": " ".join(["bench/run.py", *sys.argv[1:]]), "recorded_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "commit": commit, "machine": results["machine"], "config": {k: v for k, v in cfg.items() if k.startswith("gcp")},
              "binaries": {recorded(b): sha256(b) for b in (BENCH, CONTROL, GCP)}, "runs": runs}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"gcp-{commit or 'unknown'}.json").write_text(json.dumps(record, indent=1) + "\n")
    results["gcp"] = record


# ---------------------------------------------------------------------------------------------
# 10. Following a Eureka server at scale


def bench_follow(cfg, workdir, results):
    """`odmesh-bench follow-load`: odmesh-control following `eureka-serve` (generated Spring-like
    instances, gzip, deltas once it changes), and an embedded registry filling from it as a peer."""
    out = []
    for n in cfg["follow_instances"]:
        r = bench_json("follow-load", "--control", CONTROL, "--instances", n, "--full-fetches", cfg["follow_full"],
                       "--deltas", cfg["follow_deltas"], "--interval", 1, "--timeout", 900)
        out.append(r)
        if "failed" in r:
            log(f"follow {n}: failed: {r['failed'][:300]}")
            continue
        log(f"follow {n}: first registry {r['first']['seconds']:.1f} s, RSS {r['first']['rss_bytes'] / 2**20:.0f} MiB; "
            f"after {r['full_fetches']['count']} full fetches {r['full_fetches']['rss_bytes'] / 2**20:.0f} MiB; "
            f"after {r['deltas']['count']} deltas {r['deltas']['rss_bytes'] / 2**20:.0f} MiB "
            f"(peak {r['deltas']['peak_rss_bytes'] / 2**20:.0f} MiB)")
    for n in cfg["follow_peer_instances"]:
        r = bench_json("follow-load", "--peer-fill", "--control", CONTROL, "--instances", n, "--timeout", 900)
        out.append(r)
        if "failed" in r:
            log(f"peer fill {n}: failed: {r['failed'][:300]}")
            continue
        log(f"peer fill {n}: {r['first']['seconds']:.1f} s, RSS {r['first']['rss_bytes'] / 2**20:.0f} MiB "
            f"(peak {r['first']['peak_rss_bytes'] / 2**20:.0f} MiB)")
    results["follow"] = {"control_sha256": sha256(CONTROL), "runs": out}


# ---------------------------------------------------------------------------------------------
# 5. The filter


def bench_filter(cfg, workdir, results):
    cmd = ["cargo", "bench", "-j2", "-p", "odmesh-filter", "--bench", "mapping", "--", "--noplot"]
    if cfg["quick"]:
        cmd += ["--warm-up-time", "1", "--measurement-time", "2"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    crit = {}
    for est in sorted((ROOT / "target/criterion").glob("*/*/new/estimates.json")):
        e = json.loads(est.read_text())
        crit[f"{est.parts[-4]}/{est.parts[-3]}"] = e["median"]["point_estimate"]
    results["filter"] = {"criterion_median_ns": crit, "wasm_bytes": WASM.stat().st_size}
    log(f"filter: {crit}")


# ---------------------------------------------------------------------------------------------
# The report


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    envoy_v = subprocess.run([ENVOY, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    # Envoy's version line is "<its path>  version: ..."; the report names the path as `recorded`.
    envoy = f"{recorded(ENVOY)}  version: {envoy_v[-1].split(' version: ', 1)[-1]}" if envoy_v else "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**20, 1),
            "kernel": platform.release(), "envoy": envoy,
            "loadavg_start": open("/proc/loadavg").read().strip()}


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def control_metrics(admin):
    """The control plane's `/metrics` on the admin port `admin`, as {series: value}, and each
    labelled family's sum under its bare name (`odmesh_xds_acks_total` beside
    `odmesh_xds_acks_total{type="cluster"}`)."""
    out = {}
    for line in http_get(f"http://127.0.0.1:{admin}/metrics").splitlines():
        if not line.startswith("#") and " " in line:
            k, v = line.rsplit(" ", 1)
            out[k] = int(float(v))
            if "{" in k:
                family = k.split("{", 1)[0]
                out[family] = out.get(family, 0) + int(float(v))
    return out


def begin(script, needs):
    """The start of a benchmark script of its own (bench/failover.py, bench/flood.py): Envoy
    found, every path of `needs` present (else exits naming `make bench-build`), a work folder
    for the logs, and the report's first fields: the machine, the command, the time, the
    sha256 of the control plane and of the filter."""
    global ENVOY
    ENVOY = envoy_binary()
    for need in needs:
        if not Path(need).exists():
            sys.exit(f"missing {need}: run `make bench-build`")
    workdir = Path(tempfile.mkdtemp(prefix=f"odmesh-{script}-"))
    log(f"work folder (logs): {workdir}")
    results = {"machine": machine(), "command": " ".join([os.path.relpath(Path(sys.argv[0]).resolve(), ROOT), *sys.argv[1:]]),
               "recorded_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
               "control": recorded(CONTROL), "control_sha256": sha256(CONTROL), "wasm_sha256": sha256(WASM)}
    return workdir, results


def fmt_us(v):
    return f"{v:,.0f} µs" if v >= 10 else f"{v:.1f} µs"


def write_report(cfg, results, argv):
    OUT.mkdir(parents=True, exist_ok=True)
    m = results["machine"]
    L = [f"# odmesh benchmark results ({'quick' if cfg['quick'] else 'full'} run)", "",
         f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{' '.join(argv)}` "
         f"(`make {'bench-quick' if cfg['quick'] else 'bench'}`). Raw figures: `latest.json`."
         + (f" Sections {results['rerun']}; the others are from the previous run." if results.get("rerun") else ""), "",
         "## Machine", "",
         f"- CPU: {m['cpu']}, {m['cores']} cores; memory {m['memory_gib']} GiB; kernel {m['kernel']}",
         f"- Envoy: {m['envoy']}",
         f"- /proc/loadavg at start: `{m['loadavg_start']}`; at end: `{m.get('loadavg_end', '?')}`", ""]
    if "first_request" in results:
        f = results["first_request"]
        L += ["## 1. First request to a never-seen VIP", "",
              f"{f['vips']} new VIPs per Envoy × {f['reps']} fresh Envoys (`--concurrency 1`), each VIP "
              "registered with one nginx endpoint; the first request on a keep-alive connection (Envoy "
              "discovers the cluster meanwhile) against the median of 5 warm requests right after.", "",
              "| | p50 | p90 | p99 | max |", "|---|---|---|---|---|"]
        rows = [("first_us", "first request"), ("warm_us", "warm request"), ("added_us", "**added by discovery**")]
        if "predicted_added_us" in f:
            rows += [("predicted_first_us", "predicted VIP (prewarmed), first request"),
                     ("predicted_warm_us", "predicted VIP, warm request"),
                     ("predicted_added_us", "**predicted VIP: added over warm**")]
        if "new_connection_added_us" in f:
            rows += [("new_connection_first_us", "warm VIP (the predicted ones again) on a new client connection"),
                     ("new_connection_added_us", "**warm VIP, new client connection: added over warm**")]
        for k, label in rows:
            s = f[k]
            L.append(f"| {label} | {fmt_us(s['p50'])} | {fmt_us(s['p90'])} | {fmt_us(s['p99'])} | {fmt_us(s['max'])} |")
        L += ["", "Target: p50 < 1,000 µs, p99 < 3,000 µs added. Reference (prototype): +2.4 ms p50, +3.0 ms p90.",
              "", "![first-request latency added](first-request.svg)", ""]
    if "overhead" in results:
        o = results["overhead"]
        med = o["median"]
        L += ["## 2. Per-request overhead (and 5. the filter's share)", "",
              f"wrk -t1 -c32, {cfg['overhead_seconds']} s windows, {cfg['overhead_rounds']} rounds alternating the "
              "three Envoys (each `--concurrency 1`, same nginx upstream); Envoy CPU from /proc/<pid>/stat."
              + (f" Filter: {o['wasm']['bytes']:,} bytes, sha256 {o['wasm']['sha256'][:12]}." if "wasm" in o else ""), "",
              "| configuration | Envoy CPU per request (median) | requests/s (median) | ratio of baseline (CPU) | ratio (req/s) |",
              "|---|---|---|---|---|"]
        base = med["static"]
        for k, label in [("static", "static route (baseline)"), ("wasm", "wasm filter + static cluster"),
                         ("odmesh", "full odmesh chain (wasm → on_demand → router), warm")]:
            L.append(f"| {label} | {med[k]['cpu_us_per_req']:.1f} µs | {med[k]['rps']:,.0f} | "
                     f"{base['cpu_us_per_req'] / med[k]['cpu_us_per_req']:.2f} | {med[k]['rps'] / base['rps']:.2f} |")
        L += ["", f"Median of the per-round CPU ratios (the three windows of a round run back to back): odmesh chain "
              f"{o['paired_cpu_ratio_odmesh']:.2f}, wasm only {o['paired_cpu_ratio_wasm']:.2f}. Per-round CPU per request "
              "(µs): " + "; ".join(f"{k} " + ", ".join(f"{r['cpu_us_per_req']:.0f}" for r in v) for k, v in o["rounds"].items()) + ".",
              "", f"The wasm filter's share of the odmesh chain's Envoy CPU per request: "
              f"{o['wasm_share_of_odmesh_cpu'] * 100:.0f}%. Target: ≥ 0.90 of baseline. Reference: 0.71.", ""]
    if "memory_on_demand" in results:
        mo = results["memory_on_demand"]
        n = results["first_request"]["vips"]
        L += ["## 3. Envoy memory per cluster", "",
              "| how the clusters got there | clusters | allocated per cluster | RSS per cluster | total allocated |",
              "|---|---|---|---|---|",
              f"| on demand (odmesh) | 20 | {mo['per_cluster_20_allocated'] / 1024:.1f} KB | {mo['per_cluster_20_rss'] / 1024:.1f} KB | "
              f"{mo['runs'][0]['after_21']['allocated'] / 2**20:.1f} MiB |",
              f"| on demand (odmesh) | {n} | {mo[f'per_cluster_{n}_allocated'] / 1024:.1f} KB | "
              f"{mo[f'per_cluster_{n}_rss'] / 1024:.1f} KB | {mo['runs'][0][f'after_{21 + n}']['allocated'] / 2**20:.1f} MiB |"]
        if "prewarmed_per_cluster_allocated" in mo:
            clusters = mo["prewarmed_runs"][0]["clusters"]
            L.append(f"| prewarmed (sent ahead from the history as Envoy starts; no connection yet) | {clusters} | "
                     f"{mo['prewarmed_per_cluster_allocated'] / 1024:.1f} KB | | "
                     f"{mo['prewarmed_runs'][0]['start']['allocated'] / 2**20:.1f} MiB |")
            L.append(f"| prewarmed, then its first request: + the upstream connection | {n} | "
                     f"+{mo[f'prewarmed_connection_per_cluster_{n}_allocated'] / 1024:.1f} KB | | |")
        for row in results.get("memory_discovered", []):
            L.append(f"| on demand, with its connection ({row['workers']} worker{'s' if row['workers'] > 1 else ''}) | "
                     f"{row['vips']:,} | {row['per_cluster_discovered']['allocated'] / 1024:.1f} KB | "
                     f"{row['per_cluster_discovered']['rss'] / 1024:.1f} KB | {row['memory']['after_n']['allocated'] / 2**20:.0f} MiB |")
            L.append(f"| the same sent ahead by prewarm, no connection ({row['workers']} worker{'s' if row['workers'] > 1 else ''}) | "
                     f"{row['pushed_clusters']:,} | {row['per_cluster_pushed']['allocated'] / 1024:.1f} KB | "
                     f"{row['per_cluster_pushed']['rss'] / 1024:.1f} KB | {row['memory']['pushed']['allocated'] / 2**20:.0f} MiB |")
        for row in results.get("memory_push_all", []):
            pc = row.get("per_cluster", {})
            what = ("same Cluster/CLA as odmesh" if row.get("variant", "odmesh") == "odmesh"
                    else f"clusters `--variant {row['variant']}`")
            L.append(f"| push all (bench push-all ADS server, {what}) | {row['vips']:,} | "
                     f"{pc.get('allocated', 0) / 1024:.1f} KB | {pc.get('rss', 0) / 1024:.1f} KB | "
                     f"{row['memory']['allocated'] / 2**20:.0f} MiB (warm in {row['warm_seconds']:.1f} s) |")
        L += ["", f"Baseline Envoy (odmesh bootstrap, no cluster yet): {mo['baseline']['allocated'] / 2**20:.1f} MiB "
              f"allocated, {mo['baseline']['rss'] / 2**20:.1f} MiB RSS. KB = 1024 bytes. Target: < 30 KB per "
              "discovered cluster. Reference: 84 KB on demand, 50-61 KB pushed.", ""]
        pa = results.get("memory_push_all")
        if pa:
            big = pa[-1]
            L += [f"A proxy that uses 20 clusters holds {mo['per_cluster_20_allocated'] * 20 / 2**20:.2f} MiB of "
                  f"cluster state on demand against {(big['memory']['allocated'] - mo['baseline']['allocated']) / 2**20:.0f} MiB "
                  f"with all {big['vips']:,} pushed: "
                  f"{(big['memory']['allocated'] - mo['baseline']['allocated']) / max(1, mo['per_cluster_20_allocated'] * 20):,.0f}× less.", ""]
    if "scale" in results:
        L += ["## 4. Control-plane scale", "",
              f"`odmesh-bench xds-load`: {cfg['scale_proxies']} simulated proxies (one gRPC connection and delta "
              f"ADS stream each) × 30 subscribed clusters (and their load assignments); {cfg['scale_samples']} "
              f"on-demand requests timed one at a time (subscribe the Cluster, then its load assignment unless the server "
              f"pushed it along, as Envoy does); {cfg['scale_flips']} registry changes of 1% of the "
              "instances (status UP↔DOWN) each. Registry: the YAML file form, 10 instances per VIP.", "",
              "| VIPs | endpoints | CP RSS loaded | CP RSS, proxies connected (peak) | answer p50 / p99 (Cluster) | to its load assignment (warm) p50 / p99 | xDS fan-out p50 / p99 | fan-out from parsed p50 / p99 | CPU s per change |",
              "|---|---|---|---|---|---|---|---|---|"]
        for s in results["scale"]:
            cpu = statistics.median(f["cpu_seconds_incl_rereads"] for f in s["flips"]) if s["flips"] else float("nan")
            rl = statistics.median(f["rename_to_loaded_ms"] for f in s["flips"]) if s["flips"] else float("nan")
            L.append(f"| {s['vips']:,} | {s['endpoints']:,} | {s['rss_idle']['rss_bytes'] / 2**20:.0f} MiB | "
                     f"{s['rss_connected']['rss_bytes'] / 2**20:.0f} MiB (peak {s['rss_end']['peak_rss_bytes'] / 2**20:.0f}) | "
                     f"{s['answer_cds_ms']['p50']:.3f} / {s['answer_cds_ms']['p99']:.3f} ms | "
                     f"{s['answer_eds_ms']['p50']:.3f} / {s['answer_eds_ms']['p99']:.3f} ms | "
                     f"{s['fanout_from_applied_ms']['p50']:.1f} / {s['fanout_from_applied_ms']['p99']:.1f} ms | "
                     f"{s['fanout_from_loaded_ms']['p50']:.1f} / {s['fanout_from_loaded_ms']['p99']:.1f} ms | "
                     f"{cpu:.2f} |")
        L += ["", "Where a registry change's time goes (medians over the changes):", "",
              "| VIPs | registry file | parse: YAML (peak RSS) | parse: Eureka JSON (peak RSS) | rename → parsed (poll + parse) | parsed → snapshot built | snapshot built → applied |",
              "|---|---|---|---|---|---|---|"]
        for s in results["scale"]:
            med = lambda k: statistics.median(f[k] for f in s["flips"]) if s["flips"] else float("nan")
            p, js = s["parse"], s["parse"].get("eureka_json")
            jtxt = f"{js['parse_seconds']:.2f} s ({js['peak_rss_bytes'] / 2**20:.0f} MiB)" if js else "not run (memory)"
            L.append(f"| {s['vips']:,} | {s['registry_bytes'] / 2**20:.1f} MiB | {p['parse_seconds']:.2f} s "
                     f"({p['peak_rss_bytes'] / 2**20:.0f} MiB) | {jtxt} | {med('rename_to_loaded_ms'):.0f} ms | "
                     f"{med('loaded_to_snapshot_built_ms'):.0f} ms | "
                     f"{med('loaded_to_snapshot_applied_ms') - med('loaded_to_snapshot_built_ms'):.0f} ms |")
        L += ["", "xDS fan-out: from the cache holding the new snapshot (`snapshot applied` in the control "
              "plane's log) to each affected proxy's receipt of its new load assignments. Fan-out from parsed: "
              "from the file source's `registry loaded` (the file is parsed), so it adds building the snapshot. "
              "The file source's poll (200 ms) and YAML parse come before that. CPU per change includes the "
              "file source's re-reads of a just-modified file (2 s). Targets: 1M endpoints < 1 GiB, answer "
              "p99 < 1 ms, fan-out p99 < 100 ms.", "", "![control-plane scaling](control-plane-scaling.svg)", ""]
    if results.get("scale_eureka"):
        L += ["### Through the embedded Eureka registry (the default source)", "",
              "The same load generator against `odmesh-control --serve-eureka`: every instance registered first "
              f"(POST `/eureka/apps/{{APP}}`, 8 connections), then {cfg['scale_flips']} changes of the same 1% of "
              "the instances, each its own REST call (`PUT .../status?value=OUT_OF_SERVICE`, then `DELETE "
              ".../status`), sent as fast as the registry answers. Change to proxy: from sending a VIP's status "
              "change to each subscribed proxy's receipt of that VIP's new load assignment, over every "
              "(proxy, changed VIP) pair.", "",
              "| VIPs | instances | registrations/s | CP RSS registered / proxies connected | answer p50 / p99 | "
              "1% of statuses sent in | change to proxy p50 / p90 / p99 | CPU s per 1% change |",
              "|---|---|---|---|---|---|---|---|"]
        for s in results["scale_eureka"]:
            if "failed" in s:
                L.append(f"| {s['vips']:,} | failed: see latest.json | | | | | | |")
                continue
            r, c = s["registered"], s["change_to_proxy_ms"]
            send = statistics.median(f["send_seconds"] for f in s["flips"]) if s["flips"] else float("nan")
            cpu = statistics.median(f["cpu_seconds"] for f in s["flips"]) if s["flips"] else float("nan")
            L.append(f"| {s['vips']:,} | {r['instances']:,} | {r['registrations_per_second']:,.0f} | "
                     f"{r['rss']['rss_bytes'] / 2**20:.0f} / {s['rss_connected']['rss_bytes'] / 2**20:.0f} MiB | "
                     f"{s['answer_cds_ms']['p50']:.3f} / {s['answer_cds_ms']['p99']:.3f} ms | {send:.2f} s | "
                     f"{c['p50']:.0f} / {c['p90']:.0f} / {c['p99']:.0f} ms | {cpu:.2f} |")
        L.append("")
    if results.get("gcp"):
        g = results["gcp"]
        L += ["### Beside go-control-plane", "",
              f"The same `xds-load` ({g['config']['gcp_vips']:,} VIPs × 10 instances, 30 subscriptions per proxy) against "
              "`bench/gcp` (go-control-plane v0.14.0: a `LinearCache` per type behind a `MuxCache`, serving "
              "`odmesh-bench xds-dump`'s resources; a change is a new dump, renamed into place, polled every 200 ms) "
              "and against `odmesh-control --registry` (a new YAML file, polled every 200 ms), alternating. "
              "Fan-out from the rename includes each one's poll and read (odmesh: YAML parse and snapshot; "
              "gcp: protobuf decode, the resources were built by xds-load); from the change ready: odmesh's "
              "`snapshot built`, gcp's `dump diffed` (changed resources found, before `UpdateResources`). "
              f"Raw: `gcp-{g['commit']}.json`.", "",
              "| server | proxies | run | answer p50 / p99 (Cluster) | + load assignment p50 / p99 | RSS loaded → proxies | per proxy | "
              "fan-out from rename p50 / p99 | from change ready p50 / p99 | load avg before → after |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for s in g["runs"]:
            if "failed" in s:
                L.append(f"| {s['server']} | {s['proxies']:,} | {s['run']} | failed: see the JSON | | | | | | |")
                continue
            per = (s["rss_connected"]["rss_bytes"] - s["rss_idle"]["rss_bytes"]) / s["proxies"]
            L.append(f"| {s['server']} | {s['proxies']:,} | {s['run']} | "
                     f"{s['answer_cds_ms']['p50']:.3f} / {s['answer_cds_ms']['p99']:.3f} ms | "
                     f"{s['answer_eds_ms']['p50']:.3f} / {s['answer_eds_ms']['p99']:.3f} ms | "
                     f"{s['rss_idle']['rss_bytes'] / 2**20:.0f} → {s['rss_connected']['rss_bytes'] / 2**20:.0f} MiB | "
                     f"{per / 1024:.1f} KiB | "
                     f"{s['fanout_from_rename_ms']['p50']:.0f} / {s['fanout_from_rename_ms']['p99']:.0f} ms | "
                     f"{s['fanout_from_built_ms']['p50']:.0f} / {s['fanout_from_built_ms']['p99']:.0f} ms | "
                     f"{s['loadavg_before'].split()[0]} → {s['loadavg_after'].split()[0]} |")
        L.append("")
    if results.get("peers"):
        L += ["### Peered embedded registries: replication lag", "",
              "Two `odmesh-control --serve-eureka ... --peer ...` nodes. `odmesh-bench replication-lag` "
              "registers at the asked rate on the first (16 keep-alive connections, 50,000 ids in turn) and, "
              "one at a time every 10 ms, registers a probe instance there and polls the second node for it "
              "until it answers: the lag is from the first node's 204 to the second's first 200 (the poll adds "
              "about 0.1 ms).", "",
              "| asked /s | sent /s | failed | probes | lag p50 / p99 / max | CPU s (origin, peer) |",
              "|---|---|---|---|---|---|"]
        for g in results["peers"]:
            L.append(f"| {g['rate_asked']:,} | {g['registrations_per_s']:,.0f} | {g['registrations_failed']} | "
                     f"{g['probes']} | {g['lag_ms_p50']:.2f} / {g['lag_ms_p99']:.2f} / {g['lag_ms_max']:.1f} ms | "
                     f"{g['cpu_seconds'][0]:.1f}, {g['cpu_seconds'][1]:.1f} |")
        L.append("")
    if "filter" in results:
        fl = results["filter"]
        L += ["## 5. The filter", "", f"- `dist/odmesh_filter.wasm`: {fl['wasm_bytes']:,} bytes",
              "- Native mapping micro-benchmark (criterion, median per call):"]
        for k, v in fl["criterion_median_ns"].items():
            L.append(f"  - `{k}`: {v:.0f} ns")
        L.append("")
    if results.get("follow"):
        L += ["## 10. Following a Eureka server at scale", "",
              "`odmesh-bench follow-load`: `odmesh-control --eureka URL --eureka-interval 1` (release, sha256 "
              f"`{results['follow']['control_sha256'][:16]}…`) following `odmesh-bench eureka-serve` (generated "
              "Spring-like instances, about 1 KB of JSON each, 10 per app, gzip; its delta answers 404 until it "
              "starts changing 1% of the instances a second); `peer-fill`: `--serve-eureka --peer URL` filling from it.", "",
              "| mode | instances | `/apps` plain / gzip | first complete registry | RSS then (peak) | "
              "after full fetches | after deltas (peak) | RSS per instance |",
              "|---|---|---|---|---|---|---|---|"]
        for r in results["follow"]["runs"]:
            sv = r["server"]
            docs = f"{sv['apps_bytes'] / 2**20:,.0f} / {sv['apps_gzip_bytes'] / 2**20:,.1f} MiB"
            if "failed" in r:
                L.append(f"| {r['mode']} | {r['instances']:,} | {docs} | failed: see latest.json | | | | |")
                continue
            f = r["first"]
            mib = lambda b: f"{b / 2**20:,.0f} MiB"
            full = r.get("full_fetches")
            deltas = r.get("deltas")
            last = deltas or f
            L.append(f"| {r['mode']} | {r['instances']:,} | {docs} | {f['seconds']:.1f} s | "
                     f"{mib(f['rss_bytes'])} ({mib(f['peak_rss_bytes'])}) | "
                     + (f"{mib(full['rss_bytes'])} ({full['count']}) | " if full else "| ")
                     + (f"{mib(deltas['rss_bytes'])} ({mib(deltas['peak_rss_bytes'])}), {deltas['count']} deltas, "
                        f"{deltas['hash_mismatches']} mismatched | " if deltas else "| ")
                     + f"{last['rss_bytes'] / r['instances']:,.0f} B |")
        L.append("")
    L += ["## Commands", "", "```sh", "make bench-deps   # nginx-light, nghttp2-client, wrk (apt)",
          f"make {'bench-quick' if cfg['quick'] else 'bench'}", f"# = {' '.join(argv)} (after building release binaries and the wasm)",
          "```", ""]
    (OUT / "latest.md").write_text("\n".join(L))
    slim = json.loads(json.dumps(results))
    (OUT / "latest.json").write_text(json.dumps(slim, indent=1) + "\n")
    if "first_request" in results:
        svg.histogram(OUT / "first-request.svg", [v / 1000 for v in results["first_request"]["added_samples_us"]],
                      "Latency added to the first request to a new VIP", "added latency (ms)", "requests",
                      markers=[(1.0, "target p50"), (3.0, "target p99")])
    if "scale" in results and results["scale"]:
        xs = [s["vips"] for s in results["scale"]]
        svg.scaling(OUT / "control-plane-scaling.svg", xs, [
            ("RSS with proxies (MiB)", [s["rss_connected"]["rss_bytes"] / 2**20 for s in results["scale"]]),
            ("answer p99 (µs)", [s["answer_cds_ms"]["p99"] * 1000 for s in results["scale"]]),
            ("xDS fan-out p99 (ms)", [s["fanout_from_applied_ms"]["p99"] for s in results["scale"]]),
            ("parsed→proxies p99 (ms)", [s["fanout_from_loaded_ms"]["p99"] for s in results["scale"]]),
        ], "odmesh-control as the registry grows (10 instances per VIP)", "VIPs in the registry")
    log(f"wrote {recorded(OUT / 'latest.md')}")


QUICK = {"quick": True, "first_vips": 200, "first_reps": 1, "overhead_rounds": 3, "overhead_seconds": 5,
         "push_all_vips": [1000], "scale_vips": [1000, 10000], "scale_proxies": 200, "scale_samples": 300,
         "scale_flips": 2, "scale_eureka_vips": [1000], "peers_rates": [2000], "peers_seconds": 5, "discovered_vips": [1000], "discovered_workers": [1],
         "follow_instances": [10000, 100000], "follow_peer_instances": [100000], "follow_full": 2, "follow_deltas": 2,
         "push_all_variants": ["inline", "bare"],
         "gcp_vips": 1000, "gcp_proxies": [200], "gcp_runs": 1, "gcp_samples": 300, "gcp_flips": 2}
FULL = {"quick": False, "first_vips": 250, "first_reps": 3, "overhead_rounds": 6, "overhead_seconds": 10,
        "push_all_vips": [1000, 10000], "scale_vips": [1000, 10000, 100000], "scale_proxies": 1000,
        "scale_samples": 2000, "scale_flips": 4, "scale_eureka_vips": [1000, 10000, 100000],
        "peers_rates": [1000, 10000], "peers_seconds": 20,
        "follow_instances": [10000, 100000, 1000000], "follow_peer_instances": [100000, 1000000],
        "follow_full": 3, "follow_deltas": 3,
        "discovered_vips": [1000, 10000], "discovered_workers": [1, 4],
        "push_all_variants": ["inline", "no-outlier", "no-breakers", "bare"],
        "gcp_vips": 1000, "gcp_proxies": [1000, 10000], "gcp_runs": 2, "gcp_samples": 2000, "gcp_flips": 4}
SECTIONS = {"first": bench_first, "overhead": bench_overhead, "memory": bench_push_all,
            "discovered": bench_discovered, "scale": bench_scale, "gcp": bench_gcp,
            "eureka": bench_scale_eureka, "peers": bench_peers, "follow": bench_follow, "filter": bench_filter}


def main():
    global ENVOY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=",".join(SECTIONS))
    args = ap.parse_args()
    cfg = QUICK if args.quick else FULL
    global OUT
    if args.quick:  # never overwrites the recorded full run
        OUT = OUT / "quick"
    ENVOY = envoy_binary()
    sections = args.only.split(",")
    # Only the sections that run Envoy need the filter.
    needs = [BENCH, CONTROL] + ([WASM] if set(sections) - {"scale", "gcp", "eureka", "peers", "follow"} else [])
    for need in needs:
        if not need.exists():
            sys.exit(f"missing {need}: run `make bench` (or bench-quick), which builds it")
    results = {"machine": machine(), "config": cfg}
    previous = OUT / "latest.json"
    if args.only != ",".join(SECTIONS) and previous.exists():
        # A partial run updates the last report: its other sections stay as they were.
        old = json.loads(previous.read_text())
        if old.get("config", {}).get("quick") == cfg["quick"]:
            results = {**old, "machine": results["machine"], "config": cfg}
            results["rerun"] = f"{args.only} re-run at {time.strftime('%H:%M UTC', time.gmtime())}"
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-bench-"))
    log(f"work folder (logs): {workdir}")
    for name in sections:
        log(f"--- {name}")
        SECTIONS[name](cfg, workdir, results)
    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().strip()
    write_report(cfg, results, ["bench/run.py"] + sys.argv[1:])


if __name__ == "__main__":
    main()
