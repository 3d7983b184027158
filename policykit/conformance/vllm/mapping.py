"""Which policykit scenario fields vLLM's scheduler has a meaning for, and how they map.

``page_size`` is vLLM's ``block_size``; ``chunked_prefill_size`` is ``max_num_batched_tokens``
(the step's token budget); the pool (``free_tokens + evictable_tokens`` plus pinned device
prefixes) is ``num_blocks`` plus vLLM's reserved null block. A device prefix is the request's
own first tokens, computed before round 1 by a prefix-owner request so vLLM's prefix cache holds
them: a pinned one's owner keeps its blocks (the references from outside the scenario), an
unpinned one's are freed to the cache, where they are evictable as in policykit. The rules are
policykit's node that preempts's own (:mod:`policykit.preempting_scenario`), so the oracle and
the model lay a scenario out alike.
"""

from __future__ import annotations

from policykit.preempting_scenario import OWNER, pool_blocks, refuse_unmappable

__all__ = ["OWNER", "pool_blocks", "refuse_unmappable"]
