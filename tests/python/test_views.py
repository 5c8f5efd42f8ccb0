"""Zero-copy views of the pool's memory: numpy and torch see and change the pool's bytes."""

import numpy as np
import pytest
import torch

import kvpool


def test_layer_view_has_vllm_shape_and_addresses_the_page_layout(conn):
    g = conn.pool.geometry
    k_v = kvpool.kv_cache_view(conn, layer=1)
    assert tuple(k_v.shape) == (2, conn.pool.num_pages, g.tokens_per_page, g.kv_heads, g.head_dim)
    assert k_v.dtype == torch.float16
    [page] = conn.alloc(1)
    raw = kvpool.page_bytes(conn, page).view(np.float16)
    raw[:] = 0
    k_v[0, page, 3, 1, 5] = 1.5  # K, token 3, head 1, element 5
    k_v[1, page, 0, 0, 0] = -2.0  # V, token 0, head 0, element 0
    tile = g.tokens_per_page * g.head_dim
    k_at = (2 * 1 * g.kv_heads + 1) * tile + 3 * g.head_dim + 5  # page-major: [L][K|V][H][T][D]
    v_at = (2 * 1 * g.kv_heads + g.kv_heads + 0) * tile
    assert raw[k_at] == 1.5 and raw[v_at] == -2.0
    assert np.count_nonzero(raw) == 2
    conn.release([page])


def test_numpy_and_torch_views_share_memory(conn):
    views = kvpool.kv_cache_views(conn, framework="numpy")
    tensors = kvpool.kv_cache_views(conn)
    assert len(views) == conn.pool.geometry.layers
    [page] = conn.alloc(1)
    tensors[0][1, page].fill_(3.0)
    assert np.all(views[0][1, page] == 3.0)
    views[0][1, page] = 0
    assert float(tensors[0][1, page].abs().sum()) == 0.0
    conn.release([page])


def test_views_keep_the_memory_mapped_after_close(daemon):
    c = kvpool.attach(daemon.socket, worker="short")
    [page] = c.alloc(1)
    data = kvpool.page_bytes(c, page)
    tensor = kvpool.kv_cache_view(c, 0)
    c.close()
    data[:] = 7  # still mapped: the views hold the session
    assert int(tensor.view(torch.uint8).flatten()[0:1].numel()) == 1
    assert data[0] == 7
    del data, tensor
    probe = kvpool.attach(daemon.socket, worker="probe")
    assert probe.stats()["in_use"] == 0  # the last view went, so did the session
    probe.close()


def test_views_outside_the_mapping_are_refused(conn):
    end = conn.pool.mapped_bytes
    with pytest.raises(ValueError, match="past the mapping"):
        conn.view("uint8", (2,), (1,), end - 1)
    with pytest.raises(ValueError, match="past the mapping"):
        conn.view("float16", (2, 1 << 62), (1, 1 << 62))
    with pytest.raises(ValueError, match="negative"):
        conn.view("uint8", (2,), (-1,), 8)
    with pytest.raises(ValueError, match="dtype"):
        conn.view("float64", (1,), (1,))
    assert conn.view("uint8", (1,), (1,), end - 1).shape == (1,)


def test_dlpack_capsule_describes_a_cpu_tensor(conn):
    view = conn.view("float16", (4, 8), (8, 1), 0)
    assert view.__dlpack_device__() == (1, 0)
    t = torch.utils.dlpack.from_dlpack(view.__dlpack__())
    assert t.shape == (4, 8) and t.data_ptr() == view.data_ptr
    a = np.asarray(view)
    assert a.ctypes.data == view.data_ptr and a.strides == (16, 2)


def test_bfloat16_goes_through_dlpack_only(daemon):
    from conftest import pool_config
    from kvpool.local_daemon import LocalDaemon

    with LocalDaemon(pool_config(dtype="bf16", pages=4)) as d:
        c = kvpool.attach(d.socket)
        k_v = kvpool.kv_cache_view(c, 0)
        assert k_v.dtype == torch.bfloat16
        with pytest.raises(TypeError, match="bfloat16"):
            kvpool.kv_cache_view(c, 0, framework="numpy")
        c.close()


def test_layer_major_pool_gives_dense_per_layer_tensors():
    from conftest import pool_config
    from kvpool.local_daemon import LocalDaemon

    config = pool_config(pages=8).replace("    capacity: 8 pages\n",
                                          "    capacity: 8 pages\n    layout: layer_major\n")
    with LocalDaemon(config) as d:
        c = kvpool.attach(d.socket)
        g, pool = c.pool.geometry, c.pool
        assert pool.layout == "layer_major"
        plane = pool.num_pages * g.tokens_per_page * g.kv_heads * g.head_dim
        assert pool.layer_stride == 2 * plane * 2
        views = kvpool.kv_cache_views(c)
        assert all(v.is_contiguous() for v in views)
        assert views[1].data_ptr() - views[0].data_ptr() == pool.layer_stride
        whole = np.asarray(c.view("float16", (g.layers * 2 * plane,), (1,), 0))
        whole[:] = 0
        [page] = c.alloc(1)
        views[1][1, page, 2, 1, 3] = 4.0  # V of layer 1, token 2, head 1, element 3
        at = (1 * 2 * plane + plane + ((page * g.tokens_per_page + 2) * g.kv_heads + 1) * g.head_dim
              + 3)
        assert whole[at] == 4.0 and np.count_nonzero(whole) == 1
        with pytest.raises(ValueError, match="layer-major"):
            kvpool.page_bytes(c, page)
        c.release([page])
        c.close()


