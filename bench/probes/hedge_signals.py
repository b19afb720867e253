#!/usr/bin/env python3
"""What stock Envoy shows of a hedge, and of which try won (one-off probe, issue 30's "hedges
won"; docs/envoy.md, "What Envoy tells of a hedge").

    bench/probes/hedge_signals.py [--envoy .tools/envoy-1.40.0/envoy/_bin/envoy]

One Envoy (no odmesh part), one static cluster of two local HTTP servers A and B, a route with a
100 ms per-try timeout, one retry and `hedge_on_per_try_timeout`; the downstream access log and
the router's upstream log (one line per try) to a file, with the try's host, status and flags.
Three cases, four requests each, each case in a fresh Envoy:

- `hedge wins`: A answers in 1 s, B at once; round robin sends the first try to A;
- `first try wins`: A answers in 150 ms, B in 1 s;
- `both too slow`: both answer in 1 s, the route's timeout is 300 ms.

Prints, per case, the non-zero retry and timeout counters of the cluster and the log lines
(counted). Standard library only; free ports from the OS; every process is stopped at the end.
"""

import argparse
import collections
import http.server
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORMAT = "host=%UPSTREAM_HOST% code=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT%"

BOOTSTRAP = """
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  clusters:
  - name: c
    type: STATIC
    lb_policy: ROUND_ROBIN
    load_assignment:
      cluster_name: c
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {a}}}}}}}
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {b}}}}}}}
  listeners:
  - name: l
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: probe
          access_log:
          - name: downstream
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {log}
              log_format: {{text_format_source: {{inline_string: "request {format}\\n"}}}}
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {{prefix: /}}
                route:
                  cluster: c
                  timeout: {timeout}
                  retry_policy: {{retry_on: 5xx, num_retries: 1, per_try_timeout: 0.1s}}
                  hedge_policy: {{hedge_on_per_try_timeout: true}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              upstream_log:
              - name: tries
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
                  path: {log}
                  log_format: {{text_format_source: {{inline_string: "try {format}\\n"}}}}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(delay):
    """An HTTP server answering every GET after `delay` seconds with its own port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            time.sleep(delay)
            body = str(self.server.server_port).encode()
            try:
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # Envoy reset the losing try

        def log_message(self, *args):
            pass

    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def case(envoy, name, delay_a, delay_b, timeout, work):
    a, b = server(delay_a), server(delay_b)
    ports = {"admin": free_port(), "listener": free_port()}
    log = work / f"{name.replace(' ', '-')}.log"
    config = work / f"{name.replace(' ', '-')}.yaml"
    config.write_text(BOOTSTRAP.format(a=a.server_port, b=b.server_port, log=log, format=FORMAT,
                                       timeout=timeout, **ports))
    proc = subprocess.Popen([envoy, "-c", config, "--concurrency", "1", "-l", "error",
                             "--file-flush-interval-msec", "100"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if get(f"http://127.0.0.1:{ports['admin']}/ready", 1)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{name}: Envoy did not start (log {config})")
            time.sleep(0.1)
        print(f"== {name}: A {a.server_port} answers in {delay_a} s, B {b.server_port} in {delay_b} s, "
              f"route timeout {timeout}")
        for _ in range(4):
            start = time.monotonic()
            status, body = get(f"http://127.0.0.1:{ports['listener']}/")
            print(f"  {status} from {body.strip()[:40]!r} in {time.monotonic() - start:.3f} s")
        time.sleep(1.5)  # the tries still running end, the log is flushed
        stats = get(f"http://127.0.0.1:{ports['admin']}/stats?filter=^cluster\\.c\\.upstream_rq_")[1]
        counters = [l for l in stats.splitlines() if any(k in l for k in ("retry", "timeout", "tx_reset"))
                    and not l.endswith(": 0")]
        print("  counters: " + ", ".join(counters))
        lines = log.read_text().splitlines() if log.exists() else []
        named = {str(a.server_port): "A", str(b.server_port): "B"}
        for line, n in sorted(collections.Counter(lines).items()):
            for port, letter in named.items():
                line = line.replace(f"127.0.0.1:{port}", letter)
            print(f"  {n} × {line}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        a.shutdown()
        b.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envoy", default=str(ROOT / ".tools/envoy-1.40.0/envoy/_bin/envoy"))
    args = ap.parse_args()
    out = subprocess.run([args.envoy, "--version"], capture_output=True, text=True).stdout.strip()
    print(out)
    with tempfile.TemporaryDirectory(prefix="odmesh-hedge-") as work:
        work = Path(work)
        case(args.envoy, "hedge wins", 1.0, 0.0, "5s", work)
        case(args.envoy, "first try wins", 0.15, 1.0, "5s", work)
        case(args.envoy, "both too slow", 1.0, 1.0, "0.3s", work)


if __name__ == "__main__":
    sys.exit(main())
