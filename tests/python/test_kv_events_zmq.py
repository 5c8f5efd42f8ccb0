"""KV events over ZeroMQ, decoded as a router written for vLLM decodes them (pyzmq + msgpack).

The field lists below are vLLM's (vllm/distributed/kv_events.py): a msgspec Struct with
array_like=True is an array of its fields in declaration order, a tagged one with its class name
first; without array_like it is a map with the tag under "type".
"""

import time

import msgpack
import pytest
import zmq

import kvpool
from conftest import pool_config
from kvpool.local_daemon import LocalDaemon

FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def decode_array_batch(payload):
    batch = msgpack.unpackb(payload, raw=False)
    ts, events = batch[0], batch[1]
    decoded = []
    for e in events:
        tag, values = e[0], e[1:]
        assert len(values) == len(FIELDS[tag]), (tag, values)
        decoded.append({"type": tag, **dict(zip(FIELDS[tag], values))})
    return ts, decoded


def decode_map_batch(payload):
    batch = msgpack.unpackb(payload, raw=False)
    for e in batch["events"]:
        assert set(FIELDS[e["type"]]) <= set(e), e
    return batch["ts"], batch["events"]


class Router:
    """A SUB socket as a vLLM KV-aware router opens it; waits out ZeroMQ's slow joiner by
    publishing probe blocks until the first batch arrives."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)

    def next(self, timeout_ms=5000):
        assert self.sub.poll(timeout_ms), "no batch within the timeout"
        topic, seq, payload = self.sub.recv_multipart()
        return topic.decode(), int.from_bytes(seq, "big"), payload

    def join(self, conn, hasher, root, published):
        for attempt in range(50):
            [page] = conn.alloc(1)
            chain = hasher.chain(root, [90_000 + attempt] * 4, 4)
            conn.publish([page], chain)
            conn.release([page])
            published.update(bytes(h) for h in chain)
            if self.sub.poll(200):
                return self.next()
        raise AssertionError("the subscription never reached the daemon")

    def close(self):
        self.sub.close(linger=0)
        self.ctx.term()


@pytest.mark.parametrize("payload", ["array", "map"])
def test_router_decodes_stored_removed_and_cleared(tmp_path, payload):
    endpoint = f"ipc://{tmp_path}/kv-events"
    config = pool_config(pages=16) + (
        f"events: {{zmq_endpoint: \"{endpoint}\", zmq_topic: \"kv@\", zmq_payload: {payload}}}\n")
    decode = decode_array_batch if payload == "array" else decode_map_batch
    with LocalDaemon(config) as daemon:
        router = Router(endpoint)
        conn = kvpool.attach(daemon.socket, worker="events")
        hasher = kvpool.BlockHasher()
        root = hasher.root("m", conn.pool.geometry)
        published = set()  # every hash this test stored, probes included
        topic, first_seq, _ = router.join(conn, hasher, root, published)
        assert topic == "kv@default"
        while router.sub.poll(300):  # probes published before the subscription took
            _, first_seq, _ = router.next()

        chain = hasher.chain(root, list(range(12)), 4)
        pages = conn.alloc(3)
        conn.publish(pages, chain)
        topic, seq, body = router.next()
        ts, events = decode(body)
        assert seq == first_seq + 1 and topic == "kv@default"
        assert abs(ts - time.time()) < 60
        [stored] = events
        assert stored["type"] == "BlockStored"
        assert stored["block_hashes"] == [bytes(h) for h in chain]
        assert stored["parent_block_hash"] is None and stored["token_ids"] == []
        assert stored["block_size"] == 4 and stored["medium"] == "CPU"
        assert stored["lora_id"] is None and stored["lora_name"] is None

        published.update(bytes(h) for h in chain)
        conn.release(pages)
        assert conn.evict(1) == 1
        _, seq, body = router.next()
        [removed] = decode(body)[1]
        assert seq == first_seq + 2
        assert removed["type"] == "BlockRemoved" and len(removed["block_hashes"]) == 1
        assert removed["block_hashes"][0] in published

        conn.flush()
        _, seq, body = router.next()
        assert seq == first_seq + 3
        assert [e["type"] for e in decode(body)[1]] == ["AllBlocksCleared"]
        conn.close()
        router.close()


def low_word(h):
    return int.from_bytes(bytes(h)[:8], "little")


def test_router_gets_the_token_ids_and_parent_a_worker_publishes(tmp_path):
    endpoint = f"ipc://{tmp_path}/kv-events"
    config = pool_config(pages=16) + (
        f"events: {{zmq_endpoint: \"{endpoint}\", zmq_block_hash: uint64}}\n")
    with LocalDaemon(config) as daemon:
        router = Router(endpoint)
        conn = kvpool.attach(daemon.socket, worker="events")
        hasher = kvpool.BlockHasher()
        root = hasher.root("m", conn.pool.geometry)
        router.join(conn, hasher, root, set())
        while router.sub.poll(300):  # probes published before the subscription took
            router.next()

        tokens = list(range(100, 112))
        chain = hasher.chain(root, tokens, 4)
        pages = conn.alloc(3)
        conn.publish(pages[:2], chain[:2], token_ids=tokens[:8], lora_name="sql")
        [stored] = decode_array_batch(router.next()[2])[1]
        assert stored["block_hashes"] == [low_word(h) for h in chain[:2]]
        assert stored["parent_block_hash"] is None  # the sequence's first block
        assert stored["token_ids"] == tokens[:8] and stored["lora_name"] == "sql"

        conn.publish(pages[2:], chain[2:], token_ids=tokens[8:], parent=chain[1])
        [stored] = decode_array_batch(router.next()[2])[1]
        assert stored["parent_block_hash"] == low_word(chain[1])
        assert stored["token_ids"] == tokens[8:]

        # Token ids that do not fill the blocks, or that are not 32-bit, are refused.
        [page] = conn.alloc(1)
        other = hasher.chain(root, [7] * 4, 4)
        with pytest.raises(kvpool.Error, match="3 token ids for 1 blocks of 4 tokens"):
            conn.publish([page], other, token_ids=[7, 7, 7])
        with pytest.raises(ValueError, match="token_ids"):
            conn.publish([page], other, token_ids=[7, 7, 7, 2**32])
        assert conn.lookup(other) == []
        assert not router.sub.poll(300)
        conn.release([page])

        # A SequenceCache names its adapter in every publish; a fork keeps the name.
        seq = kvpool.SequenceCache(conn, hasher, hasher.root("m", conn.pool.geometry, "sql"))
        assert seq.lora_name == ""
        seq.lora_name = "sql"
        prompt = list(range(500, 508))
        seq.begin(prompt)
        seq.publish_full()
        [stored] = decode_array_batch(router.next()[2])[1]
        assert stored["token_ids"] == prompt and stored["lora_name"] == "sql"
        child = seq.fork()
        assert child.lora_name == "sql"
        for t in range(600, 604):
            child.append(t)
        child.publish_full()
        [stored] = decode_array_batch(router.next()[2])[1]
        assert stored["token_ids"] == list(range(600, 604)) and stored["lora_name"] == "sql"
        assert stored["parent_block_hash"] == low_word(seq.block_hashes[-1])
        seq.lora_name = "x" * 257
        for t in range(700, 704):
            seq.append(t)
        with pytest.raises(kvpool.Error, match="lora_name"):
            seq.publish_full()
        child.close()
        seq.close()
        conn.close()
        router.close()
