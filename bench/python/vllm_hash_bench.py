#!/usr/bin/env python3
"""vLLM's block hash two ways, in one run: as vLLM computes it (Python: cbor2.dumps(...,
canonical=True) and hashlib.sha256 per block, vLLM's sha256_cbor) and through
kvpool.VllmBlockHasher.chain (C++), over the same 8,192 tokens. Prints ns per token for each block
size and the ratio; the digests are checked equal first.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python/vllm_hash_bench.py
"""

import hashlib
import time

import cbor2

import kvpool

TOKENS = list(range(100, 100 + 8192))


def vllm_chain(seed, tokens, block):
    parent = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    out = []
    for i in range(len(tokens) // block):
        parent = hashlib.sha256(cbor2.dumps((parent, tuple(tokens[i * block:(i + 1) * block]), None),
                                            canonical=True)).digest()
        out.append(parent)
    return out


def best_ns_per_token(fn, repeats=7):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e9 / len(TOKENS)


def main():
    hasher = kvpool.VllmBlockHasher("0")
    print("| tokens per block | vLLM (cbor2 + hashlib) ns/token | kvpool.VllmBlockHasher ns/token "
          "| speed-up |")
    print("|---:|---:|---:|---:|")
    for block in (16, 64, 256, 512):
        assert hasher.chain(TOKENS, block) == vllm_chain("0", TOKENS, block)
        python = best_ns_per_token(lambda: vllm_chain("0", TOKENS, block))
        ours = best_ns_per_token(lambda: hasher.chain(TOKENS, block))
        print(f"| {block} | {python:.1f} | {ours:.1f} | {python / ours:.1f}x |")


if __name__ == "__main__":
    main()
