"""kvpool.router.KvRouter against real daemons: two kvpoold "nodes" (fake-device pools, so the
pool's medium is GPU and its host tier's CPU) serve a workload of prompts with shared prefixes
through small pools, so blocks are evicted, demoted, promoted and dropped; an operator evicts
and flushes; one node restarts; the router loses one node's connection and catches up by
replay. After every step the router's view of each node equals the node's own index: its GPU
blocks are exactly the blocks `kvpoolctl prefixes` lists, its CPU blocks as many as the host
tier holds and disjoint from them.
"""

import grp
import json
import os
import random
import subprocess
import time

import pytest

import kvpool
from kvpool.local_daemon import LocalDaemon
from kvpool.router import Endpoints, KvRouter

TPP = 4


def node_config(tmp_path, name):
    return f"""backend: fake-device
admin_group: {grp.getgrgid(os.getgid()).gr_name}
pools:
  - name: default
    geometry: {{layers: 2, kv_heads: 2, head_dim: 8, tokens_per_page: {TPP}, dtype: fp16}}
    capacity: 24 pages
    host_tier: 16 pages
events:
  zmq_endpoint: "ipc://{tmp_path}/{name}-events"
  zmq_replay_endpoint: "ipc://{tmp_path}/{name}-replay"
"""


def indexed_on_gpu(daemon):
    """The node's device-tier index, as kvpoolctl lists it."""
    out = subprocess.run([os.environ["KVPOOLCTL_BIN"], "--socket", daemon.socket, "--json",
                          "prefixes", "--limit", "10000"], check=True, capture_output=True,
                         text=True).stdout
    listed = json.loads(out)
    assert listed["indexed"] == len(listed["prefixes"])
    return {bytes.fromhex(p["hash"]) for p in listed["prefixes"]}


class Node:
    def __init__(self, tmp_path, name):
        self.config = node_config(tmp_path, name)
        self.endpoints = Endpoints(f"ipc://{tmp_path}/{name}-events",
                                   f"ipc://{tmp_path}/{name}-replay")
        self.start()

    def start(self):
        self.daemon = LocalDaemon(self.config).start()
        self.conn = kvpool.attach(self.daemon.socket, worker="router-test")
        self.hasher = kvpool.BlockHasher()
        self.root = self.hasher.root("router-test", self.conn.pool.geometry)

    def restart(self):
        self.conn.close()
        self.daemon.close()
        self.start()

    def serve(self, prompt):
        """A request: look the prompt up, compute the rest, publish it, let it go."""
        with kvpool.SequenceCache(self.conn, self.hasher, self.root) as seq:
            seq.begin(prompt)
            seq.publish_full()

    def close(self):
        self.conn.close()
        self.daemon.close()


def views(router, nodes):
    """(router's GPU, node's GPU, router's CPU count, node's host-tier count) per node."""
    out = {}
    for name, node in nodes.items():
        cpu = router.cached(name, medium="CPU")
        out[name] = (router.cached(name, medium="GPU"), indexed_on_gpu(node.daemon), cpu,
                     node.conn.stats()["host_held"])
    return out


def check_agreement(router, nodes, step):
    # A demotion or promotion may finish on the daemon's copy thread a moment after the reply:
    # look again for a while before calling a difference a disagreement.
    for _ in range(20):
        router.drain()
        seen = views(router, nodes)
        if all(r_gpu == n_gpu and len(r_cpu) == n_cpu for r_gpu, n_gpu, r_cpu, n_cpu in
               seen.values()):
            break
        time.sleep(0.1)
    for name, (r_gpu, n_gpu, r_cpu, n_cpu) in seen.items():
        assert r_gpu == n_gpu, f"step {step}: node {name} GPU"
        assert len(r_cpu) == n_cpu, f"step {step}: node {name} CPU"
        assert not r_cpu & r_gpu, f"step {step}: node {name}: a block in both tiers"


