"""Block hashing: Python, the C API of libkvpool.so (through ctypes) and the daemon agree."""

import ctypes
import os
import pickle

import numpy as np
import pytest

import kvpool


class CHash(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_uint64), ("hi", ctypes.c_uint64)]


class CGeometry(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_uint32), ("kv_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("tokens_per_page", ctypes.c_uint32),
                ("dtype", ctypes.c_uint8)]


@pytest.fixture(scope="module")
def libkvpool():
    return ctypes.CDLL(os.environ["KVPOOL_LIB"])


GEOMETRY = kvpool.Geometry(layers=4, kv_heads=8, head_dim=128, tokens_per_page=16, dtype="bf16")


def test_python_and_c_api_hash_the_same_chain(libkvpool):
    tokens = list(range(5, 5 + 16 * 3 + 7))
    hasher = kvpool.BlockHasher()
    root = hasher.root("llama-3-8b", GEOMETRY, adapter_id="lora-a", salt="s")
    chain = hasher.chain(root, tokens, 16)
    assert len(chain) == 3

    c_root = CHash()
    geometry = CGeometry(4, 8, 128, 16, 1)
    assert libkvpool.kvpool_hash_root(b"llama-3-8b", ctypes.byref(geometry), b"lora-a", b"s",
                                      ctypes.byref(c_root)) == 0
    assert (c_root.lo, c_root.hi) == (root.lo, root.hi)
    c_tokens = (ctypes.c_uint32 * len(tokens))(*tokens)
    out = (CHash * 8)()
    written = ctypes.c_size_t()
    assert libkvpool.kvpool_hash_chain(ctypes.byref(c_root), c_tokens, len(tokens), 16, out, 8,
                                       ctypes.byref(written)) == 0
    assert written.value == 3
    assert [(h.lo, h.hi) for h in out[:3]] == [(h.lo, h.hi) for h in chain]

    block = CHash()
    assert libkvpool.kvpool_hash_block(ctypes.byref(c_root), c_tokens, 16, None, 0,
                                       ctypes.byref(block)) == 0
    assert (block.lo, block.hi) == (chain[0].lo, chain[0].hi)


def test_c_api_refuses_bad_input_and_names_the_cause(libkvpool):
    libkvpool.kvpool_hash_last_error.restype = ctypes.c_char_p
    libkvpool.kvpool_error_name.restype = ctypes.c_char_p
    bad = CGeometry(4, 8, 128, 16, 9)
    code = libkvpool.kvpool_hash_root(b"m", ctypes.byref(bad), None, None, ctypes.byref(CHash()))
    assert libkvpool.kvpool_error_name(code) == b"invalid_argument"
    assert b"dtype 9" in libkvpool.kvpool_hash_last_error()
    zero_pages = CGeometry(4, 8, 128, 0, 0)
    assert libkvpool.kvpool_hash_root(b"m", ctypes.byref(zero_pages), None, None,
                                      ctypes.byref(CHash())) != 0
    assert b"tokens_per_page" in libkvpool.kvpool_hash_last_error()


def test_chain_matches_block_by_block_and_extra_keys_matter():
    hasher = kvpool.BlockHasher()
    root = hasher.root("m", GEOMETRY)
    tokens = np.arange(48, dtype=np.uint32)
    chain = hasher.chain(root, tokens, 16)
    parent = root
    for i, h in enumerate(chain):
        parent = hasher.block(parent, tokens[16 * i:16 * (i + 1)])
        assert parent == h
    assert hasher.block(root, tokens[:16], extra=b"image-1") != chain[0]
    assert hasher.chain(root, tokens[:15], 16) == []


def test_roots_differ_by_model_geometry_adapter_and_salt():
    hasher = kvpool.BlockHasher()
    base = hasher.root("m", GEOMETRY)
    other_geometry = kvpool.Geometry(4, 8, 128, 16, "fp16")
    assert len({base, hasher.root("n", GEOMETRY), hasher.root("m", other_geometry),
                hasher.root("m", GEOMETRY, adapter_id="a"),
                hasher.root("m", GEOMETRY, salt="s")}) == 5


def test_block_hash_bytes_round_trip_and_pickle():
    h = kvpool.BlockHash(0x0102030405060708, 0x1112131415161718)
    data = bytes(h)
    assert data[:8] == bytes([8, 7, 6, 5, 4, 3, 2, 1])  # lo first, little-endian
    assert kvpool.BlockHash.from_bytes(data) == h
    assert pickle.loads(pickle.dumps(h)) == h
    with pytest.raises(ValueError, match="16 bytes"):
        kvpool.BlockHash.from_bytes(b"short")


