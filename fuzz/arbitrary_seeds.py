#!/usr/bin/env python3
"""Writes the seeds of the fuzz targets whose input `arbitrary` decodes (derived on the
target's `Input`): xds_session and load_report (fuzz/seeds/<target>/).

A seed is written here in that format, for an input worth starting from: integers little-endian,
a bool one byte (its lowest bit), an enum variant as a u32 (the variant `(x * count) >> 32`),
an `Option` a bool then the value, each element of a `Vec` after a byte 1, the `Vec` ended by
a byte 0 (or by the end of the input). No text fields: a string takes its length from the end
of the input. Check a seed with `cargo +nightly fuzz fmt <target> <file>`; run this script
again after changing a target's `Input`.
"""
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def u8(v):
    return bytes([v])


def boolean(b):
    return bytes([1 if b else 0])


def variant(i, count):
    # The smallest x with (x * count) >> 32 == i.
    return struct.pack("<I", -(-(i << 32) // count))


def vec(items):
    return b"".join(b"\x01" + item for item in items) + b"\x00"


def option(value):
    return boolean(False) if value is None else boolean(True) + value


# The target's alphabet (NAMES): indexes.
A_VIP, B_VIP, C_VIP, D_VIP, A_SVIP, B_SVIP, E_VIP, E_SVIP, XDS_CLUSTER, UPPER_A_VIP, WILDCARD = range(11)


def setup(max_names, max_unregistered, bound, share, prewarm, registered, loading=False):
    """Bounds as the target reads them: max_names 1 + n % 5, max_unregistered n % 3, the bound
    n % 8, a share 1 + n % 6 (None: no share)."""
    return (
        u8(max_names - 1)
        + u8(max_unregistered)
        + u8(bound)
        + option(None if share is None else u8(share - 1))
        + boolean(prewarm)
        + u8(sum(1 << i for i in registered))
        + boolean(loading)
    )


def name(i):
    return variant(0, 2) + u8(i)


ADS, CDS, EDS = range(3)
CLUSTERS, ENDPOINTS, EMPTY = range(3)
NONCE_NONE, NONCE_LAST = range(2)


def open_(slot, service, source):
    return variant(0, 8) + u8(slot) + variant(service, 3) + u8(source)


def request(slot, ty, subscribe=(), unsubscribe=(), kept=(), caller=None, nonce=NONCE_NONE):
    """A request; `kept`: names whose version the slot was last sent, `caller`: a node of
    CALLERS[caller]."""
    node = None if caller is None else variant(0, 2) + u8(caller)
    return (
        variant(1, 8)
        + u8(slot)
        + variant(ty, 4)
        + option(node)
        + vec([name(n) for n in subscribe])
        + vec([name(n) for n in unsubscribe])
        + vec([name(n) + variant(0, 2) for n in kept])
        + variant(nonce, 3)
        + option(None)
    )


def change(slot):
    return variant(2, 8) + u8(slot)


def tick(slot):
    return variant(3, 8) + u8(slot)


def close(slot):
    return variant(4, 8) + u8(slot)


def toggle(i):
    return variant(5, 8) + variant(0, 3) + u8(i)


def move(i):
    return variant(5, 8) + variant(1, 3) + u8(i)


def loading(on):
    return variant(5, 8) + variant(2, 3) + boolean(on)


def policy(i):
    return variant(6, 8) + u8(i)


def report(slot, names):
    return variant(7, 8) + u8(slot) + vec([name(n) for n in names])


def ops(*items):
    return vec(items)


SEEDS = {
    # A refused unregistered name (max_unregistered 0) registered once the source's share is
    # full: it is sent, and counted without room (the known overshoot).
    "refused-then-registered": setup(4, 0, 7, 1, False, [A_VIP])
    + ops(
        open_(0, ADS, 0),
        request(0, CLUSTERS, [C_VIP], caller=0),
        request(0, CLUSTERS, [A_VIP]),
        toggle(C_VIP),
        change(0),
        close(0),
    ),
    # Two sources under a bound of 2: the second's names wait, and are pushed once the first
    # closes; the same name subscribed and unsubscribed in one request.
    "waiting-for-room": setup(5, 2, 2, None, False, [A_VIP, B_VIP, C_VIP, A_SVIP])
    + ops(
        open_(0, ADS, 0),
        open_(1, ADS, 1),
        request(0, CLUSTERS, [A_VIP, B_VIP], caller=0),
        request(1, CLUSTERS, [C_VIP, A_SVIP, D_VIP], [D_VIP], caller=1),
        tick(1),
        close(0),
        tick(1),
        request(1, CLUSTERS, nonce=NONCE_LAST),
    ),
    # A proxy reconnects (a new stream in its slot) with the versions it kept, while the
    # registry loads; the registry completes and changes; kept unregistered names.
    "reconnect-kept-versions": setup(5, 1, 7, 3, False, [A_VIP, B_VIP, B_SVIP])
    + ops(
        open_(0, ADS, 0),
        request(0, CLUSTERS, [A_VIP, B_VIP, E_VIP], caller=1),
        request(0, ENDPOINTS, [A_VIP, B_VIP], nonce=NONCE_LAST),
        loading(True),
        open_(0, ADS, 0),
        request(0, CLUSTERS, [A_VIP, B_VIP, E_VIP, B_SVIP], kept=[A_VIP, B_VIP, E_VIP], caller=1),
        request(0, ENDPOINTS, [A_VIP], kept=[A_VIP, B_VIP]),
        move(A_VIP),
        loading(False),
        change(0),
        policy(2),
        change(0),
    ),
    # Prewarm: a service's proxy asks for names on demand; another of that service opens a
    # wildcard stream and is sent them ahead; load reports; idle ones are evicted.
    "wildcard-prewarm": setup(5, 2, 7, None, True, [A_VIP, B_VIP, C_VIP])
    + ops(
        open_(0, ADS, 0),
        request(0, CLUSTERS, [A_VIP, B_VIP, C_VIP], caller=0),
        open_(1, ADS, 1),
        request(1, CLUSTERS, caller=0),
        report(1, [A_VIP]),
        tick(1),
        request(1, CLUSTERS, [WILDCARD], [WILDCARD]),
        close(0),
        close(1),
    ),
    # Standalone CDS and EDS streams, names over max_names, not odmesh names, a registry
    # change that one stream's names see.
    "cds-and-eds": setup(2, 1, 7, 2, False, [A_VIP, A_SVIP])
    + ops(
        open_(0, CDS, 2),
        open_(1, EDS, 2),
        request(0, EMPTY, [A_VIP, XDS_CLUSTER, UPPER_A_VIP, A_SVIP], caller=0),
        request(1, EMPTY, [A_VIP, E_SVIP, B_VIP], caller=0),
        request(0, ENDPOINTS, [A_VIP]),
        toggle(A_VIP),
        change(0),
        change(1),
        request(1, EMPTY, [], [E_SVIP], nonce=NONCE_LAST),
    ),
}


# load_report: the alphabet (NAMES) and services (SERVICES) of the target.
LR_A_VIP, LR_B_VIP, LR_C_VIP, LR_A_SVIP, LR_B_SVIP, LR_GONE_VIP, LR_UPPER_A_VIP, LR_ODMESH_XDS = range(8)
SVC_A, SVC_B, SVC_NONE = range(3)


def known(i):
    return variant(0, 2) + u8(i)


def stats(cluster, localities, dropped=0):
    """A cluster's stats; each locality: (issued, successful, error, in progress), each a byte
    the target reads as 0 (below 128), that number, or the largest u64 (255)."""
    return known(cluster) + vec([bytes(l) for l in localities]) + u8(dropped)


def load_report(max_per_service, registered, reports):
    return (
        u8(max_per_service)
        + struct.pack("<H", sum(1 << i for i in registered))
        + vec(u8(node) + known(service) + vec(clusters) for node, service, clusters in reports)
    )


LOAD_REPORT_SEEDS = {
    # Two services' proxies report; some clusters carried requests, some only dropped ones,
    # some are not registered or not odmesh clusters; svc-a uses more than its bound of 2.
    "two-services": load_report(
        2,
        [LR_A_VIP, LR_B_VIP, LR_C_VIP, LR_A_SVIP, LR_ODMESH_XDS],
        [
            (0, SVC_A, [
                stats(LR_A_VIP, [(130, 0, 0, 0)]),
                stats(LR_B_VIP, [(0, 0, 0, 0), (0, 0, 0, 200)]),
                stats(LR_C_VIP, [(0, 0, 0, 0)], dropped=140),
                stats(LR_GONE_VIP, [(150, 150, 0, 0)]),
                stats(LR_ODMESH_XDS, [(255, 0, 0, 0)]),
            ]),
            (1, SVC_B, [stats(LR_A_SVIP, [(0, 129, 129, 0)]), stats(LR_UPPER_A_VIP, [(200, 0, 0, 0)])]),
            (0, SVC_A, [stats(LR_C_VIP, [(0, 0, 255, 0)]), stats(LR_A_VIP, [(131, 0, 0, 0)])]),
            (2, SVC_NONE, [stats(LR_B_VIP, [(131, 0, 0, 0)])]),
        ],
    ),
}


def main():
    for target, seeds in (("xds_session", SEEDS), ("load_report", LOAD_REPORT_SEEDS)):
        out = HERE / "seeds" / target
        out.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (out / name).write_bytes(data)
            print(f"{out / name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
