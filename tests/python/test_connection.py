"""Connections against a real kvpoold: the pool calls, sharing across processes, errors."""

import multiprocessing

import numpy as np
import pytest

import kvpool


def chain_of(conn, tokens, model="m"):
    hasher = kvpool.BlockHasher()
    root = hasher.root(model, conn.pool.geometry)
    return hasher.chain(root, tokens, conn.pool.geometry.tokens_per_page)


def test_attach_describes_the_pool(conn):
    assert conn.pool.name == "default"
    assert conn.pool.backend == "host"
    assert conn.pool.num_pages == 32
    assert conn.pool.geometry == kvpool.Geometry(2, 2, 8, 4, "fp16")
    assert conn.device == -1
    assert conn.session_id > 0


def test_published_pages_are_found_by_another_connection(daemon, conn):
    chain = chain_of(conn, list(range(100, 112)))
    pages = conn.alloc(3)
    assert len(set(pages)) == 3
    results = conn.publish(pages, chain)
    assert [r.page for r in results] == pages
    assert not any(r.duplicate for r in results)
    other = kvpool.attach(daemon.socket, worker="other")
    found = other.lookup(chain + chain_of(conn, list(range(200, 204))))
    assert found == pages  # the cached prefix only, in chain order
    other.release(found)
    conn.release(pages)
    other.close()


def test_a_second_publish_of_a_hash_is_a_duplicate(daemon, conn):
    chain = chain_of(conn, [7, 7, 7, 7], model="dup")
    first = conn.alloc(1)
    conn.publish(first, chain)
    other = kvpool.attach(daemon.socket, worker="other")
    mine = other.alloc(1)
    [r] = other.publish(mine, chain)
    assert r.duplicate and r.page == first[0]
    other.release(mine + [r.page])
    conn.release(first)
    other.close()


def _write_and_publish(socket, tokens, value):
    c = kvpool.attach(socket, worker="writer")
    [page] = c.alloc(1)
    kvpool.page_bytes(c, page)[:] = value
    c.publish([page], chain_of(c, tokens))
    c.release([page])  # cached: it outlives this process


def test_another_process_writes_what_this_one_reads_without_copy(daemon, conn):
    tokens = [31, 32, 33, 34]
    p = multiprocessing.get_context("spawn").Process(target=_write_and_publish,
                                                     args=(daemon.socket, tokens, 0x5A))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    [page] = conn.lookup(chain_of(conn, tokens))
    assert np.all(kvpool.page_bytes(conn, page) == 0x5A)
    conn.release([page])


def test_pages_are_released_when_the_connection_closes(daemon):
    c = kvpool.attach(daemon.socket, worker="short")
    c.alloc(5)
    assert c.stats()["session_held_pages"] == 5
    c.close()
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        c.alloc(1)
    probe = kvpool.attach(daemon.socket, worker="probe")
    assert probe.stats()["in_use"] == 0
    probe.close()


def test_stats_names_every_counter_of_the_pool(conn):
    # The daemon's counter table, by name: pins and host-tier counters included.
    assert "pins" in kvpool.POOL_COUNTERS and "host_demoted" in kvpool.POOL_COUNTERS
    before = conn.stats()
    assert set(kvpool.POOL_COUNTERS) <= set(before)
    pages = conn.alloc(3)
    after = conn.stats()
    assert after["allocated"] == before["allocated"] + 3
    conn.release(pages)


def test_daemon_stats_names_every_row_of_the_daemon_table(daemon, conn):
    assert "sessions_refused" in kvpool.DAEMON_COUNTERS and "reloads" in kvpool.DAEMON_COUNTERS
    d = conn.daemon_stats()
    assert set(d) == set(kvpool.DAEMON_COUNTERS)
    assert d["num_pools"] >= 1 and d["sessions"] >= 1
    other = kvpool.attach(daemon.socket, worker="second")
    assert conn.daemon_stats()["sessions"] == d["sessions"] + 1
    other.close()


