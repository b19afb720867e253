#!/usr/bin/env python3
"""Control-plane failover: how long a proxy goes unserved when the replica it is connected to dies.

    bench/failover.py [--rounds 20] [--replicas 3] [--out docs/bench/failover.json]

(`make bench-failover`.) Starts nginx (the upstream), REPLICAS `odmesh-control` replicas over
one registry file, and one Envoy from envoy/odmesh.yaml as shipped, its `odmesh_xds` cluster
listing every replica. Each round, under a steady load on a VIP Envoy holds: finds the replica
holding Envoy's ADS stream (its admin `/debug/proxies`), SIGKILLs it, and times from the kill

  - to the first 200 for a VIP Envoy never asked for, asked at once (and again at once after a
    503: the discovery timeout, 1 s, passed before a replica answered);
  - to a surviving replica listing Envoy's ADS stream (polled every 5 ms);

then counts the load's failures, what the new replica sent (its `odmesh_xds_resources_sent_total`)
and Envoy's refused connections to the dead replica, and restarts the killed replica on its
ports, as a supervisor would. Needs target/release/odmesh-control, dist/odmesh_filter.wasm,
Envoy and nginx (`make bench-build`). Standard library only; the helpers are bench/run.py's.
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402

NODE_ID = "odmesh-local"
# The xDS cluster's one endpoint in the shipped bootstrap; each replica gets a copy.
XDS_ENDPOINT = "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 18000}}}\n"
KNOWN = "known"
LOAD_RATE = 100  # requests per second on the known VIP
POLL = 0.005


def bootstrap(listener, admin, xds_ports):
    """envoy/odmesh.yaml as bench/run.py renders it, with one xDS endpoint per replica."""
    y = run.odmesh_bootstrap(listener, admin, 18000)
    assert y.count(XDS_ENDPOINT) == 1, "the bootstrap's xDS endpoint moved"
    return y.replace(XDS_ENDPOINT, "".join(XDS_ENDPOINT.replace("18000", str(p)) for p in xds_ports))


class Replica:
    """One odmesh-control on fixed ports, restartable on the same ports."""

    def __init__(self, procs, workdir, name, registry):
        self.procs, self.workdir, self.name, self.registry = procs, workdir, name, registry
        self.xds, self.admin = run.free_port(), run.free_port()
        self.starts, self.p = 0, None

    def start(self):
        self.starts += 1
        self.p = self.procs.start(f"{self.name}-{self.starts}", [
            run.CONTROL, "--registry", self.registry, "--xds", f"127.0.0.1:{self.xds}",
            "--admin", f"127.0.0.1:{self.admin}",
            "--prewarm-history", self.workdir / f"{self.name}-prewarm.json"], env={"NO_COLOR": "1"})
        run.wait_for(f"{self.name} ready", lambda: run.http_get(f"http://127.0.0.1:{self.admin}/readyz") is not None,
                     timeout=30, every=0.02)

    def kill(self):
        self.p.kill()
        self.p.wait()
        self.procs.children.remove(self.p)

    def holds_envoy(self):
        try:
            proxies = json.loads(run.http_get(f"http://127.0.0.1:{self.admin}/debug/proxies", timeout=1))
        except OSError:
            return False
        return any(p["service"] == "ads" and p["node_id"] == NODE_ID for p in proxies)

    def metrics(self):
        return run.control_metrics(self.admin)

    def answered(self):
        m = self.metrics()
        return m["odmesh_xds_acks_total"] + m["odmesh_xds_nacks_total"] == m["odmesh_xds_responses_total"]


def get(port, host, timeout=5.0):
    """GET / with Host: host through Envoy on a new connection: (status, body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", "/", headers={"Host": host})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


class Load:
    """LOAD_RATE requests per second to the known VIP on one kept-alive connection; counts outcomes."""

    def __init__(self, port):
        self.port, self.outcomes, self.stopped = port, {}, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        conn, nxt = None, time.monotonic()
        while not self.stopped.is_set():
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/", headers={"Host": KNOWN})
                r = conn.getresponse()
                r.read()
                key = str(r.status)
            except (OSError, http.client.HTTPException) as e:
                key, conn = f"error {type(e).__name__}", None
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
            nxt += 1 / LOAD_RATE
            time.sleep(max(0.0, nxt - time.monotonic()))

    def stop(self):
        self.stopped.set()
        self.thread.join(5)
        return self.outcomes


def connect_failures(envoy):
    """Envoy's refused or timed-out connections to the replicas (a KeyError if the stat is gone)."""
    name = "cluster.odmesh_xds.upstream_cx_connect_fail"
    return run.envoy_stats(envoy, f"^{name}$")[name]


def one_round(i, replicas, envoy, load):
    holding = [r for r in replicas if r.holds_envoy()]
    assert len(holding) == 1, f"round {i}: {len(holding)} replicas hold Envoy's stream"
    dead = holding[0]
    survivors = [r for r in replicas if r is not dead]
    sent_before = {r.name: r.metrics()["odmesh_xds_resources_sent_total"] for r in survivors}
    fail_before = connect_failures(envoy)
    outcomes_before = dict(load.outcomes)
    vip = f"new-{i:03d}"
    new_vip = {}

    def ask():
        tries = []
        while time.monotonic() - t0 < 10:
            status, body = get(envoy.listener, vip)
            tries.append(status)
            if status == 200:
                new_vip["ms"] = (time.monotonic() - t0) * 1000
                break
        new_vip["tries"] = tries

    t0 = time.monotonic()
    dead.kill()
    asker = threading.Thread(target=ask)
    asker.start()
    reconnect_ms, new = None, None
    while time.monotonic() - t0 < 10:
        new = next((r for r in survivors if r.holds_envoy()), None)
        if new:
            reconnect_ms = (time.monotonic() - t0) * 1000
            break
        time.sleep(POLL)
    asker.join(15)
    if reconnect_ms is None or "ms" not in new_vip:
        raise RuntimeError(f"round {i}: no failover in 10 s (reconnect {reconnect_ms}, new VIP {new_vip})")
    run.wait_for("the new replica's responses answered", new.answered, timeout=10, every=0.02)
    sent = new.metrics()["odmesh_xds_resources_sent_total"] - sent_before[new.name]
    fail_after = connect_failures(envoy)
    time.sleep(0.3)  # a little load after the failover, before the round is counted
    load_round = {k: v - outcomes_before.get(k, 0) for k, v in load.outcomes.items()}
    dead.start()
    row = {"round": i, "killed": dead.name, "to": new.name, "new_vip_ms": round(new_vip["ms"], 1),
           "new_vip_answers": new_vip["tries"], "reconnect_ms": round(reconnect_ms, 1),
           "resources_sent_by_new_replica": sent, "connects_refused": fail_after - fail_before,
           "load": load_round}
    run.log(f"round {i}: killed {dead.name}; Envoy on {new.name} after {reconnect_ms:.0f} ms; "
            f"{vip} routed after {new_vip['ms']:.0f} ms ({new_vip['tries']}); {sent} resources sent; "
            f"{row['connects_refused']} connects refused; load {load_round}")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--out", type=Path, default=run.OUT / "failover.json")
    args = ap.parse_args()
    workdir, results = run.begin("failover", [run.CONTROL, run.WASM])
    results["replicas"] = args.replicas
    procs = run.Procs(workdir)
    try:
        up = run.start_nginx(procs, workdir)
        registry = workdir / "registry.yaml"
        vips = [KNOWN] + [f"new-{i:03d}" for i in range(args.rounds)]
        registry.write_text("instances:\n" + "".join(
            f"  - {{app: {v}, ip: 127.0.0.1, port: {up}}}\n" for v in vips))
        replicas = [Replica(procs, workdir, f"control-{i}", registry) for i in range(args.replicas)]
        for r in replicas:
            r.start()
        listener, admin = run.free_port(), run.free_port()
        envoy = run.start_envoy(procs, workdir, "envoy", bootstrap(listener, admin, [r.xds for r in replicas]),
                                listener, admin)
        run.wait_for("Envoy's ADS stream", lambda: sum(r.holds_envoy() for r in replicas) == 1, timeout=10)
        assert get(listener, KNOWN)[0] == 200
        load = Load(listener)
        rounds = []
        for i in range(args.rounds):
            time.sleep(0.5)  # the restarted replica settles; the load runs on
            rounds.append(one_round(i, replicas, envoy, load))
        outcomes = load.stop()
    finally:
        procs.stop_all()
    results["rounds"] = rounds
    results["load"] = {"rate": LOAD_RATE, "outcomes": outcomes,
                       "failed": sum(v for k, v in outcomes.items() if k != "200")}
    for key in ["new_vip_ms", "reconnect_ms"]:
        values = [r[key] for r in rounds]
        results[key] = {**run.summary(values), "mean": statistics.mean(values)}
    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")

    def ms(d):
        return f"p50 {d['p50']:.0f} ms, p90 {d['p90']:.0f} ms, max {d['max']:.0f} ms"

    print(f"{args.rounds} rounds, {args.replicas} replicas; control {results['control_sha256'][:12]}")
    print(f"kill -> first 200 for a never-asked VIP: {ms(results['new_vip_ms'])}")
    print(f"kill -> Envoy's ADS stream on a survivor: {ms(results['reconnect_ms'])}")
    print(f"load on the known VIP: {outcomes} ({results['load']['failed']} failed)")
    print(f"resources sent by the new replica per round: {sorted({r['resources_sent_by_new_replica'] for r in rounds})}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
