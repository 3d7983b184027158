"""vLLM 0.33.0's KV block pool: blocks, their reference counts, the free queue and the cache.

A node that preempts (:mod:`policykit.preempting`) frees a preempted request's blocks into the
prefix cache, and whether it recomputes them when it comes back depends on which of them were
evicted in between: on the *order* of vLLM's free queue, not just its length. So this is
vLLM's ``BlockPool`` with one full-attention group: allocation takes blocks from the front of
the free queue and evicts any cached hash they carry; a freed block goes to the back when it is
cached (full) and to the front when it is not; a prefix hit takes its blocks out of the queue.
A block's key is the content it holds (a request's ``(content, index)``), which is what vLLM's
block hash identifies.

The blocks are real: they are the pages of a :class:`~policykit.pool.TokenPool` (one page per
block), on the device the SGLang node would use, whose free list *is* the free queue (its top
is the queue's front). Given a model's :class:`~policykit.pool.KVLayout` the pool also owns the
K and V tensors the blocks index, so a prefix hit reads the KV a request computed before it
was preempted, unless the queue order let another request overwrite it. Reference counts and
the hash table stay Python dictionaries, as SGLang's radix tree does.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import torch

from policykit.pool import KVLayout, TokenPool

#: what a full block holds: equal keys are the same tokens, so one can stand for the other
BlockKey = Hashable


class BlockPool:
    """``num_blocks`` usable blocks (ids from 1: vLLM's null block 0 is never handed out)."""

    def __init__(
        self,
        num_blocks: int,
        page_size: int,
        *,
        device: str | torch.device = "cpu",
        layout: KVLayout | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.kv = TokenPool(
            (num_blocks + 1) * page_size, page_size, device=device, name="block", layout=layout
        )
        # every page off the free list, then all but the null block back with block 1 on top:
        # vLLM's initial queue is blocks 1..num_blocks, front to back
        self.kv.alloc(num_blocks + 1)
        self.kv.free(torch.arange(num_blocks, 0, -1, dtype=torch.int64))
        self._refs = [0] * (num_blocks + 1)
        self._key_of: dict[int, BlockKey] = {}
        #: key -> the blocks caching it, first cached first (vLLM's ``get_one_block``)
        self._cached: dict[BlockKey, dict[int, None]] = {}

    @property
    def free_blocks(self) -> int:
        """Blocks no request holds, cached or not (vLLM's ``get_num_free_blocks``)."""
        return self.kv.free_pages

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.kv.free_pages

    @property
    def evictable_free_blocks(self) -> int:
        """Free blocks that still cache content (a hit could bring them back)."""
        return sum(self._refs[b] == 0 for b in self._key_of)

    def free_queue(self) -> list[int]:
        """The free blocks, front (next handed out) to back (for tests and invariants)."""
        return self.kv.free_page_ids().flip(0).tolist()

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
        leaving = []
        for b in blocks:
            if self._refs[b] == 0:
                leaving.append(b)
            self._refs[b] += 1
        if leaving:
            self.kv.take(_ids(leaving))

    def allocate(self, count: int) -> list[int]:
        """``count`` blocks from the front of the free queue, their cached content evicted."""
        if count == 0:
            return []
        out = self.kv.alloc(count).flip(0).tolist()
        for block in out:
            key = self._key_of.pop(block, None)
            if key is not None:
                holders = self._cached[key]
                del holders[block]
                if not holders:
                    del self._cached[key]
            self._refs[block] = 1
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
        first: list[int] = []
        last: list[int] = []
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] < 0:
                raise RuntimeError(f"block {b} freed more often than it was held")
            if self._refs[b] == 0:
                (last if b in self._key_of else first).append(b)
        # the top of the page stack is the queue's front: the first of ``first`` ends on top
        if first:
            self.kv.free(_ids(first[::-1]))
        if last:
            self.kv.free_last(_ids(last))

    def slots(self, blocks: Sequence[int], start: int, end: int) -> torch.Tensor:
        """KV slots of token positions ``[start, end)`` of a sequence laid on ``blocks``."""
        return self.kv.slots(_ids(blocks), start, end)


def _ids(blocks: Sequence[int]) -> torch.Tensor:
    return torch.tensor(blocks, dtype=torch.int64)
