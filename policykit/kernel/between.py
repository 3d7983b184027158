"""Between rounds: what a node does after a round is planned and before the next one looks at
its queue, written once for SGLang's node, the node that preempts and both checker models.

Each rule used to be stated by every node and model its own way, and the copies drifted (the
release of held KV came one round apart between the nodes). Here each is one function over a
number domain's logic (:class:`~policykit.kernel.domain.Logic`): the nodes ask it on ints about the
request they hold, the models on terms about every request at once. Truth values come in as
sequences where a model spells one condition as several facts, so that a model's formula is
the flat conjunction it always was (the checker's budgets depend on the formula's shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policykit.kernel.domain import Logic, is_int

#: SGLang 0.5.23's ``WAITING_PREFIX_REFRESH_INTERVAL``: sorts of a non-empty queue between two
#: refreshes of the waiting requests' prefixes (``Scheduler._refresh_waiting_prefixes``)
WAITING_PREFIX_REFRESH_INTERVAL = 32
#: SGLang 0.5.23's ``WAITING_QUEUE_PREFIX_MATCH_MAX``: a refresh touches this many, from the head
WAITING_PREFIX_REFRESH_MAX = 128


def kv_back(finished: Any, delay: Any, round_no: Any) -> Any:
    """Whether the KV of a request that finished in round ``finished``, its transfer to decode
    taking ``delay`` rounds, is free for round ``round_no`` to plan with. SGLang's node frees it
    as that round starts, the node that preempts as the round before ends (asking for
    ``round_no + 1``), so both give it back to round ``finished + delay``, and to the next round
    where ``delay`` is 0 or 1. Numbers of any kind: ints, or terms (the checker's models)."""
    return finished + delay <= round_no


def kv_due(domain: Logic, finished: Any, released: Sequence[Any], never: Any) -> Any:
    """Whether a request holds KV that will still come back: it finished (``finished``, its
    round, is past 0), none of ``released`` says its KV went back already (a model keeps the
    rounds before and this one apart), and the node releases KV at all (``never``: a node whose
    transfers never complete, ``kv_release_rounds`` None)."""
    return domain.all(finished > 0, *(domain.not_(r) for r in released), domain.not_(never))


def stuck(domain: Logic, computed: Any, due: Any, in_progress: Sequence[Any]) -> Any:
    """The stuck-request valve: the request in progress (``in_progress``: the facts that say a
    request is that one) fails when nothing was computed this round and no held KV is ``due``
    back. Memory comes back only through a release, so the next round would see the same
    ledger and defer it again, forever, while its KV blocks the queue behind it."""
    return domain.all(domain.not_(computed), domain.not_(due), *in_progress)


def drained(domain: Logic, busy: Sequence[Any], holding: Sequence[Any]) -> Any:
    """A node with nothing in progress (none of ``busy``) and no request holding KV (none of
    ``holding``, due back or not): a round on it starts from the whole pool."""
    return domain.all(*(domain.not_(b) for b in busy), *(domain.not_(h) for h in holding))


def starves(domain: Logic, drained: Any, could_start: Sequence[Any], placed: Sequence[Any]) -> Any:
    """The ``no-starvation`` failure: a round on a ``drained`` node placed nothing (none of
    ``placed``) while a waiting request that an idle node would start waits (one of
    ``could_start``). With nothing running nothing changes before the next round looks at the
    queue again, so the queue stays stopped in front of it."""
    return domain.all(drained, domain.any(*could_start), domain.not_(domain.any(*placed)))


def reclaimable(domain: Logic, baseline: Any, due: Sequence[Any], gives: Sequence[Any]) -> Any:
    """The most a node can ever have free again: ``baseline`` (free plus evictable now) plus
    what each request whose KV is ``due`` back ``gives`` when it comes back. New admissions only
    borrow from it, so nothing can ever raise it: an in-progress request that owes more than
    this never completes (:func:`policykit.liveness.never_completes`)."""
    return baseline + sum(domain.choose(d, g, 0) for d, g in zip(due, gives, strict=True))


def refresh_due(domain: Logic, sorts: Any, round_no: int) -> Any:
    """SGLang 0.5.23 refreshes the waiting requests' cached prefixes on the first sort of a
    non-empty queue and on every :data:`WAITING_PREFIX_REFRESH_INTERVAL`-th after; ``sorts``
    such sorts came before round ``round_no`` (at most one a round, so fewer than
    ``round_no``), which is what bounds the multiples a term is compared with. A count that is
    an int is one remainder away (the same rule in one step: comparing it with every multiple
    below the round made a node's long run quadratic)."""
    if is_int(sorts):
        return sorts % WAITING_PREFIX_REFRESH_INTERVAL == 0
    return domain.any(*(sorts == k for k in range(0, round_no, WAITING_PREFIX_REFRESH_INTERVAL)))
