"""Which policykit scenario fields vLLM's scheduler has a meaning for, and how they map.

``page_size`` is vLLM's ``block_size``; ``chunked_prefill_size`` is ``max_num_batched_tokens``
(the step's token budget); the pool (``free_tokens + evictable_tokens`` plus pinned device
prefixes) is ``num_blocks`` plus vLLM's reserved null block. A device prefix is the request's
own first tokens, computed before round 1 by a prefix-owner request so vLLM's prefix cache holds
them: a pinned one's owner keeps its blocks (the references from outside the scenario), an
unpinned one's are freed to the cache, where they are evictable as in policykit.
"""

from __future__ import annotations

from policykit.errors import ScenarioError
from policykit.scenario import Scenario


def refuse_unmappable(scenario: Scenario) -> None:
    """Raise :class:`ScenarioError` for a field vLLM's v1 scheduler has no meaning for."""
    name = scenario.name
    hosted = [r.id for r in scenario.requests if r.host_prefix_tokens]
    if hosted:
        raise ScenarioError(
            f"scenario {name!r}: request(s) {', '.join(map(repr, hosted[:5]))} have "
            "'host_prefix_tokens', but vLLM's v1 scheduler has no host tier of its own: a "
            "host-side KV cache is a KV connector (offloading or LMCache), whose load timing is "
            "not part of the scheduler this oracle drives. Remove the host prefixes (or fold "
            "them into the prompt) to compare with vLLM."
        )
    if scenario.config.sliding_window is not None:
        raise ScenarioError(
            f"scenario {name!r} turns hybrid SWA on ('sliding_window'), but the vLLM oracle "
            "builds one full-attention KV cache group; vLLM's hybrid allocator sizes its "
            "sliding-window groups from the model, not from a free-token count, so there is no "
            "faithful mapping. Drop 'swa_free_tokens' and 'sliding_window'."
        )
    if scenario.config.max_prefill_tokens is not None:
        raise ScenarioError(
            f"scenario {name!r} sets 'max_prefill_tokens' (SGLang's second budget, "
            "rem_input_tokens, which counts new requests' whole inputs); vLLM has one step "
            "budget per token kind and none that matches it. Remove it to compare with vLLM."
        )
    chunked = [r.id for r in scenario.requests if r.chunked]
    if chunked:
        raise ScenarioError(
            f"scenario {name!r}: request {chunked[0]!r} starts as an in-progress chunked "
            "request; the vLLM oracle starts from an empty scheduler and cannot hand vLLM a "
            "half-computed request without inventing its state. Let it arrive at round 0 instead."
        )


def pool_blocks(scenario: Scenario) -> int:
    """Usable blocks: free + evictable + pinned device prefixes (vLLM adds its null block)."""
    page = scenario.config.page_size
    pinned = sum(r.device_prefix_tokens for r in scenario.requests if r.device_prefix_pinned)
    return (scenario.free_tokens + scenario.evictable_tokens + pinned) // page
