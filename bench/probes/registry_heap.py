#!/usr/bin/env python3
"""Where the embedded registry's memory goes: a heap profile of `odmesh-bench registry-load`.

    bench/probes/registry_heap.py [--instances 20000]

Runs `registry-load --registrations-only` (the registry in-process, its publisher and eviction
running, no reads) under valgrind's massif, then prints the peak snapshot's allocation sites
(massif's tree, functions only) down to `--depth` levels and above `--min-kib`, with the live
heap and the allocator's overhead per instance. Needs target/release/odmesh-bench and valgrind.
"""

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--min-kib", type=int, default=300)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="odmesh-heap-")) / "massif.out"
    bench = ROOT / "target/release/odmesh-bench"
    subprocess.run(["valgrind", "--tool=massif", f"--massif-out-file={out}", "--depth=12", "--threshold=0.5",
                    str(bench), "registry-load", "--registrations-only", "--instances", str(args.instances),
                    "--first-checkpoint", str(args.instances), "--window", "1000"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    snapshots = out.read_text().split("snapshot=")[1:]
    peak = next(s for s in snapshots if "heap_tree=peak" in s)
    heap = int(re.search(r"mem_heap_B=(\d+)", peak).group(1))
    extra = int(re.search(r"mem_heap_extra_B=(\d+)", peak).group(1))
    print(f"peak: {heap / 2**20:.1f} MiB live heap ({heap / args.instances:.0f} bytes per instance), "
          f"{extra / 2**20:.1f} MiB allocator overhead ({extra / args.instances:.0f} per instance)")
    for line in peak.splitlines():
        m = re.match(r"^( *)n\d+: (\d+) (.*)$", line)
        if not m or len(m.group(1)) > args.depth or int(m.group(2)) < args.min_kib * 1024:
            continue
        site = re.sub(r"0x[0-9A-F]+: |\(in /[^)]*\)", "", m.group(3)).strip()
        print(f"{'  ' * len(m.group(1))}{int(m.group(2)) / 1024:8.0f} KiB {100 * int(m.group(2)) / heap:5.1f}%  {site[:140]}")


if __name__ == "__main__":
    main()
