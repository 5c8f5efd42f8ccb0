#!/usr/bin/env python3
"""Routing on kvpool's KV events: the Mooncake trace spread over several kvpoold nodes by
kvpool.router.KvRouter's longest-prefix choice against round robin, in one run.

Starts N private kvpoold nodes (KVPOOLD_BIN, host backend, `--capacity` pages each, KV events on
ipc endpoints) and one more holding N × capacity (one node holding everything, the bound). Each
request of ../shared/data/mooncake_synthetic_trace.jsonl (one page per 512-token block, its hash
the kvpool chain hash of its hash_ids) goes, in trace order, to one node: a lookup of its chain
(the hits), then the rest allocated and published, then every page released (the replay rule of
../shared/data/README.md). Routing:
  round-robin   request i to node i mod N;
  router        the node whose prefix KvRouter reports longest (ties: round robin among them),
                the router fed by the nodes' events only.
Prints the hit rate of each (hit blocks / requested blocks), the router's cost per query, and its
agreement: after the replay, the blocks the router believes each node holds against the node's
own index (kvpoolctl prefixes; expected 100%).

    PYTHONPATH=build/release/python KVPOOLD_BIN=build/release/daemon/kvpoold \\
      KVPOOLCTL_BIN=build/release/client/kvpoolctl python3 bench/python/router_figures.py
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

import kvpool
from kvpool.local_daemon import LocalDaemon
from kvpool.router import Endpoints, KvRouter

TPP = 4  # tokens per page; a trace block is one page whose tokens are its hash id


def config(pages, events_dir, name):
    return f"""backend: host
pools:
  - name: default
    geometry: {{layers: 2, kv_heads: 1, head_dim: 8, tokens_per_page: {TPP}, dtype: fp16}}
    capacity: {pages} pages
    policy: lru
events:
  zmq_endpoint: "ipc://{events_dir}/{name}-events"
  zmq_replay_endpoint: "ipc://{events_dir}/{name}-replay"
"""


def load_trace(path, limit):
    with open(path) as f:
        requests = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    return requests[:limit] if limit else requests


class Node:
    def __init__(self, name, pages, events_dir):
        self.name = name
        self.endpoints = Endpoints(f"ipc://{events_dir}/{name}-events",
                                   f"ipc://{events_dir}/{name}-replay")
        self.daemon = LocalDaemon(config(pages, events_dir, name)).start()
        self.conn = kvpool.attach(self.daemon.socket, worker="router-figures")

    def serve(self, chain):
        """One request; the number of blocks that hit."""
        hits = self.conn.lookup(chain)
        rest = chain[len(hits):]
        pages = list(hits)
        if rest:
            fresh = self.conn.alloc(len(rest))
            results = self.conn.publish(fresh, rest)
            for page, r in zip(fresh, results):
                if r.duplicate:  # cached elsewhere in the pool: reuse it, give ours back
                    self.conn.release([page])
                    pages.append(r.page)
                else:
                    pages.append(page)
        self.conn.release(list(reversed(pages)))
        return len(hits)

    def indexed(self):
        out = subprocess.run([os.environ["KVPOOLCTL_BIN"], "--socket", self.daemon.socket,
                              "--json", "prefixes", "--limit", "10000"], check=True,
                             capture_output=True, text=True).stdout
        return {bytes.fromhex(p["hash"]) for p in json.loads(out)["prefixes"]}

    def close(self):
        self.conn.close()
        self.daemon.close()


def replay(chains, nodes, route):
    hit = total = 0
    for i, chain in enumerate(chains):
        node = route(i, chain)
        hit += node.serve(chain)
        total += len(chain)
    return hit / total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=os.path.join(os.path.dirname(__file__),
                                                    "../../../shared/data/mooncake_synthetic_trace.jsonl"))
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--capacity", type=int, default=1000, help="pages per node")
    ap.add_argument("--limit", type=int, default=0, help="first N requests (0: all)")
    args = ap.parse_args()

    hasher = kvpool.BlockHasher()
    geometry = None
    requests = load_trace(args.trace, args.limit)
    print(f"trace: {len(requests)} requests, {sum(map(len, requests))} blocks; "
          f"{args.capacity} pages per node")
    print("| nodes | round robin | router | one node of N x capacity | router query (us) "
          "| router agreement |")
    print("|---|---|---|---|---|---|")
    for n in args.nodes:
        with tempfile.TemporaryDirectory(prefix="kvpool-router-") as d:
            single = Node("all", n * args.capacity, d)
            if geometry is None:
                geometry = single.conn.pool.geometry
                root = hasher.root("mooncake", geometry)
                chains = [hasher.chain(root, [i for i in ids for _ in range(TPP)], TPP)
                          for ids in requests]
                keys = [[bytes(h) for h in chain] for chain in chains]
            bound = replay(chains, [single], lambda i, c: single)
            single.close()

            rr_nodes = [Node(f"rr{k}", args.capacity, d) for k in range(n)]
            rr = replay(chains, rr_nodes, lambda i, c: rr_nodes[i % n])
            for node in rr_nodes:
                node.close()

            nodes = {f"n{k}": Node(f"n{k}", args.capacity, d) for k in range(n)}
            names = list(nodes)
            router = KvRouter({name: nodes[name].endpoints for name in names})
            # Wait out ZeroMQ's slow joiner before the replay: a probe per node until it is heard.
            for _ in range(100):
                for node in nodes.values():
                    probe = hasher.chain(root, [10**9 + _] * TPP, TPP)
                    node.serve(probe)
                router.poll(50)
                if all(router.nodes[k].batches for k in names):
                    break
            router.drain()
            query_s = []

            def route(i, chain):
                router.poll(1)  # the previous requests' events (the last may still be on its way)
                t = time.perf_counter()
                prefixes = router.longest_prefix(keys[i])
                query_s.append(time.perf_counter() - t)
                best = max(p.blocks for p in prefixes.values())
                tied = [k for k in names if prefixes[k].blocks == best]
                return nodes[tied[i % len(tied)]]

            routed = replay(chains, nodes, route)
            router.drain()
            agree = held = 0
            for name, node in nodes.items():
                actual = node.indexed()
                believed = router.cached(name)
                agree += len(actual & believed)
                held += len(actual | believed)
            router.close()
            for node in nodes.values():
                node.close()
            query_us = 1e6 * sorted(query_s)[len(query_s) // 2]
            print(f"| {n} | {rr:.3f} | {routed:.3f} | {bound:.3f} | {query_us:.1f} "
                  f"| {100.0 * agree / max(held, 1):.2f}% |", flush=True)


if __name__ == "__main__":
    main()
