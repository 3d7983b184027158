"""The waiting queue's order inside SGLang 0.5.23: the combo's queue policy sorts it.

SGLang sorts its waiting queue once per round, in place, in
``sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority``, just before the scheduler
builds the round's ``PrefillAdder`` and walks the queue in that order. The plugin wraps that one
method (``AROUND``): the combo's queue policy replaces SGLang's ``--schedule-policy``, and the
queue ends up in the order ``policykit simulate`` looks at it, by
:meth:`~policykit.policy.QueuePolicy.priority` (lower first) with arrival order among equals.

The policy also owns what the sort costs the prefix cache. Matching a request's prefix touches
its nodes in the LRU, so a queue sorted by cached prefix keeps waiting prefixes from being
evicted. A policy that reads prefixes (``lpm``) has every waiting request matched, in arrival
order, as policykit's planner matches them; one that keeps arrival order (``fcfs``,
``fcfs-skip``) matches nothing, even under a cache-aware ``--schedule-policy`` whose matching
would have changed which prefixes eviction takes. Only when SGLang's policy keeps arrival order
as well (``fcfs`` without priority scheduling, its default) does upstream's own call run
unchanged, so that the upstream-faithful combo changes nothing.

A queue longer than the policy's ``sort_limit`` (``lpm``: 128, upstream's own limit) is not
sorted: it keeps the order the last sort left, new arrivals at the back, as upstream's does.

Arrival is numbered by the plugin, the first time it sees a request, in the order of the queue
as it finds it: the scheduler appends new requests at the end, so that is the order they came
in, and unlike a timestamp it has no ties.

What the engine does not do is the head-of-line rule of ``skips_never_fitting``: a request
``PrefillAdder`` refuses still ends SGLang's round (its scheduler loop, not a ``PrefillAdder``
method, breaks there), so ``fcfs-skip`` orders like ``fcfs`` and a never-fitting head waits.
The plugin says so at start-up (:func:`policykit.integrations.sglang.startup.queue_line`).

A ``priority`` that raises or is not an int is logged by :mod:`.guard`, and upstream's own
``calc_priority`` orders that round.
"""

from __future__ import annotations

import itertools
from functools import cache
from typing import Any

from policykit import kernel
from policykit.host_tier import LOAD_BACK_THRESHOLD
from policykit.integrations.sglang import guard, hooks
from policykit.integrations.sglang.guard import FALLBACK
from policykit.integrations.sglang.views import queue_view

SCHEDULE_POLICY = "sglang.srt.managers.schedule_policy.SchedulePolicy"
ORDER = f"{SCHEDULE_POLICY}.calc_priority"
#: set on a request the first time the hook sees it: its place in arrival order
ARRIVAL = "policykit_arrival"

_arrivals = itertools.count()


@cache
def _upstream() -> tuple[Any, Any]:
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy
    from sglang.srt.mem_cache.common import match_kv_cache

    return CacheAgnosticPolicy.FCFS, match_kv_cache


def keeps_arrival_order(schedule: Any) -> bool:
    """Whether upstream's own sort leaves the queue in arrival order (``fcfs``, no priorities)."""
    return schedule.policy is _upstream()[0] and not schedule.enable_priority_scheduling


def order_queue(original: Any, schedule: Any, waiting_queue: list, *args: Any, **kw: Any) -> Any:
    """AROUND ``calc_priority``: the combo's queue policy orders the waiting queue."""
    combo = hooks.active()
    if combo is None:
        return original(schedule, waiting_queue, *args, **kw)
    policy = combo.queue
    if policy.arrival_order and keeps_arrival_order(schedule):
        return original(schedule, waiting_queue, *args, **kw)
    for req in waiting_queue:
        if ARRIVAL not in req.__dict__:
            req.__dict__[ARRIVAL] = next(_arrivals)
    if not policy.arrival_order and not policy.sorts(len(waiting_queue)):
        return _keep_order(original, schedule, waiting_queue, *args, **kw)
    waiting_queue.sort(key=_arrival)
    if policy.arrival_order:
        return None
    ranks = _ranks(policy, schedule.tree_cache, waiting_queue)
    if ranks is None:
        return original(schedule, waiting_queue, *args, **kw)
    # (ties keep arrival order)
    ranked = [ranks[id(req)] for req in waiting_queue]
    waiting_queue[:] = kernel.in_queue_order(kernel.Ints(combo), waiting_queue, ranked)
    return None


def _keep_order(original: Any, schedule: Any, waiting_queue: list, *args: Any, **kw: Any) -> Any:
    """A queue over the policy's ``sort_limit`` keeps its order (the last sort's, arrivals
    behind). Upstream's own call does exactly that, touching the waiting prefixes as ``fcfs``
    does, when its policy leaves such a queue unsorted (``fcfs`` without priorities, or
    ``lpm``/``hrrn`` over their own limit); otherwise the queue is left as it is."""
    policy = schedule._determine_active_policy(waiting_queue)
    unsorted = policy is _upstream()[0] and (
        schedule.policy is not policy or not schedule.enable_priority_scheduling
    )
    return original(schedule, waiting_queue, *args, **kw) if unsorted else None


def _arrival(req: Any) -> int:
    return req.__dict__[ARRIVAL]


def _ranks(policy: Any, cache_: Any, waiting_queue: list) -> dict[int, int] | None:
    """Each request's priority, keyed by ``id``, its prefix matched first (in queue order, as
    the planner does); None if one answer failed."""
    match = _upstream()[1]
    page = cache_.page_size
    threshold = getattr(cache_, "load_back_threshold", LOAD_BACK_THRESHOLD)
    ranks: dict[int, int] = {}
    for req in waiting_queue:
        match(req, cache_)
        host = req.host_hit_length
        view = queue_view(
            prompt_tokens=len(req.origin_input_ids) + len(req.output_ids),
            prefix_tokens=req.prefix_len,
            host_prefix_tokens=host if host >= threshold else 0,
            page_size=page,
        )
        rank = guard.rank(policy, view, req)
        if rank is FALLBACK:
            return None
        ranks[id(req)] = rank
    return ranks
