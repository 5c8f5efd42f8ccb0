"""kvpool.HybridModel and kvpool.HybridSequence against a real kvpoold: a two-group model (a
sliding group of window 8 tokens over 4-token pages, and a full group). A second worker's
sequence begins from the prefix both groups can serve, the sliding group holding only the
blocks its window needs; appends fill both groups; publish_full lets the sliding group drop what
left its window; release gives everything back; a plain pool is a model of one group; a group
that cannot be attached leaves nothing attached.
"""

import pytest

import kvpool
from kvpool.local_daemon import LocalDaemon

CONFIG = """backend: host
pools:
  - name: m
    capacity: 256KiB
    segment_size: 16KiB
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 4, dtype: fp16}
    groups:
      - {name: local, kind: sliding, window: 8}
      - {name: global}
  - name: plain
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 4, dtype: fp16}
    capacity: 32 pages
"""


def held(model):
    return [model.group(g).stats()["session_held_pages"] for g in range(model.num_groups)]


def test_a_second_worker_begins_from_what_every_group_holds():
    with LocalDaemon(CONFIG) as d:
        first = kvpool.HybridModel(d.socket, "m", worker="first")
        assert (first.model, first.names, first.num_groups) == ("m", ["local", "global"], 2)
        assert first.group(1).pool.name == "m/global"
        hasher = kvpool.BlockHasher()
        root = hasher.root("toy", first.group(0).pool.geometry)
        prompt = list(range(100, 124))  # 6 blocks

        with kvpool.HybridSequence(first, hasher, root) as seq:
            assert seq.begin(prompt) == 0
            assert seq.publish_full() == 0
            # The next query, at 24, sees tokens 17..24: the sliding group keeps blocks 4 and 5.
            assert held(first) == [2, 6]
            seq.release()
            assert held(first) == [0, 0]

        second = kvpool.HybridModel(d.socket, "m/global", worker="second")  # any group's name
        assert second.names == ["local", "global"]
        with kvpool.HybridSequence(second, hasher, root) as seq:
            assert seq.begin(prompt + [7, 7]) == 24  # every block, both groups
            assert seq.group(0).block_table[:4] == [kvpool_no_page()] * 4
            assert held(second) == [2 + 1, 6 + 1]  # the hit, and a page for the partial block
            for t in range(8):
                seq.append(500 + t)
            assert seq.tokens == 34
            seq.publish_full()
            # 8 full blocks published; the sliding group keeps the window's blocks 6..8.
            assert held(second) == [3, 9]
            seq.release()
            assert held(second) == [0, 0]
        first.close()
        second.close()


def kvpool_no_page():
    return 0xFFFFFFFF


def test_a_plain_pool_is_a_model_of_one_group():
    with LocalDaemon(CONFIG) as d:
        with kvpool.HybridModel(d.socket, "plain") as model:
            assert (model.model, model.names, model.num_groups) == ("plain", ["plain"], 1)
            hasher = kvpool.BlockHasher()
            root = hasher.root("toy", model.group(0).pool.geometry)
            with kvpool.HybridSequence(model, hasher, root) as seq:
                assert seq.begin(list(range(8))) == 0
                seq.publish_full()
            with kvpool.HybridSequence(model, hasher, root) as seq:
                assert seq.begin(list(range(8))) == 8
                with pytest.raises(ValueError, match="begin"):
                    seq.begin([1, 2, 3, 4])


def test_a_group_that_cannot_be_attached_leaves_nothing_attached(monkeypatch):
    # The model's second group refused (as a daemon at its session limit would): the first
    # group's session, already attached, is closed, and the error names the group.
    import kvpool.hybrid

    real_attach = kvpool.hybrid.attach

    def refuse_global(socket, **kwargs):
        if kwargs.get("pool") == "m/global":
            raise ConnectionError("refused")
        return real_attach(socket, **kwargs)

    monkeypatch.setattr(kvpool.hybrid, "attach", refuse_global)
    with LocalDaemon(CONFIG) as d:
        with pytest.raises(ConnectionError) as refused:
            kvpool.HybridModel(d.socket, "m", worker="partial")
        assert "while attaching group global (pool m/global)" in refused.value.__notes__
        with real_attach(d.socket, pool="plain") as observer:
            assert observer.daemon_stats()["sessions"] == 1  # the observer alone


def test_a_lookup_maps_the_segments_a_group_grew_since_its_session_last_synced():
    # The second model attaches while each group has one segment (128 pages of 128 bytes); the
    # first then computes 200 blocks, so both groups grow. The second's one lookup returns pages
    # past what its sessions mapped: HybridModel.lookup maps them before returning.
    with LocalDaemon(CONFIG) as d:
        second = kvpool.HybridModel(d.socket, "m", worker="second")
        mapped = [second.group(g).pool.num_pages for g in range(2)]
        first = kvpool.HybridModel(d.socket, "m", worker="first")
        hasher = kvpool.BlockHasher()
        root = hasher.root("toy", first.group(0).pool.geometry)
        prompt = list(range(800))  # 200 blocks
        with kvpool.HybridSequence(first, hasher, root) as seq:
            seq.begin(prompt)
            seq.publish_full()
        hit = second.lookup(hasher.chain(root, prompt, 4))
        assert len(hit[1]) == 200
        for g in range(2):
            pages = [p for p in hit[g] if p is not None]
            assert pages, g
            assert max(pages) >= mapped[g], (g, max(pages), mapped[g])  # the test's premise
            assert max(pages) < second.group(g).pool.num_pages, g  # mapped now
            second.group(g).release(pages)
        first.close()
        second.close()
