"""vLLM's block hash in kvpool (kvpool.VllmBlockHasher, pools[].hash_scheme: vllm-sha256-cbor/1).

The reference is vLLM's definition computed here with the libraries vLLM itself uses (cbor2's
canonical encoding and hashlib's SHA-256): hash_block_tokens(sha256_cbor, parent, tokens,
extra_keys) = sha256(cbor2.dumps((parent or NONE_HASH, tuple(tokens), extra_keys),
canonical=True)), NONE_HASH = sha256_cbor(PYTHONHASHSEED). A pool of that scheme takes such workers
only (and a SequenceCache, which hashes kvpool's way, refuses to begin on it), and its uint64 KV
events carry exactly the integers vLLM's own events carry (int.from_bytes(digest, "big") &
(2**64 - 1)), so one router indexes engines and kvpool alike.
"""

import hashlib
import json
import os
import random

import cbor2
import pytest
import zmq
import msgpack

import kvpool
from conftest import pool_config
from kvpool.local_daemon import LocalDaemon

VECTORS = os.path.join(os.path.dirname(__file__), "..", "data", "vllm_block_hash_vectors.json")


def sha256_cbor(value):
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def vllm_block(seed, parent, tokens, extra_keys=None):
    return sha256_cbor((parent or sha256_cbor(seed), tuple(tokens), extra_keys))


def vllm_int(digest):
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def test_blocks_equal_sha256_over_cbor2_for_random_tokens_and_extra_keys():
    rng = random.Random(26)
    extras = [None, ("sql-adapter",), ("mm-7f3a", ("mm-7f3a", 16), -1, b"\x00\xff"),
              ("salt",), (2**63, -2**63, 2**64 - 1, 0, 23, 24), ("a", None, ()),
              (bytearray(b"\x01\x02"), [3, "x" * 300])]
    for seed in ("0", "42", "a seed that is long enough to need a one-byte length head"):
        h = kvpool.VllmBlockHasher(seed)
        assert h.none_hash == sha256_cbor(seed)
        parent = None
        for i in range(60):
            n = rng.choice([1, 16, 23, 24, 64, 300])
            tokens = [rng.choice([0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1,
                                  rng.randrange(2**32)]) for _ in range(n)]
            extra = extras[i % len(extras)]
            got = h.block(parent, tokens, extra)
            assert got == vllm_block(seed, parent, tokens, extra), (seed, i)
            assert kvpool.VllmBlockHasher.key(got).lo == vllm_int(got)
            parent = got


def test_a_chain_is_vllms_chain_and_the_vectors_hold():
    h = kvpool.VllmBlockHasher("0")
    tokens = list(range(100, 150))
    chain = h.chain(tokens, 16)
    assert len(chain) == 3  # the partial block is not hashed
    parent = None
    for i, digest in enumerate(chain):
        parent = vllm_block("0", parent, tokens[16 * i:16 * (i + 1)])
        assert digest == parent
    with open(VECTORS) as f:
        vectors = json.load(f)
    for v in vectors["blocks"]:
        parent = None if v["parent"] == "none" else bytes.fromhex(v["parent"])
        extra = cbor2.loads(bytes.fromhex(v["extra_keys"])) if v["extra_keys"] else None
        assert h.block(parent, v["tokens"], extra).hex() == v["digest"], v["name"]
        assert vllm_int(bytes.fromhex(v["digest"])) == v["vllm_int_hash"]


