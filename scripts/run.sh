#!/usr/bin/env bash
# `make run`: odmesh for real on this machine. Starts odmesh-control with its embedded
# Eureka-compatible registry, demo upstreams that register with it as Eureka clients do, and
# Envoy with the filter; prints curl lines to try, and stops everything on Ctrl-C. Uses the
# default addresses (README, "Default addresses": Envoy on :15001, the registry on :8761).
#
# NODES=3 (`make run NODES=3`) starts three odmesh-control nodes instead, each with its own
# embedded registry (8761, 8762, 8763), xDS (18000, 18002, 18004) and admin (18001, 18003,
# 18005) port, peered with each other (--peer); Envoy's xDS cluster lists the three, and the
# demo services know every registry. Kill one: the mesh goes on.
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
cd "$top"
ENVOY="${ENVOY:-$top/.tools/envoy-1.40.0/envoy/_bin/envoy}"
CONTROL="${CONTROL:-$top/target/debug/odmesh-control}"
DEMO_GRPC="${DEMO_GRPC:-target/debug/odmesh-demo-grpc}"
state="$top/.run"
rm -rf "$state" && mkdir -p "$state"
NODES="${NODES:-1}"
if ! [[ "$NODES" =~ ^[1-9]$ ]]; then
  echo "NODES=$NODES: expected 1 to 9 control-plane nodes" >&2
  exit 1
fi
# Node n (from 1): registry 8760+n, xDS 17998+2n, admin 17999+2n (node 1: the defaults, README "Default addresses").
nodes=$(seq 1 "$NODES")
registry_port() { echo $((8760 + $1)); }
xds_port() { echo $((17998 + 2 * $1)); }
admin_port() { echo $((17999 + 2 * $1)); }

pids=()
stop() {
  trap - INT TERM EXIT
  ((${#pids[@]})) || return 0
  echo; echo "stopping odmesh..."
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "stopped; logs are in $state/"
}
trap stop EXIT
trap 'stop; exit 0' INT TERM

ports=(15001 15006 9901 18081 18082 18083 18084 18443)
for n in $nodes; do ports+=("$(registry_port "$n")" "$(xds_port "$n")" "$(admin_port "$n")"); done
for port in "${ports[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port on 127.0.0.1 is in use: stop what runs there (another 'make run'?) and try again" >&2
    exit 1
  fi
done

# A test CA and a certificate for the secure demo service (SVIP demo-secure).
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=odmesh demo CA" \
  -keyout "$state/ca.key" -out "$state/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=demo-secure" -keyout "$state/demo-secure.key" \
  -out "$state/demo-secure.csr" 2>/dev/null
printf 'subjectAltName=DNS:demo-secure\n' > "$state/san.ext"
openssl x509 -req -in "$state/demo-secure.csr" -CA "$state/ca.pem" -CAkey "$state/ca.key" \
  -CAcreateserial -days 2 -extfile "$state/san.ext" -out "$state/demo-secure.pem" 2>/dev/null

start() { # name, command...
  local name=$1; shift
  "$@" >"$state/$name.log" 2>&1 &
  pids+=($!)
}
case "${FILTER:-wasm}" in
  wasm) bootstrap=envoy/odmesh.yaml ;;
  native) bootstrap=envoy/odmesh-native.yaml ;;
  *) echo "FILTER=$FILTER: expected wasm or native" >&2; exit 1 ;;
esac
eureka=http://127.0.0.1:8761/eureka
eureka_args=() # every node's registry, for the demo services
peer_args=()   # every node's registry, for each node (a node skips its own URL)
for n in $nodes; do
  eureka_args+=(--eureka "http://127.0.0.1:$(registry_port "$n")/eureka")
  peer_args+=(--peer "http://127.0.0.1:$(registry_port "$n")/eureka")
done
node_pids=()
if ((NODES == 1)); then
  # The control plane, being the registry (the default without --registry or --eureka).
  # The demo services run on this machine, at 127.0.0.1: a production registry refuses that.
  start odmesh-control "$CONTROL" --serve-eureka 127.0.0.1:8761 --allow-loopback-instances --upstream-ca "$state/ca.pem" \
    --policy demo/policy.yaml --prewarm-history "$state/prewarm.json"
  logs=("$state/odmesh-control.log")
else
  # Each node: its own registry, xDS and admin port, the same peers, policy and CA, and one
  # prewarm history file that all of them merge into.
  logs=()
  for n in $nodes; do
    start "node-$n" "$CONTROL" --serve-eureka "127.0.0.1:$(registry_port "$n")" --allow-loopback-instances \
      "${peer_args[@]}" --xds "127.0.0.1:$(xds_port "$n")" --admin "127.0.0.1:$(admin_port "$n")" \
      --upstream-ca "$state/ca.pem" --policy demo/policy.yaml --prewarm-history "$state/prewarm.json"
    node_pids+=("${pids[-1]}")
    echo "${pids[-1]}" >"$state/node-$n.pid"
    logs+=("$state/node-$n.log")
  done
  # The shipped bootstrap, its xDS cluster listing every node.
  endpoint='        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 18000}}}'
  if [ "$(grep -cxF "$endpoint" "$bootstrap")" != 1 ]; then
    echo "$bootstrap: its odmesh_xds endpoint line changed; update scripts/run.sh" >&2
    exit 1
  fi
  xds_ports="$(for n in $nodes; do xds_port "$n"; done | tr '\n' ' ')"
  awk -v line="$endpoint" -v ports="$xds_ports" '
    $0 == line { n = split(ports, p, " "); for (i = 1; i <= n; i++) { l = line; sub(/18000/, p[i], l); print l }; next }
    { print }' "$bootstrap" >"$state/envoy.yaml"
  bootstrap="$state/envoy.yaml"
