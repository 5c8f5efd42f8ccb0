"""HybridModel and HybridSequence: a hybrid model's KV groups (kvpoold's pools[].groups) from
Python, as C++'s ModelConnection and HybridSequence (client/worker/hybrid_sequence.h).

A hybrid model (sliding-window and full-attention layers, say) is one pool per KV group, all on
one memory budget. A worker holds one session per group, linked so that one lookup_groups answers
for every group: the longest prefix every full group holds whole and every sliding group holds
as far as its window reaches. HybridModel attaches them; HybridSequence keeps one SequenceCache
per group over the same tokens and one block chain, begun from that one lookup, so every group
starts from the prefix all of them can serve. The caller writes each group's K/V at
``seq.group(g).slot(pos)`` (a sliding group's blocks that left its window have no page).

A plain pool is a model of one group: the same code serves both.

Thread-safety: one thread at a time, as the connections. Errors: kvpool.Error from the daemon;
a begin() that fails leaves the sequence empty and holds nothing.

    model = kvpool.HybridModel(socket, "gemma-3", worker="engine-0")
    hasher = kvpool.BlockHasher()
    root = hasher.root("gemma-3-27b", model.group(0).pool.geometry)  # the first group's
    with kvpool.HybridSequence(model, hasher, root) as seq:
        cached = seq.begin(prompt)          # tokens every group already holds
        ...                                 # compute the rest into seq.group(g).slot(pos)
        seq.publish_full()
"""

from __future__ import annotations

from typing import Optional, Sequence

from ._kvpool import BlockHash, BlockHasher, Connection, SequenceCache, attach


def _each(actions) -> Optional[BaseException]:
    """Runs every action, even after one fails; returns the first exception (None when all ran)."""
    first: Optional[BaseException] = None
    for action in actions:
        try:
            action()
        except BaseException as e:
            first = first or e
    return first


class HybridModel:
    """One linked session per KV group of a model, in the model's group order."""

    def __init__(self, socket: Optional[str] = None, model: str = "", worker: str = "python",
                 map_memory: bool = True, hasher=None) -> None:
        """Attaches to every group of `model` (a hybrid model's name, one of its groups' pools,
        or a plain pool; "" = the daemon's default pool). hasher: as attach()'s."""
        first = attach(socket, worker=worker, pool=model, map_memory=map_memory, hasher=hasher)
        info = first.pool
        if not info.groups:
            self.model, self.names, self._groups = info.name, [info.name], [first]
            return
        self.model, self.names = info.model, list(info.groups)
        groups: list[Optional[Connection]] = [None] * len(info.groups)
        groups[info.group] = first
        try:
            for g, name in enumerate(info.groups):
                if groups[g] is not None:
                    continue
                pool = f"{info.model}/{name}"
                try:
                    groups[g] = attach(socket, worker=worker, pool=pool, map_memory=map_memory,
                                       link_session=first.session_id, hasher=hasher)
                except Exception as e:
                    if hasattr(e, "add_note"):  # Python 3.11 on
                        e.add_note(f"while attaching group {name} (pool {pool})")
                    raise
        except BaseException:
            _each(c.close for c in groups if c is not None)
            raise
        self._groups = groups

    @property
    def num_groups(self) -> int:
        """The model's KV groups (1 for a plain pool)."""
        return len(self._groups)

    def group(self, g: int) -> Connection:
        """Group g's connection (its pool is model/names[g])."""
        return self._groups[g]

    def lookup(self, chain: Sequence[BlockHash]) -> list[list[Optional[int]]]:
        """The longest prefix of `chain` every group can serve now: per group, a page per block
        of it (None where that group's window does not need the block), each held by that
        group's session, whose mapping covers them when this returns."""
        if len(self._groups) == 1:
            return [list(self._groups[0].lookup(chain))]
        hit = self._groups[0].lookup_groups(chain)
        # The reply came on group 0's connection: a group whose pool grew since its session last
        # synced maps its new segments now, before anyone reads the pages.
        for g, part in enumerate(hit):
            mapped = self._groups[g].pool.num_pages
            if any(p is not None and p >= mapped for p in part):
                self._groups[g].sync()
        return hit

    def close(self) -> None:
        """Closes every group's session (the daemon releases what each still held)."""
        first = _each(c.close for c in self._groups)
        if first is not None:
            raise first

    def __enter__(self) -> "HybridModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HybridSequence:
    """One sequence of a hybrid model: a SequenceCache per group over the same tokens."""

    def __init__(self, model: HybridModel, hasher: BlockHasher, root: BlockHash) -> None:
        """root: hasher.root() of the model's first group (docs/BLOCK_HASH.md)."""
        self._model, self._hasher, self._root = model, hasher, root
        self._groups = [SequenceCache(model.group(g), hasher, root)
                        for g in range(model.num_groups)]

    def group(self, g: int) -> SequenceCache:
        """Group g's SequenceCache: its block table and slots."""
        return self._groups[g]

    @property
    def num_groups(self) -> int:
        """The model's KV groups."""
        return len(self._groups)

    @property
    def tokens(self) -> int:
        """Tokens the sequence holds (every group holds the same)."""
        return self._groups[0].tokens

    def begin(self, prompt: Sequence[int]) -> int:
        """Starts the sequence with `prompt`: returns how many leading tokens every group
        already holds (a multiple of tokens_per_page); the rest of the prompt's pages are
        allocated in every group."""
        if self.tokens != 0:
            raise ValueError("begin() on a sequence that has tokens")
        tpp = self._model.group(0).pool.geometry.tokens_per_page
        hit = self._model.lookup(self._hasher.chain(self._root, prompt, tpp))
        cached = 0
        for g, part in enumerate(hit):
            try:
                cached = self._groups[g].begin_from(prompt, part)
            except BaseException:
                # begin_from gave group g's part back; the groups not begun give the hit's
                # references back, and the groups begun their pages, each tried (the error
                # raised is begin_from's).
                later = [(k, [p for p in hit[k] if p is not None]) for k in range(g + 1, len(hit))]
                _each([*(lambda k=k, held=held: self._model.group(k).release(held)
                         for k, held in later if held),
                       *(s.release for s in self._groups)])
                raise
        return cached

    def append(self, token: int) -> None:
        """Appends one token to every group (a block that fills takes a page in each)."""
        for s in self._groups:
            s.append(token)

    def publish_full(self) -> int:
        """Publishes every group's full blocks (a sliding group then lets go of the blocks its
        window left); returns the blocks adopted from another worker, all groups together."""
        return sum(s.publish_full() for s in self._groups)

    def release(self) -> None:
        """Gives every group's pages back, tail first; raises the first error after trying
        every group."""
        first = _each(s.release for s in self._groups)
        if first is not None:
            raise first

    def close(self) -> None:
        """Releases every group's pages and closes the caches (each tried; the first error is
        raised)."""
        first = _each(s.close for s in self._groups)
        if first is not None:
            raise first

    def __enter__(self) -> "HybridSequence":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
