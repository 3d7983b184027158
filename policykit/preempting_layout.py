"""How a scenario's pool stands before round 1 on a node that preempts, as vLLM reaches it.

A scenario describes a node in the middle of its life: cached content nobody holds, device
prefixes (pinned or not), perhaps a request already half computed. vLLM 0.33.0 can only be
*brought* into such a state by running earlier requests, and the state it ends in depends on
the order it ran them: freed full blocks go to the tail of ``FreeKVCacheBlockQueue`` (a
request's blocks last first), an allocation pops the head and evicts what it cached, a prefix
hit takes its blocks out of the queue. So the free queue's order is the layout's history, and
this module writes that history down once, as data; the node that preempts
(:func:`policykit.preempting_scenario.prepare`) and the conformance oracle
(:mod:`policykit.conformance.vllm.driver`, on vLLM's real scheduler) each replay it with their
own code, so a comparison between them sees any difference the replay makes.

The history, in order:

1. **Filler.** The scenario's ``evictable_tokens`` beyond its unpinned device prefixes is
   cached content of no request in the scenario. It was computed by earlier requests (of at
   most the scenario's longest prompt each, whole blocks, so a vLLM built for the scenario's
   prompts can hold them), freed before anything else: evictions take it first.
2. **Device prefixes**, one after another in scenario order, each computed by its own earlier
   request (an *owner* with the request's first tokens) running **alone**: no threshold, no
   budget shared with another request, so the combo or vLLM settings under test cannot change
   which finishes first. An unpinned owner frees its blocks as soon as it finishes (into the
   cache, after the filler and the earlier prefixes: older prefixes are evicted first); a
   pinned one keeps them (held from outside the scenario).
3. **The request in progress** (``computed_tokens`` with ``chunked: true``, at most one), run
   alone last: admitted with its device prefix as a cache hit, then computed chunk by chunk
   (the step budget, the last chunk cut to end at ``computed_tokens``) until it has computed
   that many tokens; it stays in the running list, holding its prefix and
   ``ceil((computed - prefix) / page)`` blocks of its own, the last one partial unless
   ``computed`` is a whole number of blocks. Its admission is the scenario's given, not a
   decision under test: it is admitted on its first chunk (as without full-sequence
   reservation), because the scenario says it is running.

The pool has exactly the blocks this needs besides the free ones (``free + evictable + pinned
+ the in-progress request's own``, :func:`policykit.scenario.pool_tokens`), and every step
takes never-cached blocks from the head of the queue, so nothing is evicted while laying out:
at round 1 the queue holds the free blocks, then the filler, then the unpinned prefixes in
scenario order.
"""

from __future__ import annotations

from dataclasses import dataclass

from policykit.scenario import Scenario

#: the prefix owners' ids, outside any scenario id space
OWNER = "policykit-prefix-owner:"
#: the filler requests' ids
FILLER = "policykit-filler:"


@dataclass(frozen=True)
class Warm:
    """An earlier request that runs alone before round 1 and finishes."""

    id: str
    #: the scenario request whose first tokens it computes; None: filler (no request's)
    request: int | None
    #: filler only: where its tokens start in the filler's own token range
    first: int
    tokens: int
    #: its blocks stay held (a pinned prefix); otherwise freed when it finishes
    keep: bool


@dataclass(frozen=True)
class InProgress:
    """The scenario request that is running at round 1, with ``computed`` tokens done (its
    device prefix, a cache hit, among them)."""

    request: int
    prefix: int
    computed: int

    def chunks(self, budget: int) -> list[int]:
        """Its warm-up chunks under a ``budget``-token step: whole budgets, the last one cut to
        end where the scenario says it stands."""
        return split(self.computed - self.prefix, budget)


@dataclass(frozen=True)
class Layout:
    """The history that brings a node to the scenario's round-1 state, in order."""

    warm: tuple[Warm, ...]
    in_progress: InProgress | None


def split(tokens: int, size: int) -> list[int]:
    """``tokens`` in pieces of ``size``, the last one shorter."""
    return [min(size, tokens - at) for at in range(0, tokens, size)]


def filler_tokens(scenario: Scenario) -> int:
    """Cached tokens that belong to no request: ``evictable_tokens`` less the unpinned device
    prefixes (which it includes)."""
    unpinned = sum(r.device_prefix_tokens for r in scenario.requests if not r.device_prefix_pinned)
    return scenario.evictable_tokens - unpinned


def filler_request_tokens(scenario: Scenario) -> int:
    """The most tokens one filler request computes: the longest prompt, in whole blocks (one
    block at least), so it never outgrows the context a vLLM for the scenario is built with."""
    page = scenario.config.page_size
    longest = max((r.prompt_tokens for r in scenario.requests), default=page)
    return max(1, longest // page) * page


def layout(scenario: Scenario) -> Layout:
    """The scenario's history before round 1 (see the module docstring)."""
    warm = [
        Warm(f"{FILLER}{n}", None, first, tokens, keep=False)
        for n, (first, tokens) in enumerate(_pieces(filler_tokens(scenario), scenario))
    ]
    for index, spec in enumerate(scenario.requests):
        if spec.device_prefix_tokens:
            warm.append(
                Warm(
                    OWNER + spec.id,
                    index,
                    0,
                    spec.device_prefix_tokens,
                    keep=spec.device_prefix_pinned,
                )
            )
    chunked = [(i, r) for i, r in enumerate(scenario.requests) if r.chunked]
    if not chunked:
        return Layout(tuple(warm), None)
    index, spec = chunked[0]
    return Layout(tuple(warm), InProgress(index, spec.device_prefix_tokens, spec.computed_tokens))


def _pieces(tokens: int, scenario: Scenario) -> list[tuple[int, int]]:
    """The filler's requests: ``(first token, tokens)`` of each."""
    size = filler_request_tokens(scenario)
    return list(zip(range(0, tokens, size), split(tokens, size), strict=True))
