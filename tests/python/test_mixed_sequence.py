"""kvpool.MixedSequence against a real kvpoold: a bf16 pool and an fp8 pool of one shape. Blocks
that fall recent_tokens behind the head go down to the fp8 pool at publish_full; a second
sequence of the same prompt finds them there and the newer ones in the bf16 pool; the pages come
back on release and close; pools that cannot pair are refused with kvpool.Error naming why.
"""

import pytest

import kvpool
from kvpool.local_daemon import LocalDaemon

GEOMETRY = "{layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 4, dtype: %s}"
CONFIG = f"""backend: host
pools:
  - name: recent
    geometry: {GEOMETRY % "bf16"}
    capacity: 32 pages
  - name: older
    geometry: {GEOMETRY % "fp8_e4m3"}
    capacity: 32 pages
"""


def held(conn):
    return conn.stats()["session_held_pages"]


def test_aged_blocks_go_to_the_fp8_pool_and_a_second_sequence_finds_them():
    with LocalDaemon(CONFIG) as d:
        recent = kvpool.attach(d.socket, worker="first", pool="recent")
        older = kvpool.attach(d.socket, worker="first", pool="older")
        hasher = kvpool.BlockHasher()
        root = hasher.root("toy", recent.pool.geometry)
        prompt = list(range(100, 126))  # 6 full blocks and 2 tokens
        with kvpool.MixedSequence(recent, older, hasher, root, recent_tokens=8) as seq:
            assert seq.begin(prompt) == 0
            assert seq.older_pages == 0
            # Blocks [0, (26 - 8) // 4) = [0, 4) are 8 or more tokens behind the head.
            assert seq.publish_full() == 4
            assert (seq.older_pages, seq.converted, seq.adopted) == (4, 4, 0)
            assert len(seq.block_table) == 7 and len(seq.block_hashes) == 6
            assert (held(older), held(recent)) == (4, 3)
            page, offset = seq.append(7)
            assert (page, offset) == (seq.block_table[6], 2)
            assert seq.tokens == 27
        assert seq.closed
        assert (held(older), held(recent)) == (0, 0)

        recent2 = kvpool.attach(d.socket, worker="second", pool="recent")
        older2 = kvpool.attach(d.socket, worker="second", pool="older")
        with kvpool.MixedSequence(recent2, older2, hasher, root, recent_tokens=8) as seq:
            assert seq.begin(prompt) == 24  # four blocks in fp8, two in bf16
            assert (seq.older_pages, seq.converted) == (4, 0)
            seq.release()
            assert seq.tokens == 0
            assert (held(older2), held(recent2)) == (0, 0)
        with pytest.raises(ValueError, match="closed"):
            seq.begin(prompt)


def test_pools_that_cannot_pair_are_refused():
    with LocalDaemon(CONFIG) as d:
        recent = kvpool.attach(d.socket, worker="w", pool="recent")
        older = kvpool.attach(d.socket, worker="w", pool="older")
        hasher = kvpool.BlockHasher()
        root = hasher.root("toy", recent.pool.geometry)
        with pytest.raises(kvpool.Error, match="the recent pool keeps 16 bits"):
            kvpool.MixedSequence(older, recent, hasher, root, 8)
        with pytest.raises(kvpool.Error, match="recent_tokens must be at least 1"):
            kvpool.MixedSequence(recent, older, hasher, root, 0)
        with pytest.raises(ValueError, match="one connection"):
            kvpool.MixedSequence(recent, recent, hasher, root, 8)
