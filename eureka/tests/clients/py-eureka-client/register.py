"""Drives the unmodified PyPI `py-eureka-client` against a Eureka server, for
eureka/tests/eureka_real_clients.rs: serves HTTP on a free port, registers it, heartbeats,
and obeys commands on stdin, one per line:
  out_of_service  client.status_update("OUT_OF_SERVICE")
  in_service      client.delete_status_override()
  stop            client.stop(): reports DOWN, deregisters, then exits 0
  stop_within S   the same, as a shutdown hook with a deadline of S seconds: when stop()
                  has not returned by then it reports "stop timed out" and exits 0 anyway
Reports on stdout as lines starting with "odmesh-driver: ".
Environment: EUREKA_URL, APP, INSTANCE_ID, VIP, HEARTBEAT_SECS, LEASE_SECS.
"""

import asyncio
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import py_eureka_client.eureka_client as eureka_client


def say(line):
    print(f"odmesh-driver: {line}", flush=True)


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from {os.environ.get('INSTANCE_ID', 'pydemo-1')}\n".encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


async def main():
    app = os.environ.get("APP", "pydemo")
    vip = os.environ.get("VIP", app)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    say(f"listening {port}")

    client = await eureka_client.init_async(
        eureka_server=os.environ.get("EUREKA_URL", "http://127.0.0.1:8761/eureka"),
        app_name=app,
        instance_id=os.environ.get("INSTANCE_ID", "pydemo-1"),
        instance_host="localhost",
        instance_ip="127.0.0.1",
        instance_port=port,
        vip_adr=vip,
        renewal_interval_in_secs=int(os.environ.get("HEARTBEAT_SECS", "1")),
        duration_in_secs=int(os.environ.get("LEASE_SECS", "3")),
        should_discover=True,
    )
    say("registered")
    # Discovery parsed the registry (XML, as this client reads it) at start.
    mine = client.applications.get_application(app.upper())
    say(f"discovered {len(mine.up_instances) if mine else 0}")

    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        command = line.strip()
        if command == "out_of_service":
            await client.status_update("OUT_OF_SERVICE")
            say("status OUT_OF_SERVICE")
        elif command == "in_service":
            await client.delete_status_override()
            say("status override removed")
        elif command == "stop":
            await client.stop()
            say("stopped")
            server.shutdown()
            os._exit(0)
        elif command.startswith("stop_within "):
            # stop() can hang: this client's heartbeat thread runs its own event loop and
            # shares an asyncio.Lock and a dict with stop(); when a heartbeat carrying the
            # new DOWN status reaches the server before stop()'s registration does, Eureka
            # answers 404 (a newer lastDirtyTimestamp) and the two threads collide.
            try:
                await asyncio.wait_for(client.stop(), float(command.split()[1]))
                say("stopped")
            except asyncio.TimeoutError:
                say("stop timed out: exiting without deregistering")
            server.shutdown()
            os._exit(0)
        else:
            say(f"unknown command {command}")


if __name__ == "__main__":
    asyncio.run(main())
