#!/usr/bin/env python3
"""Two engine workers sharing one kvpool: the second reuses the system prompt's KV the first one
computed, zero copy, and checks that what it reused equals what it would have computed.

Each worker is a process running a small deterministic transformer (torch, CPU) whose attention
reads and writes the pool through per-layer views in vLLM's shape
([2, num_pages, tokens_per_page, kv_heads, head_dim], kvpool.kv_cache_view). For each prompt a
worker looks up the longest cached prefix (kvpool.SequenceCache), computes only the rest, writes
its K/V into the pool, and publishes the full blocks. Then it recomputes the whole prompt
without the cache and compares: the KV read from the pool and the final hidden state must match.

    python3 examples/two_worker_engine.py              # starts a private kvpoold (KVPOOLD_BIN)
    python3 examples/two_worker_engine.py --socket S   # uses a running daemon's pool instead

What it needs: torch (CPU) and numpy; with --socket, a pool of the toy model's geometry (4 layers,
2 KV heads, head dim 32, 16 tokens per page, fp16 or bf16) with at least 8 free pages. A pool of
another geometry is refused before any worker starts, naming what differs. Every wait is bounded
(WAIT_S): a worker that fails or hangs makes the example fail, never hang.
"""

import argparse
import multiprocessing
import os
import sys

import torch

import kvpool
from kvpool.local_daemon import LocalDaemon

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, TOKENS_PER_PAGE, VOCAB = 4, 2, 4, 32, 16, 5000
MODEL = "toy-transformer"
WAIT_S = 60  # the longest any worker waits for another, and main for a worker
SYSTEM_PROMPT = list(range(1000, 1000 + 3 * TOKENS_PER_PAGE + 5))  # 53 tokens: 3 full blocks


