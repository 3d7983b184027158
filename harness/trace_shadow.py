"""Combos planned beside a replay on its own node, for as long as they plan exactly as it does.

A replay of a whole trace spends most of its time keeping the node's state: committing, caching
and evicting KV. Two combos that make the same decisions (:func:`decisions`) in every round
from the same state run the same replay, since nothing after the plan asks a policy: the node
commits the plan's entries, and the clock and the tally read them. So a replay can carry
*shadows*: each round, after the replayed combo (the leader) has planned, every shadow plans
the same round on the same node with a planner of its own; a shadow whose decisions differ,
or who raises, is dropped there and replayed on its own later. A shadow still attached at the
end provably had the leader's replay.

Why planning twice changes nothing: planning allocates nothing, and what it does touch (the
access times of the cached prefixes it matches, and the split of a node where a match ends) it
does for each request it looks at. Shadows share the leader's queue policy, so the same
decisions looked at the same requests in the same order and matched the same prefixes: the second
planner's touches keep the first's order and split nothing new. The planner state a queue
keeps between rounds (``lpm``'s last order) is each shadow's own.

What the scheduler decides outside the plan names the combo or asks its policies: failing a
request (a policy fault, a stuck in-progress request), the never-completes record, and the
starvation check of a drained round. A replay in which any of those happens drops every
shadow. So does a plugin with a ``policykit_round_start`` hook, which could change the leader's
ledger. Policies are taken to be functions of their views, as the checker takes them.
"""

from __future__ import annotations

from typing import Any

from policykit.errors import PolicyError, RequestFault
from policykit.node import PrefillNode
from policykit.plan import Plan
from policykit.planner import Planner
from policykit.plugin_manager import PolicykitPluginManager
from policykit.registry import Combo
from policykit.scheduler import RoundRecord, Scheduler


def decisions(plan: Plan) -> tuple[Any, ...]:
    """What of a plan the rest of a round reads: the entries the node commits and the
    requests refused (those rejected for good leave the queue). Not the ledger marks along
    the way (admission policies that decide alike can account differently) nor why admission
    stopped: the node, the clock and the tally never read them."""
    return plan.entries, plan.rejected


class Shadows:
    """The combos still planning as the leader does, and a hook on the leader's planner."""

    def __init__(self, node: PrefillNode, leader: Combo, combos: list[Combo]) -> None:
        if any(c.queue.spec != leader.queue.spec for c in combos):
            raise ValueError("a shadow shares the leader's queue policy")
        self.node = node
        self.planners = {str(c): (c, Planner(node, c)) for c in combos}

    @property
    def attached(self) -> list[Combo]:
        return [combo for combo, _ in self.planners.values()]

    def follow(self, scheduler: Scheduler, pm: PolicykitPluginManager | None) -> None:
        """Plan beside every plan the leader's planner makes (it plans again after a fault)."""
        if pm is not None and pm.hook.policykit_round_start.get_hookimpls():
            self.planners.clear()
            return
        lead = scheduler.planner.plan

        def plan(round_no: int, ledger: Any = None) -> Plan:
            made = lead(round_no, ledger)
            self.compare(round_no, made)
            return made

        scheduler.planner.plan = plan  # type: ignore[method-assign]  # the shadow compares each plan

    def compare(self, round_no: int, made: Plan) -> None:
        for name, (_, planner) in list(self.planners.items()):
            try:
                same = decisions(planner.plan(round_no)) == decisions(made)
            except (PolicyError, RequestFault):
                same = False
            if not same:
                del self.planners[name]

    def after_round(self, record: RoundRecord) -> None:
        """Drop every shadow when the scheduler decided outside the plan this round."""
        node = self.node
        drained = not record.plan.batch and node.chunked is None and not node.held
        if record.failed or (drained and node.waiting):
            self.planners.clear()

    def after_run(self, row: dict[str, Any], scheduler: Scheduler) -> list[Combo]:
        """The shadows the replay carried to its end; the hook comes off the leader's planner
        (it and the shadows' planners hold the node, which a replay must not keep alive)."""
        if row.get("never_completes") or row.get("starvation"):
            self.planners.clear()
        carried = self.attached
        scheduler.planner.__dict__.pop("plan", None)
        self.planners.clear()
        return carried
