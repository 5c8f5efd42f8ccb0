"""Per-layer KV tensors over a pool, in the shape engines' attention backends read.

vLLM's FlashAttention backend keeps one tensor per layer of shape
``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K at index 0, V at 1). kv_cache_view()
returns exactly that shape over the pool's own memory, without a copy, for either layout:

* ``layer_major`` pools store it contiguously (page p of layer l at a fixed stride), so the view
  is a dense tensor, as FlashInfer/FlashAttention kernels require. An elastic layer_major pool is
  segmented (``pool.segment_pages`` pages per segment, ``pool.segment_stride`` bytes apart): its
  view has the same shape and block stride, but page p is block ``pool.block_index(p)`` of it
  (the blocks in between belong to other layers), so block tables handed to such kernels hold
  ``block_index(p)`` rather than p (``SequenceCache.kv_block_table``);
* ``page_major`` pools (a page holds every layer, each K and V tile ``[kv_heads][tokens][dim]``)
  give a strided view of the same shape: right for torch code, not for kernels that assume a
  dense layout.

A latent (MLA) pool keeps one vector per token and layer and no V: its view is
``[num_blocks, block_size, head_dim]`` (head_dim = latent width + rotary width, 576 for
DeepSeek-V3), the paged cache FlashMLA and FlashInfer's MLA kernels read.

8-bit pools (fp8_e4m3, int8) are viewed as their raw bytes (uint8 / int8); their scales live in
the pool's side region, which kv_scales_view() shows (a K or V element's value is its byte,
decoded, times the scale of its page, layer, head and plane).
"""

from typing import Any, Literal

from ._kvpool import Connection, PoolView

Framework = Literal["torch", "numpy", "view"]

_ELEMENT = {"fp16": "float16", "bf16": "bfloat16", "fp8_e4m3": "uint8", "int8": "int8"}
_SIZE = {"float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1}


def element_dtype(conn: Connection) -> str:
    """The element type of the pool's K/V as PoolView names it (float16, bfloat16, uint8, int8)."""
    return _ELEMENT[conn.pool.geometry.dtype]


def _as(view: PoolView, framework: str) -> Any:
    if framework == "view":
        return view
    if framework == "torch":
        import torch

        return torch.from_dlpack(view)
    if framework == "numpy":
        import numpy

        if view.dtype == "bfloat16":
            raise TypeError("numpy has no bfloat16: use framework='torch'")
        return numpy.asarray(view)
    raise ValueError(f"framework {framework!r} is not one of torch, numpy, view")


def kv_cache_view(conn: Connection, layer: int, framework: Framework = "torch") -> Any:
    """Layer `layer` of the pool as one tensor ``[2, num_pages, tokens_per_page, kv_heads,
    head_dim]``: ``t[0, p, i, h, d]`` is K of token i of page p, head h, element d; ``t[1]`` is V.
    A latent pool's is ``[num_pages, tokens_per_page, head_dim]``: ``t[p, i, d]`` is element d of
    token i's vector. In a segmented layer_major pool (an elastic one) page p is block
    ``conn.pool.block_index(p)`` and the block dimension is ``block_index(num_pages - 1) + 1``
    long. Writing to it writes the pool. framework: "torch" (any pool), "numpy" (host pools),
    "view"."""
    pool = conn.pool
    g = pool.geometry
    if not 0 <= layer < g.layers:
        raise IndexError(f"layer {layer} of a pool with {g.layers} layers")
    dtype = element_dtype(conn)
    size = _SIZE[dtype]
    pages, tokens, heads, dim = pool.num_pages, g.tokens_per_page, g.kv_heads, g.head_dim
    # A plane's pages: a segment's in a segmented pool. Blocks run to the last page's.
    plane_pages = pool.segment_pages or pages
    if pool.layout == "layer_major" and pages > 0:
        pages = pool.block_index(pages - 1) + 1
    if g.kind == "latent":
        # One plane per layer, kv_heads 1: a page's tokens are dim apart in both layouts.
        shape = (pages, tokens, dim)
        if pool.layout == "layer_major":
            strides = (tokens * dim, dim, 1)
            offset = layer * pool.layer_stride
        else:
            strides = (pool.page_stride // size, dim, 1)
            offset = layer * tokens * dim * size
        return _as(conn.view(dtype, shape, strides, offset), framework)
    shape = (2, pages, tokens, heads, dim)
    if pool.layout == "layer_major":
        plane = plane_pages * tokens * heads * dim
        strides = (plane, tokens * heads * dim, heads * dim, dim, 1)
        offset = layer * pool.layer_stride
    else:
        tile = tokens * dim
        strides = (heads * tile, pool.page_stride // size, dim, tile, 1)
        offset = 2 * layer * heads * tile * size
    return _as(conn.view(dtype, shape, strides, offset), framework)


def kv_cache_views(conn: Connection, framework: Framework = "torch") -> list[Any]:
    """kv_cache_view() of every layer, in layer order."""
    return [kv_cache_view(conn, layer, framework) for layer in range(conn.pool.geometry.layers)]


def page_bytes(conn: Connection, page: int, framework: Framework = "numpy") -> Any:
    """The raw bytes of one page's K/V data (page_data_bytes of them), as uint8."""
    pool = conn.pool
    if not 0 <= page < pool.num_pages:
        raise IndexError(f"page {page} of a pool of {pool.num_pages} pages")
    if pool.layout == "layer_major":
        raise ValueError("a layer-major pool's page is not contiguous: use kv_cache_view()")
    n = pool.geometry.page_data_bytes
    return _as(conn.view("uint8", (n,), (1,), page * pool.page_stride), framework)


def kv_scales_view(conn: Connection, framework: Framework = "torch") -> Any:
    """An 8-bit pool's scales as one float32 tensor ``[num_pages, layers, kv_heads, planes]``
    (planes: 2, K then V; 1 for a latent pool): the element at [p, l, h, 0] scales K of page p,
    layer l, head h. A 16-bit pool has none (ValueError)."""
    pool = conn.pool
    g = pool.geometry
    if g.dtype not in ("fp8_e4m3", "int8"):
        raise ValueError(f"a {g.dtype} pool has no scales (only fp8_e4m3 and int8 pools do)")
    planes = 1 if g.kind == "latent" else 2
    shape = (pool.num_pages, g.layers, g.kv_heads, planes)
    strides = (g.layers * g.kv_heads * planes, g.kv_heads * planes, planes, 1)  # elements
    return _as(conn.view("float32", shape, strides, pool.scales_offset), framework)