def test_daemon_errors_raise_kvpool_error_with_code_and_name(conn):
    with pytest.raises(kvpool.Error) as e:
        conn.release([10_000])
    assert e.value.name == "invalid_page"
    assert e.value.code == 2
    assert "10000" in e.value.message
    [page] = conn.alloc(1)
    conn.release([page])
    with pytest.raises(kvpool.Error) as e:
        conn.release([page])  # a double release changes nothing
    assert e.value.name == "not_held"
    # The name is said once: "not_held: page N is not held by this owner".
    assert str(e.value).count("not_held") == 1, str(e.value)
    assert not e.value.message.startswith("not_held")
    with pytest.raises(kvpool.Error) as e:
        conn.alloc(33)
    assert e.value.name == "exceeds_capacity"
    assert conn.stats()["session_held_pages"] == 0


def test_bad_arguments_raise_before_anything_is_sent(conn):
    with pytest.raises(ValueError, match="priority"):
        conn.alloc(1, priority="urgent")
    with pytest.raises(ValueError, match="2 pages but 1 hashes"):
        conn.publish([0, 1], chain_of(conn, [1, 2, 3, 4]))
    with pytest.raises(ValueError, match="one-dimensional"):
        conn.release(np.zeros((2, 2), dtype=np.uint32))
    assert conn.stats()["session_held_pages"] == 0


def test_out_of_range_arguments_are_refused_by_name(conn):
    hasher = kvpool.BlockHasher()
    root = hasher.root("args", conn.pool.geometry)
    # Token ids are uint32: -1 and 2**33 are refused, never wrapped into another block's hash.
    for bad in ([1, -1, 3], [2**33], np.array([5, -2], dtype=np.int64), [1.5, 2.0]):
        with pytest.raises(ValueError, match="tokens"):
            hasher.block(root, bad)
        with pytest.raises(ValueError, match="tokens"):
            hasher.chain(root, bad, 4)
    assert hasher.chain(root, np.array([1, 2, 3, 4], dtype=np.uint64), 4) == \
        hasher.chain(root, [1, 2, 3, 4], 4)
    for bad_block in (0, -4):
        with pytest.raises(ValueError, match="tokens_per_block"):
            hasher.chain(root, [1, 2, 3, 4], bad_block)
    with pytest.raises(ValueError, match="n is -1"):
        conn.alloc(-1)
    seq = kvpool.SequenceCache(conn, hasher, root)
    with pytest.raises(ValueError, match=r"prompt\[1\] is -7"):
        seq.begin([1, -7])
    # A priority by name or number, everywhere.
    pages = conn.alloc(1, priority=3)
    conn.release(pages)
    seq.set_hints(priority="conversation")
    seq.set_hints(priority=1)
    with pytest.raises(ValueError, match="priority"):
        seq.set_hints(priority=7)
    with pytest.raises(ValueError, match="priority"):
        conn.alloc(1, priority=-1)
    assert conn.stats()["session_held_pages"] == 0


def test_hints_pin_a_page_past_eviction(conn):
    chain = chain_of(conn, [9, 9, 9, 9], model="pinned")
    pages = conn.alloc(1, priority="system", pin_ttl_ms=60_000)
    conn.publish(pages, chain)
    conn.release(pages)
    conn.evict(32)
    found = conn.lookup(chain)
    assert found == pages
    conn.release(found)
    conn.flush()


def test_daemon_side_copy(conn):
    src, dst = conn.alloc(2)
    kvpool.page_bytes(conn, src)[:] = np.arange(256, dtype=np.uint8).repeat(2)[: conn.pool.geometry.page_data_bytes]
    assert conn.copy([src], [dst]) == 1
    assert np.array_equal(kvpool.page_bytes(conn, dst), kvpool.page_bytes(conn, src))
    conn.release([src, dst])


def test_sequence_cache_reuses_another_sequences_prefix(daemon, conn):
    hasher = kvpool.BlockHasher()
    root = hasher.root("seq", conn.pool.geometry)
    prompt = list(range(1000, 1010))  # two full blocks of 4 and two tokens
    first = kvpool.SequenceCache(conn, hasher, root)
    assert first.begin(prompt) == 0
    assert first.publish_full() == 0
    assert first.published_blocks == 2
    other = kvpool.attach(daemon.socket, worker="other")
    second = kvpool.SequenceCache(other, kvpool.BlockHasher(), root)
    assert second.begin(prompt) == 8
    assert second.block_table[:2] == first.block_table[:2]
    page, offset = second.append(5)
    assert offset == 2 and page == second.block_table[2]
    second.release()
    first.release()
    assert other.stats()["session_held_pages"] == 0
    other.close()


