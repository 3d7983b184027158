"""A scenario on a node that preempts: its requests, its pool and its device prefixes.

The pool is the scenario's ``free_tokens + evictable_tokens`` plus its pinned device prefixes,
in blocks of ``page_size``. A device prefix is the request's own first tokens, computed before
round 1 by a prefix-owner request, as vLLM would have computed it for an earlier request: a
pinned prefix's owner keeps its blocks (they are held from outside the scenario), an unpinned
one's are freed into the prefix cache, evictable. This is also how ``policykit conformance
vllm`` lays the scenario out in the real vLLM scheduler (docs/conformance-vllm.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from policykit.errors import ScenarioError
from policykit.plugin_manager import PolicykitPluginManager
from policykit.pool import KVLayout
from policykit.preempting import (
    Forward,
    PagedRequest,
    PreemptingConfig,
    PreemptingNode,
    PreemptingScheduler,
    Step,
)
from policykit.registry import Combo
from policykit.scenario import _ID_STRIDE, Scenario
from policykit.tokens import TokenRuns

#: the prefix owners' ids, outside any scenario id space
OWNER = "policykit-prefix-owner:"
#: computing the device prefixes takes at most one step per budget's worth of prefix tokens
MAX_WARMUP_STEPS = 1 << 20


def refuse_unmappable(scenario: Scenario) -> None:
    """Raise :class:`ScenarioError` for a field a node that preempts (vLLM's) has no meaning
    for."""
    name = scenario.name
    hosted = [r.id for r in scenario.requests if r.host_prefix_tokens]
    if hosted:
        raise ScenarioError(
            f"scenario {name!r}: request(s) {', '.join(map(repr, hosted[:5]))} have "
            "'host_prefix_tokens', but vLLM's v1 scheduler has no host tier of its own: a "
            "host-side KV cache is a KV connector (offloading or LMCache), whose load timing is "
            "not part of the scheduler. Remove the host prefixes (or fold them into the prompt) "
            "to run it on a node that preempts."
        )
    if scenario.config.sliding_window is not None:
        raise ScenarioError(
            f"scenario {name!r} turns hybrid SWA on ('sliding_window'), but a node that "
            "preempts is modelled with one full-attention KV cache group; vLLM's hybrid "
            "allocator sizes its sliding-window groups from the model, not from a free-token "
            "count, so there is no faithful mapping. Drop 'swa_free_tokens' and "
            "'sliding_window'."
        )
    if scenario.config.max_prefill_tokens is not None:
        raise ScenarioError(
            f"scenario {name!r} sets 'max_prefill_tokens' (SGLang's second budget, "
            "rem_input_tokens, which counts new requests' whole inputs); vLLM has one step "
            "budget per token kind and none that matches it. Remove it to run it on a node "
            "that preempts."
        )
    chunked = [r.id for r in scenario.requests if r.chunked]
    if chunked:
        raise ScenarioError(
            f"scenario {name!r}: request {chunked[0]!r} starts as an in-progress chunked "
            "request; a node that preempts starts from an empty scheduler and cannot be handed "
            "a half-computed request without inventing its state. Let it arrive at round 0 "
            "instead."
        )


def pool_blocks(scenario: Scenario) -> int:
    """Usable blocks: free + evictable + pinned device prefixes."""
    page = scenario.config.page_size
    pinned = sum(r.device_prefix_tokens for r in scenario.requests if r.device_prefix_pinned)
    return (scenario.free_tokens + scenario.evictable_tokens + pinned) // page


def _keys(index: int, tokens: int, page: int) -> tuple[tuple[int, int], ...]:
    """Request ``index``'s full blocks: its own tokens, shared with nobody but its prefix."""
    return tuple((index, block) for block in range(tokens // page))


def _tokens(index: int, count: int) -> TokenRuns:
    """Request ``index``'s token ids, as :func:`policykit.scenario.build_node` lays them out:
    what a harness forward computes (equal keys above are equal tokens here)."""
    return TokenRuns.span((index + 1) * _ID_STRIDE, count)


def prepare(
    scenario: Scenario,
    combo: Combo,
    *,
    max_running: int | None = None,
    pm: PolicykitPluginManager | None = None,
    device: str | torch.device = "cpu",
    layout: KVLayout | None = None,
    forward: Forward | None = None,
) -> tuple[PreemptingScheduler, int]:
    """A scheduler for ``scenario`` with its device prefixes computed, and the steps that took
    (not rounds of the scenario: round 1 comes next). The block pool lives on ``device`` and
    holds K/V of ``layout`` when one is given; ``forward`` runs every step, the prefixes' too,
    so their KV is real. ``pm``'s hooks see the scenario's rounds only."""
    refuse_unmappable(scenario)
    page = scenario.config.page_size
    config = PreemptingConfig(page, scenario.config.chunked_prefill_size, max_running)
    node = PreemptingNode(config, pool_blocks(scenario), device=device, layout=layout)
    sched = PreemptingScheduler(node, combo, forward=forward)
    owners = []
    for index, spec in enumerate(scenario.requests):
        if spec.device_prefix_tokens:
            release = None if spec.device_prefix_pinned else 1
            count = spec.device_prefix_tokens
            keys = _keys(index, count, page)
            tokens = _tokens(index, count)
            owners.append(PagedRequest(OWNER + spec.id, count, 0, keys, release, tokens=tokens))
    steps = warm_up(sched, owners)
    sched.pm = pm
    for index, spec in enumerate(scenario.requests):
        keys = _keys(index, spec.prompt_tokens, page)
        release = scenario.config.kv_release_rounds
        tokens = _tokens(index, spec.prompt_tokens)
        node.add(
            PagedRequest(
                spec.id, spec.prompt_tokens, spec.arrival_round, keys, release, tokens=tokens
            )
        )
    return sched, steps


def warm_up(sched: PreemptingScheduler, owners: list[PagedRequest]) -> int:
    """Compute the prefix ``owners`` before round 1, as vLLM would have for earlier requests,
    and forget the steps that took: returns how many there were. A step that schedules
    nothing ends it (the owners left waiting do not fit: the caller says so)."""
    node = sched.node
    for owner in owners:
        node.add(owner)
    steps = 0
    while (node.waiting or node.running or node.future) and steps < MAX_WARMUP_STEPS:
        steps += 1
        if not sched.step().scheduled:
            break
    sched.round_no = 0
    node.finished.clear()
    return steps


def run(
    sched: PreemptingScheduler,
    requests: int,
    max_rounds: int = 10_000,
    *,
    on_step: Callable[[Step], None] | None = None,
) -> list[Step]:
    """Step until every one of the ``requests`` finished and released its KV (if it ever
    does), or nothing can change any more, or ``max_rounds``; ``on_step`` sees every step."""
    node, steps = sched.node, []
    for _ in range(max_rounds):
        step = sched.step()
        steps.append(step)
        if on_step is not None:
            on_step(step)
        done = len(node.finished) == requests
        if done and not any(r.release_rounds is not None for r in node.held):
            break
        if sched.idle(step):
            break
    return steps
