#!/usr/bin/env python3
"""What a proxy-wasm filter costs Envoy per request, step by step, and filter builds side by side.

    bench/wasm_floor.py                                   # 30 rounds of 5 s
    bench/wasm_floor.py --filter old=OLD.wasm --filter new=dist/odmesh_filter.wasm
    bench/wasm_floor.py --no-floor --filter native=OLD/libodmesh_filter.so \
        --filter wasm=dist/odmesh_filter.wasm   # a native HTTP-filter module (before ce73175;
                                                # bench/probes/native_at.sh ca74098 builds one)

The two shells as they ship today, side by side: bench/chains.py (`make bench-shells`).

Envoys (each `--concurrency 1`, one nginx upstream), in bench/run.py's harness:
- `static`: a plain static route, the baseline;
- `no-callbacks`: the wasm filter with a module that exports no callback, only the ABI version
  and `proxy_on_memory_allocate` (what Envoy's wasm filter costs by itself);
- `request-headers`: plus an empty `proxy_on_request_headers`;
- `context-create`: plus an empty `proxy_on_context_create`;
- `all-http`: plus empty `proxy_on_response_headers`, `_body`, `proxy_on_log`, `_done`,
  `_delete` (what an SDK exports, and the host calls, on every request);
- `header-route`: no filter, the route of the odmesh chain (`cluster_header: x-odmesh-cluster`),
  the client sending that header itself: what routing by a header costs with no filter at all,
  the floor of any filter that routes by setting it;
- each `--filter NAME=FILE` (default: `odmesh=dist/odmesh_filter.wasm`): the filter and a
  static cluster named like the VIP, as bench/run.py's overhead section. A `.so` is loaded as
  a native Envoy dynamic module (`envoy.filters.http.dynamic_modules`: only a module built
  before commit ce73175, when it was an HTTP filter; today's is the route's cluster specifier,
  measured by bench/chains.py), a `.wasm` by the wasm filter.
`--no-floor` leaves out the hand-written modules (the floor steps), to compare filters only.
The hand-written modules are a few bytes each, written here; the static route serves them since
nothing sets the cluster header. Each round runs `wrk -t1 -c32` against every Envoy, the order
rotated; Envoy CPU per request from /proc/<pid>/stat. The report: each configuration's median
CPU per request, and its per-round ratio to the one before (mean ± standard error, median).
Standard library only; needs what bench/run.py needs.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402

I32 = 0x7F
# Function types: () -> (); (i32) -> i32; (i32, i32) -> (); (i32, i32, i32) -> i32; (i32) -> ()
TYPES = [((), ()), ((I32,), (I32,)), ((I32, I32), ()), ((I32, I32, I32), (I32,)), ((I32,), ())]
RETURN_0 = bytes([0x41, 0])  # i32.const 0 (Continue, false)
RETURN_1 = bytes([0x41, 1])
RETURN_1024 = bytes([0x41, 0x80, 0x08])
BASE = [("proxy_abi_version_0_2_1", 0, b""), ("proxy_on_memory_allocate", 1, RETURN_1024)]
EMPTY = {
    "no-callbacks": BASE,
    "request-headers": BASE + [("proxy_on_request_headers", 3, RETURN_0)],
    "context-create": BASE + [("proxy_on_request_headers", 3, RETURN_0), ("proxy_on_context_create", 2, b"")],
    "all-http": BASE + [("proxy_on_request_headers", 3, RETURN_0), ("proxy_on_context_create", 2, b""),
                        ("proxy_on_response_headers", 3, RETURN_0), ("proxy_on_response_body", 3, RETURN_0),
                        ("proxy_on_log", 4, b""), ("proxy_on_done", 1, RETURN_1), ("proxy_on_delete", 4, b"")],
}


def leb(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def vec(items):
    return leb(len(items)) + b"".join(items)


def module(funcs):
    """A wasm module with one memory and `funcs` [(export name, type index, body)] exported."""
    def section(sid, payload):
        return bytes([sid]) + leb(len(payload)) + payload

    def name(s):
        return leb(len(s)) + s.encode()

    types = vec([bytes([0x60]) + vec([bytes([p]) for p in ps]) + vec([bytes([r]) for r in rs]) for ps, rs in TYPES])
    exports = vec([name("memory") + bytes([2, 0])] + [name(n) + bytes([0]) + leb(i) for i, (n, _, _) in enumerate(funcs)])
    bodies = [bytes([0]) + body + bytes([0x0B]) for _, _, body in funcs]
    return (b"\0asm" + bytes([1, 0, 0, 0]) + section(1, types) + section(3, vec([leb(t) for _, t, _ in funcs]))
            + section(5, vec([bytes([0, 1])])) + section(7, exports) + section(10, vec([leb(len(b)) + b for b in bodies])))


NATIVE_FILTER = """
          - name: envoy.filters.http.dynamic_modules
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {{module: {{local: {{filename: {path}}}}}, do_not_close: true}}
              filter_name: odmesh
              filter_config: {{"@type": type.googleapis.com/google.protobuf.StringValue, value: "{{}}"}}"""


HEADER_ROUTE = "header-route"
# What a native module that is an HTTP filter exports (found in its dynamic symbol names).
HTTP_FILTER_HOOK = b"envoy_dynamic_module_on_http_filter_config_new"


def bootstrap(listener, admin, upstream, wasm, static_route):
    if wasm == HEADER_ROUTE:
        # The filter chain's route and cluster, without the filter.
        boot = run.static_bootstrap(listener, admin, upstream, wasm=True)
        start = boot.index("\n          - name: envoy.filters.http.wasm")
        end = boot.index("\n", boot.index("code: {local:", start))
        return boot[:start] + boot[end:]
    run.WASM = wasm
    boot = run.static_bootstrap(listener, admin, upstream, wasm=wasm is not None)
    if static_route and wasm is not None:
        boot = boot.replace("route: {cluster_header: x-odmesh-cluster}", "route: {cluster: fr-000000.vip}")
    if wasm is not None and Path(wasm).suffix == ".so":
        # The same chain with the native module in the wasm filter's place: only a module that
        # is an HTTP filter (before commit ce73175; since, the module is the route's cluster
        # specifier, which bench/chains.py measures in envoy/odmesh-native.yaml as shipped).
        if HTTP_FILTER_HOOK not in Path(wasm).read_bytes():
            sys.exit(f"{wasm} is no HTTP filter (it exports no {HTTP_FILTER_HOOK.decode()}): "
                     "measure it with bench/chains.py")
        start = boot.index("\n          - name: envoy.filters.http.wasm")
        end = boot.index("\n", boot.index("code: {local:", start))
        boot = boot[:start] + NATIVE_FILTER.format(path=wasm) + boot[end:]
    return boot


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--filter", action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--no-floor", action="store_true", help="leave out the hand-written floor modules")
    ap.add_argument("--out", type=Path, help="write every sample here (JSON)")
    args = ap.parse_args()
    filters = [f.split("=", 1) for f in args.filter] or [["odmesh", str(run.ROOT / "dist/odmesh_filter.wasm")]]
    run.ENVOY = run.envoy_binary()
    workdir = Path(tempfile.mkdtemp(prefix="odmesh-wasm-floor-"))
    run.log(f"work folder (logs): {workdir}")
    configs = [("static", None, True)]
    for label, funcs in ({} if args.no_floor else EMPTY).items():
        path = workdir / f"{label}.wasm"
        path.write_bytes(module(funcs))
        configs.append((label, path, True))
    configs.append((HEADER_ROUTE, HEADER_ROUTE, False))
    configs += [(label, Path(path).resolve(), False) for label, path in filters]

    procs = run.Procs(workdir)
    rows = {label: [] for label, _, _ in configs}
    try:
        upstream = run.start_nginx(procs, workdir)
        envoys = {}
        headers = {}  # label: the request headers wrk and curl send
        for label, wasm, static_route in configs:
            lst, adm = run.free_port(), run.free_port()
            envoys[label] = run.start_envoy(procs, workdir, f"envoy-{label}",
                                            bootstrap(lst, adm, upstream, wasm, static_route), lst, adm)
            headers[label] = ["-H", "Host: fr-000000"]
            if wasm == HEADER_ROUTE:
                headers[label] += ["-H", "x-odmesh-cluster: fr-000000.vip"]
            status = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *headers[label],
                                     f"http://127.0.0.1:{lst}/"], capture_output=True, text=True).stdout
            if status != "200":
                raise RuntimeError(f"{label}: a request got {status}, not 200")
        order = list(envoys)
        for rnd in range(args.rounds):
            for label in order[rnd % len(order):] + order[:rnd % len(order)]:
                e = envoys[label]
                c0 = run.cpu_seconds(e.pid)
                out = subprocess.run(["wrk", "-t1", "-c32", f"-d{args.seconds}s", *headers[label],
                                      f"http://127.0.0.1:{e.listener}/"], check=True, capture_output=True, text=True).stdout
                c1 = run.cpu_seconds(e.pid)
                requests, rps = run.parse_wrk(out)
                rows[label].append({"cpu_us_per_req": (c1 - c0) / requests * 1e6, "rps": rps,
                                    "loadavg": open("/proc/loadavg").read().split()[0]})
            run.log(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]['cpu_us_per_req']:.0f}" for k, v in rows.items()))
    finally:
        procs.stop_all()

    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{'Envoy':<18} {'CPU/request':>12}  per-round ratio to the row above: mean ± SE (median)")
    labels = list(rows)
    for i, label in enumerate(labels):
        cpu = statistics.median(r["cpu_us_per_req"] for r in rows[label])
        line = f"{label:<18} {cpu:>9.1f} µs"
        if i:
            ratios = [b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in zip(rows[labels[i - 1]], rows[label])]
            se = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else 0.0
            line += f"  {statistics.mean(ratios):.3f} ± {se:.3f} ({statistics.median(ratios):.3f})"
        print(line)
    # Every configuration against the static route, per round (the same round's static run).
    print(f"\n{'Envoy':<18} {'throughput / static':>22} {'CPU per request / static':>26}   (mean ± SE over rounds)")
    base = rows[labels[0]]
    for label in labels[1:]:
        rps = [b["rps"] / a["rps"] for a, b in zip(base, rows[label])]
        cpu = [b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in zip(base, rows[label])]
        def fmt(xs):
            se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
            return f"{statistics.mean(xs):.3f} ± {se:.3f}"
        print(f"{label:<18} {fmt(rps):>22} {fmt(cpu):>26}")


if __name__ == "__main__":
    main()
