#!/usr/bin/env python3
"""The request chains side by side, in alternating rounds of one run (issue 29, "No filter on the
request path"; `make bench-shells`).

    bench/chains.py                                        # 20 rounds of 4 s
    bench/chains.py --rounds 70 --seconds 4 --out docs/bench/chains.json
    bench/chains.py --only native,wasm                     # static and those two
    bench/chains.py --policy policy.yaml ...               # the control plane's policy file
    bench/chains.py --chain wasm-hand-abi=$(bench/probes/hand_abi_wasm.sh 702a260 hand-abi.wasm) \\
        --chain native-filter=$(bench/probes/native_at.sh ca74098)

One nginx upstream, one `odmesh-control --registry FILE` (release build; prewarm on, as by
default, so that Envoy's load reports are answered) whose registry has the VIP `fr-000000` (one
instance: the nginx), and one Envoy per chain, each `--concurrency 1`:

- `static`: a plain static route to a static cluster (bench/run.py's baseline), the ratios'
  denominator;
- `floor`: envoy/odmesh.yaml's chain with no odmesh code: its route (`cluster_header:
  x-odmesh-cluster`: inline in the bootstrap, or served by the control plane over RDS for a
  proxy whose node metadata says the wasm filter maps), on_demand and the router, nothing else
  (the wasm filter and, when the bootstrap has it, header_mutation taken out); the client sends
  `x-odmesh-cluster: fr-000000.vip` itself;
- `native`: envoy/odmesh-native.yaml as shipped (the module as the route's cluster specifier,
  the route inline or by RDS);
- `wasm`: envoy/odmesh.yaml as shipped (dist/odmesh_filter.wasm);
- `wasm-empty`: envoy/odmesh.yaml with the wasm module replaced by bench/wasm_floor.py's
  `no-callbacks` module (what the wasm filter costs by itself); it maps nothing, so the client
  sends the cluster header;
- each `--chain NAME=FILE`: a `.so` in envoy/odmesh-native.yaml's place of the module, a
  `.wasm` in envoy/odmesh.yaml's, or `BOOTSTRAP.yaml[:MODULE]`, another bootstrap (say one of an
  older commit, `git show COMMIT:envoy/odmesh-native.yaml`; bench/probes/native_at.sh builds
  its module) with the same edits and its one module path (`filename:` or `module: dist/...`)
  replaced by MODULE (without MODULE: made absolute against the folder above the bootstrap's, a
  checkout's root). Such a chain sends only the Host header.

The shipped bootstraps are read at run time, without their comment lines, and edited as
tests/src/mesh.rs `odmesh_bootstrap` does: the listener (15001), the admin (9901), the xDS
endpoint (18000) and the module's relative path, each edit asserted to match exactly once.
Nothing else is changed: the node (id, cluster, metadata) stays as shipped.
Every Envoy is warmed before the rounds: a first request answered 200 by nginx (for the dynamic
chains the cluster `fr-000000.vip` discovered on demand and healthy), then `--warmup` seconds
of the load. Each round runs `wrk -t1 -c32 -d<seconds>s` (keep-alive, `Host: fr-000000`)
against every Envoy in turn, the order rotated by one each round; a non-2xx answer fails the run.
Per round and chain: throughput (wrk's requests/s) and Envoy's CPU per request (user + system
time of the whole process, /proc/<pid>/stat, over the wrk run), each as a ratio to the same
round's `static`; and the load average after each round. With `--out`, the rounds so far are
written after each round (marked `partial`), the whole report at the end.

Pinning (taskset / sched_setaffinity): every Envoy on CPU 0 (`--envoy-cpu`); this script and
everything it starts besides the Envoys (nginx, the control plane, wrk, curl) on CPU 1
(`--client-cpu`); `--no-pin` leaves the scheduler free.

The report, per chain: median, interquartile range, min-max and mean ± standard error of the
per-round ratios, for throughput and for CPU per request; the 95% interval's half-width
(Student's t) and the rounds it would take to bring it to `--target` (0.015). `--out` writes
every sample, the bootstraps' and modules' sha256 and the machine (JSON). Needs
target/release/odmesh-control, dist/, Envoy, nginx, wrk and curl (`make bench-build`).
Standard library only; the helpers are bench/run.py's.
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402
import wasm_floor  # noqa: E402

ROOT = run.ROOT
WASM_BOOTSTRAP = ROOT / "envoy/odmesh.yaml"
NATIVE_BOOTSTRAP = ROOT / "envoy/odmesh-native.yaml"
WASM_MODULE = ROOT / "dist/odmesh_filter.wasm"
NATIVE_MODULE = ROOT / "dist/libodmesh_filter.so"
VIP = "fr-000000"
CLUSTER = f"{VIP}.vip"
HOST = [f"Host: {VIP}"]
CLUSTER_HEADER = HOST + [f"x-odmesh-cluster: {CLUSTER}"]
# The shipped bootstraps' ports, and the xDS cluster's one endpoint (as tests/src/mesh.rs).
LISTENER_PORT = "port_value: 15001"
INBOUND_PORT = "port_value: 15006"
ADMIN_PORT = "port_value: 9901"
XDS_ENDPOINT = "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 18000}}}\n"
# The module's relative path: the wasm filter's `filename:`, or the native module's (the route's
# `filename:` in a bootstrap with its route inline, ce73175 and before; the node metadata's
# `module:` in one whose route comes by RDS, and the concurrency limit's `filename:`).
MODULE_PATH = re.compile(r"\b((?:filename|module): )(dist/[^\s}]+)")
# The filters the floor keeps, in this order.
FLOOR_FILTERS = ["envoy.filters.http.on_demand", "envoy.filters.http.router"]


# ---------------------------------------------------------------------------------------------
# Bootstraps


def without_comments(text):
    """The bootstrap as Envoy reads it: without its comment lines (which name the same ports
    and files in words), as tests/src/mesh.rs `shipped_bootstrap`."""
    return "".join(l + "\n" for l in text.splitlines() if not l.lstrip().startswith("#"))


def edit_once(y, what, old, new):
    found = y.count(old)
    if found != 1:
        raise RuntimeError(f"{what} should say {old.strip()!r} once, it does {found} times")
    return y.replace(old, new)


def mesh_bootstrap(path, listener, admin, xds, module=None, module_root=None):
    """The bootstrap at `path` as Envoy reads it, with this run's ports and xDS endpoint and its
    one relative module path (`filename: dist/...` or `module: dist/...`) replaced by `module`,
    or made absolute against `module_root` (default: the folder above the bootstrap's), and
    without its example access log (run.without_access_log)."""
    path = Path(path)
    y = run.without_access_log(without_comments(path.read_text()))
    y = edit_once(y, path, LISTENER_PORT, f"port_value: {listener}")
    if y.count(INBOUND_PORT) > 1:
        raise RuntimeError(f"{path} should have one inbound listener (15006) at most")
    y = y.replace(INBOUND_PORT, "port_value: 0")  # any free port (older bootstraps have none)
    y = edit_once(y, path, ADMIN_PORT, f"port_value: {admin}")
    y = edit_once(y, path, XDS_ENDPOINT, XDS_ENDPOINT.replace("port_value: 18000", f"port_value: {xds}"))
    modules = MODULE_PATH.findall(y)
    files = {relative for _, relative in modules}
    if len(files) != 1:
        raise RuntimeError(f"{path} should name one module file (filename: or module: dist/...), it "
                           f"names {[''.join(m) for m in modules]}")
    relative = files.pop()
    target = Path(module) if module else (Path(module_root) if module_root else path.resolve().parent.parent) / relative
    # Every place that names it (the native bootstrap names its module twice: the route's, in
    # the node metadata, and the concurrency limit's filter).
    return MODULE_PATH.sub(lambda m: m.group(1) + str(Path(target).resolve()), y)


def http_filters(y):
    """[(name, first line, end line)] of the egress listener's `http_filters:` list of `y` (the
    first: the inbound listener's comes after it), by line index."""
    lines = y.splitlines(keepends=True)
    at = [i for i, l in enumerate(lines) if l.strip() == "http_filters:"]
    if not 1 <= len(at) <= 2:
        raise RuntimeError(f"the bootstrap should have one or two http_filters lists, it has {len(at)}")
    indent = lambda l: len(l) - len(l.lstrip(" "))
    base = indent(lines[at[0]])
    items, i = [], at[0] + 1
    while i < len(lines):
        l = lines[i]
        if l.strip() and (indent(l) < base or (indent(l) == base and not l.lstrip().startswith("- "))):
            break
        if l.lstrip().startswith("- ") and (not items or indent(l) == items[0][3]):
            m = re.match(r"- name: (\S+)", l.lstrip())
            if not m:
                raise RuntimeError(f"an HTTP filter without its name first: {l.strip()}")
            if items:
                items[-1][2] = i
            items.append([m.group(1), i, None, indent(l)])
        i += 1
    if not items:
        raise RuntimeError("the bootstrap's http_filters list is empty")
    items[-1][2] = i
    return lines, [(name, start, end) for name, start, end, _ in items]


def filter_names(y):
    return [name for name, _, _ in http_filters(y)[1]]


def keep_filters(y, keep):
    """`y` with only the HTTP filters named in `keep` (each must be there, in that order)."""
    lines, items = http_filters(y)
    drop = set()
    for name, start, end in items:
        if name not in keep:
            drop.update(range(start, end))
    out = "".join(l for i, l in enumerate(lines) if i not in drop)
    if filter_names(out) != list(keep):
        raise RuntimeError(f"the floor should keep the filters {keep}, the bootstrap has {filter_names(y)}")
    return out


class Chain:
    """One Envoy configuration: `render(listener, admin)` gives its bootstrap; `headers` are what
    the client sends; `dynamic`: it discovers fr-000000.vip from the control plane; `module`:
    the odmesh module it loads, if any (recorded by sha256)."""

    def __init__(self, name, render, headers, dynamic, module=None, bootstrap=None):
        self.name, self.render, self.headers, self.dynamic = name, render, headers, dynamic
        self.module, self.bootstrap = module, bootstrap

    def describe(self):
        d = {"headers": self.headers, "dynamic": self.dynamic}
        for key, path in (("module", self.module), ("bootstrap", self.bootstrap)):
            if path:
                p = Path(path)
                d[key] = {"path": run.recorded(p), "bytes": p.stat().st_size, "sha256": run.sha256(p)}
        return d


def empty_module(workdir):
    """bench/wasm_floor.py's `no-callbacks` module (no callback but the ABI's allocator)."""
    path = Path(workdir) / "no-callbacks.wasm"
    path.write_bytes(wasm_floor.module(wasm_floor.EMPTY["no-callbacks"]))
    return path


def extra_chain(spec, xds):
    """A `--chain NAME=FILE` (see the docstring)."""
    name, sep, target = spec.partition("=")
    if not sep or not name or not target:
        raise SystemExit(f"--chain {spec!r}: NAME=FILE expected")
    boot, _, module = target.partition(":")
    if boot.endswith((".yaml", ".yml")):
        boot, module = Path(boot).resolve(), (Path(module).resolve() if module else None)
    elif target.endswith(".so"):
        boot, module = NATIVE_BOOTSTRAP, Path(target).resolve()
    elif target.endswith(".wasm"):
        boot, module = WASM_BOOTSTRAP, Path(target).resolve()
    else:
        raise SystemExit(f"--chain {spec!r}: a .so, a .wasm or BOOTSTRAP.yaml[:MODULE] expected")
    for p in (boot, module):
        if p and not p.is_file():
            raise SystemExit(f"--chain {spec!r}: no file {p}")
    return Chain(name, lambda l, a: mesh_bootstrap(boot, l, a, xds, module), HOST, True, module, boot)


def chains(workdir, upstream, xds, extras=()):
    """The chains of the docstring, `static` first, then each `--chain`."""
    empty = empty_module(workdir)

    def floor(l, a):
        y = mesh_bootstrap(WASM_BOOTSTRAP, l, a, xds)
        if "envoy.filters.http.wasm" not in filter_names(y):
            raise RuntimeError(f"{WASM_BOOTSTRAP} has no wasm filter: what is its floor?")
        return keep_filters(y, FLOOR_FILTERS)

    out = [
        Chain("static", lambda l, a: run.static_bootstrap(l, a, upstream, wasm=False), HOST, False),
        Chain("floor", floor, CLUSTER_HEADER, True, None, WASM_BOOTSTRAP),
        Chain("native", lambda l, a: mesh_bootstrap(NATIVE_BOOTSTRAP, l, a, xds), HOST, True,
              NATIVE_MODULE, NATIVE_BOOTSTRAP),
        Chain("wasm", lambda l, a: mesh_bootstrap(WASM_BOOTSTRAP, l, a, xds), HOST, True,
              WASM_MODULE, WASM_BOOTSTRAP),
        Chain("wasm-empty", lambda l, a: mesh_bootstrap(WASM_BOOTSTRAP, l, a, xds, empty), CLUSTER_HEADER,
              True, empty, WASM_BOOTSTRAP),
    ]
    out += [extra_chain(spec, xds) for spec in extras]
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"two chains of one name: {names}")
    return out


