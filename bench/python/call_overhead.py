#!/usr/bin/env python3
"""What the Python module adds per call, against the C++ client, in one run on one connection.

Starts a private kvpoold (KVPOOLD_BIN) and times, on one connection, blocks of the same calls
made two ways, alternating: from Python through kvpool.Connection, and by the C++ client itself
inside the same process (kvpool._kvpool._native_call_times, which loops in C++ over
client::Connection). Operations: alloc 1, release 1, alloc 256, release 256 and a lookup of a
cached 16-block chain (every block a hit). Prints per operation the p50 and p99 of each and the
difference, which is the module's cost per call. Run from the repository root:

    PYTHONPATH=build/release/python KVPOOLD_BIN=build/release/daemon/kvpoold \\
        python3 bench/python/call_overhead.py
"""

import argparse
import time

import kvpool
from kvpool import _kvpool
from kvpool.local_daemon import LocalDaemon

CONFIG = """backend: host
pools:
  - name: default
    geometry: {layers: 32, kv_heads: 8, head_dim: 128, tokens_per_page: 16, dtype: fp16}
    capacity: 1024 pages
"""


def python_times(conn, op, pages, chain, iterations):
    """The same loop as _native_call_times, in Python: (op times, release times), µs."""
    clock = time.perf_counter_ns
    first, release = [], []
    for _ in range(iterations):
        t0 = clock()
        got = conn.alloc(pages) if op == "alloc" else conn.lookup(chain)
        t1 = clock()
        conn.release(got)
        t2 = clock()
        first.append((t1 - t0) / 1e3)
        release.append((t2 - t1) / 1e3)
    return first, release


def pct(samples, q):
    s = sorted(samples)
    return s[int(q * (len(s) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=20000, help="calls per operation and side")
    ap.add_argument("--block", type=int, default=500, help="calls per alternating block")
    args = ap.parse_args()
    with LocalDaemon(CONFIG) as daemon:
        conn = kvpool.attach(daemon.socket, worker="call-overhead")
        chain = [kvpool.BlockHash(0xBEEF0 + i, 0x4321 + i) for i in range(16)]
        pages = conn.alloc(16)
        conn.publish(pages, chain)
        conn.release(pages)
        cases = [("alloc 1", "release 1", "alloc", 1), ("alloc 256", "release 256", "alloc", 256),
                 ("lookup 16 (hits)", None, "lookup", 0)]
        rows = []
        for name, release_name, op, n in cases:
            native, python = ([], []), ([], [])
            for _ in range(max(1, args.iterations // args.block)):
                for side, measure in ((native, _kvpool._native_call_times),
                                      (python, python_times)):
                    a, r = measure(conn, op, n, chain, args.block)
                    side[0].extend(a)
                    side[1].extend(r)
            rows.append((name, native[0], python[0]))
            if release_name:
                rows.append((release_name, native[1], python[1]))
        print(f"{args.iterations} calls per operation and side, alternating blocks of "
              f"{args.block}; microseconds per call")
        print(f"{'operation':<18} {'C++ p50':>8} {'Py p50':>8} {'+Py p50':>8} {'ratio':>6} "
              f"{'C++ p99':>8} {'Py p99':>8}")
        for name, native, python in rows:
            c50, p50 = pct(native, 0.5), pct(python, 0.5)
            print(f"{name:<18} {c50:8.2f} {p50:8.2f} {p50 - c50:8.2f} {p50 / c50:6.2f} "
                  f"{pct(native, 0.99):8.2f} {pct(python, 0.99):8.2f}")


if __name__ == "__main__":
    main()
