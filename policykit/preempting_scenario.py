"""A scenario on a node that preempts: its requests, its pool and its state before round 1.

The pool is the scenario's ``free_tokens + evictable_tokens`` plus its pinned device prefixes
and the in-progress request's own KV, in blocks of ``page_size``
(:func:`policykit.scenario.pool_tokens`). Its state at round 1 is reached the way vLLM would
reach it, by running the earlier requests :mod:`policykit.preempting_layout` writes down
(filler, then each device prefix alone, then the request in progress) on the node itself,
under :data:`LAYOUT_COMBO` whatever the combo under test: the free queue's order then is the
one vLLM's would have. ``policykit conformance vllm`` replays the same history on vLLM's real
scheduler (docs/conformance-vllm.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from policykit import preempting_layout
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
from policykit.preempting_layout import OWNER, InProgress, Warm
from policykit.registry import Combo, builtin_registry
from policykit.scenario import _ID_STRIDE, Scenario, pool_tokens
from policykit.tokens import TokenRuns

__all__ = ["OWNER", "pool_blocks", "prepare", "refuse_unmappable", "run", "warm_up"]

#: the combo the layout's requests run under, whatever the combo under test: vLLM's, each
#: request alone (so no threshold applies) and admitted on its first chunk (the request in
#: progress is running because the scenario says so, not by an admission under test)
LAYOUT_COMBO = "vllm-no-reserve/vllm/none/default/fcfs/vllm"
#: the filler's blocks: keys no scenario request's block has
_FILLER_KEY = -1


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
    idle = [
        r.id for r in scenario.requests if r.chunked and r.computed_tokens == r.device_prefix_tokens
    ]
    if idle:
        raise ScenarioError(
            f"scenario {name!r}: the in-progress request {idle[0]!r} has computed nothing "
            "beyond its device prefix ('computed_tokens' equals 'device_prefix_tokens'), a "
            "state vLLM never holds: its scheduler admits a request together with its first "
            "chunk, so a running request has always computed at least one token past its "
            "prefix-cache hit (one that has not is waiting, its prefix merely cached). Give it "
            "a 'computed_tokens' above its prefix, or let it arrive at round 0 instead."
        )


def pool_blocks(scenario: Scenario) -> int:
    """Usable blocks: free + evictable + pinned device prefixes + the in-progress request's
    own KV."""
    return pool_tokens(scenario) // scenario.config.page_size


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
    """A scheduler for ``scenario`` under ``combo``, its node brought to the scenario's round-1
    state, and the steps that took (not rounds of the scenario: round 1 comes next). The block
    pool lives on ``device`` and holds K/V of ``layout`` when one is given; ``forward`` runs
    every step, the layout's too, so the cached KV is real. ``pm``'s hooks see the scenario's
    rounds only."""
    refuse_unmappable(scenario)
    page = scenario.config.page_size
    config = PreemptingConfig(page, scenario.config.chunked_prefill_size, max_running)
    node = PreemptingNode(config, pool_blocks(scenario), device=device, layout=layout)
    steps = _lay_out(node, scenario, forward)
    sched = PreemptingScheduler(node, combo, pm=pm, forward=forward)
    for index, spec in enumerate(scenario.requests):
        if not spec.chunked:
            node.add(_request(scenario, index, spec.arrival_round))
    return sched, steps


def _request(scenario: Scenario, index: int, arrival: int) -> PagedRequest:
    """Scenario request ``index`` as the node holds it."""
    spec = scenario.requests[index]
    keys = _keys(index, spec.prompt_tokens, scenario.config.page_size)
    tokens = _tokens(index, spec.prompt_tokens)
    release = scenario.config.kv_release_rounds
    return PagedRequest(spec.id, spec.prompt_tokens, arrival, keys, release, tokens=tokens)


def _warm_request(scenario: Scenario, warm: Warm) -> PagedRequest:
    """One of the layout's earlier requests: a device prefix's owner (the request's first
    tokens) or a piece of filler (tokens and blocks of no scenario request)."""
    page, release = scenario.config.page_size, None if warm.keep else 1
    if warm.request is None:
        keys = tuple((_FILLER_KEY, (warm.first + at) // page) for at in range(0, warm.tokens, page))
        tokens = TokenRuns.span(warm.first, warm.tokens)
    else:
        keys = _keys(warm.request, warm.tokens, page)
        tokens = _tokens(warm.request, warm.tokens)
    return PagedRequest(warm.id, warm.tokens, 0, keys, release, tokens=tokens)


def _layout_scheduler(node: PreemptingNode, forward: Forward | None) -> PreemptingScheduler:
    """A scheduler on ``node`` that runs the layout's requests (no hooks: they are not rounds
    of the scenario)."""
    return PreemptingScheduler(node, builtin_registry().resolve(LAYOUT_COMBO), forward=forward)


def _lay_out(node: PreemptingNode, scenario: Scenario, forward: Forward | None) -> int:
    """Run the history :func:`policykit.preempting_layout.layout` writes down on ``node``;
    return the steps it took. A history the pool cannot hold is the scenario's fault."""
    plan = preempting_layout.layout(scenario)
    sched = _layout_scheduler(node, forward)
    steps = 0
    for warm in plan.warm:
        request = _warm_request(scenario, warm)
        steps += _alone(sched, request)
        if request.finished_round is None:
            raise ScenarioError(
                f"scenario {scenario.name!r}: the pool cannot hold the cached content and "
                f"device prefixes it describes ({request.id!r} does not fit)."
            )
    if plan.in_progress is not None:
        steps += _start_in_progress(sched, scenario, plan.in_progress)
    node.finished.clear()
    return steps


def _alone(sched: PreemptingScheduler, request: PagedRequest) -> int:
    """Run ``request`` alone until it finishes (its blocks freed unless it holds them for good)
    or a step schedules nothing; return the steps it took."""
    sched.node.add(request)
    steps = 0
    while request.finished_round is None:
        steps += 1
        if request.id not in sched.step().scheduled:
            break
    return steps


def _start_in_progress(sched: PreemptingScheduler, scenario: Scenario, going: InProgress) -> int:
    """Admit the request in progress alone and compute its warm-up chunks, one step each with
    the step budget set to the chunk, leaving it running; return the steps it took."""
    node, config = sched.node, sched.node.config
    request = _request(scenario, going.request, 0)
    node.add(request)
    chunks = going.chunks(config.budget)
    try:
        for chunk in chunks:
            node.config = dataclasses.replace(config, budget=chunk)
            if sched.step().scheduled.get(request.id) != chunk:
                raise ScenarioError(
                    f"scenario {scenario.name!r}: the in-progress request {request.id!r} does "
                    f"not fit the pool with its {going.computed} computed tokens."
                )
    finally:
        node.config = config
    return len(chunks)


def warm_up(sched: PreemptingScheduler, owners: list[PagedRequest]) -> int:
    """Compute the prefix ``owners`` before round 1, one after another, each alone under
    :data:`LAYOUT_COMBO` (as vLLM would have for earlier requests, whatever ``sched``'s combo),
    and forget the steps that took: returns how many there were. An owner that a step does not
    schedule ends it (it and those after it do not fit: the caller says so)."""
    layout_sched = _layout_scheduler(sched.node, sched.forward)
    steps = 0
    for at, owner in enumerate(owners):
        steps += _alone(layout_sched, owner)
        if owner.finished_round is None:
            for later in owners[at + 1 :]:
                sched.node.add(later)
            break
    sched.node.finished.clear()
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
        if done and not node.pending_releases():
            break
        if sched.idle(step):
            break
    return steps
