#!/usr/bin/env bash
# Installs what `make bench` drives besides Rust and Envoy: nginx (the upstream), wrk (load),
# h2load (nghttp2-client). Debian/Ubuntu packages; skips what is already there.
set -euo pipefail
need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v wrk >/dev/null || need+=(wrk)
command -v h2load >/dev/null || need+=(nghttp2-client)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -eq 0 ]; then
  echo "bench deps: nginx, wrk, h2load present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "bench deps: installing ${need[*]}"
$sudo apt-get update
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${need[@]}"
