"""The waiting queue's order: the queue policy's priority, checked to be an int, and the order
every node and model looks at the queue in (when SGLang 0.5.23 refreshes the waiting requests'
prefixes is :mod:`policykit.kernel.between`'s)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cmp_to_key
from typing import Any

from policykit.errors import PolicyError
from policykit.kernel.blame import ask, describe
from policykit.kernel.domain import Numbers
from policykit.policy import QueuePolicy, QueueView


def queue_rank(policy: QueuePolicy, view: QueueView, request_id: str) -> int:
    """The queue policy's priority of a waiting request (lower goes first), checked to be an
    int: a sort on anything else would order the queue by accident, not by the policy."""
    rank = ask(policy, policy.priority, view, request_id)
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise PolicyError(
            f"{describe(policy, 'priority')} gave request {request_id!r} the priority {rank!r}; "
            "a priority "
            "is an int (lower goes first).",
            request_id=request_id,
        )
    return rank


# SGLang's planner, the node that preempts, both engine plugins and both checker models look at
# the waiting requests in one order: by the queue policy's priority, lower first, equal
# priorities in the queue's own order (arrival; the front for a request a node preempted).
# That is a stable sort by priority. Terms cannot be sorted, so the order is one comparison,
# :func:`goes_before`: the models turn it into facts, the nodes sort by it.
def goes_before(domain: Numbers, rank: Any, other_rank: Any, own_order: Any) -> Any:
    """Whether a request of priority ``rank`` goes before one of ``other_rank``, where
    ``own_order`` says whether it comes first in the queue's own order. ``rank`` None: the
    queue keeps its own order (``arrival_order``)."""
    if rank is None:
        return own_order
    return domain.any(rank < other_rank, domain.all(rank == other_rank, own_order))


def in_queue_order(domain: Numbers, items: list[Any], ranks: list[int]) -> list[Any]:
    """``items`` (in the queue's own order) ordered by :func:`goes_before` on their ``ranks``."""

    def compare(a: int, b: int) -> int:
        return -1 if goes_before(domain, ranks[a], ranks[b], a < b) else 1

    return [items[i] for i in sorted(range(len(items)), key=cmp_to_key(compare))]


def queue_order(
    domain: Numbers,
    policy: QueuePolicy,
    waiting: list[Any],
    rank: Callable[[Any], int],
    kept: dict[str, int] | None,
) -> tuple[list[Any], dict[str, int] | None]:
    """The order a round looks at ``waiting`` (in the queue's own order) under the queue
    policy, and the order to keep for a round that does not sort (None: the queue's own).

    A queue longer than the policy's ``sort_limit`` is not sorted: it keeps the order ``kept``
    from the last round that sorted, later arrivals behind in their own order, as SGLang's
    waiting list keeps its last in-place sort (which a round in arrival order leaves as it
    is). Both nodes order their queue here."""
    if policy.arrival_order:
        return waiting, kept
    if policy.sorts(len(waiting)):
        order = (
            in_queue_order(domain, waiting, [rank(r) for r in waiting])
            if len(waiting) > 1
            else waiting
        )
    elif kept is None:  # the last queue was in its own order, and so is this one
        order = waiting
    else:
        order = sorted(waiting, key=lambda r: kept.get(r.id, len(kept)))
    return order, None if order == waiting else {r.id: i for i, r in enumerate(order)}
