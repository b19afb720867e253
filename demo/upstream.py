#!/usr/bin/env python3
"""A demo upstream service for `make run`: answers every request with its own name and instance.

    demo/upstream.py --app demo-a --instance demo-a-1 --port 18081
    demo/upstream.py --app demo-secure --instance demo-secure-1 --port 18443 --cert c.pem --key k.pem
"""
import argparse
import http.server
import json
import signal
import ssl
import sys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--app", required=True, help="the app name it answers with")
    p.add_argument("--instance", required=True, help="the instance id it answers with")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", help="serve TLS with this certificate (PEM)")
    p.add_argument("--key", help="the certificate's private key (PEM)")
    args = p.parse_args()

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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    scheme = "https" if args.cert else "http"
    print(f"{args.app}/{args.instance} listening on {scheme}://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass


if __name__ == "__main__":
    main()
