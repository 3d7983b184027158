"""Built-in preemption policies: which running request gives its KV back.

Only a node that preempts asks (vLLM 0.33.0's v1 scheduler, :mod:`policykit.preempting`).
``none`` is the default and says the node never preempts: SGLang's nodes, whose ledger must
keep every running chunk allocatable instead, so a combo with it is planned by the ledger
planner as before.
"""

from __future__ import annotations

from policykit.hookspecs import hookimpl
from policykit.policy import PreemptionPolicy, PreemptView


class NoPreemption(PreemptionPolicy):
    """The node never preempts (SGLang 0.5.23's; the default).

    The combo runs on the ledger planner: what a running chunk will need is promised when the
    request enters, and a broken promise is an out-of-memory crash, not a preemption.
    """

    name = "none"
    preempts = False

    def victim_rank(self, v: PreemptView) -> int:
        return 0


class VllmPreemption(PreemptionPolicy):
    """vLLM 0.33.0: preempt the request admitted last (``running[-1]``).

    With ``--scheduling-policy priority`` vLLM takes the lowest-priority, latest-arriving one
    instead: ``vllm-priority``. The requester itself can be the victim: then it waits, and
    vLLM stops serving running requests this step.
    """

    name = "vllm"

    def victim_rank(self, v: PreemptView) -> int:
        return v.position


class VllmPriorityPreemption(PreemptionPolicy):
    """vLLM 0.33.0 with ``--scheduling-policy priority``: the least important, latest arrival.

    vLLM takes ``max(running, key=lambda r: (r.priority, r.arrival_time))``: the highest
    priority value (lower is served first), then the latest arrival; Python's ``max`` keeps the
    first of equal keys, so on a full tie the one earlier in the running list. The node prefers
    the later of equal ranks, so the rank orders by ``(priority, arrival, -position)`` in one
    int: ``arrival`` and ``position`` are both below ``running_requests``, so each part fits
    under the one before it. Only the vLLM integration gives priorities and arrival stamps
    (``running_requests`` > 0); a node that gives none is refused rather than ranked by a
    stand-in order.
    """

    name = "vllm-priority"
    #: the checker's model has no priorities or arrival times, and policykit's nodes give
    #: none: every enumerated verdict would be a refusal
    enumerated = False

    def victim_rank(self, v: PreemptView) -> int:
        n = v.running_requests
        if n < 1:
            raise ValueError(
                "this node gives no request priorities or arrival stamps (only the vLLM "
                "integration does), so vLLM's priority victim cannot be told"
            )
        return (v.priority * n + v.arrival) * n + (n - 1 - v.position)


@hookimpl
def policykit_register_policies(register):
    register(NoPreemption)
    register(VllmPreemption)
    register(VllmPriorityPreemption)
