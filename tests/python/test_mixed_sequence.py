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


def test_the_scales_view_decodes_what_the_conversion_wrote():
    """kv_scales_view shows the 8-bit pool's scales: the bf16 values written before a
    conversion come back from the fp8 bytes times their tile's scale, within fp8's error."""
    torch = pytest.importorskip("torch")
    with LocalDaemon(CONFIG) as d:
        recent = kvpool.attach(d.socket, worker="w", pool="recent")
        older = kvpool.attach(d.socket, worker="w", pool="older")
        with pytest.raises(ValueError, match="no scales"):
            kvpool.kv_scales_view(recent)
        scales = kvpool.kv_scales_view(older)
        g = older.pool.geometry
        assert tuple(scales.shape) == (older.pool.num_pages, g.layers, g.kv_heads, 2)
        hasher = kvpool.BlockHasher()
        root = hasher.root("scales", recent.pool.geometry)
        prompt = list(range(200, 210))  # 2 full blocks and 2 tokens
        with kvpool.MixedSequence(recent, older, hasher, root, recent_tokens=1) as seq:
            seq.begin(prompt)
            view16 = kvpool.kv_cache_view(recent, 0)
            values = torch.linspace(-3.0, 5.0, 10 * 8).view(10, 1, 8)
            table = seq.block_table
            for t in range(10):
                view16[0, table[t // 4], t % 4] = values[t].to(torch.bfloat16)
                view16[1, table[t // 4], t % 4] = (-values[t]).to(torch.bfloat16)
            written = [view16[0, table[b]].float().clone() for b in range(2)]
            assert seq.publish_full() == 2
            view8 = kvpool.kv_cache_view(older, 0)
            for b in range(2):
                page = seq.block_table[b]
                k_scale = float(scales[page, 0, 0, 0])
                assert k_scale > 0 and float(scales[page, 0, 0, 1]) > 0
                # The tile's amax maps to fp8's largest value, 448.
                assert k_scale == pytest.approx(float(written[b].abs().max()) / 448.0, rel=1e-6)
                raw = view8[0, page].to(torch.int32)  # e4m3fn bytes
                sign = torch.where(raw >= 128, -1.0, 1.0)
                e, m = (raw >> 3) & 15, raw & 7
                mag = torch.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
                decoded = sign * mag * k_scale
                assert torch.allclose(decoded, written[b], rtol=0.07, atol=1e-6 * k_scale)