fi
start envoy "$ENVOY" -c "$bootstrap" --concurrency 2 --disable-hot-restart --log-level warn
deadline=$((SECONDS + 20))
for n in $nodes; do
  until curl -sf "http://127.0.0.1:$(registry_port "$n")/eureka/apps" >/dev/null; do
    if ((SECONDS > deadline)); then
      echo "odmesh-control did not start in 20 s; see ${logs[*]}" >&2
      tail -n 20 "${logs[@]}" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
done

start demo-a-1 demo/upstream.py --app demo-a --instance demo-a-1 --port 18081 "${eureka_args[@]}"
start demo-a-2 demo/upstream.py --app demo-a --instance demo-a-2 --port 18082 "${eureka_args[@]}"
start demo-b-1 demo/upstream.py --app demo-b --instance demo-b-1 --port 18083 "${eureka_args[@]}"
start demo-secure-1 demo/upstream.py --app demo-secure --instance demo-secure-1 --port 18443 \
  --cert "$state/demo-secure.pem" --key "$state/demo-secure.key" "${eureka_args[@]}"
# A gRPC service (demo/echo.proto), registered like the others; it speaks only HTTP/2.
start demo-grpc-1 "$DEMO_GRPC" serve --listen 127.0.0.1:18084 --name demo-grpc-1
start demo-grpc-1-registration demo/upstream.py --app demo-grpc --instance demo-grpc-1 --port 18084 \
  --register-only "${eureka_args[@]}"

# Ready: Envoy, and every node's registry holding the five instances (with several nodes, the
# demo services registered with node 1: the others have them by replication).
registered() {
  curl -sf -H 'Accept: application/json' "http://127.0.0.1:$(registry_port "$1")/eureka/apps" |
    grep -o '"instanceId"' | wc -l
}
deadline=$((SECONDS + 20))
for n in $nodes; do
  until curl -sf http://127.0.0.1:9901/ready >/dev/null && [ "$(registered "$n")" -ge 5 ]; do
    if ((SECONDS > deadline)); then
      echo "odmesh did not become ready in 20 s; see the logs in $state/" >&2
      tail -n 20 "${logs[@]}" "$state"/envoy.log >&2 || true
      exit 1
    fi
    sleep 0.2
  done
done

cat <<TXT

odmesh is running ($bootstrap): Envoy on 127.0.0.1:15001, the registry on $eureka, admin on 127.0.0.1:18001.
Try:
  curl -H 'Host: demo-a' http://127.0.0.1:15001/             # VIP demo-a: round robin over 2 instances
  curl -H 'Host: demo-b' http://127.0.0.1:15001/             # VIP demo-b
  curl -H 'Host: demo-secure:8443' http://127.0.0.1:15001/   # SVIP demo-secure, TLS to the upstream
  $DEMO_GRPC call --vip demo-grpc --message hi      # gRPC to VIP demo-grpc
  $DEMO_GRPC call --vip demo-grpc --stream 3        # a server stream, with its trailers
  $DEMO_GRPC call --vip nosuch                      # gRPC: UNAVAILABLE, naming the VIP
  curl -H 'Host: nosuch' http://127.0.0.1:15001/             # not registered: fast 503 that says so
  curl -H 'Host: bad_name!' http://127.0.0.1:15001/          # invalid: 400 that says why
Change the registry as a Eureka client or operator would:
  curl -X PUT '$eureka/apps/DEMO-A/demo-a-2/status?value=OUT_OF_SERVICE'   # drain one instance
  curl -X DELETE '$eureka/apps/DEMO-A/demo-a-2/status'                     # and back
  curl -H 'Accept: application/json' $eureka/apps                           # what is registered
See what the mesh holds:
  curl http://127.0.0.1:18001/debug/proxies                  # what Envoy subscribed to
  curl http://127.0.0.1:18001/debug/policy                   # each cluster's policy (demo/policy.yaml), and from where
  curl http://127.0.0.1:18001/debug/prewarm                  # what a restarted Envoy would be sent ahead
  curl -s http://127.0.0.1:9901/clusters | grep -c '::cx_total'   # endpoints Envoy knows
Logs: $state/. Ctrl-C stops everything.
TXT
watch=("${pids[@]}")
if ((NODES > 1)); then
  holds_envoy() { curl -sf "http://127.0.0.1:$(admin_port "$1")/debug/proxies" | grep -q '"ads"'; }
  connected=1
  for n in $nodes; do if holds_envoy "$n"; then connected=$n; fi; done
  list() { local out=(); for n in $nodes; do out+=("$("$1" "$n")"); done; echo "${out[*]}"; }
  cat <<TXT

$NODES control-plane nodes, each with its own registry, peered (--peer): registries on ports
$(list registry_port) (/eureka), xDS on $(list xds_port), admin on $(list admin_port). Envoy lists every
xDS port; its stream is on node $connected now. Kill that node as a crash would, and ask again:
  kill -9 \$(cat $state/node-$connected.pid)                    # node $connected dies
  curl -H 'Host: demo-a' http://127.0.0.1:15001/             # still answers, through another node
  for n in $(list admin_port); do curl -s localhost:\$n/debug/proxies | grep -c '"ads"'; done   # where Envoy's stream is now
  curl -H 'Accept: application/json' http://127.0.0.1:$(registry_port $(( connected % NODES + 1 )))/eureka/apps   # the registry on a survivor
TXT
  # A node's death is the point of the demo: only the other processes' end stops it.
  watch=()
  for pid in "${pids[@]}"; do [[ " ${node_pids[*]} " == *" $pid "* ]] || watch+=("$pid"); done
fi
wait -n "${watch[@]}" || true
echo "a process stopped unexpectedly; see $state/" >&2