@pytest.mark.parametrize("layout", ["page_major", "layer_major"])
def test_latent_pool_view_is_flashmla_shaped(layout):
    """An MLA pool: [num_blocks, block_size, head_dim] per layer, one vector a token, no V."""
    from conftest import pool_config
    from kvpool.local_daemon import LocalDaemon

    config = pool_config(layers=3, kv_heads=1, head_dim=24, tokens_per_page=4, pages=8)
    config = config.replace("dtype: fp16}", "dtype: fp16, kind: latent}")
    config = config.replace("    capacity: 8 pages\n", f"    capacity: 8 pages\n    layout: {layout}\n")
    with LocalDaemon(config) as d:
        c = kvpool.attach(d.socket)
        g, pool = c.pool.geometry, c.pool
        assert (g.kind, pool.layout) == ("latent", layout)
        assert g.page_data_bytes == 3 * 4 * 24 * 2  # no V: one vector a token and layer
        views = kvpool.kv_cache_views(c)
        assert [tuple(v.shape) for v in views] == [(pool.num_pages, 4, 24)] * 3
        assert all(v.is_contiguous() for v in views) == (layout == "layer_major")
        data_bytes = (g.layers * pool.layer_stride if layout == "layer_major"
                      else pool.num_pages * pool.page_stride)
        whole = np.asarray(c.view("float16", (data_bytes // 2,), (1,), 0))
        whole[:] = 0
        [page] = c.alloc(1)
        views[2][page, 1, 5] = 3.0  # layer 2, token 1, element 5
        if layout == "layer_major":
            assert pool.layer_stride == 8 * 4 * 24 * 2
            at = 2 * 8 * 4 * 24 + (page * 4 + 1) * 24 + 5
        else:
            at = page * pool.page_stride // 2 + (2 * 4 + 1) * 24 + 5  # [L][T][D] in a page
        assert whole[at] == 3.0 and np.count_nonzero(whole) == 1
        c.release([page])
        c.close()


def test_elastic_layer_major_pool_is_viewed_by_block_index():
    """An elastic layer_major pool is segmented: kv_cache_view keeps vLLM's shape and block
    stride, and page p is block pool.block_index(p) of it (segments are whole blocks apart)."""
    from conftest import pool_config
    from kvpool.local_daemon import LocalDaemon

    # 3 layers x 2 heads x 12 x 4 tokens x fp16: 192-byte blocks, 1152-byte pages. Segments of
    # 12 KiB (whole 4 KiB granules and blocks) hold 10 pages and 4 blocks of slack.
    config = pool_config(layers=3, head_dim=12, pages=10, extra=(
        "    layout: layer_major\n    max_capacity: 30 pages\n    segment_size: 12KiB\n"
        "    grow_ahead: false\n"))
    with LocalDaemon(config) as d:
        c = kvpool.attach(d.socket)
        pool = c.pool
        assert (pool.segment_pages, pool.segment_stride) == (10, 12288)
        pages = c.alloc(15)  # the pool grows one segment
        assert c.pool.num_pages == 20
        pool = c.pool
        block_elems = 4 * 2 * 12
        assert pool.layer_stride == 2 * 10 * block_elems * 2
        # A segment is 64 blocks: 3 layers x K, V x 10 pages, and 4 of slack.
        assert [pool.block_index(p) for p in (0, 9, 10, 19)] == [0, 9, 64, 73]
        views = kvpool.kv_cache_views(c)
        assert tuple(views[0].shape) == (2, 74, 4, 2, 12)
        whole = np.asarray(c.view("float16", (2 * 12288 // 2,), (1,), 0))
        whole[:] = 0
        page = max(pages)  # in the second segment
        assert page >= 10
        views[2][1, pool.block_index(page), 3, 1, 5] = 7.0  # V of layer 2, token 3, head 1
        plane = 10 * block_elems
        at = (page // 10) * 12288 // 2 + (2 * 2 + 1) * plane + (page % 10) * block_elems + \
            (3 * 2 + 1) * 12 + 5
        assert whole[at] == 7.0 and np.count_nonzero(whole) == 1
        c.release(pages)
        # A sequence long enough to reach the second segment: its kv_block_table is what an
        # engine indexes the views with.
        hasher = kvpool.BlockHasher()
        seq = kvpool.SequenceCache(c, hasher, hasher.root("m", c.pool.geometry))
        assert seq.begin(list(range(4 * 15))) == 0
        table = seq.block_table
        assert max(table) >= 10
        assert seq.kv_block_table == [c.pool.block_index(p) for p in table]
        seq.release()
        c.close()
