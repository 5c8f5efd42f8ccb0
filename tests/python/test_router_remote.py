"""kvpool.router.KvRouter with the remote tier: two kvpoold "nodes" share a Redis Cluster
(scripts/redis-cluster.sh, 3 masters and 3 replicas on loopback). A prompt served on node A is
written to the cluster; A's KV events say so with medium REMOTE, and the router then counts
those blocks for B too (B fetches them on a miss) while preferring A, which holds them itself.
After their ttl_s the events remove them, and B is back to nothing.
"""
import os
import shutil
import subprocess
import tempfile
import time

import pytest

import kvpool
from kvpool.local_daemon import LocalDaemon
from kvpool.router import REMOTE, KvRouter

TPP = 4
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "redis-cluster.sh")

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed (scripts/install-deps.sh)")


@pytest.fixture
def cluster():
    # Ports apart from the C++ tests' (10000-15999, their buses 20000-25999).
    port = 16200 + (os.getpid() % 300) * 6
    work = tempfile.mkdtemp(prefix="kvpool-router-redis.")
    started = subprocess.run(["bash", SCRIPT, "start", work + "/c", str(port)],
                             capture_output=True, text=True)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield port
    finally:
        subprocess.run(["bash", SCRIPT, "stop", work + "/c"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def node_config(tmp_path, name, port):
    return f"""backend: fake-device
pools:
  - name: default
    geometry: {{layers: 2, kv_heads: 2, head_dim: 8, tokens_per_page: {TPP}, dtype: fp16}}
    capacity: 64 pages
    remote_tier: {{cluster: ["127.0.0.1:{port}"], namespace: router, ttl_s: 3}}
events:
  zmq_endpoint: "ipc://{tmp_path}/{name}-events"
"""


def wait_for(router, predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        router.drain()
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_the_fleets_remote_blocks_count_for_every_node(tmp_path, cluster):
    with LocalDaemon(node_config(tmp_path, "a", cluster)) as a, \
            LocalDaemon(node_config(tmp_path, "b", cluster)) as b:
        router = KvRouter({"a": f"ipc://{tmp_path}/a-events", "b": f"ipc://{tmp_path}/b-events"})
        try:
            conn = kvpool.attach(a.socket, worker="router-remote")
            hasher = kvpool.BlockHasher()
            root = hasher.root("router-remote", conn.pool.geometry)
            # Wait out ZeroMQ's slow joiner: serve a block of its own until A's batches arrive,
            # so that the router hears the prompt's device blocks, not only their later writes.
            for attempt in range(50):
                with kvpool.SequenceCache(conn, hasher, root) as seq:
                    seq.begin([10**6 + attempt] * TPP)
                    seq.publish_full()
                router.poll(200)
                if router.nodes["a"].batches:
                    break
            prompt = list(range(1000, 1000 + 6 * TPP))
            with kvpool.SequenceCache(conn, hasher, root) as seq:
                seq.begin(prompt)
                seq.publish_full()
            chain = [bytes(h) for h in hasher.chain(root, prompt, TPP)]
            assert wait_for(router, lambda: set(chain) <= router.cached("a", medium=REMOTE))
            assert router.cached("b", medium=REMOTE) == set()
            prefixes = router.longest_prefix(chain)
            assert prefixes["a"].local == 6 and prefixes["a"].blocks == 6
            assert prefixes["b"].local == 0 and prefixes["b"].blocks == 6
            assert prefixes["b"].by_medium[REMOTE] == 6
            assert router.route(chain) == "a"
            assert router.route(chain, candidates=["b", "a"]) == "a"
            # Past ttl_s the values are gone: A's next write (any block) brings the removals.
            time.sleep(3.2)
            with kvpool.SequenceCache(conn, hasher, root) as seq:
                seq.begin(list(range(5000, 5000 + TPP)))
                seq.publish_full()
            assert wait_for(router, lambda: not set(chain) & router.cached("a", medium=REMOTE))
            assert router.longest_prefix(chain)["b"].blocks == 0
            conn.close()
        finally:
            router.close()
