"""Which policykit scenario fields vLLM's scheduler has a meaning for, and how they map.

``page_size`` is vLLM's ``block_size``; ``chunked_prefill_size`` is ``max_num_batched_tokens``
(the step's token budget); the pool (``free_tokens + evictable_tokens`` plus pinned device
prefixes and the in-progress request's own KV) is ``num_blocks`` plus vLLM's reserved null
block. What the pool holds at round 1 (cached filler, device prefixes, a request in progress)
is reached by running earlier requests through vLLM's own scheduler, in the order
:mod:`policykit.preempting_layout` writes down once for both sides. The refusals are
policykit's node that preempts's own (:mod:`policykit.preempting_scenario`).
"""

from __future__ import annotations

from policykit.preempting_scenario import OWNER, pool_blocks, refuse_unmappable

__all__ = ["OWNER", "pool_blocks", "refuse_unmappable"]
