"""Lifetimes a Python user relies on: close() and with-blocks on SequenceCache and EventStream,
Connection.closed once the daemon is gone, and a LocalDaemon that fails to start leaving nothing
behind."""

import os
import time

import pytest

import kvpool
from kvpool.local_daemon import LocalDaemon

from conftest import pool_config


def test_a_sequence_cache_closes_and_gives_its_pages_back(conn):
    hasher = kvpool.BlockHasher()
    root = hasher.root("lifecycle", conn.pool.geometry)
    with kvpool.SequenceCache(conn, hasher, root) as seq:
        seq.begin(list(range(10)))
        assert conn.stats()["session_held_pages"] == 3
        assert not seq.closed
    assert seq.closed
    assert conn.stats()["session_held_pages"] == 0
    seq.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        seq.append(1)
    other = kvpool.SequenceCache(conn, hasher, root)
    other.begin(list(range(6)))
    other.close()
    assert conn.stats()["session_held_pages"] == 0


def test_an_event_stream_closes(daemon):
    with kvpool.EventStream(daemon.socket) as stream:
        assert not stream.closed
        assert stream.next(timeout_ms=10) == []
    assert stream.closed
    with pytest.raises(kvpool.Error, match="closed"):
        stream.next(timeout_ms=10)
    stream.close()  # idempotent


def test_a_connection_says_closed_once_its_daemon_is_gone():
    with LocalDaemon(pool_config()) as d:
        c = kvpool.attach(d.socket, worker="w")
        assert not c.closed
        d.stop()
        deadline = time.monotonic() + 5
        while not c.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.closed
        with pytest.raises(kvpool.Error) as e:
            c.alloc(1)
        assert e.value.name == "connection_lost"


def test_a_local_daemon_that_cannot_start_leaves_nothing_behind():
    d = LocalDaemon("pools: not-a-list\n")
    with pytest.raises(RuntimeError, match="kvpoold exited"):
        d.start()
    assert not os.path.exists(d.dir)
    d.close()  # still safe


def test_closing_an_event_stream_wakes_a_reader_in_another_thread(daemon):
    import threading

    stream = kvpool.EventStream(daemon.socket)
    outcome = []

    def read():
        try:
            outcome.append(stream.next(timeout_ms=-1))  # nothing comes: waits until closed
        except kvpool.Error as e:
            outcome.append(e.name)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    stream.close()
    reader.join(timeout=10)
    assert not reader.is_alive(), "close() left the reader waiting"
    assert outcome and outcome[0] != [], outcome
