#!/usr/bin/env bash
# Installs the real, unmodified Eureka clients that eureka/tests/eureka_real_clients.rs
# drives, from the npm and PyPI registries, into the git-ignored .tools/eureka-clients/:
#   .tools/eureka-clients/node/node_modules/eureka-js-client   (npm, pinned by package-lock.json)
#   .tools/eureka-clients/python/py_eureka_client              (PyPI, pinned by requirements.txt)
# Idempotent: skips a client whose pins have not changed since its last install.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
clients="$root/eureka/tests/clients"
dest="$root/.tools/eureka-clients"
mkdir -p "$dest/node" "$dest/python"

need() { command -v "$1" >/dev/null || { echo "install-eureka-clients: '$1' not found; it is needed for the real Eureka client tests" >&2; exit 1; }; }
"$root/scripts/check-prereqs.sh" node
need npm
need python3

stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

js_src="$clients/eureka-js-client"
js_stamp="$(stamp_of "$js_src/package.json" "$js_src/package-lock.json")"
if [[ "$(cat "$dest/node/.stamp" 2>/dev/null)" != "$js_stamp" ]]; then
  cp "$js_src/package.json" "$js_src/package-lock.json" "$dest/node/"
  (cd "$dest/node" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$js_stamp" > "$dest/node/.stamp"
fi
echo "eureka-js-client $(node -p "require('$dest/node/node_modules/eureka-js-client/package.json').version") in $dest/node"

py_src="$clients/py-eureka-client"
py_stamp="$(stamp_of "$py_src/requirements.txt")"
if [[ "$(cat "$dest/python/.stamp" 2>/dev/null)" != "$py_stamp" ]]; then
  rm -rf "$dest/python" && mkdir -p "$dest/python"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$dest/python" -r "$py_src/requirements.txt"
  echo "$py_stamp" > "$dest/python/.stamp"
fi
echo "py-eureka-client $(PYTHONPATH="$dest/python" python3 -c 'import importlib.metadata as m; print(m.version("py-eureka-client"))') in $dest/python"
