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
    instead; with equal priorities (a scenario has no field for them) that is the same request,
    since the running list stays in arrival order. The requester itself can be the victim:
    then it waits, and vLLM stops serving running requests this step.
    """

    name = "vllm"

    def victim_rank(self, v: PreemptView) -> int:
        return v.position


@hookimpl
def policykit_register_policies(register):
    register(NoPreemption)
    register(VllmPreemption)
