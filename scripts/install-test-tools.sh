#!/usr/bin/env bash
# Installs the outside tools the end-to-end tests read odmesh's output with, each only when it
# is missing:
#   chromium         (Debian) renders the registry and mesh dashboards headless
#   skopeo, umoci    (Debian) read the OCI images `make dist` writes back, as a registry would
#   prometheus-client (PyPI, pinned in tests/tools/requirements.txt) parses /metrics strictly,
#                    into the git-ignored .tools/test-python/
# Idempotent; CI runs it through `make e2e`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

need=()
command -v chromium >/dev/null || need+=(chromium)
command -v skopeo >/dev/null || need+=(skopeo)
command -v umoci >/dev/null || need+=(umoci)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || {
    echo "install-test-tools: ${need[*]} missing and no apt-get: install them with your package manager" >&2
    exit 1
  }
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-test-tools: installing ${need[*]} (apt)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "install-test-tools: $(chromium --version 2>/dev/null | head -1); skopeo $(skopeo --version | awk '{print $3}'); umoci $(umoci --version | awk '{print $3}')"

req="$root/tests/tools/requirements.txt"
dest="$root/.tools/test-python"
stamp="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ "$(cat "$dest/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$dest" && mkdir -p "$dest"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$dest" -r "$req"
  echo "$stamp" > "$dest/.stamp"
fi
echo "install-test-tools: prometheus-client $(PYTHONPATH="$dest" python3 -c 'import importlib.metadata as m; print(m.version("prometheus-client"))') in $dest"
