#!/usr/bin/env python3
"""What the Python module adds per call, against the C++ client, in one run on one connection.

Starts a private kvpoold (KVPOOLD_BIN) and times, on one connection, blocks of the same calls
made two ways, alternating: from Python through kvpool.Connection, and by the C++ client itself
inside the same process (kvpool._kvpool._native_call_times, which loops in C++ over
client::Connection). Operations: alloc 1, release 1, alloc 256, release 256 and a lookup of a
cached 16-block chain (every block a hit). Prints per operation the wall-clock p50 and p99 of
each, and the client thread's CPU time per pair of calls: the round trip is mostly waiting for the
daemon, and how fast the next request follows a reply changes how the daemon is scheduled, so
the CPU-time difference is the module's own cost. Run from the repository root:

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
    """The same loop as _native_call_times, in Python: (op times, release times, this thread's
    CPU time for the loop), µs."""
    clock = time.perf_counter_ns
    first, release = [], []
    cpu0 = time.thread_time_ns()
    for _ in range(iterations):
        t0 = clock()
        got = conn.alloc(pages) if op == "alloc" else conn.lookup(chain)
        t1 = clock()
        conn.release(got)
        t2 = clock()
        first.append((t1 - t0) / 1e3)
        release.append((t2 - t1) / 1e3)
    return first, release, (time.thread_time_ns() - cpu0) / 1e3


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
        rows, cpu_rows = [], []
        for name, release_name, op, n in cases:
            native, python = ([], []), ([], [])
            cpu = {"C++": 0.0, "Py": 0.0}
            blocks = max(1, args.iterations // args.block)
            for _ in range(blocks):
                for side, label, measure in ((native, "C++", _kvpool._native_call_times),
                                             (python, "Py", python_times)):
                    a, r, cpu_us = measure(conn, op, n, chain, args.block)
                    side[0].extend(a)
                    side[1].extend(r)
                    cpu[label] += cpu_us
            rows.append((name, native[0], python[0]))
            if release_name:
                rows.append((release_name, native[1], python[1]))
            pair = f"{name} + release" if release_name is None else f"{name} + {release_name}"
            calls = blocks * args.block
            cpu_rows.append((pair, cpu["C++"] / calls, cpu["Py"] / calls))
        print(f"{args.iterations} calls per operation and side, alternating blocks of "
              f"{args.block}; microseconds per call")
        print("Round trip (wall clock):")
        print(f"{'operation':<18} {'C++ p50':>8} {'Py p50':>8} {'+Py p50':>8} {'ratio':>6} "
              f"{'C++ p99':>8} {'Py p99':>8}")
        for name, native, python in rows:
            c50, p50 = pct(native, 0.5), pct(python, 0.5)
            print(f"{name:<18} {c50:8.2f} {p50:8.2f} {p50 - c50:8.2f} {p50 / c50:6.2f} "
                  f"{pct(native, 0.99):8.2f} {pct(python, 0.99):8.2f}")
        print("Client CPU time per pair of calls (this thread; the module's own cost is the "
              "difference):")
        print(f"{'calls':<28} {'C++':>8} {'Py':>8} {'+Py':>8}")
        for pair, c, p in cpu_rows:
            print(f"{pair:<28} {c:8.2f} {p:8.2f} {p - c:8.2f}")


if __name__ == "__main__":
    main()
