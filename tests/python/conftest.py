"""Fixtures for the Python tests: a real kvpoold per test module (kvpool.local_daemon).

ctest sets PYTHONPATH to the build tree's python/ folder, KVPOOLD_BIN to the daemon it built and
KVPOOL_LIB to its libkvpool.so.
"""

import grp
import os

import pytest

from kvpool.local_daemon import LocalDaemon


def pool_config(layers=2, kv_heads=2, head_dim=8, tokens_per_page=4, dtype="fp16", pages=32,
                extra=""):
    # admin_group: this user's group, so the tests may evict and flush without being root.
    return f"""backend: host
admin_group: {grp.getgrgid(os.getgid()).gr_name}
pools:
  - name: default
    geometry: {{layers: {layers}, kv_heads: {kv_heads}, head_dim: {head_dim}, tokens_per_page: {tokens_per_page}, dtype: {dtype}}}
    capacity: {pages} pages
{extra}"""


@pytest.fixture(scope="module")
def daemon():
    with LocalDaemon(pool_config()) as d:
        yield d


@pytest.fixture()
def conn(daemon):
    c = __import__("kvpool").attach(daemon.socket, worker="pytest")
    yield c
    c.close()