def only(todo, names):
    """The chains of `todo` named in `names` (comma-separated), and `static`; all if no names."""
    if not names:
        return todo
    want = {"static", *names.split(",")}
    unknown = want - {c.name for c in todo}
    if unknown:
        raise SystemExit(f"--only: no chain {sorted(unknown)}; the chains: {[c.name for c in todo]}")
    return [c for c in todo if c.name in want]


# ---------------------------------------------------------------------------------------------
# Processes


def write_registry(workdir, upstream):
    """The registry file: the VIP fr-000000, one instance (the nginx), as `odmesh-bench
    gen-registry --vips 1 --instances 1 --prefix fr- --loopback` writes it."""
    reg = Path(workdir) / "registry.yaml"
    reg.write_text(f"instances:\n  - {{app: {VIP}, ip: 127.0.0.1, port: {upstream}, vip: {VIP}, "
                   "status: UP, zone: zone-0}\n")
    return reg


def control_extra(workdir, policy=None):
    """The control plane's flags besides its registry and ports: prewarm on, as by default (its
    history in the work folder), so that the load reports (LRS) the shipped bootstraps send are
    answered; with `--no-prewarm` there is no LRS service and Envoy retries it every 5 s. With
    `policy`, `--policy` that file."""
    extra = ["--prewarm-history", Path(workdir) / "prewarm.json"]
    return extra + (["--policy", Path(policy).resolve()] if policy else [])


