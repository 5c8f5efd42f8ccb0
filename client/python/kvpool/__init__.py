"""kvpool: a worker's client of kvpoold, the KV-cache page pool daemon.

Attach to the daemon, share KV pages with every other worker of the pool, and see them without a
copy as numpy arrays (host pools) or torch tensors (any pool, through DLPack)::

    import kvpool
    conn = kvpool.attach(worker="engine-0")          # $KVPOOL_SOCKET or the daemon's default
    hasher = kvpool.BlockHasher()
    root = hasher.root("my-model", conn.pool.geometry)
    chain = hasher.chain(root, prompt_tokens, conn.pool.geometry.tokens_per_page)
    cached = conn.lookup(chain)                      # pages of the longest cached prefix
    fresh = conn.alloc(len(chain) - len(cached))     # pages for the rest: write K/V, then
    conn.publish(fresh, chain[len(cached):])         # name them so every worker finds them
    # (kvpool.SequenceCache does all of this, and publishes each block's token ids and parent,
    # which KV-aware routers need: publish(..., token_ids=, parent=))
    k_cache, v_cache = kvpool.kv_cache_view(conn, layer=0)   # vLLM's per-layer shape
    # (a latent / MLA pool: one [num_blocks, block_size, head_dim] tensor, FlashMLA's)

Errors the daemon reports raise kvpool.Error (code, name, message).
"""

from ._kvpool import (
    BlockHash,
    BlockHasher,
    Connection,
    DAEMON_COUNTERS,
    Error,
    Event,
    EventStream,
    Geometry,
    MixedSequence,
    POOL_COUNTERS,
    PoolInfo,
    PoolView,
    PublishResult,
    SequenceCache,
    VllmBlockHasher,
    attach,
    default_socket_path,
    error_name,
)
from .hybrid import HybridModel, HybridSequence
from .layers import element_dtype, kv_cache_view, kv_cache_views, kv_scales_view, page_bytes

__all__ = [
    "BlockHash",
    "BlockHasher",
    "Connection",
    "DAEMON_COUNTERS",
    "Error",
    "Event",
    "EventStream",
    "Geometry",
    "HybridModel",
    "HybridSequence",
    "MixedSequence",
    "POOL_COUNTERS",
    "PoolInfo",
    "PoolView",
    "PublishResult",
    "SequenceCache",
    "VllmBlockHasher",
    "attach",
    "default_socket_path",
    "element_dtype",
    "error_name",
    "kv_cache_view",
    "kv_cache_views",
    "kv_scales_view",
    "page_bytes",
]
