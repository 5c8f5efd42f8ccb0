#!/usr/bin/env python3
"""Two engine workers sharing a hybrid model's pool: sliding-window and full-attention layers in
one kvpool model (pools[].groups), the second worker reusing what the first computed in both
groups from one lookup, and checking it against a full recompute.

The toy transformer of two_worker_engine.py with its layers alternating: even layers attend to
the last WINDOW tokens (the "local" group), odd layers to every token (the "global" group).
Each worker attaches one session per group (the second linked to the first), hashes the prompt
once, asks lookup_groups for the prefix both groups can serve, and begins a SequenceCache per
group from its part of the hit: the global group reuses every block of the prefix, the local
group only the blocks its window still sees (the rest it never reads). It computes the rest,
publishes, and compares the KV in the pool and its output with a recompute without any cache.

    python3 examples/hybrid_engine.py        # starts a private kvpoold (KVPOOLD_BIN)

What it needs: torch (CPU) and numpy. Every wait is bounded (WAIT_S).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvpool  # noqa: E402
from kvpool.local_daemon import LocalDaemon  # noqa: E402
from two_worker_engine import (HEAD_DIM, KV_HEADS, LAYERS, SYSTEM_PROMPT,  # noqa: E402
                               TOKENS_PER_PAGE, WAIT_S, ToyModel, recompute,
                               run_workers)

MODEL = "toy-hybrid"
WINDOW = 24  # tokens a sliding layer sees
NO_PAGE = 0xFFFFFFFF
CONFIG = f"""backend: host
pools:
  - name: toy
    capacity: 4MiB
    segment_size: 64KiB
    geometry: {{layers: {LAYERS // 2}, kv_heads: {KV_HEADS}, head_dim: {HEAD_DIM},
               tokens_per_page: {TOKENS_PER_PAGE}, dtype: fp16}}
    groups:
      - {{name: local, kind: sliding, window: {WINDOW}}}
      - {{name: global}}
"""


class HybridToyModel(ToyModel):
    """Even layers slide (WINDOW tokens), odd layers see everything."""

    def window_of(self, layer):
        return WINDOW if layer % 2 == 0 else None


def group_of(layer):
    """(group, the layer's index in its group): local = 0, global = 1."""
    return layer % 2, layer // 2


def run_prompt(conns, hasher, root, model, views, prompt):
    chain = hasher.chain(root, prompt, TOKENS_PER_PAGE)
    hit = conns[0].lookup_groups(chain)  # one lookup: what every group can serve
    seqs = [kvpool.SequenceCache(c, hasher, root) for c in conns]
    cached = [s.begin_from(prompt, part) for s, part in zip(seqs, hit)][0]
    reused = [[b for b, p in enumerate(part) if p is not None] for part in hit]

    def slots(layer, first, n):
        g, _ = group_of(layer)
        table = torch.tensor([0 if p == NO_PAGE else p for p in seqs[g].block_table])
        pos = torch.arange(first, first + n)
        return table[pos // TOKENS_PER_PAGE], pos % TOKENS_PER_PAGE

    def read_kv(layer, n):
        # A sliding layer's blocks before its window have no page (read as page 0): the window's
        # mask hides those keys.
        g, gl = group_of(layer)
        pages, offsets = slots(layer, 0, n)
        return views[g][gl][0, pages, offsets], views[g][gl][1, pages, offsets]

    def write_kv(layer, k, v):
        g, gl = group_of(layer)
        pages, offsets = slots(layer, cached, k.shape[0])
        views[g][gl][0, pages, offsets] = k
        views[g][gl][1, pages, offsets] = v

    hidden = model.forward(prompt[cached:], cached, read_kv, write_kv)
    for s in seqs:
        s.publish_full()  # the local group lets go of the blocks its window left
    pooled = [read_kv(layer, len(prompt)) for layer in range(LAYERS)]
    held = [[p != NO_PAGE for p in s.block_table] for s in seqs]
    return seqs, cached, reused, hidden, pooled, held


def worker(name, socket, user_tokens, go, done, results):
    try:
        torch.set_num_threads(1)
        local = kvpool.attach(socket, worker=name, pool="toy")  # the model: its first group
        glob = kvpool.attach(socket, worker=name, pool="toy/global",
                             link_session=local.session_id)
        conns = [local, glob]
        hasher = kvpool.BlockHasher()
        root = hasher.root(MODEL, local.pool.geometry)  # the model's first group roots the chain
        views = [kvpool.kv_cache_views(c) for c in conns]
        model = HybridToyModel()
        if not go.wait(WAIT_S):
            raise TimeoutError(f"{name}: the worker before it did not finish in {WAIT_S} s")
        prompt = SYSTEM_PROMPT + user_tokens
        seqs, cached, reused, hidden, pooled, held = run_prompt(conns, hasher, root, model, views,
                                                                prompt)
    finally:
        done.set()
    ref_hidden, ref_kv = recompute(model, prompt)
    kv_diff = 0.0
    for layer in range(LAYERS):
        g, _ = group_of(layer)
        # What the pool still holds of this layer: every block of a global layer, the window's
        # blocks of a local one.
        keep = torch.tensor([held[g][p // TOKENS_PER_PAGE] for p in range(len(prompt))])
        for i in (0, 1):
            diff = (pooled[layer][i].float() - ref_kv[layer][i].float()).abs()[keep]
            kv_diff = max(kv_diff, float(diff.max()) if diff.numel() else 0.0)
    out_diff = float((hidden - ref_hidden).abs().max())
    results[name] = (len(prompt), cached, reused, kv_diff, out_diff)
    for s in seqs:
        s.release()


def main():
    daemon = LocalDaemon(CONFIG)
    daemon.start()
    try:
        ok, results = run_workers(worker, daemon.socket)
        for name in sorted(results):
            tokens, cached, reused, kv_diff, out_diff = results[name]
            print(f"{name}: prompt {tokens} tokens, {cached} reused from the pool (local group "
                  f"blocks {reused[0]}, global group blocks {reused[1]}), computed "
                  f"{tokens - cached}; max |KV - recomputed| = {kv_diff:.2e}, "
                  f"max |output - recomputed| = {out_diff:.2e}")
        if ok:
            b = results["worker-b"]
            # At 48 tokens the next query sees keys 25..48: blocks 1 and 2 of the local group.
            ok = (results["worker-a"][1] == 0 and b[1] == 3 * TOKENS_PER_PAGE and
                  b[2] == [[1, 2], [0, 1, 2]] and
                  all(r[3] <= 2e-3 and r[4] <= 2e-3 for r in results.values()))
        print("OK: worker-b reused worker-a's prefix in both groups and matches a full recompute"
              if ok else "FAILED")
        return 0 if ok else 1
    finally:
        daemon.close()


if __name__ == "__main__":
    sys.exit(main())
