"""Hook specifications: how a plugin talks to policykit.

One registration hook adds policies; the others observe the scheduler. Observers are called on
every registered plugin and their return values are ignored, so tracing and metrics plugins can
stack. No hook is ``firstresult``: the scheduler never asks a plugin *which* policy to use at run
time, it resolves the combo once, before the first round.

A plugin module looks like::

    import policykit

    @policykit.hookimpl
    def policykit_register_policies(register):
        register(MyAdmission)

The observers fire on both kinds of node, with the same arguments. On SGLang's node a round
plans against its ledger, commits the plan and allocates. On a node that preempts (vLLM's v1
scheduler, a combo whose preemption policy preempts) a step allocates each chunk's blocks as it
schedules it: ``policykit_round_start``, ``policykit_admit`` (every running or waiting request
that gets a chunk, in scheduling order), ``policykit_reject`` (the waiting request that stopped
the queue), ``policykit_round_end`` (the step's plan) and ``policykit_preempt`` fire there. Its
``ledger`` is a snapshot, not a planning ledger: vLLM promises nothing beyond what it has
allocated, so the baseline is the free blocks (cached ones included, as SGLang's free +
evictable), both offsets are zero and ``rem_chunk_tokens`` is the step's token budget left. A
request already admitted in a step and then preempted in the same step gets
``policykit_admit`` then ``policykit_preempt``, and is not in the step's plan.
``policykit_oom`` never fires there: that node does not run out of memory, it preempts (a
request that never completes is ``simulate``'s exit 3 on either node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from policykit.errors import PrefillOutOfMemory
    from policykit.ledger import Ledger
    from policykit.plan import Plan
    from policykit.policy import Policy

PROJECT = "policykit"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def policykit_register_policies(register: Callable[[type[Policy]], None]) -> None:
    """Register policy classes by calling ``register(PolicyClass)`` once for each."""


@hookspec
def policykit_round_start(round_no: int, ledger: Ledger) -> None:
    """A planning round opened its ledger."""


@hookspec
def policykit_admit(round_no: int, request_id: str, entry: Any, ledger: Ledger) -> None:
    """A request got a chunk in this round's plan (``entry``: a :class:`~policykit.plan.Entry`;
    on a node that preempts, ``entry.cached`` is a new request's prefix-cache hit)."""


@hookspec
def policykit_reject(round_no: int, request_id: str, verdict: str, ledger: Ledger) -> None:
    """A waiting request was looked at and not admitted (``NO_TOKEN`` or ``OTHER``; on a node
    that preempts: ``NO_TOKEN`` when admission refused it or its blocks do not fit, ``OTHER``
    when the chunking policy gave it no tokens)."""


@hookspec
def policykit_round_end(round_no: int, plan: Plan) -> None:
    """A round's plan was committed and its KV allocated."""


@hookspec
def policykit_preempt(round_no: int, request_id: str, victim_id: str) -> None:
    """A running request (``victim_id``) gave its KV back so ``request_id``'s chunk could be
    allocated: on a node that preempts (vLLM's), the recomputation it causes is the cost a
    tracing plugin wants to see, and a run of these without progress is a livelock."""


@hookspec
def policykit_oom(round_no: int, error: PrefillOutOfMemory) -> None:
    """Allocation failed: the simulated engine crashes at this round (SGLang's node only: a
    node that preempts takes blocks back instead)."""