def start_envoy(procs, workdir, chain, wrapper=(), ready_timeout=300):
    """Envoy (`--concurrency 1`) on `chain`'s bootstrap, run through `wrapper` (taskset,
    valgrind), ready."""
    lst, adm = run.free_port(), run.free_port()
    cfg = Path(workdir) / f"envoy-{chain.name}.yaml"
    cfg.write_text(chain.render(lst, adm))
    p = procs.start(f"envoy-{chain.name}", [*wrapper, run.ENVOY, "-c", cfg, "--concurrency", "1",
                                            "--disable-hot-restart", "--log-level", "warn"])
    p.listener, p.admin_port, p.chain = lst, adm, chain

    def ready():
        if p.poll() is not None:
            raise SystemExit(f"Envoy of {chain.name} exited ({p.returncode}): see {p.logpath}")
        return run.http_get(f"http://127.0.0.1:{adm}/ready").strip() == "LIVE"
    try:
        run.wait_for(f"Envoy of {chain.name} ready", ready, timeout=ready_timeout, every=0.1)
    except RuntimeError:
        raise RuntimeError(f"Envoy of {chain.name} not ready in {ready_timeout} s: see {p.logpath}")
    return p


def first_request(envoy, timeout=60):
    """The chain's first request, until it is answered 200 by nginx (a dynamic chain's first may
    wait for discovery, or under valgrind miss on_demand's 1 s and get a 503); for a dynamic
    chain, then until fr-000000.vip is healthy in Envoy."""
    chain = envoy.chain
    cmd = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", "30"]
    for h in chain.headers:
        cmd += ["-H", h]
    cmd.append(f"http://127.0.0.1:{envoy.listener}/")
    deadline, last = time.time() + timeout, "?"
    while time.time() < deadline:
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
        body, _, status = out.rpartition("\n")
        if status == "200" and body == "ok\n":
            break
        last = f"{status} {body[:200]!r}"
        time.sleep(0.2)
    else:
        raise RuntimeError(f"{chain.name}: the first request got {last}, not nginx's 200")
    if chain.dynamic:
        key = f"cluster.{CLUSTER}.membership_healthy"
        run.wait_for(f"{chain.name}: {CLUSTER} discovered and healthy",
                     lambda: run.envoy_stats(envoy, re.escape(key)).get(key) == 1, timeout=timeout)


