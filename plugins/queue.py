"""Built-in waiting-queue policies: the order requests are looked at, and head-of-line rules.

SGLang 0.5.23's scheduler (``Scheduler._get_new_batch_prefill_raw``) walks its waiting queue
in the order its ``SchedulePolicy`` sorted it and stops at the first request ``PrefillAdder``
refuses: a request at the head that can never fit blocks every request behind it, in every
round (the class of SGLang issue #31205; vLLM #39734 is the same class). ``fcfs`` and ``lpm``
reproduce that; ``fcfs-skip`` is policykit's extension that rejects such a request for good.
"""

from __future__ import annotations

from policykit import hookimpl
from policykit.policy import QueuePolicy, QueueView


class FcfsQueue(QueuePolicy):
    """Arrival order; a refused request stops the queue (SGLang 0.5.23's ``fcfs``).

    Upstream's behaviour: a request that can never fit stays at the head and every request
    behind it waits forever (``policykit check`` reports it under ``no-starvation``).
    """

    name = "fcfs"
    arrival_order = True

    def priority(self, v: QueueView) -> int:
        return 0


class FcfsSkipQueue(QueuePolicy):
    """Arrival order; a request that can never fit is rejected for good (policykit's extension).

    A refused request that an idle node would still refuse (``Planner.never_fits``) is
    rejected with ``NEVER`` and the planner looks at the next one; any other refusal stops
    the queue as upstream's does. Not upstream behaviour: the default of policykit's combos.
    """

    name = "fcfs-skip"
    skips_never_fitting = True
    arrival_order = True

    def priority(self, v: QueueView) -> int:
        return 0


class LongestPrefixQueue(QueuePolicy):
    """Longest cached prefix first; a refused request stops the queue (SGLang 0.5.23's ``lpm``).

    Upstream sorts by ``-num_matched_prefix_tokens`` (the device match plus the host hit)
    with a stable sort. Above 128 waiting requests it does not sort at all (its
    ``_determine_active_policy`` returns ``fcfs`` when ``len(waiting_queue) >
    WAITING_QUEUE_PREFIX_MATCH_MAX``, 128): the queue keeps its last sort's order, new
    arrivals at the back, no prefix is matched for the order, and the periodic refresh of
    waiting prefixes that ``fcfs`` does runs instead; ``sort_limit`` reproduces all of that.
    Not reproduced: its in-batch prefix caching, which moves waiting requests that share a
    short prefix with each other to the back; its sort of the previous round's order (here
    equal matches keep arrival order); and its count of a host hit too short to load back
    (under 10 tokens), or of a match capped one token short of the prompt. In SGLang under the
    policykit plugin, ``lpm`` orders as described here.
    """

    name = "lpm"
    sort_limit = 128

    def priority(self, v: QueueView) -> int:
        return -(v.prefix_tokens + v.host_prefix_tokens)


class PriorityQueue(QueuePolicy):
    """The engine's request priority, lower first (vLLM 0.33.0's ``--scheduling-policy priority``).

    vLLM's ``PriorityRequestQueue`` is a heap of requests ordered by ``Request.__lt__``:
    priority, then ``arrival_time``, then ``request_id``. A rank here is one int, so this
    policy ranks by priority alone and leaves the rest to the queue's order among equal ranks:
    under a priority engine the vLLM integration keeps its waiting queue in vLLM's arrival
    order (``arrival_time``, then ``request_id``; a preempted request goes back to its place
    there, as in the heap, not to the front), so the whole order is the heap's, ties included.
    Where requests carry no priority (SGLang, policykit's own nodes) every rank is 0 and this
    is the node's own fcfs order.
    """

    name = "priority"
    #: the checker's model has no priorities or arrival times, and policykit's nodes give
    #: none: every enumerated verdict would be a refusal
    enumerated = False
    #: only the vLLM integration gives priorities, and it runs on vLLM's kind of node; on
    #: SGLang's node (its own priority scheduling is not this) it would be fcfs under a new name
    preempting_only = True

    def priority(self, v: QueueView) -> int:
        return v.priority


@hookimpl
def policykit_register_policies(register):
    register(FcfsQueue)
    register(FcfsSkipQueue)
    register(LongestPrefixQueue)
    register(PriorityQueue)
