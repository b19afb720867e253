#!/usr/bin/env bash
# `make run`: odmesh for real on this machine. Starts odmesh-control with its embedded
# Eureka-compatible registry, demo upstreams that register with it as Eureka clients do, and
# Envoy with the filter; prints curl lines to try, and stops everything on Ctrl-C. Uses the
# default addresses of SPEC.md (Envoy on :15001, the registry on :8761).
set -euo pipefail
top="$(cd "$(dirname "$0")/.." && pwd)"
cd "$top"
ENVOY="${ENVOY:-$top/.tools/envoy-1.40.0/envoy/_bin/envoy}"
CONTROL="${CONTROL:-$top/target/debug/odmesh-control}"
DEMO_GRPC="${DEMO_GRPC:-target/debug/odmesh-demo-grpc}"
state="$top/.run"
rm -rf "$state" && mkdir -p "$state"

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

for port in 15001 9901 18000 18001 8761 18081 18082 18083 18084 18443; do
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
# The control plane, being the registry (the default without --registry or --eureka).
# The demo services run on this machine, at 127.0.0.1: a production registry refuses that.
start odmesh-control "$CONTROL" --serve-eureka 127.0.0.1:8761 --allow-loopback-instances --upstream-ca "$state/ca.pem" \
  --policy demo/policy.yaml --prewarm-history "$state/prewarm.json"
case "${FILTER:-wasm}" in
  wasm) bootstrap=envoy/odmesh.yaml ;;
  native) bootstrap=envoy/odmesh-native.yaml ;;
  *) echo "FILTER=$FILTER: expected wasm or native" >&2; exit 1 ;;
esac
start envoy "$ENVOY" -c "$bootstrap" --concurrency 2 --disable-hot-restart --log-level warn
eureka=http://127.0.0.1:8761/eureka
deadline=$((SECONDS + 20))
until curl -sf "$eureka/apps" >/dev/null; do
  if ((SECONDS > deadline)); then
    echo "odmesh-control did not start in 20 s; see $state/odmesh-control.log" >&2
    tail -n 20 "$state/odmesh-control.log" >&2 || true
    exit 1
  fi
  sleep 0.2
done

start demo-a-1 demo/upstream.py --app demo-a --instance demo-a-1 --port 18081 --eureka "$eureka"
start demo-a-2 demo/upstream.py --app demo-a --instance demo-a-2 --port 18082 --eureka "$eureka"
start demo-b-1 demo/upstream.py --app demo-b --instance demo-b-1 --port 18083 --eureka "$eureka"
start demo-secure-1 demo/upstream.py --app demo-secure --instance demo-secure-1 --port 18443 \
  --cert "$state/demo-secure.pem" --key "$state/demo-secure.key" --eureka "$eureka"
# A gRPC service (demo/echo.proto), registered like the others; it speaks only HTTP/2.
start demo-grpc-1 "$DEMO_GRPC" serve --listen 127.0.0.1:18084 --name demo-grpc-1
start demo-grpc-1-registration demo/upstream.py --app demo-grpc --instance demo-grpc-1 --port 18084 \
  --register-only --eureka "$eureka"

deadline=$((SECONDS + 20))
until curl -sf http://127.0.0.1:9901/ready >/dev/null &&
  [ "$(curl -sf -H 'Accept: application/json' "$eureka/apps" | grep -o '"instanceId"' | wc -l)" -ge 5 ]; do
  if ((SECONDS > deadline)); then
    echo "odmesh did not become ready in 20 s; see the logs in $state/" >&2
    tail -n 20 "$state"/odmesh-control.log "$state"/envoy.log >&2 || true
    exit 1
  fi
  sleep 0.2
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
wait -n "${pids[@]}" || true
echo "a process stopped unexpectedly; see $state/" >&2