def test_event_stream_reports_stored_blocks(daemon, conn):
    stream = kvpool.EventStream(daemon.socket)
    chain = chain_of(conn, [4, 4, 4, 4, 5, 5, 5, 5], model="events")
    pages = conn.alloc(2)
    conn.publish(pages, chain)
    seen = []
    while len(seen) < 2:
        batch = stream.next(timeout_ms=5000)
        assert batch, "no events within 5 s"
        seen += [e for e in batch if e.kind == "stored"]
    assert [e.hash for e in seen] == chain
    assert [e.page for e in seen] == pages
    conn.release(pages)


def test_a_sliding_pool_hit_skips_blocks_before_the_window():
    """Window 6 over 4-token blocks: a hit of 4 blocks needs blocks 2 and 3 only (the next query,
    at 16, sees keys 11..16), so with blocks 0 and 1 evicted it is still a hit, None before."""
    from conftest import pool_config
    from kvpool.local_daemon import LocalDaemon

    config = pool_config(pages=8).replace("dtype: fp16}", "dtype: fp16, kind: sliding, window: 6}")
    with LocalDaemon(config) as d:
        c = kvpool.attach(d.socket)
        chain = chain_of(c, list(range(16)))
        pages = c.alloc(4)
        c.publish(pages, chain)
        c.release(pages)  # head first: the head is evicted first
        assert c.evict(2) == 2
        found, tiers = c.lookup_with_tiers(chain)
        assert found == [None, None, pages[2], pages[3]]
        assert tiers == ["none", "none", "device", "device"]
        assert c.stats()["session_held_pages"] == 2
        c.release([p for p in found if p is not None])
        assert c.lookup(chain[:2]) == []  # a hit of 1 or 2 blocks needs block 0
        c.close()


def test_a_hybrid_model_answers_one_lookup_for_every_group():
    """A model of a sliding group (window 8 tokens over 4-token blocks) and a full group: two
    linked sessions, one lookup_groups; the sliding group's part skips what its window does not
    need. A reservation seeded from the hit keeps the table fixed until unreserve."""
    from kvpool.local_daemon import LocalDaemon

    config = """backend: host
pools:
  - name: m
    capacity: 256KiB
    segment_size: 16KiB
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 4, dtype: fp16}
    groups:
      - {name: local, kind: sliding, window: 8}
      - {name: global}
"""
    with LocalDaemon(config) as d:
        local = kvpool.attach(d.socket, pool="m")  # the model's name: its first group
        assert (local.pool.model, local.pool.group, local.pool.groups) == ("m", 0, ["local", "global"])
        glob = kvpool.attach(d.socket, pool="m/global", link_session=local.session_id)
        assert glob.pool.name == "m/global" and glob.pool.group == 1
        chain = chain_of(local, list(range(24)))  # 6 blocks
        for c in (local, glob):
            pages = c.alloc(6)
            c.publish(pages, chain)
            c.release(list(reversed(pages)))
        found = glob.lookup_groups(chain)
        assert len(found) == 2 and len(found[0]) == len(found[1]) == 6
        # The next query, at 24, sees keys 17..24: blocks 4 and 5 of the sliding group.
        assert found[0][:4] == [None] * 4 and None not in found[0][4:]
        assert None not in found[1]
        assert local.stats()["session_held_pages"] == 2
        assert glob.stats()["session_held_pages"] == 6
        rid, table = glob.reserve(40, found[1])  # 10 blocks from the 6 of the hit
        assert table[:6] == found[1] and len(table) == 10
        glob.release(found[1])  # the lookup's own references; the reservation's stay
        with pytest.raises(kvpool.Error):
            glob.release(table[:1])
        glob.unreserve(rid)
        assert glob.stats()["session_held_pages"] == 0
        local.release([p for p in found[0] if p is not None])
        with pytest.raises(kvpool.Error, match="kNoPage"):
            glob.reserve(4, [None])  # a full group's hit has no holes
        local.close()
        glob.close()
