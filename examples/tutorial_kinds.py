"""One small policy of each kind besides admission, as the tutorial shows them.

The tutorial includes the sections between the ``--8<--`` markers; policykit's tests register
these classes and run ``simulate`` and ``check`` on them, so every snippet on the page runs.
"""

from __future__ import annotations

import policykit
from policykit import AlignmentPolicy, AlignView, ChunkingPolicy, ChunkView, ceil_paged
from policykit.memory.allocator import AllocatorFacade, torch_allocator


# --8<-- [start:chunking]
class WholePagesChunking(ChunkingPolicy):
    """Like ``defer``, except that a resumed chunk that does not finish its request is a whole
    number of pages (a partial page would be allocated again by the next chunk)."""

    name = "whole-pages"

    def new_chunk(self, v: ChunkView) -> int:
        if ceil_paged(v.remaining_tokens, v.page_size) <= v.rem_chunk_tokens:
            return v.remaining_tokens
        return v.rem_chunk_tokens // v.page_size * v.page_size

    def resume_chunk(self, v: ChunkView) -> int:
        budget = min(v.rem_chunk_tokens, v.rem_total_tokens)
        if v.hybrid_swa:
            budget = min(budget, v.rem_swa_tokens - v.page_size)
        if v.remaining_tokens <= budget:
            return v.remaining_tokens
        return max(budget, 0) // v.page_size * v.page_size  # 0 defers to a later round


# --8<-- [end:chunking]


# --8<-- [start:alignment]
class TwoPageAlignment(AlignmentPolicy):
    """A non-final chunk ends on a multiple of two pages when that keeps at least one token."""

    name = "two-pages"

    def align_end(self, v: AlignView) -> int:
        step = 2 * v.page_size
        aligned = v.end // step * step
        return aligned if aligned > v.start else v.end


# --8<-- [end:alignment]


# --8<-- [start:allocator-phase]
class EmptyCacheAtServing(policykit.AllocatorPhasePolicy):
    """Return the blocks cached during initialisation to the driver before serving starts."""

    name = "empty-cache"

    def __init__(self, arg: object = None, *, facade: AllocatorFacade | None = None) -> None:
        super().__init__(arg)
        self.facade = facade if facade is not None else torch_allocator()

    def on_serving(self) -> None:
        if self.facade.is_available():
            self.facade.empty_cache()


# --8<-- [end:allocator-phase]


# --8<-- [start:queue]
class LeastWorkFirst(policykit.QueuePolicy):
    """The request with the fewest tokens left to compute goes first; one that can never fit
    is rejected for good instead of blocking the queue."""

    name = "least-work"
    skips_never_fitting = True

    def priority(self, v: policykit.QueueView) -> int:
        return v.prompt_tokens - v.prefix_tokens - v.host_prefix_tokens


# --8<-- [end:queue]


# --8<-- [start:preemption]
class MostBlocksFirst(policykit.PreemptionPolicy):
    """Preempt the running request that holds the most KV blocks: one preemption then frees
    the most memory, so fewer requests are disturbed (each costs more to compute again)."""

    name = "most-blocks"

    def victim_rank(self, v: policykit.PreemptView) -> int:
        return v.held_blocks


# --8<-- [end:preemption]


@policykit.hookimpl
def policykit_register_policies(register):
    register(WholePagesChunking)
    register(TwoPageAlignment)
    register(EmptyCacheAtServing)
    register(LeastWorkFirst)
    register(MostBlocksFirst)
