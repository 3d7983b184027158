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

from policykit import kernel
from policykit.errors import ComboError, PolicyError, PrefillOutOfMemory, RequestFault
from policykit.fairness import OvertakenBeyond, Overtaking, RoundSeen
from policykit.kernel import WAITING_PREFIX_REFRESH_MAX
from policykit.ledger import Ledger
from policykit.liveness import never_completes, owed_tokens
from policykit.node import PrefillNode
from policykit.plan import NEVER, Entry, EntryKind, Plan, Rejection
from policykit.planner import Observer, Planner, describe
from policykit.plugin_manager import PolicykitPluginManager
from policykit.registry import Combo
from policykit.request import Request, State

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


@dataclass(frozen=True)
class NeverCompletes:
    """An admitted request that can never complete: the failure ``admitted-completes`` names.

    ``cause`` is ``"memory"`` when what the request still owes (``owed`` slots) is more than
    the node can ever have free again (``reclaimable``: free + evictable + the KV of held
    requests still due back), ``"stuck"`` when the scheduler failed it for waiting forever, or
    ``"policy-error"`` when a policy of the combo broke its contract while deciding on it.
    """

    round: int
    request: str
    cause: str
    owed: int
    reclaimable: int
    message: str


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
    #: requests failed this round (a policy or load-back fault), in order
    failed: list[str] = field(default_factory=list)

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
            "failed": self.failed,
        }
        if self.swa_free_tokens_after is not None:
            out["swa_free_tokens_after"] = self.swa_free_tokens_after
        return out


@dataclass
class Starvation:
    """A waiting request that waits forever although an idle node would admit it: the failure
    ``no-starvation`` names. The node is drained (nothing in progress, no KV held) and nothing
    was planned, because the queue stops at ``head`` every round (a queue policy that does not
    skip a request that can never fit, as upstream's ``fcfs``)."""

    round: int
    request: str
    head: str | None
    message: str


@dataclass
class RunResult:
    combo: Combo
    rounds: list[RoundRecord] = field(default_factory=list)
    oom: OOMReport | None = None
    #: the first admitted request found unable to ever complete (or None)
    never_completes: NeverCompletes | None = None
    #: the first waiting request found to wait forever on a drained node (or None)
    starvation: Starvation | None = None
    completed: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: requests failed because a policy raised, answered with the wrong type or broke its
    #: contract (a subset of ``failed``; a load-back fault is the runtime's, not listed here)
    policy_faults: dict[str, str] = field(default_factory=dict)
    starved: dict[str, int] = field(default_factory=dict)
    #: requests an idle node would admit that more than ``overtaking_bound`` later arrivals
    #: were admitted ahead of (:mod:`policykit.fairness`); empty where no bound was given
    overtaken: dict[str, OvertakenBeyond] = field(default_factory=dict)
    overtaking_bound: int | None = None
    stopped_by: str = "idle"

    def to_dict(self) -> dict[str, Any]:
        return {
            "combo": self.combo.as_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
            "oom": None if self.oom is None else self.oom.__dict__.copy(),
            "never_completes": None
            if self.never_completes is None
            else self.never_completes.__dict__.copy(),
            "starvation": None if self.starvation is None else self.starvation.__dict__.copy(),
            "completed": self.completed,
            "pending": self.pending,
            "rejected": [{"id": k, "reason": v} for k, v in self.rejected.items()],
            "failed": [{"id": k, "reason": v} for k, v in self.failed.items()],
            "policy_faults": [{"id": k, "reason": v} for k, v in self.policy_faults.items()],
            "starved": [{"id": k, "waited_rounds": v} for k, v in self.starved.items()],
            "overtaken": [o.to_dict() for o in self.overtaken.values()],
            "stopped_by": self.stopped_by,
        }