class ToyModel:
    """A seeded decoder: embeddings + position encoding, then per layer q/k/v projections,
    causal GQA attention and a residual output projection. fp32 compute, fp16 KV."""

    def __init__(self):
        g = torch.Generator().manual_seed(1234)
        width = Q_HEADS * HEAD_DIM
        self.embed = torch.randn(VOCAB, width, generator=g) * 0.5
        self.layers = [
            {name: torch.randn(width, out, generator=g) / width**0.5
             for name, out in (("q", Q_HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM),
                               ("v", KV_HEADS * HEAD_DIM), ("o", width))}
            for _ in range(LAYERS)
        ]

    def positions(self, pos):
        width = Q_HEADS * HEAD_DIM
        freq = torch.exp(-torch.arange(0, width, 2) / width * 9.2)
        angle = pos[:, None].float() * freq[None, :]
        return torch.cat([angle.sin(), angle.cos()], dim=1)

    def forward(self, tokens, start, read_kv, write_kv):
        """Runs tokens at positions start.. given the KV of positions [0, start) through
        read_kv(layer, n) -> (k, v) of the first n positions, and hands each layer's new K/V to
        write_kv(layer, k, v). Returns the last hidden state."""
        pos = torch.arange(start, start + len(tokens))
        h = self.embed[torch.tensor(tokens)] + self.positions(pos)
        for layer, w in enumerate(self.layers):
            q = (h @ w["q"]).view(-1, Q_HEADS, HEAD_DIM)
            k = (h @ w["k"]).view(-1, KV_HEADS, HEAD_DIM).half()
            v = (h @ w["v"]).view(-1, KV_HEADS, HEAD_DIM).half()
            write_kv(layer, k, v)
            k_all, v_all = read_kv(layer, start + len(tokens))
            window = self.window_of(layer)
            h = h + self.attend(q, k_all.float(), v_all.float(), start, window) @ w["o"]
        return h[-1]

    def window_of(self, layer):
        """The tokens layer `layer` attends to (None: every earlier one)."""
        return None

    @staticmethod
    def attend(q, k, v, start, window=None):
        group = Q_HEADS // KV_HEADS
        k = k.repeat_interleave(group, dim=1)  # [n, Q_HEADS, D]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / HEAD_DIM**0.5
        q_pos = torch.arange(start, start + q.shape[0])[:, None]
        keys = torch.arange(k.shape[0])[None, :]
        hidden = keys > q_pos
        if window is not None:  # a sliding layer sees keys q_pos - window < j <= q_pos
            hidden = hidden | (keys <= q_pos - window)
        scores = scores.masked_fill(hidden, float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(q.shape[0], -1)


def run_prompt(conn, hasher, root, model, views, prompt):
    seq = kvpool.SequenceCache(conn, hasher, root)
    cached = seq.begin(prompt)  # leading tokens whose K/V another worker already wrote

    def slots(first, n):
        table = torch.tensor(seq.block_table, dtype=torch.long)
        pos = torch.arange(first, first + n)
        return table[pos // TOKENS_PER_PAGE], pos % TOKENS_PER_PAGE

    def read_kv(layer, n):
        pages, offsets = slots(0, n)
        return views[layer][0, pages, offsets], views[layer][1, pages, offsets]

    def write_kv(layer, k, v):
        pages, offsets = slots(cached, k.shape[0])
        views[layer][0, pages, offsets] = k
        views[layer][1, pages, offsets] = v

    hidden = model.forward(prompt[cached:], cached, read_kv, write_kv)
    seq.publish_full()
    pooled = [read_kv(layer, len(prompt)) for layer in range(LAYERS)]
    return seq, cached, hidden, pooled


def recompute(model, prompt):
    """The same prompt without any cache: the reference."""
    kv = [[None, None] for _ in range(LAYERS)]

    def write_kv(layer, k, v):
        kv[layer] = [k, v]

    hidden = model.forward(prompt, 0, lambda layer, n: tuple(kv[layer]), write_kv)
    return hidden, kv


def worker(name, socket, user_tokens, go, done, results):
    try:
        torch.set_num_threads(1)
        conn = kvpool.attach(socket, worker=name)
        hasher = kvpool.BlockHasher()
        root = hasher.root(MODEL, conn.pool.geometry)
        views = kvpool.kv_cache_views(conn)
        model = ToyModel()
        if not go.wait(WAIT_S):
            raise TimeoutError(f"{name}: the worker before it did not finish in {WAIT_S} s")
        prompt = SYSTEM_PROMPT + user_tokens
        seq, cached, hidden, pooled = run_prompt(conn, hasher, root, model, views, prompt)
    finally:
        done.set()  # the next worker never waits on one that failed
    ref_hidden, ref_kv = recompute(model, prompt)
    kv_diff = max(float((pooled[l][i].float() - ref_kv[l][i].float()).abs().max())
                  for l in range(LAYERS) for i in (0, 1))
    out_diff = float((hidden - ref_hidden).abs().max())
    results[name] = (len(prompt), cached, kv_diff, out_diff, conn.pool.num_pages)
    seq.release()


def run_workers(target, socket):
    """Runs target(name, socket, user_tokens, go, done, results) as worker-a, then as worker-b
    once worker-a is done, each in its own process. Returns (ok, results): ok when both ended
    cleanly with a result."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Manager().dict()
    start, first_done, second_done = ctx.Event(), ctx.Event(), ctx.Event()
    workers = [
        ctx.Process(name="worker-a", target=target,
                    args=("worker-a", socket, [7, 8, 9, 10, 11], start, first_done, results)),
        ctx.Process(name="worker-b", target=target,
                    args=("worker-b", socket, [20, 21, 22], first_done, second_done, results)),
    ]
    for w in workers:
        w.start()
    start.set()  # worker-a first; worker-b starts when a has published
    for w in workers:
        w.join(2 * WAIT_S)
        if w.is_alive():
            print(f"{w.name}: no result after {2 * WAIT_S} s; stopped", file=sys.stderr)
            w.terminate()
            w.join()
    results = dict(results)
    ok = all(w.exitcode == 0 for w in workers) and len(results) == 2
    for name in ("worker-a", "worker-b"):
        if name not in results:
            print(f"{name}: failed")
    return ok, results


def geometry_problems(socket):
    """What keeps the pool at `socket` from holding the toy model's KV ([] when nothing)."""
    conn = kvpool.attach(socket, worker="example-check")
    try:
        g = conn.pool.geometry
        want = {"layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                "tokens_per_page": TOKENS_PER_PAGE}
        problems = [f"{key} {getattr(g, key)} (needs {value})" for key, value in want.items()
                    if getattr(g, key) != value]
        if g.dtype not in ("fp16", "bf16"):
            problems.append(f"dtype {g.dtype} (needs fp16 or bf16)")
        if g.kind != "full":
            problems.append(f"kind {g.kind} (the toy model attends to every token: needs full)")
        return problems
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", help="a running kvpoold's socket (default: start a private one)")
    ap.add_argument("--layout", default="layer_major", choices=["layer_major", "page_major"],
                    help="the private daemon's pool layout (default: %(default)s)")
    args = ap.parse_args()

    daemon = None
    socket = args.socket
    if socket is None:
        layout = f"    layout: {args.layout}\n" if args.layout != "page_major" else ""
        daemon = LocalDaemon(
            "backend: host\npools:\n  - name: default\n"
            f"    geometry: {{layers: {LAYERS}, kv_heads: {KV_HEADS}, head_dim: {HEAD_DIM}, "
            f"tokens_per_page: {TOKENS_PER_PAGE}, dtype: fp16}}\n    capacity: 64 pages\n{layout}")
        daemon.start()
        socket = daemon.socket
    else:
        problems = geometry_problems(socket)
        if problems:
            print(f"the pool at {socket} does not fit this example's model: " +
                  ", ".join(problems), file=sys.stderr)
            return 2
    try:
        ok, results = run_workers(worker, socket)
        for name in sorted(results):
            tokens, cached, kv_diff, out_diff, _ = results[name]
            print(f"{name}: prompt {tokens} tokens, {cached} reused from the pool, computed "
                  f"{tokens - cached}; max |KV - recomputed| = {kv_diff:.2e}, "
                  f"max |output - recomputed| = {out_diff:.2e}")
        if ok:
            reused = results["worker-b"][1]
            ok = (results["worker-a"][1] == 0 and reused == 3 * TOKENS_PER_PAGE and
                  all(r[2] <= 2e-3 and r[3] <= 2e-3 for r in results.values()))
        print("OK: worker-b reused worker-a's system prompt and matches a full recompute" if ok
              else "FAILED")
        return 0 if ok else 1
    finally:
        if daemon is not None:
            daemon.close()


if __name__ == "__main__":
    sys.exit(main())
