#!/usr/bin/env python3
"""Mixed precision on a real model's decode loop: the toy transformer of
examples/two_worker_engine.py generates a long sequence whose KV lives in a kvpoold's pools through
kvpool.MixedSequence (an fp16 pool for the recent tokens, an fp8_e4m3 pool for the older ones).
Every K/V row the model attends to is read back from the pool memory: fp16 rows as written, 8-bit
rows as the conversion left them (bytes decoded and times their page's scale, kv_scales_view).

The reference keeps every token in fp16 (recent_tokens larger than the sequence); it generates
greedily from a seeded prompt, and every other configuration replays the reference's tokens
(teacher forcing), so that each step compares the same context: top-1 agreement (the argmax
equals the reference's), the logits' relative L2 error and the largest logit difference, against
the reference logits' standard deviation. Configurations: recent_tokens 256, 1024, 4096 and
all-8-bit (recent_tokens 1: every full block is converted once a token follows it; the block being
written stays fp16 until then).

    /usr/bin/python3 bench/python/mixed_precision_accuracy.py [--prompt 512] [--generate 4600]

Needs KVPOOLD_BIN (or kvpoold on PATH), the kvpool module (PYTHONPATH=build/release/python) and
torch. Prints one table; bench/RESULTS.md records it.
"""

import argparse
import os
import sys

import torch

import kvpool
from kvpool.local_daemon import LocalDaemon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from two_worker_engine import HEAD_DIM, KV_HEADS, LAYERS, TOKENS_PER_PAGE, VOCAB, ToyModel  # noqa: E402

GEOMETRY = (f"{{layers: {LAYERS}, kv_heads: {KV_HEADS}, head_dim: {HEAD_DIM}, "
            f"tokens_per_page: {TOKENS_PER_PAGE}, dtype: ")


def config(pages):
    return (f"backend: host\npools:\n  - name: recent\n    geometry: {GEOMETRY}fp16}}\n"
            f"    capacity: {pages} pages\n  - name: older\n    geometry: {GEOMETRY}fp8_e4m3}}\n"
            f"    capacity: {pages} pages\n")


def fp8_table():
    """The value of every fp8 e4m3fn byte (OCP: bias 7, no infinities, 0x7f/0xff NaN)."""
    values = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            values.append(float("nan"))
        elif e == 0:
            values.append(sign * m / 8.0 * 2.0**-6)
        else:
            values.append(sign * (1.0 + m / 8.0) * 2.0 ** (e - 7))
    return torch.tensor(values, dtype=torch.float32)