def refuse_preempting(combo: Combo) -> None:
    """This loop is SGLang's node, which never preempts: a combo whose preemption policy does
    runs on :class:`~policykit.preempting.PreemptingScheduler` instead."""
    if combo.preempts:
        raise ComboError(
            f"The combo {combo} preempts (preemption policy {combo.preemption.spec!r}), so it "
            "runs on a node that preempts (vLLM's v1 scheduler, policykit.preempting), not on "
            "SGLang's ledger planner, which never takes KV back once it is promised."
        )


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
        history: bool = True,
        fail_stuck: bool = True,
        overtaking_bound: int | None = None,
    ) -> None:
        refuse_preempting(combo)
        self.node = node
        self.combo = combo
        self.pm = pm
        self.forward = forward
        self.starvation_rounds = starvation_rounds
        #: keep every round's record in the result (off for soak runs: memory stays flat)
        self.history = history
        #: the in-progress request and how many rounds in a row it has been deferred
        self._deferred: tuple[str, int] | None = None
        #: fail an in-progress request that is stuck on an otherwise idle node (policykit's
        #: extension; SGLang 0.5.23 defers it forever)
        self.fail_stuck = fail_stuck
        self._observer = _HookObserver(pm)
        self.planner = Planner(node, combo, self._observer)
        self.round_no = 0
        #: rounds that sorted a non-empty waiting queue (:meth:`_refresh_waiting_prefixes`)
        self._queue_sorts = 0
        self.result = RunResult(combo, overtaking_bound=overtaking_bound)
        self._serving = False
        #: the overtakes so far, counted where a bound is given (:mod:`policykit.fairness`)
        self._overtaking = None if overtaking_bound is None else self._overtaking_tally()

    def start_serving(self) -> None:
        """The init -> serving boundary: the node is built, no round has run yet.

        The allocator-phase policy switches allocator settings here
        (docs/incidents.md#allocator-fragmentation); called by
        :meth:`run`, or earlier by a harness that allocates more static buffers first.
        """
        if not self._serving:
            self._serving = True
            self.combo.allocator_phase.on_serving()

    def use(self, combo: Combo) -> None:
        """Switch policies between rounds (the next round plans under ``combo``)."""
        refuse_preempting(combo)
        self.combo = self.planner.combo = combo

    def step(self) -> RoundRecord:
        """Run one round.

        A fault confined to one request (a :class:`PolicyError` naming it, a
        :class:`RequestFault`) rolls the round back, fails that request with the error as its
        reason, and plans the round again without it: the others keep being served. Raises
        :class:`PrefillOutOfMemory` when the batch cannot be placed (fatal, as in the engine);
        the round is recorded (with its plan) and the node rolled back to how it was before the
        round, before the error propagates.
        """
        node = self.node
        self.round_no += 1
        r = self._observer.round_no = self.round_no
        t0 = time.perf_counter()
        released = [q.id for q in node.release_due(r)]
        arrived = [q.id for q in node.arrive(r)]
        node.checkpoint()
        self._refresh_waiting_prefixes()
        failed: list[str] = []
        while True:
            ledger = self.planner.open_ledger()
            if self.pm is not None:
                self.pm.hook.policykit_round_start(round_no=r, ledger=ledger)
            t1 = time.perf_counter()
            try:
                plan = self.planner.plan(r, ledger)
            except (PolicyError, RequestFault) as err:
                self._fail(err, failed)
                continue
            t2 = time.perf_counter()
            for rej in plan.rejected:
                if rej.verdict == NEVER:
                    node.reject(node.requests[rej.request_id], rej.reason or "")
            record = RoundRecord(plan, 0, 0, None, released, arrived, t2 - t1, 0.0, failed)
            try:
                node.commit(plan)
            except (PolicyError, RequestFault) as err:
                self._fail(err, failed)
                continue
            except PrefillOutOfMemory:
                self._record(record, t0)
                raise
            break
        try:
            # After the commit: a fault here is the forward's (the harness's), not the plan's.
            if self.forward is not None and plan.batch:
                self.forward(plan, node)
        finally:
            self._record(record, t0)
        self._track_deferrals(plan)
        self._fail_if_stuck(plan, record)
        self._check_completable(r)
        if self.pm is not None:
            self.pm.hook.policykit_round_end(round_no=r, plan=plan)
        return record

    def _refresh_waiting_prefixes(self) -> None:
        """SGLang 0.5.23's ``SchedulePolicy._touch_waiting_prefixes``, on by default.

        A queue that is not sorted this round (one that keeps arrival order, or one over its
        ``sort_limit``, where upstream's ``lpm`` becomes ``fcfs``) matches no prefix while it
        sorts, so on its first sort
        of a non-empty queue, and on every 32nd after (:func:`policykit.kernel.refresh_due`),
        the engine touches the waiting requests' cached prefixes, the head last: they become
        the most recently used, so eviction takes idle cache before a waiting request's prefix
        (and the tail's before the head's). A sorting queue touches them as it matches.
        """
        waiting = self.node.waiting
        if self.combo.queue.sorts(len(waiting)) or not waiting:
            return
        refresh = kernel.refresh_due(self.planner.domain, self._queue_sorts, self.round_no)
        self._queue_sorts += 1
        if refresh:
            # in the queue's own order: a queue over its sort limit keeps its last sort's
            for req in reversed(self.planner.queue()[:WAITING_PREFIX_REFRESH_MAX]):
                self.node.cache.match(req.tokens)

    def _fail(self, err: PolicyError | RequestFault, failed: list[str]) -> None:
        """Fail the request a fault names, or re-raise a fault that names none."""
        req = self.node.requests.get(err.request_id) if err.request_id is not None else None
        if req is None or req.state not in (State.WAITING, State.CHUNKED):
            raise err
        if req.state is State.CHUNKED and isinstance(err, PolicyError):
            # admitted, then failed by its own combo's policy: it can never complete
            owed = owed_tokens(req.prompt_tokens, req.seq_len, self.node.config.page_size)
            self._never_completes(req.id, "policy-error", owed, self.reclaimable(), str(err))
        self.node.fail(req, str(err))
        failed.append(req.id)
        if isinstance(err, PolicyError):
            self.result.policy_faults[req.id] = str(err)

    def _record(self, record: RoundRecord, t0: float) -> None:
        node = self.node
        record.free_tokens_after = node.pool.free_tokens
        record.evictable_tokens_after = node.cache.evictable_tokens
        if node.swa_pool is not None:
            record.swa_free_tokens_after = node.swa_pool.free_tokens
        record.round_seconds = time.perf_counter() - t0
        if self.history:
            self.result.rounds.append(record)

    def _fail_if_stuck(self, plan: Plan, record: RoundRecord) -> None:
        """Fail the in-progress request when it was deferred and no memory can come back.

        Memory only comes back when held KV is released; with nothing due for release (nothing
        held, or held KV that is never released) and nothing else computed, the next round sees
        the same ledger and defers it again, forever, while its KV blocks everyone behind it.
        Failing it frees that KV for them; the run reports it as never completing.
        """
        req, domain = self.node.chunked, self.planner.domain
        if not self.fail_stuck or not kernel.stuck(
            domain, bool(plan.batch), self.node.pending_releases(), [req is not None]
        ):
            return
        assert req is not None  # (one of the valve's facts)
        chunking = self.combo.chunking
        message = (
            f"{describe(chunking)} deferred it on a node with nothing else running and no held "
            f"KV due back, so no memory can come back for it: with {req.remaining} of its "
            f"{req.prompt_tokens} tokens left it would wait forever."
        )
        owed = owed_tokens(req.prompt_tokens, req.seq_len, self.node.config.page_size)
        self._never_completes(req.id, "stuck", owed, self.reclaimable(), message)
        self.node.fail(req, message)
        record.failed.append(req.id)

    def reclaimable(self) -> int:
        """The most the node can ever have free again: free + evictable now, plus the KV of
        held requests whose release is still to come (own pages and unpinned locked prefix).
        New admissions only borrow from this, so nothing can ever raise it."""
        node, domain = self.node, self.planner.domain
        never = node.config.kv_release_rounds is None
        # KV held for good gives nothing back: not walking it keeps a round's cost flat however
        # many requests finished before it
        held = [] if never else list(node.held)
        due = [kernel.kv_due(domain, q.finished_round, [], never) for q in held]
        return kernel.reclaimable(domain, node.baseline, due, [self._gives(q) for q in held])

    def _gives(self, held: Request) -> int:
        """What a held request gives back when its KV is released: its own pages and the part
        of its locked prefix (the matched one, and under hybrid SWA its checkpointed chunks)
        that is not pinned."""
        page = self.node.config.page_size
        locked = held.prefix_pages.numel() * page
        pinned = self.node.cache.pinned_prefix(held.tokens[:locked])
        return held.own_pages.numel() * page + locked - pinned

    def _check_completable(self, round_no: int) -> None:
        """Record the in-progress request if it owes more than the node can ever free again."""
        req = self.node.chunked
        if req is None or self.result.never_completes is not None:
            return
        owed = owed_tokens(req.prompt_tokens, req.seq_len, self.node.config.page_size)
        reclaimable = self.reclaimable()
        if never_completes(owed, reclaimable):
            # its own pages are not counted: they come back only when it is failed, which the
            # trace then shows as a jump in free memory
            held = req.own_pages.numel() * self.node.config.page_size
            self._never_completes(
                req.id,
                "memory",
                owed,
                reclaimable,
                f"it still needs {owed} KV slots to finish its {req.remaining} remaining tokens, "
                f"but while it runs the node can never have more than {reclaimable} free for it "
                f"(free + evictable + held KV still due back; the {held} slots it holds itself "
                "come back only if it is failed).",
            )

    def _check_starvation(self, record: RoundRecord) -> None:
        """A round on a drained node (nothing in progress, no KV held) that placed nothing
        while a request an idle node would admit waits: the queue stopped in front of it, and
        with nothing running nothing changes before the next round looks at it again."""
        node, domain = self.node, self.planner.domain
        if self.result.starvation is not None or not node.waiting:
            return
        idle = kernel.drained(domain, [node.chunked is not None], [bool(node.held)])
        placed = [bool(record.plan.batch)]
        if not kernel.starves(domain, idle, [True], placed):
            return  # nothing could starve: ask no policy and touch no prefix (queue() does)
        for req in self.planner.queue():
            if kernel.starves(domain, idle, [self.planner.never_fits(req) is None], placed):
                refused = record.plan.rejected
                head = refused[-1].request_id if refused else None
                self.result.starvation = Starvation(
                    self.round_no,
                    req.id,
                    head,
                    f"an idle node would admit it, but in round {self.round_no} the node is "
                    f"drained and {self._why_stopped(refused[-1] if refused else None)}, so "
                    "it waits behind it.",
                )
                return

    def _overtaking_tally(self) -> Overtaking:
        """The overtaking detector over this node: arrival rounds, and whether an idle node
        would admit a request (asked once, about a request a later arrival passed)."""
        requests = self.node.requests
        return Overtaking(
            lambda rid: requests[rid].arrival_round,
            lambda rid: self.planner.never_fits(requests[rid]) is None,
        )

    def _count_overtakes(self, record: RoundRecord) -> None:
        """Feed the round to the overtaking detector: who was admitted, who still waits."""
        if self._overtaking is None:
            return
        admitted = (EntryKind.WHOLE, EntryKind.TRUNCATED)
        placed = [e.request_id for e in record.plan.entries if e.kind in admitted]
        if not placed:  # nobody passed anybody: the waiting queue need not be read
            return
        waiting = [q.id for q in self.node.waiting]
        self._overtaking.observe(RoundSeen(record.plan.round, placed, waiting))

    def _why_stopped(self, refusal: Rejection | None) -> str:
        """Why the queue stopped in front of a starving request, true to the queue policy: a
        skipping queue never stops at a request that can never fit, so its stop is the
        combo's refusal of one that could."""
        if refusal is None:
            return "nothing admits it"
        head = self.node.requests.get(refusal.request_id)
        queue = self.combo.queue.spec
        if head is not None and self.planner.never_fits(head) is not None:
            return (
                f"the queue stops at {head.id}, which can never fit (the {queue!r} queue "
                "policy stops at such a request instead of skipping it)"
            )
        return (
            f"the queue stops at {refusal.request_id}, which the combo would admit on an idle "
            f"node (every unpinned cached prefix evicted) but refuses here every round "
            f"({refusal.verdict}), and the {queue!r} queue policy stops at a refused request"
        )

    def _never_completes(
        self, request: str, cause: str, owed: int, reclaimable: int, message: str
    ) -> None:
        if self.result.never_completes is None:
            self.result.never_completes = NeverCompletes(
                self.round_no, request, cause, owed, reclaimable, message
            )

    def _track_deferrals(self, plan: Plan) -> None:
        """Count consecutive rounds the in-progress request was deferred (for starvation)."""
        deferred = [e.request_id for e in plan.entries if e.kind is EntryKind.DEFERRED]
        if not deferred:
            self._deferred = None
        elif self._deferred is not None and self._deferred[0] == deferred[0]:
            self._deferred = (deferred[0], self._deferred[1] + 1)
        else:
            self._deferred = (deferred[0], 1)

    def idle(self, record: RoundRecord) -> bool:
        """Nothing can change any more after this round (a request failed in it gave its KV
        back, so the next round may admit what this one could not)."""
        node = self.node
        return (
            not record.plan.batch
            and not record.failed
            and not node.future
            and not node.pending_releases()
        )

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
                self._check_starvation(record)
                self._count_overtakes(record)
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
        result.failed = {
            q.id: q.reason or "" for q in node.requests.values() if q.state is State.FAILED
        }
        result.starved = self.starved()
        if self._overtaking is not None and result.overtaking_bound is not None:
            result.overtaken = self._overtaking.beyond(result.overtaking_bound)

    def starved(self) -> dict[str, int]:
        """Requests that waited more than ``starvation_rounds`` rounds: for their first chunk
        (still waiting, or served late), or deferred that many rounds in a row while in
        progress. Value: the rounds waited."""
        out: dict[str, int] = {}
        for q in self.node.requests.values():
            if q.state is State.FUTURE:
                continue
            first = q.first_scheduled_round
            arrived = max(q.arrival_round, 1)  # round 1 is the first
            waited = (self.round_no if first is None else first) - arrived
            if q.state in (State.REJECTED, State.FAILED) and first is None:
                continue
            if waited > self.starvation_rounds:
                out[q.id] = waited
        if self._deferred is not None and self._deferred[1] > self.starvation_rounds:
            out[self._deferred[0]] = max(out.get(self._deferred[0], 0), self._deferred[1])
        return out