def wrk(envoy, seconds, connections, client_cpu):
    cmd = (["taskset", "-c", str(client_cpu)] if client_cpu is not None else []) + \
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s"]
    for h in envoy.chain.headers:
        cmd += ["-H", h]
    cmd.append(f"http://127.0.0.1:{envoy.listener}/")
    c0 = run.cpu_seconds(envoy.pid)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    c1 = run.cpu_seconds(envoy.pid)
    requests, rps = run.parse_wrk(out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad or requests == 0:
        raise RuntimeError(f"{envoy.chain.name}: {bad.group(1) if bad else 'no'} requests not answered 2xx:\n{out}")
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    row = {"requests": requests, "rps": rps, "cpu_seconds": c1 - c0, "cpu_us_per_req": (c1 - c0) / requests * 1e6}
    if errors:
        row["socket_errors"] = dict(zip(("connect", "read", "write", "timeout"), map(int, errors.groups())))
        run.log(f"{envoy.chain.name}: wrk saw socket errors {row['socket_errors']}")
    return row


# ---------------------------------------------------------------------------------------------
# Statistics

# Student's t, two-sided 95%, by degrees of freedom (beyond: the normal's 1.96).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
       18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
       26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t95(df):
    for d in sorted(T95):
        if df <= d:
            return T95[d]
    return 1.960


def rounds_for(sd, half_width):
    """Rounds whose 95% interval of the mean has `half_width`, at this per-round SD."""
    if not sd or not half_width:
        return None
    n = 2
    while t95(n - 1) * sd / math.sqrt(n) > half_width and n < 100000:
        n += 1
    return n


def describe(xs, target):
    n = len(xs)
    sd = statistics.stdev(xs) if n > 1 else 0.0
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if n > 1 else (xs[0],) * 3
    se = sd / math.sqrt(n)
    return {"n": n, "median": statistics.median(xs), "q1": q1, "q3": q3, "min": min(xs), "max": max(xs),
            "mean": statistics.mean(xs), "sd": sd, "se": se,
            "ci95_half_width": t95(n - 1) * se if n > 1 else None,
            "rounds_for_target": rounds_for(sd, target)}


def summarize(rounds, names, target):
    out = {}
    for name in names:
        rows = [r["chains"][name] for r in rounds]
        base = [r["chains"]["static"] for r in rounds]
        out[name] = {
            "rps_median": statistics.median(r["rps"] for r in rows),
            "cpu_us_per_req_median": statistics.median(r["cpu_us_per_req"] for r in rows),
            "rps_ratio": describe([r["rps"] / b["rps"] for r, b in zip(rows, base)], target),
            "cpu_ratio": describe([r["cpu_us_per_req"] / b["cpu_us_per_req"] for r, b in zip(rows, base)], target),
        }
    return out


def report(results, target):
    s, names, rounds = results["summary"], results["chains_order"], results["rounds"]
    print("\nPer round: load average (1 min, after the round), static's CPU per request and "
          "throughput, every chain's CPU per request / static's")
    print(f"{'round':>5} {'load':>5} {'static µs':>9} {'static rps':>10}  " + " ".join(f"{n:>11}" for n in names[1:]))
    for i, r in enumerate(rounds):
        st = r["chains"]["static"]
        print(f"{i + 1:>5} {r['loadavg_after']:>5.2f} {st['cpu_us_per_req']:>9.1f} {st['rps']:>10.0f}  "
              + " ".join(f"{r['chains'][n]['cpu_us_per_req'] / st['cpu_us_per_req']:>11.3f}" for n in names[1:]))
    for key, what in (("rps_ratio", "throughput / static"), ("cpu_ratio", "CPU per request / static")):
        print(f"\n{what}, per-round ratios over {len(rounds)} rounds")
        print(f"{'chain':<16} {'median':>7} {'IQR':>15} {'min-max':>15} {'mean ± SE':>15} {'95% ±':>7} "
              f"{'rounds for ±' + format(target, 'g'):>17}")
        for n in names[1:]:
            d = s[n][key]
            ci = f"{d['ci95_half_width']:.3f}" if d["ci95_half_width"] is not None else "-"
            print(f"{n:<16} {d['median']:>7.3f} {d['q1']:>7.3f}-{d['q3']:<7.3f} {d['min']:>7.3f}-{d['max']:<7.3f} "
                  f"{d['mean']:>7.3f} ± {d['se']:.3f} {ci:>7} {d['rounds_for_target'] or '-':>17}")
    print(f"\n{'chain':<16} {'CPU/request (median)':>21} {'requests/s (median)':>20}")
    for n in names:
        print(f"{n:<16} {s[n]['cpu_us_per_req_median']:>18.1f} µs {s[n]['rps_median']:>20,.0f}")


# ---------------------------------------------------------------------------------------------


def git_commit():
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "bench", "envoy", "filter", "dist"],
                           capture_output=True, text=True).stdout.strip()
    return rev + (" (with uncommitted changes in bench/ envoy/ filter/)" if dirty else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seconds", type=int, default=4, help="wrk's duration per chain and round")
    ap.add_argument("--connections", type=int, default=32, help="wrk's keep-alive connections (-c)")
    ap.add_argument("--warmup", type=int, default=2, help="seconds of load per Envoy before the rounds")
    ap.add_argument("--chain", action="append", default=[], metavar="NAME=FILE",
                    help="another chain: a .so, a .wasm, or BOOTSTRAP.yaml[:MODULE]")
    ap.add_argument("--only", help="these chains only (comma-separated; static always runs)")
    ap.add_argument("--envoy-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true", help="no taskset: the scheduler places everything")
    ap.add_argument("--target", type=float, default=0.015,
                    help="the 95%% half-width to count the rounds for (printed per chain)")
    ap.add_argument("--out", type=Path, help="write every sample here (JSON)")
    ap.add_argument("--policy", type=Path, help="the control plane's policy file (none by default)")
    args = ap.parse_args()
    if args.rounds < 1 or args.seconds < 1:
        ap.error("--rounds and --seconds must be at least 1")
    workdir, results = run.begin("chains", [run.CONTROL, WASM_MODULE, NATIVE_MODULE])
    if not args.no_pin:
        # Everything this script starts inherits CPU `client_cpu`; each Envoy is taskset to its own.
        os.sched_setaffinity(0, {args.client_cpu})
    envoy_wrapper = [] if args.no_pin else ["taskset", "-c", str(args.envoy_cpu)]
    client_cpu = None if args.no_pin else args.client_cpu
    results.update({
        "commit": git_commit(), "native_sha256": run.sha256(NATIVE_MODULE),
        "policy": args.policy.read_text() if args.policy else None,
        "config": {"rounds": args.rounds, "seconds": args.seconds, "connections": args.connections,
                   "warmup_seconds": args.warmup, "wrk": f"wrk -t1 -c{args.connections} -d{args.seconds}s",
                   "pinning": "none" if args.no_pin else
                   f"Envoys on CPU {args.envoy_cpu}; nginx, control plane, wrk on CPU {args.client_cpu}"},
    })
    procs = run.Procs(workdir)
    try:
        upstream = run.start_nginx(procs, workdir)
        cp = run.start_control(procs, write_registry(workdir, upstream), extra=control_extra(workdir, args.policy))
        todo = only(chains(workdir, upstream, cp.xds, args.chain), args.only)
        results["chains"] = {c.name: c.describe() for c in todo}
        results["chains_order"] = [c.name for c in todo]
        envoys = {}
        for c in todo:
            envoys[c.name] = e = start_envoy(procs, workdir, c, envoy_wrapper)
            first_request(e)
            run.log(f"{c.name}: Envoy pid {e.pid} ready and warm (listener {e.listener})")
        for name, e in envoys.items():
            if args.warmup:
                wrk(e, args.warmup, args.connections, client_cpu)
        names, rounds = list(envoys), []
        for rnd in range(args.rounds):
            k = rnd % len(names)
            order = names[k:] + names[:k]
            row = {"order": order, "loadavg_before": float(open("/proc/loadavg").read().split()[0]), "chains": {}}
            for name in order:
                row["chains"][name] = wrk(envoys[name], args.seconds, args.connections, client_cpu)
                row["chains"][name]["loadavg"] = float(open("/proc/loadavg").read().split()[0])
            row["loadavg_after"] = float(open("/proc/loadavg").read().split()[0])
            rounds.append(row)
            st = row["chains"]["static"]
            run.log(f"round {rnd + 1}/{args.rounds} (load {row['loadavg_after']:.2f}): static "
                    f"{st['cpu_us_per_req']:.1f} µs/req; " + ", ".join(
                        f"{n} {row['chains'][n]['cpu_us_per_req'] / st['cpu_us_per_req']:.3f}" for n in names[1:]))
            for name, e in envoys.items():
                if e.poll() is not None:
                    raise RuntimeError(f"Envoy of {name} exited: see {e.logpath}")
            if args.out:  # the rounds so far, should the run be cut short
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps({**results, "rounds": rounds, "partial": True}, indent=1) + "\n")
    finally:
        procs.stop_all()
    results["rounds"] = rounds
    results["summary"] = summarize(rounds, names, args.target)
    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().strip()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        run.log(f"wrote {run.recorded(args.out)}")
    report(results, args.target)


if __name__ == "__main__":
    main()
