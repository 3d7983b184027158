"""The scheduler loop: release, arrive, plan, commit, (forward), repeat.

A run ends by itself when nothing can change any more: the last round planned nothing, nobody
arrives later and no held KV is still due to be released. It also ends at the first
:class:`~policykit.errors.PrefillOutOfMemory`, like the engine it models.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policykit.errors import PrefillOutOfMemory
from policykit.ledger import Ledger
from policykit.node import PrefillNode
from policykit.plan import Entry, Plan
from policykit.planner import Observer, Planner
from policykit.plugin_manager import PolicykitPluginManager
from policykit.registry import Combo
from policykit.request import State

#: called after a plan is committed, with the plan and the node: the harness runs the model here
Forward = Callable[[Plan, PrefillNode], None]


@dataclass(frozen=True)
class OOMReport:
    round: int
    request: str | None
    tokens: int
    available: int
    message: str
    pool: str = "full"


@dataclass
class RoundRecord:
    """What happened in one round, for tables, JSON and metrics."""

    plan: Plan
    free_tokens_after: int
    evictable_tokens_after: int
    swa_free_tokens_after: int | None
    released: list[str]
    arrived: list[str]
    plan_seconds: float
    round_seconds: float

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        out: dict[str, Any] = {
            "round": p.round,
            "batch": [
                {
                    "id": e.request_id,
                    "start": e.start,
                    "end": e.end,
                    "kind": e.kind.value,
                    "tokens": e.tokens,
                    "cached": e.cached,
                    "load_back": e.load_back,
                }
                for e in p.entries
            ],
            "rejected": [{"id": r.request_id, "verdict": r.verdict} for r in p.rejected],
            "ledger": [
                {
                    "after": m.request_id,
                    "rem_total_tokens": m.rem_total_tokens,
                    "cur_rem_tokens": m.cur_rem_tokens,
                    "rem_chunk_tokens": m.rem_chunk_tokens,
                }
                for m in p.marks
            ],
            "stop": p.stop,
            "baseline": p.baseline,
            "free_tokens_after": self.free_tokens_after,
            "evictable_tokens_after": self.evictable_tokens_after,
            "released": self.released,
            "arrived": self.arrived,
        }
        if self.swa_free_tokens_after is not None:
            out["swa_free_tokens_after"] = self.swa_free_tokens_after
        return out


@dataclass
class RunResult:
    combo: Combo
    rounds: list[RoundRecord] = field(default_factory=list)
    oom: OOMReport | None = None
    completed: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    starved: dict[str, int] = field(default_factory=dict)
    stopped_by: str = "idle"

    def to_dict(self) -> dict[str, Any]:
        return {
            "combo": self.combo.as_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
            "oom": None if self.oom is None else self.oom.__dict__.copy(),
            "completed": self.completed,
            "pending": self.pending,
            "rejected": [{"id": k, "reason": v} for k, v in self.rejected.items()],
            "starved": [{"id": k, "waited_rounds": v} for k, v in self.starved.items()],
            "stopped_by": self.stopped_by,
        }


class _HookObserver(Observer):
    def __init__(self, pm: PolicykitPluginManager | None) -> None:
        self.pm = pm
        self.round_no = 0

    def admit(self, request_id: str, entry: Entry, ledger: Ledger) -> None:
        if self.pm is not None:
            self.pm.hook.policykit_admit(
                round_no=self.round_no, request_id=request_id, entry=entry, ledger=ledger
            )

    def reject(self, request_id: str, verdict: str, ledger: Ledger) -> None:
        if self.pm is not None:
            self.pm.hook.policykit_reject(
                round_no=self.round_no, request_id=request_id, verdict=verdict, ledger=ledger
            )


class Scheduler:
    """Drives a :class:`PrefillNode` round by round under one :class:`Combo`."""

    def __init__(
        self,
        node: PrefillNode,
        combo: Combo,
        *,
        pm: PolicykitPluginManager | None = None,
        forward: Forward | None = None,
        starvation_rounds: int = 1000,
    ) -> None:
        self.node = node
        self.combo = combo
        self.pm = pm
        self.forward = forward
        self.starvation_rounds = starvation_rounds
        self._observer = _HookObserver(pm)
        self.planner = Planner(node, combo, self._observer)
        self.round_no = 0
        self.result = RunResult(combo)
        self._serving = False

    def start_serving(self) -> None:
        """The init -> serving boundary: the node is built, no round has run yet.

        The allocator-phase policy switches allocator settings here (seed 002); called by
        :meth:`run`, or earlier by a harness that allocates more static buffers first.
        """
        if not self._serving:
            self._serving = True
            self.combo.allocator_phase.on_serving()

    def step(self) -> RoundRecord:
        """Run one round. Raises :class:`PrefillOutOfMemory` when the batch cannot be placed;
        the round is recorded (with its plan) before the error propagates."""
        node = self.node
        self.round_no += 1
        r = self._observer.round_no = self.round_no
        t0 = time.perf_counter()
        released = [q.id for q in node.release_due(r)]
        arrived = [q.id for q in node.arrive(r)]
        ledger = self.planner.open_ledger()
        if self.pm is not None:
            self.pm.hook.policykit_round_start(round_no=r, ledger=ledger)
        t1 = time.perf_counter()
        plan = self.planner.plan(r, ledger)
        t2 = time.perf_counter()
        record = RoundRecord(plan, 0, 0, None, released, arrived, t2 - t1, 0.0)
        self.result.rounds.append(record)
        try:
            node.commit(plan)
            if self.forward is not None and plan.batch:
                self.forward(plan, node)
        finally:
            record.free_tokens_after = node.pool.free_tokens
            record.evictable_tokens_after = node.cache.evictable_tokens
            if node.swa_pool is not None:
                record.swa_free_tokens_after = node.swa_pool.free_tokens
            record.round_seconds = time.perf_counter() - t0
        if self.pm is not None:
            self.pm.hook.policykit_round_end(round_no=r, plan=plan)
        return record

    def idle(self, record: RoundRecord) -> bool:
        """Nothing can change any more after this round."""
        node = self.node
        return not record.plan.batch and not node.future and not node.pending_releases()

    def run(
        self, max_rounds: int = 100_000, *, on_round: Callable[[RoundRecord], None] | None = None
    ) -> RunResult:
        result = self.result
        self.start_serving()
        try:
            while self.round_no < max_rounds:
                record = self._step_or_oom()
                if record is None:
                    break
                if on_round is not None:
                    on_round(record)
                if self.idle(record):
                    result.stopped_by = "idle"
                    break
            else:
                result.stopped_by = "max_rounds"
        finally:
            self._summarise()
        return result

    def _step_or_oom(self) -> RoundRecord | None:
        try:
            return self.step()
        except PrefillOutOfMemory as err:
            self.result.oom = OOMReport(
                round=self.round_no,
                request=err.request,
                tokens=err.tokens,
                available=err.available + err.evictable,
                message=err.message,
                pool=err.pool,
            )
            self.result.stopped_by = "oom"
            if self.pm is not None:
                self.pm.hook.policykit_oom(round_no=self.round_no, error=err)
            return None

    def _summarise(self) -> None:
        result, node = self.result, self.node
        result.completed = [
            q.id for q in node.requests.values() if q.state in (State.HELD, State.DONE)
        ]
        result.pending = [
            q.id
            for q in node.requests.values()
            if q.state in (State.WAITING, State.CHUNKED, State.FUTURE)
        ]
        result.rejected = {
            q.id: q.reason or "" for q in node.requests.values() if q.state is State.REJECTED
        }
        for q in node.requests.values():
            if (
                q.state is State.WAITING
                and self.round_no - q.arrival_round >= self.starvation_rounds
            ):
                result.starved[q.id] = self.round_no - q.arrival_round
