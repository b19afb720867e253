#!/bin/sh
# Probe: how much of a connected proxy's memory in odmesh-control is h2's own buffers.
#
#     bench/probes/h2_buffers.sh [--proxies 2000]
#
# Builds odmesh-control against a copy of the h2 crate in use (from cargo's registry) with its
# per-connection buffers made small: the write buffer 16 KB -> 2 KB (it grows for a larger
# frame), the read buffer 8 KB -> 1 KB (tokio-util's FramedRead, which grows it too), and the
# HPACK decoder's 4 KB scratch buffer allocated only when used. Then runs
# bench/probes/proxy_memory.py with 30 and with 1 subscription per proxy. Nothing of the
# repository changes: the copy and the build are under $WORK (default /tmp/odmesh-h2-probe).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/odmesh-h2-probe}
VERSION=$(awk '/^name = "h2"$/ {getline; gsub(/"/, "", $3); print $3}' "$ROOT/Cargo.lock")
SRC=$(ls -d "$HOME"/.cargo/registry/src/*/h2-"$VERSION" | head -1)
rm -rf "$WORK/h2" && mkdir -p "$WORK" && cp -r "$SRC" "$WORK/h2"
cd "$WORK/h2"
sed -i 's/^const DEFAULT_BUFFER_CAPACITY: usize = 16 \* 1_024;/const DEFAULT_BUFFER_CAPACITY: usize = 2 * 1_024;/' src/codec/framed_write.rs
sed -i 's/            buffer: BytesMut::with_capacity(4096),/            buffer: BytesMut::new(),/' src/hpack/decoder.rs
python3 - <<'EOF'
from pathlib import Path
p = Path("src/codec/mod.rs")
s = p.read_text()
old = "            .new_read(framed_write);"
assert old in s, "h2's codec changed: update this probe"
s = s.replace(old, "            .new_codec();\n"
              "        let delimited = tokio_util::codec::FramedRead::with_capacity(framed_write, delimited, 1024);")
p.write_text(s)
EOF
grep -q "DEFAULT_BUFFER_CAPACITY: usize = 2 \* 1_024" src/codec/framed_write.rs
grep -q "buffer: BytesMut::new()," src/hpack/decoder.rs
cd "$ROOT"
cp Cargo.lock "$WORK/Cargo.lock.kept"
CARGO_TARGET_DIR="$WORK/target" cargo build --release -j2 -p odmesh-control \
    --config "patch.crates-io.h2.path=\"$WORK/h2\"" || { cp "$WORK/Cargo.lock.kept" Cargo.lock; exit 1; }
cp "$WORK/Cargo.lock.kept" Cargo.lock
echo "h2 $VERSION with small buffers: $(sha256sum "$WORK/target/release/odmesh-control")"
python3 bench/probes/proxy_memory.py "$WORK/target/release/odmesh-control" "$@"
python3 bench/probes/proxy_memory.py "$WORK/target/release/odmesh-control" --subs 1 "$@"