def test_geometry_is_validated():
    with pytest.raises(ValueError, match="dtype"):
        kvpool.Geometry(1, 1, 8, 4, "fp64")
    with pytest.raises(ValueError):
        kvpool.Geometry(0, 1, 8, 4)


def test_attention_kind_and_window_are_part_of_the_root(libkvpool):
    hasher = kvpool.BlockHasher()
    full = kvpool.Geometry(4, 8, 128, 16, "bf16")
    sliding = kvpool.Geometry(4, 8, 128, 16, "bf16", kind="sliding", window=4096)
    assert (sliding.kind, sliding.window) == ("sliding", 4096)
    assert (full.kind, full.window) == ("full", 0)
    assert sliding.page_data_bytes == full.page_data_bytes  # same pages, other identity
    other_window = kvpool.Geometry(4, 8, 128, 16, "bf16", kind="sliding", window=1024)
    chunked = kvpool.Geometry(4, 8, 128, 16, "bf16", kind="chunked", window=4096)
    roots = {hasher.root("m", g) for g in (full, sliding, other_window, chunked)}
    assert len(roots) == 4
    assert "kind='sliding', window=4096" in repr(sliding)

    # The C API names the same roots; full with window 0 is kvpool_hash_root's.
    g = CGeometry(4, 8, 128, 16, 1)
    out = CHash()
    assert libkvpool.kvpool_hash_root_attention(b"m", ctypes.byref(g), 1, 4096, None, None,
                                                ctypes.byref(out)) == 0
    assert kvpool.BlockHash(out.lo, out.hi) == hasher.root("m", sliding)
    assert libkvpool.kvpool_hash_root_attention(b"m", ctypes.byref(g), 0, 0, None, None,
                                                ctypes.byref(out)) == 0
    assert kvpool.BlockHash(out.lo, out.hi) == hasher.root("m", full)
    libkvpool.kvpool_hash_last_error.restype = ctypes.c_char_p
    assert libkvpool.kvpool_hash_root_attention(b"m", ctypes.byref(g), 1, 0, None, None,
                                                ctypes.byref(out)) != 0
    assert b"window" in libkvpool.kvpool_hash_last_error()
    # A latent (MLA) pool: its own root in both APIs; an unknown kind is refused by number.
    mla = kvpool.Geometry(4, 1, 576, 16, "bf16", kind="latent")
    g_mla = CGeometry(4, 1, 576, 16, 1)
    assert libkvpool.kvpool_hash_root_attention(b"m", ctypes.byref(g_mla), 3, 0, None, None,
                                                ctypes.byref(out)) == 0
    assert kvpool.BlockHash(out.lo, out.hi) == hasher.root("m", mla)
    assert hasher.root("m", mla) != hasher.root("m", kvpool.Geometry(4, 1, 576, 16, "bf16"))
    assert libkvpool.kvpool_hash_root_attention(b"m", ctypes.byref(g_mla), 4, 0, None, None,
                                                ctypes.byref(out)) != 0
    assert b"3 latent" in libkvpool.kvpool_hash_last_error()


def test_a_window_must_fit_its_kind():
    with pytest.raises(ValueError, match="window must be at least 1"):
        kvpool.Geometry(1, 1, 8, 4, kind="sliding")
    with pytest.raises(ValueError, match="full-attention"):
        kvpool.Geometry(1, 1, 8, 4, window=128)
    with pytest.raises(ValueError, match="not full, sliding, chunked or latent"):
        kvpool.Geometry(1, 1, 8, 4, kind="local", window=128)
    with pytest.raises(ValueError, match="kv_heads 2 on a latent geometry"):
        kvpool.Geometry(1, 2, 8, 4, kind="latent")
    with pytest.raises(ValueError, match="window 4 is set on a latent geometry"):
        kvpool.Geometry(1, 1, 8, 4, kind="latent", window=4)


def test_a_latent_geometry_keeps_one_vector_per_token():
    mla = kvpool.Geometry(61, 1, 576, 64, "bf16", kind="latent")
    kv = kvpool.Geometry(61, 1, 576, 64, "bf16")
    assert mla.kind == "latent"
    assert mla.page_data_bytes == 61 * 576 * 64 * 2
    assert kv.page_data_bytes == 2 * mla.page_data_bytes


