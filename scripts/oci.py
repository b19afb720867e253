#!/usr/bin/env python3
"""Writes odmesh's two OCI images as OCI image layouts, without a container engine:

  oci.py wasm WASM OUT        the wasm filter, as the Wasm image "compat" variant that Istio's
                              and Envoy Gateway's pullers read (docs/images.md): one
                              tar+gzip layer holding plugin.wasm
  oci.py control BINARY OUT   odmesh-control at /usr/local/bin, with the shared libraries it
                              loads (ldd, from this machine), the CA bundle, user 65532

OUT is an OCI layout folder (oci-layout, index.json, blobs/sha256/), its one image tagged
with the version: `skopeo copy oci:OUT:VERSION docker://REGISTRY/NAME:VERSION` pushes it.
Environment: VERSION, REVISION (the commit), SOURCE (the repository's URL) for the labels;
SOURCE_DATE_EPOCH for every date. Reproducible: entries in name order, owned by 0 (the
control plane's state folder by 65532), dated SOURCE_DATE_EPOCH, gzip without a name or time,
JSON with sorted keys: the same inputs give the same bytes and digests.
"""
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time

EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
VERSION = os.environ.get("VERSION", "0.0.0")
USER = 65532  # the non-root user odmesh-control runs as (numeric: no /etc/passwd lookup)
STATE = "var/lib/odmesh"  # its working folder: the prewarm history is written there
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def labels(title, description):
    return {
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.description": description,
        "org.opencontainers.image.version": VERSION,
        "org.opencontainers.image.revision": os.environ.get("REVISION", "unknown"),
        "org.opencontainers.image.source": os.environ.get("SOURCE", "unknown"),
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.created": created(),
    }


def created():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH))


def layer(entries):
    """A tar+gzip layer of `entries` (path, kind, mode, uid, data or link target), in name
    order, with its parent folders: (the gzip bytes, the tar's sha256 for diff_ids)."""
    folders = {}
    for path, *_ in entries:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folders.setdefault("/".join(parts[:i]), ("dir", 0o755, 0, None))
    items = dict(folders)
    for path, kind, mode, uid, data in entries:
        items[path] = (kind, mode, uid, data)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(items):
            kind, mode, uid, data = items[path]
            info = tarfile.TarInfo(path)
            info.mode, info.uid, info.gid, info.mtime = mode, uid, uid, EPOCH
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=packed, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(tar_bytes)
    return packed.getvalue(), "sha256:" + hashlib.sha256(tar_bytes).hexdigest()


def write_layout(out, config, layers, annotations):
    """An OCI image layout in `out` holding one image: `config` (a dict, its rootfs filled in
    here), `layers` ([(gzip bytes, diff_id)]), tagged VERSION."""
    blobs = os.path.join(out, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    for name in os.listdir(blobs):  # a layout written before: only this image's blobs stay
        os.remove(os.path.join(blobs, name))

    def blob(data, media_type):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}

    config["rootfs"] = {"type": "layers", "diff_ids": [diff for _, diff in layers]}
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": blob(canonical(config), CONFIG),
        "layers": [blob(data, LAYER) for data, _ in layers],
        "annotations": annotations,
    }
    described = blob(canonical(manifest), MANIFEST)
    described["annotations"] = {"org.opencontainers.image.ref.name": VERSION}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [described]}
    with open(os.path.join(out, "index.json"), "wb") as f:
        f.write(canonical(index))
    with open(os.path.join(out, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))
    return described["digest"]


def wasm_image(wasm, out):
    with open(wasm, "rb") as f:
        module = f.read()
    # The "compat" variant: one tar+gzip layer with plugin.wasm, and the manifest annotation
    # module.wasm.image/variant=compat (docs/images.md, "The wasm image").
    data = layer([("plugin.wasm", "file", 0o644, 0, module)])
    tags = labels("odmesh-filter-wasm", "odmesh's proxy-wasm filter (Host -> <vip>.vip)")
    config = {
        "created": created(),
        # What runs it is a wasm VM, any CPU; "linux" because umoci (0.4.7) unpacks no other OS.
        "architecture": "wasm",
        "os": "linux",
        "config": {"Labels": tags},
        "history": [{"created": created(), "created_by": "scripts/oci.py wasm"}],
    }
    return write_layout(out, config, [data], dict(tags, **{"module.wasm.image/variant": "compat"}))


def shared_libraries(binary):
    """The files the dynamic loader maps for `binary`, by the paths it names them (ldd)."""
    listed = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    paths = []
    for line in listed.splitlines():
        found = re.search(r"(?:=> )?(/\S+) \(0x", line)
        if found:
            paths.append(found.group(1))
        elif "=>" in line and "vdso" not in line:
            sys.exit(f"oci.py: {binary} needs a library ldd cannot find: {line.strip()}")
    if not any("ld-linux" in p for p in paths):
        sys.exit(f"oci.py: no dynamic loader in ldd's answer for {binary}:\n{listed}")
    return sorted(paths)


def control_image(binary, out):
    def read(path):
        with open(path, "rb") as f:
            return f.read()

    entries = [("usr/local/bin/odmesh-control", "file", 0o755, 0, read(binary))]
    for lib in shared_libraries(binary):
        entries.append((lib.lstrip("/"), "file", 0o755, 0, read(os.path.realpath(lib))))
    # For --eureka https://... and --upstream-ca's default (odmesh_base::tls::SYSTEM_CA_BUNDLES).
    entries.append((CA_BUNDLE.lstrip("/"), "file", 0o644, 0, read(CA_BUNDLE)))
    entries.append(("etc/passwd", "file", 0o644, 0,
                    f"root:x:0:0:root:/root:/sbin/nologin\nodmesh:x:{USER}:{USER}:odmesh:/{STATE}:/sbin/nologin\n".encode()))
    entries.append(("etc/group", "file", 0o644, 0, f"root:x:0:\nodmesh:x:{USER}:\n".encode()))
    entries.append(("etc/nsswitch.conf", "file", 0o644, 0, b"hosts: files dns\n"))
    entries.append((STATE, "dir", 0o755, USER, None))
    entries.append(("tmp", "dir", 0o1777, 0, None))
    data = layer(entries)
    tags = labels("odmesh-control", "odmesh's xDS control plane and embedded Eureka registry")
    config = {
        "created": created(),
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{USER}:{USER}",
            "Entrypoint": ["/usr/local/bin/odmesh-control"],
            "WorkingDir": "/" + STATE,
            "Env": ["PATH=/usr/local/bin"],
            # xDS, admin, the embedded registry (README, "Default addresses"). Each binds
            # loopback unless its flag says otherwise: docs/images.md shows the flags.
            "ExposedPorts": {"18000/tcp": {}, "18001/tcp": {}, "8761/tcp": {}},
            "Labels": tags,
        },
        "history": [{"created": created(), "created_by": "scripts/oci.py control"}],
    }
    return write_layout(out, config, [data], tags)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("wasm", "control"):
        sys.exit("usage: oci.py wasm WASM OUT | oci.py control BINARY OUT")
    kind, source, out = sys.argv[1:]
    digest = (wasm_image if kind == "wasm" else control_image)(source, out)
    print(f"oci: {out}:{VERSION}, manifest {digest}")


if __name__ == "__main__":
    main()
