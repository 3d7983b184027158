"""vLLM 0.33.0's KV block pool: blocks, their reference counts, the free queue and the cache.

A node that preempts (:mod:`policykit.preempting`) frees a preempted request's blocks into the
prefix cache, and whether it recomputes them when it comes back depends on which of them were
evicted in between: on the *order* of vLLM's free queue, not just its length. So this is
vLLM's ``BlockPool`` with one full-attention group, as a model: allocation takes blocks from the
front of the free queue and evicts any cached hash they carry; a freed block goes to the back
when it is cached (full) and to the front when it is not; a prefix hit takes its blocks out of
the queue. A block's key is the content it holds (a request's ``(content, index)``), which is
what vLLM's block hash identifies.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

#: what a full block holds: equal keys are the same tokens, so one can stand for the other
BlockKey = Hashable


class BlockPool:
    """``num_blocks`` usable blocks (ids from 1: vLLM's null block 0 is never handed out)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict(
            (b, None) for b in range(1, num_blocks + 1)
        )
        self._refs = [0] * (num_blocks + 1)
        self._key_of: dict[int, BlockKey] = {}
        #: key -> the blocks caching it, first cached first (vLLM's ``get_one_block``)
        self._cached: dict[BlockKey, dict[int, None]] = {}

    @property
    def free_blocks(self) -> int:
        """Blocks no request holds, cached or not (vLLM's ``get_num_free_blocks``)."""
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def hit(self, keys: Sequence[BlockKey]) -> list[int]:
        """The cached blocks of the longest prefix of ``keys`` (one block per key)."""
        out = []
        for key in keys:
            blocks = self._cached.get(key)
            if not blocks:
                break
            out.append(next(iter(blocks)))
        return out

    def evictable(self, blocks: Iterable[int]) -> int:
        """How many of ``blocks`` are only cached (free): a hit on them takes free blocks."""
        return sum(self._refs[b] == 0 for b in blocks)

    def touch(self, blocks: Iterable[int]) -> None:
        """A prefix hit: the blocks gain a holder and leave the free queue."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, count: int) -> list[int]:
        """``count`` blocks from the front of the free queue, their cached content evicted."""
        if count > len(self._free):
            raise ValueError(f"cannot allocate {count} blocks, {len(self._free)} free")
        out = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            key = self._key_of.pop(block, None)
            if key is not None:
                holders = self._cached[key]
                del holders[block]
                if not holders:
                    del self._cached[key]
            self._refs[block] = 1
            out.append(block)
        return out

    def cache(self, block: int, key: BlockKey) -> None:
        """``block`` is full with ``key``'s tokens: later requests may hit it."""
        if block in self._key_of:
            return
        self._key_of[block] = key
        self._cached.setdefault(key, {})[block] = None

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one holder of each block, in eviction order (vLLM frees a request's blocks last
        first): unreferenced cached blocks go to the back of the queue, others to the front."""
        first, last = [], []
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                (last if b in self._key_of else first).append(b)
        for b in reversed(first):
            self._free[b] = None
            self._free.move_to_end(b, last=False)
        for b in last:
            self._free[b] = None