def test_the_router_view_equals_every_node_index_through_moves_restarts_and_lost_batches(tmp_path):
    nodes = {name: Node(tmp_path, name) for name in ("a", "b")}
    router = KvRouter({name: n.endpoints for name, n in nodes.items()})
    try:
        rng = random.Random(7)
        # Prompts of 2..8 blocks over 6 shared system prompts: hits, misses, evictions.
        systems = [[1000 * s + t for t in range(3 * TPP)] for s in range(6)]
        # Wait out ZeroMQ's slow joiner: serve new blocks until both nodes' batches arrive (the
        # router replays what it missed from each node's start).
        for attempt in range(50):
            for n in nodes.values():
                n.serve([10**6 + attempt] * TPP)
            router.poll(200)
            if all(router.nodes[name].batches for name in nodes):
                break
        check_agreement(router, nodes, "join")
        moved = {"demoted": 0, "promoted": 0}
        for step in range(60):
            name = rng.choice(list(nodes))
            node = nodes[name]
            if step == 20:
                assert node.conn.evict(4) >= 1  # the operator's evict: blocks go down
            elif step == 30:
                node.conn.flush()  # both tiers: one AllBlocksCleared
            elif step == 40:
                nodes["b"].restart()  # a new daemon: the router forgets the old one's blocks
            elif step == 45:
                router.disconnect("a")  # what a publishes now is lost, then replayed
                for _ in range(3):
                    nodes["a"].serve(systems[rng.randrange(6)] + [rng.randrange(99)] * TPP)
                router.connect("a")
                before = router.nodes["a"].batches
                for _ in range(50):  # until the new connection carries a batch
                    nodes["a"].serve(systems[rng.randrange(6)] + [rng.randrange(99)] * TPP)
                    router.poll(100)
                    if router.nodes["a"].batches > before:
                        break
            else:
                prompt = systems[rng.randrange(6)] + [rng.randrange(10**6)
                                                      for _ in range(rng.randrange(4) * TPP)]
                node.serve(prompt)
            check_agreement(router, nodes, step)
            stats = node.conn.stats()
            moved["demoted"] = max(moved["demoted"], stats["host_demoted"])
            moved["promoted"] = max(moved["promoted"], stats["host_promoted"])
        # The workload did what the test is about.
        assert moved["demoted"] > 0 and moved["promoted"] > 0, moved
        assert router.nodes["b"].restarts >= 1
        assert router.nodes["a"].replayed >= 1 and router.nodes["a"].resyncs == 0
        # A query: the node that served a prompt holds its prefix, the other not (unless it
        # served the same system prompt).
        prompt = systems[5] + [424242] * TPP
        nodes["a"].serve(prompt)
        router.drain()
        chain = [bytes(h) for h in nodes["a"].hasher.chain(nodes["a"].root, prompt, TPP)]
        prefixes = router.longest_prefix(chain)
        assert prefixes["a"].blocks == len(chain)
        assert prefixes["a"].by_medium.get("GPU") == len(chain)
        assert router.route(chain) == "a"
    finally:
        router.close()
        for n in nodes.values():
            n.close()


def test_a_gap_the_node_cannot_replay_makes_the_router_forget_it(tmp_path):
    config = node_config(tmp_path, "solo").replace(
        "  zmq_replay_endpoint", "  zmq_replay_batches: 1\n  zmq_replay_endpoint")
    with LocalDaemon(config) as daemon:
        endpoints = Endpoints(f"ipc://{tmp_path}/solo-events", f"ipc://{tmp_path}/solo-replay")
        conn = kvpool.attach(daemon.socket, worker="router-test")
        hasher = kvpool.BlockHasher()
        root = hasher.root("router-test", conn.pool.geometry)

        def serve(tokens):
            with kvpool.SequenceCache(conn, hasher, root) as seq:
                seq.begin(tokens)
                seq.publish_full()

        with KvRouter({"solo": endpoints}) as router:
            for i in range(50):
                serve([i] * TPP)
                if router.poll(200):
                    break
            router.drain()
            assert router.cached("solo")
            # Joining past what one buffered batch can replay already counted a resync.
            joined = router.nodes["solo"].resyncs
            router.disconnect("solo")
            for i in range(5):  # five batches lost; the node keeps one for replay
                serve([100 + i] * TPP)
            router.connect("solo")
            for i in range(50):
                serve([200 + i] * TPP)
                if router.poll(200):
                    break
            router.drain()
            assert router.nodes["solo"].resyncs == joined + 1
            # It under-reports (forgot what came before), never over-reports.
            assert router.cached("solo", medium="GPU") <= indexed_on_gpu(daemon)
        conn.close()


def test_a_restart_unseen_while_disconnected_is_caught_by_the_replay(tmp_path):
    # The node restarts while the router is away and publishes past the number the router last
    # saw: the gap's replay gives back another batch at that number, so the router starts the
    # node over from its batch 0 instead of keeping the old daemon's blocks.
    node = Node(tmp_path, "phoenix")
    router = KvRouter({"phoenix": node.endpoints})
    try:
        for attempt in range(50):
            node.serve([2 * 10**6 + attempt] * TPP)
            if router.poll(200):
                break
        for i in range(3):
            node.serve([3 * 10**6 + i] * TPP)
        router.drain()
        seen = router.nodes["phoenix"].last_seq
        assert router.cached("phoenix", medium="GPU") == indexed_on_gpu(node.daemon)
        router.disconnect("phoenix")
        node.restart()
        for i in range(seen + 5):
            node.serve([4 * 10**6 + i] * TPP)
        router.connect("phoenix")
        for attempt in range(50):
            node.serve([5 * 10**6 + attempt] * TPP)
            if router.poll(200):
                break
        router.drain()
        assert router.nodes["phoenix"].restarts == 1
        assert router.cached("phoenix", medium="GPU") == indexed_on_gpu(node.daemon)
    finally:
        router.close()
        node.close()