def test_bad_arguments_are_refused_naming_them():
    h = kvpool.VllmBlockHasher("0")
    with pytest.raises(ValueError, match="parent: a vLLM block hash is 32 bytes, got 16"):
        h.block(b"\x00" * 16, [1, 2])
    with pytest.raises(ValueError, match="digest: a vLLM block hash is 32 bytes"):
        kvpool.VllmBlockHasher.key(b"short")
    with pytest.raises(TypeError, match="extra_keys"):
        h.block(None, [1], (1.5,))
    with pytest.raises(TypeError, match="extra_keys: bool"):
        h.block(None, [1], (True,))
    with pytest.raises(ValueError, match="extra_keys: an integer below"):
        h.block(None, [1], (-2**64,))
    with pytest.raises(ValueError, match="extra_keys: an integer of 2\\*\\*64 or more"):
        h.block(None, [1], (2**64,))
    with pytest.raises(ValueError, match="tokens_per_block"):
        h.chain([1, 2], 0)


def test_a_vllm_pool_takes_vllm_hashers_and_its_events_carry_vllms_integers(tmp_path):
    endpoint = f"ipc://{tmp_path}/kv-events"
    config = pool_config(pages=16, extra="    hash_scheme: vllm-sha256-cbor/1\n") + (
        f"events: {{zmq_endpoint: \"{endpoint}\", zmq_block_hash: uint64}}\n")
    with LocalDaemon(config) as daemon:
        with pytest.raises(kvpool.Error, match="pool default's scheme is vllm-sha256-cbor/1"):
            kvpool.attach(daemon.socket, worker="kvpool-hasher")
        hasher = kvpool.VllmBlockHasher("0")
        conn = kvpool.attach(daemon.socket, worker="engine", hasher=hasher)
        with pytest.raises(TypeError, match="hasher"):
            kvpool.attach(daemon.socket, worker="engine", hasher="sha256")

        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        for attempt in range(50):  # ZeroMQ's slow joiner: probe until a batch arrives
            [page] = conn.alloc(1)
            probe = hasher.chain([7_000_000 + attempt] * 4, 4)
            conn.publish([page], [kvpool.VllmBlockHasher.key(d) for d in probe])
            conn.release([page])
            if sub.poll(200):
                break
        while sub.poll(300):
            sub.recv_multipart()

        tokens = list(range(500, 512))
        digests = hasher.chain(tokens, 4)
        keys = [kvpool.VllmBlockHasher.key(d) for d in digests]
        pages = conn.alloc(3)
        conn.publish(pages[:1], keys[:1], token_ids=tokens[:4])
        conn.publish(pages[1:], keys[1:], token_ids=tokens[4:], parent=keys[0])
        stored = []
        for _ in range(2):
            assert sub.poll(5000)
            _, _, payload = sub.recv_multipart()
            [event] = msgpack.unpackb(payload, raw=False)[1]
            stored.append(event)
        # What vLLM publishes for the same blocks with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES.
        assert stored[0][1] == [vllm_int(digests[0])] and stored[0][2] is None
        assert stored[1][1] == [vllm_int(d) for d in digests[1:]]
        assert stored[1][2] == vllm_int(digests[0])
        assert conn.lookup(keys) == pages
        # SequenceCache hashes with kvpool's scheme: on this pool it refuses to begin.
        seq = kvpool.SequenceCache(conn, kvpool.BlockHasher(),
                                   kvpool.BlockHasher().root("m", conn.pool.geometry))
        with pytest.raises(kvpool.Error, match="hashes with kvpool-sha256/1 but its connection "
                                               "attached with vllm-sha256-cbor/1"):
            seq.begin(tokens)
        seq.close()
        # begin_from takes a hit's references over even when it refuses: nothing stays held.
        other = kvpool.attach(daemon.socket, worker="other", hasher=hasher)
        hit = other.lookup(keys)
        assert other.stats()["session_held_pages"] == 3
        seq = kvpool.SequenceCache(other, kvpool.BlockHasher(),
                                   kvpool.BlockHasher().root("m", other.pool.geometry))
        with pytest.raises(kvpool.Error, match="attached with vllm-sha256-cbor/1"):
            seq.begin_from(tokens, hit)
        assert other.stats()["session_held_pages"] == 0
        seq.close()
        other.close()
        sub.close(linger=0)
        ctx.term()
        conn.close()
