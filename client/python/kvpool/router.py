"""KvRouter: a KV-aware router's view of several kvpoold instances, built from their KV events.

Each node is one kvpoold publishing its index changes on ZeroMQ in vLLM's format (README, "KV
events for routers"). The router subscribes to every node and keeps, per node, per pool (the
topic) and per medium ("GPU" for a device pool, "CPU" for its host tier or a host-backend pool),
the set of block hashes cached there. It answers, for a block chain, the longest prefix each
node holds (all of it in one medium or spread over both) and which node to send the request to.

The remote tier's medium ("REMOTE": what a node wrote to the Redis Cluster its fleet shares) is
the fleet's, not the writer's: any node that names the cluster fetches it on a miss. The router
keeps each node's REMOTE blocks as it heard them, but counts the union of every node's for every
node in longest_prefix (a node's local run, then the fleet's remote blocks, continue a chain),
and route() prefers, among nodes that reach as far, the one holding more of it locally.

Keeping the view exact:
  * Batches are applied in sequence order. A batch whose sequence number skips ahead (messages
    lost to a slow subscriber, a reconnect, ZeroMQ's slow joiner) is a gap: the router asks the
    node's replay socket for the batches from the last one it applied on, checks that the node
    gives that one back unchanged (else the node restarted and published past the router's
    number meanwhile: see below), and applies the missing ones. When the node cannot replay
    them (no replay endpoint, or they left its buffer), the router forgets what it holds of
    that node (it under-reports hits until the node publishes again) and counts a resync.
  * The first batch heard of a node, and the first after a restart (a sequence number that went
    back, or a replay that contradicts what was applied), bring the node's batches from 0, its
    start (an AllBlocksCleared per pool), by replay; if they cannot be had, the view starts
    from that batch and a resync is counted.
  * AllBlocksCleared empties one pool of one node, in every medium; a batch the router cannot
    read makes it forget the node (ValueError, naming it).
  * Replayed batches go under their own pool: kvpoold's replay socket gives each batch's topic
    when asked (a fourth request frame "topic"). vLLM's replay socket ignores such a request and
    its replies carry no topic: a node that does not answer the first such request (within
    replay_timeout_ms) but answers vLLM's form is asked vLLM's way from then on (until it
    restarts; Endpoints.replay_topics False says so from the start), and its replayed batches
    are placed only on a node of one pool: one whose Endpoints list a single pool, or, when they
    list none, one whose events have only ever named one; a node with several pools is
    forgotten on a gap instead. A node that answers neither costs two timeouts and a resync.
  So the router never claims a block a node does not hold.

Block hashes are kept as sent: 16-byte ``bytes`` (events.zmq_block_hash: bytes, the default) or
``int`` (uint64); pass chains in the same form (``bytes(h)`` of a kvpool BlockHash, or its low
word). Both payload layouts (array, map) are read.

Thread-safety: none; one thread polls and asks. Errors: a malformed payload raises ValueError
naming the node; ZeroMQ errors propagate.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence, Union

import msgpack
import zmq

BlockKey = Union[bytes, int]
_END = (1 << 64) - 1  # the replay socket's end marker, -1 as 8 bytes
_NO_ANSWER = object()  # a replay request nothing answered


@dataclass
class Endpoints:
    """Where a node publishes (events.zmq_endpoint) and answers replays (zmq_replay_endpoint).
    replay_topics: whether the replay socket gives each batch's topic (kvpoold does; None: ask
    and see); False for a vLLM engine, whose replayed batches the router then places only on a
    node of one pool, named in `pools` when the node has several."""
    events: str
    replay: Optional[str] = None
    pools: Optional[Sequence[str]] = None
    replay_topics: Optional[bool] = None


@dataclass
class NodeState:
    """What the router holds of one node."""
    name: str
    endpoints: Endpoints
    # pool (topic without the router's prefix) -> medium -> block hashes
    pools: dict[str, dict[str, set[BlockKey]]] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)  # every pool heard of, never forgotten
    last_seq: Optional[int] = None
    last_digest: bytes = b""  # of the last batch applied: a replay from it must give it back
    replay_topics: Optional[bool] = None  # what its replay socket answers (Endpoints'; learned)
    batches: int = 0
    replayed: int = 0
    resyncs: int = 0
    restarts: int = 0

    def forget(self) -> None:
        self.pools.clear()


REMOTE = "REMOTE"  # the remote tier's medium: the fleet's blocks (module doc)


@dataclass
class Prefix:
    """The longest prefix of a chain one node can serve: in any medium (the fleet's REMOTE blocks
    included), in each medium alone (REMOTE: the fleet's), and in its own media only."""
    blocks: int
    by_medium: dict[str, int]
    local: int = 0


class KvRouter:
    """Subscribes to each node's KV events and answers longest-prefix queries (module doc)."""

    def __init__(self, nodes: Mapping[str, Union[str, Endpoints]], topic: str = "",
                 replay_timeout_ms: int = 2000, context: Optional[zmq.Context] = None) -> None:
        self._ctx = context or zmq.Context()
        self._own_ctx = context is None
        self._topic = topic
        self._replay_timeout_ms = replay_timeout_ms
        self.nodes: dict[str, NodeState] = {}
        self._subs: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()
        try:
            for name, where in nodes.items():
                endpoints = where if isinstance(where, Endpoints) else Endpoints(where)
                self.nodes[name] = NodeState(name, endpoints,
                                             replay_topics=endpoints.replay_topics)
                self._subscribe(name)
        except Exception:
            self.close()
            raise

    # -- subscription --------------------------------------------------------------------------

    def _subscribe(self, name: str) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt_string(zmq.SUBSCRIBE, self._topic)
        sub.connect(self.nodes[name].endpoints.events)
        self._subs[name] = sub
        self._poller.register(sub, zmq.POLLIN)

    def disconnect(self, name: str) -> None:
        """Stops listening to a node (what a network fault does): what it publishes meanwhile is
        lost to the router until connect(); the next batch's gap then brings it back by replay."""
        sub = self._subs.pop(name)
        self._poller.unregister(sub)
        sub.close(linger=0)

    def connect(self, name: str) -> None:
        """Listens to a node again after disconnect()."""
        if name not in self._subs:
            self._subscribe(name)

    def close(self) -> None:
        for sub in self._subs.values():
            sub.close(linger=0)
        self._subs.clear()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> "KvRouter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- events --------------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_batches: int = 10000) -> int:
        """Applies the batches that arrive within timeout_ms and what is queued behind them, at
        most max_batches; returns how many were applied. A malformed batch makes the router
        forget its node and raises ValueError naming the node (the batches after it are
        applied by the next poll)."""
        applied = 0
        ready = dict(self._poller.poll(timeout_ms))
        while ready and applied < max_batches:
            for name, sub in list(self._subs.items()):
                while sub in ready and applied < max_batches:
                    try:
                        frames = sub.recv_multipart(zmq.DONTWAIT)
                    except zmq.Again:
                        break
                    applied += self._receive(name, frames)
            ready = dict(self._poller.poll(0))
        return applied

    def drain(self, quiet_ms: int = 200, limit_s: float = 10.0) -> int:
        """Polls until no batch arrived for quiet_ms (at most limit_s); returns batches applied."""
        applied = 0
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            n = self.poll(quiet_ms, max_batches=1000)
            applied += n
            if n == 0:
                break
        return applied

    def _receive(self, name: str, frames: list[bytes]) -> int:
        node = self.nodes[name]
        if len(frames) != 3 or len(frames[1]) != 8:
            raise ValueError(f"node {name}: a KV event message of {len(frames)} frames")
        seq = int.from_bytes(frames[1], "big")
        try:
            self._receive_batch(node, frames[0].decode(), seq, frames[2])
        except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException) as e:
            # A batch the router cannot read: what it held of the node is no longer known.
            node.resyncs += 1
            node.forget()
            node.last_seq, node.last_digest = seq, b""
            raise ValueError(f"node {name}: KV event batch {seq}: {e}") from e
        return 1

    def _receive_batch(self, node: NodeState, topic: str, seq: int, payload: bytes) -> None:
        pool = self._pool_of(topic)
        if node.last_seq is not None and seq <= node.last_seq:
            # The sequence went back: a new daemon behind the endpoint, its pools empty (and
            # perhaps another build: what its replay socket answers is learned again).
            node.restarts += 1
            node.last_seq = None
            node.replay_topics = node.endpoints.replay_topics
        elif node.last_seq is not None and seq > node.last_seq + 1:
            # A gap. The replay starts at the last batch applied: if the node gives back another
            # one there, it restarted (and published past our number meanwhile).
            got = self._replay(node, pool, node.last_seq, seq)
            if got is None:
                node.resyncs += 1
                node.forget()
            elif _digest(got[0][1]) != node.last_digest:
                node.restarts += 1
                node.last_seq = None
                node.replay_topics = node.endpoints.replay_topics
            else:
                self._apply_replayed(node, got[1:])
        if node.last_seq is None:
            # First heard of, or restarted: what the node published since it started (batch 0,
            # its AllBlocksCleared, on) comes from its replay socket, or the view stays partial.
            node.forget()
            got = self._replay(node, pool, 0, seq) if seq > 0 else []
            if got is None:
                node.resyncs += 1
            else:
                self._apply_replayed(node, got)
        self._apply(node, topic, payload)
        node.last_seq = seq

    def _apply_replayed(self, node: NodeState, got: list[tuple[str, bytes]]) -> None:
        """Applies replayed batches; those of topics the subscription leaves out are skipped
        (not counted), as the events socket would have."""
        for topic, payload in got:
            if topic.startswith(self._topic):
                self._apply(node, topic, payload)
                node.replayed += 1

    def _placeable(self, node: NodeState, pool: str) -> bool:
        """Whether replayed batches (no topic) of `node` belong to `pool`: the node has one."""
        declared = node.endpoints.pools
        if declared is not None:
            return list(declared) == [pool]
        return node.topics <= {pool}

    def _replay(self, node: NodeState, pool: str, first: int,
                upto: int) -> Optional[list[tuple[str, bytes]]]:
        """(topic, payload) of batches [first, upto) from the node's replay socket, or None when
        they cannot all be had, or placed (module doc)."""
        if node.endpoints.replay is None:
            return None
        if node.replay_topics is None:  # not known yet: ask kvpoold's way, then vLLM's
            got = self._ask_replay(node, pool, first, upto, topics=True)
            if got is not _NO_ANSWER:
                node.replay_topics = True
                return got
            if not self._placeable(node, pool):
                return None  # still unknown; a node of several pools is not asked vLLM's way
            got = self._ask_replay(node, pool, first, upto, topics=False)
            if got is _NO_ANSWER:
                return None  # nobody answers at all (down, unreachable): still unknown
            node.replay_topics = False  # it answers vLLM's form only
            return got
        if not node.replay_topics and not self._placeable(node, pool):
            return None
        got = self._ask_replay(node, pool, first, upto, topics=node.replay_topics)
        return None if got is _NO_ANSWER else got

    def _ask_replay(self, node: NodeState, pool: str, first: int, upto: int, topics: bool):
        """One replay request: the batches, None when they cannot all be had, or _NO_ANSWER
        when nothing came back at all (a socket that ignores the request's form). Without the
        node's topics, every batch is taken for `pool`'s."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVTIMEO, self._replay_timeout_ms)
        try:
            dealer.connect(node.endpoints.replay)
            request = [b"", first.to_bytes(8, "big")] + ([b"topic"] if topics else [])
            dealer.send_multipart(request)
            got: list[tuple[str, bytes]] = []
            answered = False
            while True:
                try:
                    frames = dealer.recv_multipart()
                except zmq.Again:
                    return None if answered else _NO_ANSWER
                answered = True
                if len(frames) != (4 if topics else 3) or len(frames[1]) != 8:
                    return None
                seq = int.from_bytes(frames[1], "big")
                if seq == _END:
                    break
                if seq >= upto:
                    continue
                if seq != first + len(got):
                    return None  # the buffer no longer starts where the router needs it
                topic = frames[3].decode() if topics else self._topic + pool
                got.append((topic, frames[2]))
            return got if len(got) == upto - first else None
        finally:
            dealer.close(linger=0)

    def _pool_of(self, topic: str) -> str:
        return topic[len(self._topic):] if topic.startswith(self._topic) else topic

    def _apply(self, node: NodeState, topic: str, payload: bytes) -> None:
        pool = self._pool_of(topic)
        node.topics.add(pool)
        node.last_digest = _digest(payload)
        batch = msgpack.unpackb(payload, raw=False)
        events = batch["events"] if isinstance(batch, dict) else batch[1]
        node.batches += 1
        for e in events:
            kind, fields = _event_fields(e)
            if kind == "AllBlocksCleared":
                node.pools.pop(pool, None)
                continue
            if kind not in ("BlockStored", "BlockRemoved"):
                raise ValueError(f"node {node.name}: unknown KV event {kind!r}")
            medium = fields.get("medium") or "GPU"
            blocks = node.pools.setdefault(pool, {}).setdefault(medium, set())
            if kind == "BlockStored":
                blocks.update(fields["block_hashes"])
            else:
                blocks.difference_update(fields["block_hashes"])

    # -- queries -------------------------------------------------------------------------------

    def cached(self, node: str, pool: str = "default",
               medium: Optional[str] = None) -> set[BlockKey]:
        """The blocks the router believes `node` holds in `pool` (one medium, or all)."""
        media = self.nodes[node].pools.get(pool, {})
        if medium is not None:
            return set(media.get(medium, ()))
        out: set[BlockKey] = set()
        for blocks in media.values():
            out |= blocks
        return out

    def longest_prefix(self, chain: Sequence[BlockKey], pool: str = "default") -> dict[str, Prefix]:
        """Per node, how many leading blocks of `chain` it can serve (module doc: REMOTE)."""
        fleet: set[BlockKey] = set()
        for node in self.nodes.values():
            fleet |= node.pools.get(pool, {}).get(REMOTE, set())
        out = {}
        for name, node in self.nodes.items():
            media = {m: b for m, b in node.pools.get(pool, {}).items() if m != REMOTE}
            by_medium = {m: _leading(chain, lambda h, b=b: h in b) for m, b in media.items()}
            if fleet:
                by_medium[REMOTE] = _leading(chain, lambda h: h in fleet)
            local = _leading(chain, lambda h: any(h in b for b in media.values()))
            any_medium = _leading(chain, lambda h: h in fleet or any(h in b for b in media.values()))
            out[name] = Prefix(any_medium, by_medium, local)
        return out

    def route(self, chain: Sequence[BlockKey], pool: str = "default",
              candidates: Optional[Iterable[str]] = None) -> str:
        """The node that can serve the longest prefix of `chain`, then the one holding more of it
        itself (ties: the first candidate)."""
        names = list(candidates) if candidates is not None else list(self.nodes)
        prefixes = self.longest_prefix(chain, pool)
        return max(names, key=lambda n: (prefixes[n].blocks, prefixes[n].local))


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def _leading(chain: Sequence[BlockKey], held) -> int:
    n = 0
    for h in chain:
        if not held(h):
            break
        n += 1
    return n


_FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx"],
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}


def _event_fields(e) -> tuple[str, dict]:
    """(tag, fields) of an event in either layout."""
    if isinstance(e, dict):
        return e["type"], e
    tag = e[0]
    names = _FIELDS.get(tag)
    if names is None:
        return tag, {}
    return tag, dict(zip(names, e[1:]))
