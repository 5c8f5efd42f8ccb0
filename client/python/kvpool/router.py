"""KvRouter: a KV-aware router's view of several kvpoold instances, built from their KV events.

Each node is one kvpoold publishing its index changes on ZeroMQ in vLLM's format (README, "KV
events for routers"). The router subscribes to every node and keeps, per node, per pool (the
topic) and per medium ("GPU" for a device pool, "CPU" for its host tier or a host-backend pool),
the set of block hashes cached there. It answers, for a block chain, the longest prefix each
node holds (all of it in one medium or spread over both) and which node to send the request to.

Keeping the view exact:
  * Batches are applied in sequence order. A batch whose sequence number skips ahead (messages
    lost to a slow subscriber, a reconnect, ZeroMQ's slow joiner) is a gap: the router asks the
    node's replay socket for the missing batches and applies them first. When the node cannot
    replay them (no replay endpoint, or they left its buffer), the router forgets what it holds
    of that node (it under-reports hits until the node publishes again, it never over-reports)
    and counts a resync. vLLM's replay replies carry no topic, so they can be placed only on a
    node whose events the router has seen for one pool (the pool of the batch that showed the
    gap); a node with several pools is forgotten on a gap instead.
  * The first batch the router hears of a node (it joined late, or lost the first batches to
    ZeroMQ's slow joiner) brings the node's batches from 0, its start, by replay.
  * A sequence number that goes back means the node restarted: its pools start empty, so the
    router forgets that node (the new daemon's first batch is an AllBlocksCleared per pool
    anyway; this covers a router that missed it).
  * AllBlocksCleared empties one pool of one node, in every medium.

Block hashes are kept as sent: 16-byte ``bytes`` (events.zmq_block_hash: bytes, the default) or
``int`` (uint64); pass chains in the same form (``bytes(h)`` of a kvpool BlockHash, or its low
word). Both payload layouts (array, map) are read.

Thread-safety: none; one thread polls and asks. Errors: a malformed payload raises ValueError
naming the node; ZeroMQ errors propagate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence, Union

import msgpack
import zmq

BlockKey = Union[bytes, int]
_END = (1 << 64) - 1  # the replay socket's end marker, -1 as 8 bytes


@dataclass
class Endpoints:
    """Where a node publishes (events.zmq_endpoint) and answers replays (zmq_replay_endpoint)."""
    events: str
    replay: Optional[str] = None


@dataclass
class NodeState:
    """What the router holds of one node."""
    name: str
    endpoints: Endpoints
    # pool (topic without the router's prefix) -> medium -> block hashes
    pools: dict[str, dict[str, set[BlockKey]]] = field(default_factory=dict)
    last_seq: Optional[int] = None
    batches: int = 0
    replayed: int = 0
    resyncs: int = 0
    restarts: int = 0

    def forget(self) -> None:
        self.pools.clear()


@dataclass
class Prefix:
    """The longest prefix of a chain one node holds: in any medium, and in each medium alone."""
    blocks: int
    by_medium: dict[str, int]


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
        for name, where in nodes.items():
            endpoints = where if isinstance(where, Endpoints) else Endpoints(where)
            self.nodes[name] = NodeState(name, endpoints)
            self._subscribe(name)

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

    def poll(self, timeout_ms: int = 0) -> int:
        """Applies every batch that arrives within timeout_ms (then what is already queued);
        returns how many were applied."""
        applied = 0
        ready = dict(self._poller.poll(timeout_ms))
        while ready:
            for name, sub in list(self._subs.items()):
                if sub in ready:
                    while True:
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
            n = self.poll(quiet_ms)
            applied += n
            if n == 0:
                break
        return applied

    def _receive(self, name: str, frames: list[bytes]) -> int:
        if len(frames) != 3 or len(frames[1]) != 8:
            raise ValueError(f"node {name}: a KV event message of {len(frames)} frames")
        node = self.nodes[name]
        topic, seq, payload = frames[0].decode(), int.from_bytes(frames[1], "big"), frames[2]
        if node.last_seq is None:
            # The first batch heard: what the node published since it started (batch 0, its
            # AllBlocksCleared, on) comes from its replay socket, or the view stays partial.
            if seq > 0 and not self._replay(node, self._pool_of(topic), 0, seq):
                node.resyncs += 1
                node.forget()
        elif seq <= node.last_seq:
            # The sequence went back: a new daemon behind the endpoint, its pools empty.
            node.restarts += 1
            node.forget()
        elif seq > node.last_seq + 1:
            if not self._replay(node, self._pool_of(topic), node.last_seq + 1, seq):
                node.resyncs += 1
                node.forget()
        self._apply(node, topic, payload)
        node.last_seq = seq
        return 1

    def _replay(self, node: NodeState, pool: str, first: int, upto: int) -> bool:
        """Applies batches [first, upto) of `pool` from the node's replay socket; False when
        they cannot all be had and placed (the router then forgets the node)."""
        if node.endpoints.replay is None:
            return False
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVTIMEO, self._replay_timeout_ms)
        try:
            dealer.connect(node.endpoints.replay)
            dealer.send_multipart([b"", first.to_bytes(8, "big")])
            got: list[tuple[int, bytes]] = []
            while True:
                try:
                    _, seq_bytes, payload = dealer.recv_multipart()
                except zmq.Again:
                    return False
                seq = int.from_bytes(seq_bytes, "big")
                if seq == _END:
                    break
                if seq < upto:
                    got.append((seq, payload))
            if [s for s, _ in got] != list(range(first, upto)):
                return False
            # vLLM's replay replies carry no topic: they belong to the pool of the live batch
            # that showed the gap when that is the only pool the router knows of the node.
            # A node with several pools cannot place them; the caller forgets it instead.
            known = set(node.pools) - {pool}
            if known:
                return False
            for _, payload in got:
                self._apply(node, self._topic + pool, payload)
            node.replayed += len(got)
            return True
        finally:
            dealer.close(linger=0)

    def _pool_of(self, topic: str) -> str:
        return topic[len(self._topic):] if topic.startswith(self._topic) else topic

    def _apply(self, node: NodeState, topic: str, payload: bytes) -> None:
        pool = self._pool_of(topic)
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
        """Per node, how many leading blocks of `chain` it holds."""
        out = {}
        for name, node in self.nodes.items():
            media = node.pools.get(pool, {})
            by_medium = {m: _leading(chain, lambda h, b=b: h in b) for m, b in media.items()}
            any_medium = _leading(chain, lambda h: any(h in b for b in media.values()))
            out[name] = Prefix(any_medium, by_medium)
        return out

    def route(self, chain: Sequence[BlockKey], pool: str = "default",
              candidates: Optional[Iterable[str]] = None) -> str:
        """The node holding the longest prefix of `chain` (ties: the first candidate)."""
        names = list(candidates) if candidates is not None else list(self.nodes)
        prefixes = self.longest_prefix(chain, pool)
        return max(names, key=lambda n: prefixes[n].blocks)


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
