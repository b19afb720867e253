#!/usr/bin/env python3
"""CycloneDX 1.5 SBOM (JSON) of what the bundle ships: `cargo metadata` on stdin, the version as
argv[1], the shipped crates as the rest (odmesh-control odmesh-filter-wasm odmesh-filter-native).

Lists every crate those link (their normal dependencies, transitively; not build, dev or test
ones), with its version, license and package URL (pkg:cargo/NAME@VERSION); no timestamp or
random serial, so that the same lock file gives the same bytes (scripts/dist.sh packs it
reproducibly).
"""
import json
import sys

meta = json.load(sys.stdin)
version, shipped = sys.argv[1], set(sys.argv[2:])
own = set(meta["workspace_members"])
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
linked, todo = set(), [i for i, p in packages.items() if p["name"] in shipped and i in own]
assert len(todo) == len(shipped), f"not all of {shipped} are workspace crates"
while todo:
    node = nodes[todo.pop()]
    for dep in node["deps"]:
        normal = any(k["kind"] is None for k in dep["dep_kinds"])
        if normal and dep["pkg"] not in linked:
            linked.add(dep["pkg"])
            todo.append(dep["pkg"])
components = []
for p in sorted((packages[i] for i in linked), key=lambda p: (p["name"], p["version"])):
    if p["id"] in own:
        continue
    c = {"type": "library", "name": p["name"], "version": p["version"],
         "purl": f"pkg:cargo/{p['name']}@{p['version']}"}
    if p.get("license"):
        c["licenses"] = [{"expression": p["license"]}]
    components.append(c)
sbom = {
    "bomFormat": "CycloneDX",
    "specVersion": "1.5",
    "version": 1,
    "metadata": {"component": {"type": "application", "name": "odmesh", "version": version,
                               "licenses": [{"expression": "Apache-2.0"}]}},
    "components": components,
}
json.dump(sbom, sys.stdout, indent=1, sort_keys=True)
sys.stdout.write("\n")
