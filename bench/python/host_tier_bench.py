#!/usr/bin/env python3
"""Promote and demote cost per page of a pool's host tier, against device-tier hits, in one run.

Starts a private kvpoold (KVPOOLD_BIN) whose pool has a host tier, caches blocks until every one
has been pushed down (an admin evict demotes what the pool still holds), then, for batches of k
blocks, times on one connection:
  promote   a lookup of k blocks that only the host tier holds: the daemon allocates k pages,
            copies the blocks up and publishes them before it answers;
  hit       the same lookup again, now k device-tier hits (the baseline: the round trip and the
            index work without any copy);
  demote    an admin evict of those k pages once released, which copies them back down.
Per page it prints promote − hit and demote − (an evict of k blocks without a host tier, measured
on a second pool of the same daemon), the medians over the rounds, and the copy bandwidth that
implies. Run from the repository root (evict needs root or the admin group):

    PYTHONPATH=build/release/python KVPOOLD_BIN=build/release/daemon/kvpoold \\
        python3 bench/python/host_tier_bench.py
"""

import argparse
import statistics
import time

import kvpool
from kvpool.local_daemon import LocalDaemon

GEOMETRIES = {
    # Llama-3-8B-like: 32 layers, 8 KV heads, head dim 128, 16 tokens a page, bf16: 2 MiB a page.
    "2MiB": "{layers: 32, kv_heads: 8, head_dim: 128, tokens_per_page: 16, dtype: bf16}",
    # A small model's page: 64 KiB.
    "64KiB": "{layers: 8, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16}",
}


def config(backend, geometry, pages, host_pages):
    return f"""backend: {backend}
pools:
  - name: tiered
    geometry: {geometry}
    capacity: {pages} pages
    host_tier: {host_pages} pages
  - name: plain
    geometry: {geometry}
    capacity: {pages} pages
"""


def block(i):
    return kvpool.BlockHash(0x7000_0000 + i, i)


def cache(conn, first, n):
    pages = conn.alloc(n)
    conn.publish(pages, [block(first + i) for i in range(n)])
    conn.release(list(reversed(pages)))


def timed(fn):
    t0 = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t0) / 1e3, out


def run(backend, name, geometry, k, rounds, page_bytes):
    pages = max(64, 2 * k)
    host_pages = 4 * pages
    with LocalDaemon(config(backend, geometry, pages, host_pages)) as d:
        conn = kvpool.attach(d.socket, "bench", pool="tiered")
        plain = kvpool.attach(d.socket, "bench-plain", pool="plain")
        total = 2 * pages
        for first in range(0, total, pages):
            cache(conn, first, pages)
            cache(plain, first, pages)
        conn.evict(pages)  # everything is in the host tier now
        promote, hit, demote, evict_plain = [], [], [], []
        for r in range(rounds):
            first = (r * k) % (total - k)
            chain = [block(first + i) for i in range(k)]
            t_p, (got, tiers) = timed(lambda: conn.lookup_with_tiers(chain))
            if len(got) != k or any(t != "host" for t in tiers):
                raise SystemExit(f"round {r}: expected {k} host hits, got {tiers}")
            t_h, again = timed(lambda: conn.lookup(chain))
            conn.release(again)
            conn.release(got)
            t_d, n = timed(lambda: conn.evict(k))
            if n != k:
                raise SystemExit(f"round {r}: evict demoted {n}, expected {k}")
            # The baseline evict: k cached pages dropped by a pool without a host tier.
            cache(plain, 10_000 + r * k, k)
            t_e, _ = timed(lambda: plain.evict(k))
            promote.append(t_p)
            hit.append(t_h)
            demote.append(t_d)
            evict_plain.append(t_e)
        conn.close()
        plain.close()
    p, h = statistics.median(promote), statistics.median(hit)
    de, ep = statistics.median(demote), statistics.median(evict_plain)
    up = (p - h) / k
    down = (de - ep) / k
    print(f"| {backend} | {name} | {k} | {p:.1f} | {h:.1f} | {up:.1f} | "
          f"{page_bytes / up / 1e3:.2f} | {de:.1f} | {ep:.1f} | {down:.1f} | "
          f"{page_bytes / down / 1e3:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="host,fake-device",
                    help="backends, comma-separated (host, fake-device, cuda-vmm, cuda-ipc)")
    ap.add_argument("--batches", default="1,8,32", help="blocks per lookup, comma-separated")
    ap.add_argument("--rounds", type=int, default=50, help="lookups timed per batch size")
    ap.add_argument("--pages", default="2MiB,64KiB", help="page sizes: " + ",".join(GEOMETRIES))
    args = ap.parse_args()
    print("| backend | page | k | promote µs | hit µs | promote µs/page | GB/s | demote µs | "
          "evict µs | demote µs/page | GB/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for backend in args.backend.split(","):
        for name in args.pages.split(","):
            page_bytes = {"2MiB": 2 << 20, "64KiB": 64 << 10}[name]
            for k in (int(x) for x in args.batches.split(",")):
                run(backend, name, GEOMETRIES[name], k, args.rounds, page_bytes)


if __name__ == "__main__":
    main()
