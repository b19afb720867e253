#!/usr/bin/env python3
"""A demo upstream service for `make run`: answers every request with its own name and instance.

With --eureka it registers with a Eureka server (odmesh's embedded registry in `make run`) the
way a Eureka client does: register, heartbeat every few seconds (registering again when the
server no longer knows it), and cancel on exit. Given several --eureka URLs (peered registries,
`make run NODES=3`), it talks to one at a time and moves to the next when that one does not
answer, as Eureka's clients do.

    demo/upstream.py --app demo-a --instance demo-a-1 --port 18081
    demo/upstream.py --app demo-a --instance demo-a-1 --port 18081 --eureka http://127.0.0.1:8761/eureka
    demo/upstream.py --app demo-a --instance demo-a-1 --port 18081 --eureka http://127.0.0.1:8761/eureka \
        --eureka http://127.0.0.1:8762/eureka --eureka http://127.0.0.1:8763/eureka
    demo/upstream.py --app demo-secure --instance demo-secure-1 --port 18443 --cert c.pem --key k.pem

With --register-only it serves nothing and only keeps the registration of a server another
process runs on that port (`make run` registers the demo gRPC service this way).
"""
import argparse
import http.server
import json
import signal
import ssl
import sys
import threading
import urllib.error
import urllib.request

HEARTBEAT_SECONDS = 5
LEASE_SECONDS = 15


class Eureka:
    """Registers one instance with a Eureka server (the first of `bases` that answers) and keeps
    its lease alive."""

    def __init__(self, bases: list[str], args: argparse.Namespace) -> None:
        self.bases = [b.rstrip("/") for b in bases]
        self.current = 0
        self.app = args.app.upper()
        self.instance = args.instance
        secure = bool(args.cert)
        self.body = json.dumps({"instance": {
            "instanceId": args.instance,
            "hostName": args.host,
            "app": self.app,
            "ipAddr": args.host,
            "status": "UP",
            "port": {"$": args.port, "@enabled": "false" if secure else "true"},
            "securePort": {"$": args.port, "@enabled": "true" if secure else "false"},
            "vipAddress": args.app,
            "secureVipAddress": args.app,
            "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
            "leaseInfo": {"renewalIntervalInSecs": HEARTBEAT_SECONDS, "durationInSecs": LEASE_SECONDS},
        }}).encode()
        self.stopped = threading.Event()

    def _call(self, method: str, path: str, body: bytes | None = None) -> int:
        """The call's HTTP status from the current server; a server that does not answer is
        left for the next one, each tried once. 0 if none answers."""
        for _ in self.bases:
            base = self.bases[self.current]
            req = urllib.request.Request(base + path, data=body, method=method,
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code
            except OSError as e:
                print(f"eureka: {method} {base}{path}: {e}", flush=True)
                if len(self.bases) > 1:
                    self.current = (self.current + 1) % len(self.bases)
                    print(f"eureka: trying {self.bases[self.current]}", flush=True)
        return 0

    def register(self) -> None:
        status = self._call("POST", f"/apps/{self.app}", self.body)
        print(f"eureka: registered {self.app}/{self.instance} with {self.bases[self.current]}: HTTP {status}",
              flush=True)

    def run(self) -> None:
        self.register()
        while not self.stopped.wait(HEARTBEAT_SECONDS):
            if self._call("PUT", f"/apps/{self.app}/{self.instance}") == 404:
                self.register()

    def cancel(self) -> None:
        self.stopped.set()
        self._call("DELETE", f"/apps/{self.app}/{self.instance}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--app", required=True, help="the app name it answers with")
    p.add_argument("--instance", required=True, help="the instance id it answers with")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", help="serve TLS with this certificate (PEM)")
    p.add_argument("--key", help="the certificate's private key (PEM)")
    p.add_argument("--eureka", metavar="URL", action="append",
                   help="register with this Eureka server, e.g. http://127.0.0.1:8761/eureka; "
                        "repeat for peered servers, tried in turn")
    p.add_argument("--register-only", action="store_true",
                   help="serve nothing: register a server that another process runs on --port")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.register_only:
        if not args.eureka:
            p.error("--register-only needs --eureka")
        eureka = Eureka(args.eureka, args)
        try:
            eureka.run()
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            eureka.cancel()
        return

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = json.dumps({
                "app": args.app,
                "instance": args.instance,
                "tls": bool(args.cert),
                "path": self.path,
                "host": self.headers.get("host"),
            }).encode() + b"\n"
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PUT = do_DELETE = do_GET

        def log_message(self, fmt: str, *a) -> None:  # quiet: the demo prints its own lines
            pass

    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    if args.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.cert, args.key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    scheme = "https" if args.cert else "http"
    print(f"{args.app}/{args.instance} listening on {scheme}://{args.host}:{args.port}", flush=True)
    eureka = Eureka(args.eureka, args) if args.eureka else None
    if eureka:
        threading.Thread(target=eureka.run, daemon=True).start()
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        if eureka:
            eureka.cancel()


if __name__ == "__main__":
    main()
