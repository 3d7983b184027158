"""A model of torch's CUDA caching allocator (large pool only), for predicting on a CPU.

Why a model: the fragmentation workload (:mod:`policykit.harness.fragmentation`) is only
meaningful on a GPU, but whether a given allocation pattern *can* fragment is a property of the
allocator's rules, and those rules are few. The model follows them closely enough to tell a
pattern that pins segments from one that does not, so the workload can be designed and its
dry run checked without a device. Its figures are predictions, never GPU measurements.

Rules modelled (``c10/cuda/CUDACachingAllocator.cpp``, default settings):

* best fit: the smallest cached free block that is large enough (ties: lowest address);
* a block is split when more than 1 MiB (``kSmallSize``) would remain;
* a new segment is 20 MiB (``kLargeBuffer``) for requests under 10 MiB, else the request
  rounded up to 2 MiB; freed blocks merge with free neighbours in the same segment;
* ``empty_cache()`` returns only segments that are entirely free;
* expandable segments: one growing virtual range whose physical memory is mapped in 20 MiB
  handles for the large pool; ``empty_cache()`` unmaps every handle no live block touches.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIB = 1 << 20
SMALL_SIZE = 1 * MIB  #: a remainder above this is split off
MIN_LARGE_ALLOC = 10 * MIB
LARGE_BUFFER = 20 * MIB  #: segment for mid-size requests; expandable handle size
ROUND_LARGE = 2 * MIB


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True


@dataclass
class AllocatorModel:
    """Allocation bookkeeping only: ``alloc``/``free``/``empty_cache`` and the two counters."""

    expandable: bool = False
    _blocks: list[_Block] = field(default_factory=list)  #: by (segment, offset)
    _live: dict[int, _Block] = field(default_factory=dict)
    _segments: dict[int, int] = field(default_factory=dict)  #: segment -> size (non-expandable)
    _next_segment: int = 0
    _end: int = 0  #: expandable: end of the virtual range in use
    _mapped: set[int] = field(default_factory=set)  #: expandable: mapped handle indexes
    allocated: int = 0

    # -- public ------------------------------------------------------------------------------
    @property
    def reserved(self) -> int:
        if self.expandable:
            return len(self._mapped) * LARGE_BUFFER
        return sum(self._segments.values())

    def alloc(self, key: int, size: int) -> None:
        if size <= SMALL_SIZE:
            raise ValueError("the model covers the large pool only (requests over 1 MiB)")
        size = _round_up(size, 512)
        block = self._best_fit(size) or self._grow(size)
        if block.size - size > SMALL_SIZE:
            rest = _Block(block.segment, block.offset + size, block.size - size)
            block.size = size
            self._insert(rest)
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        if self.expandable:
            self._map(block)

    def free(self, key: int) -> None:
        block = self._live.pop(key)
        self.allocated -= block.size
        block.free = True
        i = self._index(block)
        nxt = self._blocks[i + 1] if i + 1 < len(self._blocks) else None
        if nxt is not None and nxt.free and self._adjacent(block, nxt):
            block.size += nxt.size
            del self._blocks[i + 1]
        prev = self._blocks[i - 1] if i > 0 else None
        if prev is not None and prev.free and self._adjacent(prev, block):
            prev.size += block.size
            del self._blocks[i]

    def empty_cache(self) -> None:
        if self.expandable:
            live: set[int] = set()
            for b in self._live.values():
                live.update(self._handles(b))
            self._mapped = live
            return
        whole = {
            b.segment
            for b in self._blocks
            if b.free and b.offset == 0 and b.size == self._segments[b.segment]
        }
        self._blocks = [b for b in self._blocks if b.segment not in whole]
        for s in whole:
            del self._segments[s]

    # -- internals ---------------------------------------------------------------------------
    def _best_fit(self, size: int) -> _Block | None:
        fits = [b for b in self._blocks if b.free and b.size >= size]
        if self.expandable:
            # the free tail of the range also fits: it can always be grown
            return min(fits, key=lambda b: (b.size, b.offset), default=None)
        return min(fits, key=lambda b: (b.size, b.segment, b.offset), default=None)

    def _grow(self, size: int) -> _Block:
        if self.expandable:
            tail = self._blocks[-1] if self._blocks and self._blocks[-1].free else None
            if tail is not None and tail.offset + tail.size == self._end:
                tail.size += size  # extend the free tail instead of leaving a hole
                self._end += size
                return tail
            block = _Block(0, self._end, _round_up(size, ROUND_LARGE))
            self._end += block.size
            self._insert(block)
            return block
        seg_size = LARGE_BUFFER if size < MIN_LARGE_ALLOC else _round_up(size, ROUND_LARGE)
        seg = self._next_segment
        self._next_segment += 1
        self._segments[seg] = seg_size
        block = _Block(seg, 0, seg_size)
        self._insert(block)
        return block

    def _handles(self, b: _Block) -> range:
        return range(
            b.offset // LARGE_BUFFER, _round_up(b.offset + b.size, LARGE_BUFFER) // LARGE_BUFFER
        )

    def _map(self, b: _Block) -> None:
        self._mapped.update(self._handles(b))

    @staticmethod
    def _adjacent(a: _Block, b: _Block) -> bool:
        return a.segment == b.segment and a.offset + a.size == b.offset

    def _insert(self, block: _Block) -> None:
        keys = [(b.segment, b.offset) for b in self._blocks]
        self._blocks.insert(bisect.bisect(keys, (block.segment, block.offset)), block)

    def _index(self, block: _Block) -> int:
        for i, b in enumerate(self._blocks):
            if b is block:
                return i
        raise KeyError(block)