VECTORS = os.path.join(os.path.dirname(__file__), "..", "data", "block_hash_vectors.json")
DTYPES = {"fp16": 0, "bf16": 1, "fp8_e4m3": 2, "int8": 3}
KINDS = {"full": 0, "sliding": 1, "chunked": 2, "latent": 3}


def spec_root(r):
    """docs/BLOCK_HASH.md's root, from the text alone (hashlib, not kvpool)."""
    import hashlib
    import struct

    def field(s):
        return struct.pack("<I", len(s)) + s

    message = (b"R" + field(r["model"].encode())
               + struct.pack("<5I", r["layers"], r["kv_heads"], r["head_dim"],
                             r["tokens_per_page"], DTYPES[r["dtype"]])
               + field(r["adapter"].encode()) + field(r["salt"].encode()))
    if r["kind"] != "full":
        message += struct.pack("<2I", KINDS[r["kind"]], r["window"])
    return message, hashlib.sha256(message).digest()[:16]


def spec_block(parent, tokens, extra):
    import hashlib
    import struct

    message = (b"B" + parent + struct.pack(f"<I{len(tokens)}I", len(tokens), *tokens)
               + struct.pack("<I", len(extra)) + extra)
    return message, hashlib.sha256(message).digest()[:16]


def test_the_documented_vectors_hold_in_python_c_and_the_spec(libkvpool):
    import json

    with open(VECTORS) as f:
        vectors = json.load(f)
    hasher = kvpool.BlockHasher()
    for r in vectors["roots"]:
        message, digest = spec_root(r)
        assert message.hex() == r["message"] and digest.hex() == r["hash"], r["model"]
        g = kvpool.Geometry(r["layers"], r["kv_heads"], r["head_dim"], r["tokens_per_page"],
                            r["dtype"], kind=r["kind"], window=r["window"])
        assert hasher.root(r["model"], g, r["adapter"], r["salt"]).hex() == r["hash"]
        out = CHash()
        c_geometry = CGeometry(r["layers"], r["kv_heads"], r["head_dim"], r["tokens_per_page"],
                               DTYPES[r["dtype"]])
        assert libkvpool.kvpool_hash_root_attention(
            r["model"].encode(), ctypes.byref(c_geometry), KINDS[r["kind"]], r["window"],
            r["adapter"].encode(), r["salt"].encode(), ctypes.byref(out)) == 0
        assert kvpool.BlockHash(out.lo, out.hi).hex() == r["hash"]
    for b in vectors["blocks"]:
        parent, extra = bytes.fromhex(b["parent"]), bytes.fromhex(b["extra"])
        message, digest = spec_block(parent, b["tokens"], extra)
        assert message.hex() == b["message"] and digest.hex() == b["hash"]
        p = kvpool.BlockHash(int.from_bytes(parent[:8], "little"),
                             int.from_bytes(parent[8:], "little"))
        assert hasher.block(p, b["tokens"], extra).hex() == b["hash"]
        c_parent, out = CHash(p.lo, p.hi), CHash()
        c_tokens = (ctypes.c_uint32 * len(b["tokens"]))(*b["tokens"])
        assert libkvpool.kvpool_hash_block(ctypes.byref(c_parent), c_tokens, len(b["tokens"]),
                                           extra or None, len(extra), ctypes.byref(out)) == 0
        assert kvpool.BlockHash(out.lo, out.hi).hex() == b["hash"]
    # The chain of vectors 0..2 is BlockHasher.chain's over tokens 0..47.
    root = kvpool.BlockHash(*(int.from_bytes(bytes.fromhex(vectors["roots"][0]["hash"])[i:i + 8],
                                             "little") for i in (0, 8)))
    assert [h.hex() for h in hasher.chain(root, list(range(48)), 16)] == \
        [b["hash"] for b in vectors["blocks"][:3]]


def test_the_daemon_refuses_a_worker_that_hashes_with_another_scheme(daemon):
    with pytest.raises(kvpool.Error, match="kvpool-blake2s256/1.*kvpool-sha256/1"):
        kvpool.attach(daemon.socket, worker="blake", hasher=kvpool.BlockHasher("blake2s256"))
    with kvpool.attach(daemon.socket, worker="sha", hasher=kvpool.BlockHasher()) as conn:
        assert conn.pool.geometry.tokens_per_page > 0