def test_replayed_batches_of_a_node_with_two_pools_go_under_their_own_pool(tmp_path):
    # One sequence of batches for both pools; the replay socket gives each batch's topic, so a
    # late join and a gap are filled pool by pool (vLLM's topic-less replay could not place them).
    config = f"""backend: fake-device
admin_group: {grp.getgrgid(os.getgid()).gr_name}
pools:
  - name: chat
    geometry: {{layers: 2, kv_heads: 2, head_dim: 8, tokens_per_page: {TPP}, dtype: fp16}}
    capacity: 24 pages
  - name: code
    geometry: {{layers: 2, kv_heads: 2, head_dim: 8, tokens_per_page: {TPP}, dtype: fp16}}
    capacity: 24 pages
events:
  zmq_endpoint: "ipc://{tmp_path}/two-events"
  zmq_replay_endpoint: "ipc://{tmp_path}/two-replay"
"""

    def indexed(daemon, pool):
        out = subprocess.run([os.environ["KVPOOLCTL_BIN"], "--socket", daemon.socket, "--pool",
                              pool, "--json", "prefixes", "--limit", "10000"], check=True,
                             capture_output=True, text=True).stdout
        return {bytes.fromhex(p["hash"]) for p in json.loads(out)["prefixes"]}

    with LocalDaemon(config) as daemon:
        conns = {p: kvpool.attach(daemon.socket, worker="router-test", pool=p)
                 for p in ("chat", "code")}
        hasher = kvpool.BlockHasher()

        def serve(pool, tokens):
            conn = conns[pool]
            root = hasher.root(pool, conn.pool.geometry)
            with kvpool.SequenceCache(conn, hasher, root) as seq:
                seq.begin(tokens)
                seq.publish_full()

        def agree():
            router.drain()
            for pool in ("chat", "code"):
                assert router.cached("two", pool) == indexed(daemon, pool), pool

        for i in range(4):  # batches of both pools before the router joins
            serve("chat", [i] * 2 * TPP)
            serve("code", [50 + i] * 2 * TPP)
        endpoints = Endpoints(f"ipc://{tmp_path}/two-events", f"ipc://{tmp_path}/two-replay")
        with KvRouter({"two": endpoints}) as router:
            for i in range(50):  # the join: the first batch heard brings batches 0.. by replay
                serve("code", [100 + i] * TPP)
                if router.poll(200):
                    break
            agree()
            assert router.nodes["two"].replayed >= 8 and router.nodes["two"].resyncs == 0
            router.disconnect("two")  # a gap holding batches of both pools
            for i in range(3):
                serve("chat", [200 + i] * 3 * TPP)
                serve("code", [300 + i] * TPP)
            router.connect("two")
            replayed = router.nodes["two"].replayed
            for i in range(50):
                serve("chat", [400 + i] * TPP)
                if router.poll(200):
                    break
            agree()
            assert router.nodes["two"].replayed >= replayed + 6
            assert router.nodes["two"].resyncs == 0 and router.nodes["two"].restarts == 0
        for conn in conns.values():
            conn.close()


def test_a_node_that_replays_as_vllm_does_is_asked_vllms_way(tmp_path):
    # A vLLM-style node: a PUB socket and a replay ROUTER that answers three-frame requests only
    # (vLLM's publisher ignores any other form). The router's first replay asks for topics, hears
    # nothing, and asks vLLM's way; the node's batches from 0 are all applied.
    import threading

    import msgpack
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"ipc://{tmp_path}/v-events")
    batches = []
    lock = threading.Lock()
    stop = threading.Event()

    def serve_replay():
        replay = ctx.socket(zmq.ROUTER)
        replay.bind(f"ipc://{tmp_path}/v-replay")
        while not stop.is_set():
            if not replay.poll(20):
                continue
            frames = replay.recv_multipart()
            if len(frames) != 3:
                continue
            start = int.from_bytes(frames[2], "big")
            with lock:
                kept = list(batches)
            for seq, payload in kept:
                if seq >= start:
                    replay.send_multipart([frames[0], b"", seq.to_bytes(8, "big"), payload])
            replay.send_multipart([frames[0], b"", ((1 << 64) - 1).to_bytes(8, "big"), b""])
        replay.close(linger=0)

    def publish(block):
        payload = msgpack.packb([time.time(), [["BlockStored", [block], None, [], 16, None, "GPU",
                                                None]], 0])
        with lock:
            seq = len(batches)
            batches.append((seq, payload))
        pub.send_multipart([b"default", seq.to_bytes(8, "big"), payload])

    server = threading.Thread(target=serve_replay)
    server.start()
    try:
        for block in range(5):  # before the router listens: only a replay brings them
            publish(1000 + block)
        endpoints = Endpoints(f"ipc://{tmp_path}/v-events", f"ipc://{tmp_path}/v-replay")
        with KvRouter({"v": endpoints}, context=ctx, replay_timeout_ms=300) as router:
            for block in range(5, 60):
                publish(1000 + block)
                if router.poll(100):
                    break
            router.drain()
            node = router.nodes["v"]
            assert node.replay_topics is False and node.resyncs == 0
            assert router.cached("v", medium="GPU") == {1000 + b for b, _ in enumerate(batches)}
    finally:
        stop.set()
        server.join()
        pub.close(linger=0)
        ctx.term()