class PooledKv:
    """One sequence's KV as the model reads it: a float32 copy of what the pools hold, kept in
    step with them (rows written in fp16; a block's rows re-read from the fp8 pool once
    MixedSequence converted it)."""

    def __init__(self, recent, older, seq, capacity):
        self.seq = seq
        self.views16 = kvpool.kv_cache_views(recent)
        self.views8 = kvpool.kv_cache_views(older)
        self.scales = kvpool.kv_scales_view(older)
        self.fp8 = fp8_table()
        self.k = [torch.zeros(capacity, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
        self.v = [torch.zeros(capacity, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
        self.older = 0  # blocks already re-read from the 8-bit pool

    def write(self, start):
        def write_kv(layer, k, v):
            pos = torch.arange(start, start + k.shape[0])
            table = torch.tensor(self.seq.block_table, dtype=torch.long)
            pages, offsets = table[pos // TOKENS_PER_PAGE], pos % TOKENS_PER_PAGE
            self.views16[layer][0, pages, offsets] = k
            self.views16[layer][1, pages, offsets] = v
            # What the model reads back is what the pool holds.
            self.k[layer][pos] = self.views16[layer][0, pages, offsets].float()
            self.v[layer][pos] = self.views16[layer][1, pages, offsets].float()

        return write_kv

    def read(self, layer, n):
        return self.k[layer][:n], self.v[layer][:n]

    def sync_converted(self):
        """Re-reads the blocks MixedSequence moved to the 8-bit pool since the last call."""
        table = self.seq.block_table
        for block in range(self.older, self.seq.older_pages):
            page = table[block]
            rows = slice(block * TOKENS_PER_PAGE, (block + 1) * TOKENS_PER_PAGE)
            for layer in range(LAYERS):
                for plane, dest in ((0, self.k), (1, self.v)):
                    raw = self.views8[layer][plane, page].long()  # [tokens, heads, dim] bytes
                    scale = self.scales[page, layer, :, plane]  # one per head
                    dest[layer][rows] = self.fp8[raw] * scale[None, :, None]
        self.older = self.seq.older_pages


def run(model, recent, older, hasher, name, recent_tokens, prompt, steps, forced=None):
    """Prompt then `steps` decode steps (forced: the tokens to feed; else greedy). Returns the
    tokens fed and the logits of every step."""
    root = hasher.root(f"mixed-accuracy/{name}", recent.pool.geometry)
    seq = kvpool.MixedSequence(recent, older, hasher, root, recent_tokens)
    kv = PooledKv(recent, older, seq, len(prompt) + steps + 1)
    try:
        if seq.begin(prompt) != 0:
            raise RuntimeError(f"{name}: the prompt was already cached")
        hidden = model.forward(prompt, 0, kv.read, kv.write(0))
        seq.publish_full()
        kv.sync_converted()
        fed, logits = [], []
        for step in range(steps):
            out = hidden @ model.embed.T
            logits.append(out)
            token = forced[step] if forced is not None else int(out.argmax())
            fed.append(token)
            pos = seq.tokens
            seq.append(token)
            hidden = model.forward([token], pos, kv.read, kv.write(pos))
            seq.publish_full()
            kv.sync_converted()
        return fed, torch.stack(logits), seq.older_pages
    finally:
        seq.release()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--generate", type=int, default=4600, help="decode steps")
    ap.add_argument("--recent", default="256,1024,4096,1",
                    help="recent_tokens of the mixed configurations (1: all 8-bit)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    total = args.prompt + args.generate + 1
    pages = (total + TOKENS_PER_PAGE - 1) // TOKENS_PER_PAGE + 8
    prompt = torch.randint(0, VOCAB, (args.prompt,),
                           generator=torch.Generator().manual_seed(7)).tolist()
    with LocalDaemon(config(pages)) as d:
        recent = kvpool.attach(d.socket, worker="accuracy-16", pool="recent")
        older = kvpool.attach(d.socket, worker="accuracy-8", pool="older")
        hasher = kvpool.BlockHasher()
        model = ToyModel()
        ref_tokens, ref, _ = run(model, recent, older, hasher, "fp16", 1 << 30, prompt,
                                 args.generate)
        spread = ref.std().item()
        print(f"toy transformer ({LAYERS} layers, {KV_HEADS} KV heads, head dim {HEAD_DIM}), "
              f"prompt {args.prompt} tokens, {args.generate} decode steps teacher-forced on the "
              f"all-fp16 run; logits' std {spread:.3f}")
        print(f"{'configuration':>22} {'fp8 blocks':>10} {'top-1 agree':>12} "
              f"{'rel L2':>9} {'mean |dlogit|':>14} {'max |dlogit|':>13} "
              f"{'agree (last 1k)':>16}")
        for r in [int(x) for x in args.recent.split(",")]:
            name = "all fp8 (recent 1)" if r == 1 else f"recent_tokens {r}"
            _, out, older_pages = run(model, recent, older, hasher, f"r{r}", r, prompt,
                                      args.generate, forced=ref_tokens)
            agree = (out.argmax(1) == ref.argmax(1)).float()
            diff = (out - ref).abs()
            rel = ((out - ref).norm(dim=1) / ref.norm(dim=1)).mean().item()
            print(f"{name:>22} {older_pages:>10} {agree.mean().item():>12.4f} {rel:>9.2e} "
                  f"{diff.mean().item() / spread:>13.2e}σ {diff.max().item() / spread:>12.2e}σ "
                  f"{agree[-1000:].mean().item():>16.4f}")


if __name__ == "__main__":
    main()
