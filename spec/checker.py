"""Checking one combo: induction first, bounded model checking for what it cannot prove.

Verdicts are honest about their reach:

* ``proved`` with bound ``unbounded`` — the induction of :mod:`policykit.spec.induction`
  went through: any number of rounds and requests (within the model);
* ``proved`` with bound ``K rounds x N requests`` — no violation in the unrolling, nothing more;
* ``violated`` — a concrete counterexample, with the round it fails in;
* ``unknown`` — the solver gave up or timed out. Never reported as passing.
"""

from __future__ import annotations

import builtins
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import z3

from policykit.config import EngineConfig
from policykit.fairness import DEFAULT_OVERTAKING
from policykit.registry import Combo
from policykit.spec.bmc import (
    PROPERTIES,
    STUCK_ONLY,
    Bounds,
    NodeState,
    Unrolling,
    initial_state,
    make_inputs,
    unroll_round,
)
from policykit.spec.counterexample import Counterexample, extract, replay
from policykit.spec.crossval import PolicyRefused, check_lifted, check_policies
from policykit.spec.encoding import Encoder
from policykit.spec.induction import Obligations
from policykit.spec.model import RoundModel
from policykit.spec.shrink import shrunk_counterexample
from policykit.spec.solver import QUERY_RLIMIT, WALL_CLOCK, solve, unrolled

PROVED, VIOLATED, UNKNOWN = "proved", "violated", "unknown"


@dataclass(frozen=True)
class CheckOptions:
    rounds: int = 4
    requests: int = 3
    #: z3 resource units per solver query (:mod:`policykit.spec.solver`): the budget that
    #: decides every verdict, the same on any machine and under any load
    rlimit: int = QUERY_RLIMIT
    bounds: Bounds = field(default_factory=Bounds)
    #: shrink counterexamples by replaying smaller ones (:mod:`policykit.spec.shrink`)
    shrink: bool = True
    properties: tuple[str, ...] | None = None
    #: the wall-clock safety net: a ``time.time()`` instant after which no query runs on (a
    #: verdict it cuts short says so); None: no net
    deadline: float | None = None
    #: the bounds of the model of a node that preempts (:mod:`.preempting_check`), whose step
    #: costs more: two requests are enough for one to preempt another, or itself while
    #: another's KV is held, and three steps for that to repeat (docs/spec.md)
    preempting_rounds: int = 3
    preempting_requests: int = 2
    #: ``bounded-overtaking``'s K: no request passed over by more later arrivals
    overtaking: int = DEFAULT_OVERTAKING


@dataclass
class Verdict:
    combo: str
    property: str
    verdict: str
    bound: str
    seconds: float
    counterexample: Counterexample | None = None
    note: str = ""
    #: the engine configuration the verdict holds for (:func:`config_dict`)
    config: dict[str, Any] = field(default_factory=dict)
    #: the bounds of the search behind a bounded proof, a violation or an unknown
    #: (:func:`bounds_dict`); None for an unbounded proof
    bounds: dict[str, Any] | None = None
    #: the rounds a bounded proof reached, where fewer than asked (``_Deepening._unknown``)
    reached: int | None = None
    #: why a bounded proof reached fewer rounds than asked, or why a verdict is unknown: in
    #: words, for the text table as much as for ``--json``
    shortfall: str = ""

    @builtins.property  # the field ``property`` above shadows the builtin in this body
    def label(self) -> str:
        """``proved (unbounded)``, ``proved to K`` / ``violated`` / ``unknown``."""
        if self.verdict == PROVED:
            return "proved (unbounded)" if self.bound == "unbounded" else f"proved to {self.bound}"
        return self.verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "combo": self.combo,
            "property": self.property,
            "verdict": self.verdict,
            "bound": self.bound,
            "seconds": round(self.seconds, 3),
            "note": self.note,
            "shortfall": self.shortfall,
            "config": self.config,
            "bounds": self.bounds,
            "counterexample": None
            if self.counterexample is None
            else self.counterexample.to_dict(),
        }


def config_dict(config: EngineConfig) -> dict[str, Any]:
    """The engine configuration a verdict holds for: the numbers the model fixes. The model
    searches every release timing, so ``kv_release_rounds`` is not among them."""
    fixed = config.to_dict()
    del fixed["kv_release_rounds"]
    return fixed


def bounds_dict(config: EngineConfig, options: CheckOptions) -> dict[str, Any]:
    """What the bounded search covered: rounds, requests, the largest pool, the length grain."""
    return {
        "rounds": options.rounds,
        "requests": options.requests,
        "pool_cap_tokens": options.bounds.max_pool_tokens,
        "granule": options.bounds.granule_for(config),
    } | swa_bounds(config, options)


def swa_bounds(config: EngineConfig, options: CheckOptions) -> dict[str, Any]:
    """Hybrid SWA only: the smallest sliding-window pool the bounded search covered."""
    if not config.hybrid_swa:
        return {}
    floor = options.bounds.min_swa_pool_tokens
    return {"min_swa_pool_tokens": max(config.page_size, floor or 0)}


def scope_text(config: EngineConfig, options: CheckOptions) -> str:
    """One line naming what every verdict of a run holds for, and the bounded ones' bounds."""
    swa = "no SWA" if config.sliding_window is None else f"SWA window {config.sliding_window}"
    if config.max_prefill_tokens is not None:
        swa += f", max_prefill_tokens {config.max_prefill_tokens}"
    b = bounds_dict(config, options)
    floor = options.bounds.min_swa_pool_tokens
    swa_pool = "" if floor is None else f", a sliding-window pool of at least {floor} tokens"
    return (
        f"for page size {config.page_size}, chunk size {config.chunked_prefill_size}, {swa}; "
        f"bounded verdicts: up to {b['rounds']} rounds, {b['requests']} requests, a pool of "
        f"at most {b['pool_cap_tokens']} tokens{swa_pool}, lengths in multiples of "
        f"{b['granule']}"
    )


def properties_for(config: EngineConfig, wanted: tuple[str, ...] | None = None) -> list[str]:
    props = [p for p in PROPERTIES if config.hybrid_swa or p != "swa-no-oom"]
    return props if wanted is None else [p for p in props if p in wanted]


def check_combo(
    combo: Combo,
    config: EngineConfig,
    options: CheckOptions,
    sources: dict[str, str] | None = None,
) -> list[Verdict]:
    """All verdicts for one combo on SGLang's node (one that preempts is
    :func:`policykit.spec.preempting_check.check_preempting`'s;
    :func:`policykit.spec.checkable.check_or_refuse` picks the one a combo needs)."""
    sources = sources or {}
    if combo.preempts:
        raise PolicyRefused(
            f"The combo {combo} preempts, so it runs on vLLM's kind of node, which this round "
            "model (SGLang's node) does not describe: check it with check_or_refuse or "
            "check_preempting."
        )
    check_policies(combo, config, sources)
    name = combo_label(combo)
    props = properties_for(config, options.properties)
    verdicts: dict[str, Verdict] = {}
    open_props: list[str] = []
    seconds: dict[str, float] = {}
    granule = options.bounds.granule_for(config)
    ob = Obligations(combo, config, sources, options.rlimit, granule, options.deadline)
    for prop in props:
        t0 = time.perf_counter()
        outcome = ob.prove(prop)
        seconds[prop] = time.perf_counter() - t0
        if outcome == "proved":
            verdicts[prop] = Verdict(name, prop, PROVED, "unbounded", seconds[prop])
        else:
            open_props.append(prop)
    if open_props:
        # First with every device prefix pinned (no cache state: a small formula, quick to
        # violate); a violation there is one. What that search leaves proved to K is searched
        # again with unpinned prefixes, whose cache state makes each query far harder.
        stuck_only = ob.owed_always_fits
        wanted = open_props
        for unpinned in (False, True) if combo.queue.arrival_order else (False,):
            with Encoder() as enc:
                _unroll_and_solve(
                    combo,
                    config,
                    options,
                    sources,
                    name,
                    wanted,
                    seconds,
                    verdicts,
                    enc,
                    unpinned,
                    stuck_only,
                )
            wanted = [p for p in wanted if verdicts[p].verdict == PROVED]
            if not wanted:
                break
    check_lifted(combo, config, sources)
    scope, bounds = config_dict(config), bounds_dict(config, options)
    for v in verdicts.values():
        v.config = scope
        v.bounds = None if v.verdict == PROVED and v.bound == "unbounded" else bounds
        if v.reached is not None:
            v.bounds = {**bounds, "rounds": v.reached, "rounds_asked": options.rounds}
        if ob.cut_by_wall_clock and v.bounds is not None and v.verdict != VIOLATED:
            # bounded only because the safety net stopped the induction: say so in the table
            v.note = f"{v.note}; the induction was {WALL_CLOCK}".lstrip("; ")
            v.shortfall = v.shortfall or f"the induction was {WALL_CLOCK}"
    return [verdicts[p] for p in props]


@dataclass
class _Deepening:
    """The bounded search of one combo: round by round, one query per open property.

    (Asking once whether *any* property is violated was measured slower, not faster: on
    ``sglang+sglang+page`` the disjunction took 2.9 s at round 2 and timed out at round 3,
    where the two separate queries took 0.02 s each and about 1 s each.)
    """

    u: Unrolling
    options: CheckOptions
    name: str
    pending: list[str]
    seconds: dict[str, float]
    verdicts: dict[str, Verdict]
    #: the resource units each property's last query spent: the next round's is about three
    #: times harder
    last_spent: dict[str, int] = field(default_factory=dict)
    #: the induction proved admitted-completes' memory half (``Obligations.owed_always_fits``),
    #: so only its stuck half is searched: the same verdicts, a smaller question (at window
    #: 512 the round-2 query of sglang/sglang/none took 2.1-4.6 s over five seeds, against
    #: 5.9-11.8 s with the memory half)
    stuck_only: bool = False
    #: the policies' plugins (:class:`RoundModel` names them in its errors)
    sources: dict[str, str] = field(default_factory=dict)
    #: the search with a single request (:meth:`_alone`), built where the full one gives up
    lone: tuple[Unrolling, RoundModel, NodeState] | None = None

    def _key(self, prop: str) -> str:
        return STUCK_ONLY if prop == "admitted-completes" and self.stuck_only else prop

    def settle(self, k: int, violations: dict[str, z3.BoolRef], overhead_s: float) -> None:
        """Decide every pending property at round ``k``."""
        share = overhead_s / len(self.pending)
        for prop in list(self.pending):
            self.seconds[prop] += share
            self._decide(prop, k, violations[self._key(prop)])

    def _decide(self, prop: str, k: int, violation: z3.BoolRef) -> None:
        t0 = time.perf_counter()
        outcome = solve(
            [*self.u.enc.facts, violation],
            self.options.rlimit,
            unrolled(3 * self.last_spent.get(prop, 0)),
            self.options.deadline,
        )
        result, found, reason = outcome
        self.last_spent[prop] = outcome.spent
        self.seconds[prop] += time.perf_counter() - t0
        if result == z3.sat:
            self._violated(self.u, prop, k, violation, found)
        elif result != z3.unsat and not self._alone(prop, k):
            self._unknown(prop, k, reason)

    def _alone(self, prop: str, k: int) -> bool:
        """Where the query of round ``k`` gave up, look for a violation with a single request,
        from round ``k`` on: a much smaller formula (at window 512 the round-3 counterexample
        of sglang/sglang/none takes z3 0.3-1.1 s with one request, 6 s to over 15 s with three).
        A violation found so replays like any other; finding none proves nothing, and the
        verdict stays ``unknown`` at round ``k``. Each round is one query with its own
        budget: one budget shared by the rounds lost this very counterexample in a
        ``check --all --sliding-window 512``."""
        if self.u.requests == 1:
            return False
        t0 = time.perf_counter()
        for r in range(k, self.options.rounds + 1):
            u, violation = self._lone_round(r, prop)
            result, found, _ = solve(
                [*u.enc.facts, violation], self.options.rlimit, unrolled(0), self.options.deadline
            )
            if result == z3.sat:
                note = (
                    f"found with a single request: the search with {self.u.requests} gave up "
                    f"at round {k}, so a shorter counterexample may exist"
                )
                self.seconds[prop] += time.perf_counter() - t0
                self._violated(u, prop, r, violation, found, note if r > k else "")
                return True
        self.seconds[prop] += time.perf_counter() - t0
        return False

    def _lone_round(self, r: int, prop: str) -> tuple[Unrolling, z3.BoolRef]:
        """The single-request unrolling up to round ``r`` (made on first use, its own facts),
        and ``prop``'s violation in round ``r``."""
        if self.lone is None:
            u0 = self.u
            with Encoder() as enc:
                model = RoundModel(u0.combo, u0.config, enc, self.sources)
                inputs = make_inputs(enc, model, 1, self.options.rounds, u0.bounds)
            u = Unrolling(u0.combo, u0.config, 1, u0.bounds, enc, inputs)
            self.lone = (u, model, initial_state(inputs, u0.combo.queue.arrival_order, u0.config))
        u, model, state = self.lone
        with u.enc:
            while len(u.rounds) < r:
                state, violations = unroll_round(u, model, state, len(u.rounds) + 1)
                u.violations.append(violations)
        self.lone = (u, model, state)
        return u, u.violations[r - 1][self._key(prop)]

    def _violated(
        self,
        u: Unrolling,
        prop: str,
        k: int,
        violation: z3.BoolRef,
        found: z3.ModelRef,
        note: str = "",
    ) -> None:
        """Record the violation with a counterexample that replays to its failure in the real
        scheduler: shrunk if it can be, else the one the solver found."""
        t0 = time.perf_counter()
        if self.options.shrink:
            cx = shrunk_counterexample(u, prop, k, found, violation)
        else:
            cx = replay(extract(u, found, prop, k, u.combo), u.combo)
        if cx.failure is None:
            note = (
                "the counterexample does not replay to this failure in the real scheduler "
                "(the model and the scheduler disagree); it is not exported"
            )
        self.seconds[prop] += time.perf_counter() - t0
        self._close(Verdict(self.name, prop, VIOLATED, f"round {k}", self.seconds[prop], cx, note))

    def _unknown(self, prop: str, k: int, reason: str) -> None:
        why = self._why(reason)
        if self.u.inputs.unpinned and k > 1:
            # the search with unpinned prefixes proved the rounds before: that is what it
            # proves (the search without them reached every round)
            n, k_max = self.u.requests, self.options.rounds
            note = (
                "bounded only: the unbounded induction does not go through for this combo; "
                f"to K={k - 1} with unpinned device prefixes (round {k}: {why}), "
                f"to K={k_max} with every device prefix pinned"
            )
            shortfall = (
                f"round {k} with unpinned device prefixes: {why} (every round to {k_max} "
                "with every device prefix pinned)"
            )
            verdict = Verdict(self.name, prop, PROVED, f"K={k - 1},N={n}", self.seconds[prop])
            self._close(dataclasses.replace(verdict, note=note, reached=k - 1, shortfall=shortfall))
            return
        note = f"solver: {why}"
        if self.u.inputs.unpinned:
            note += f" with unpinned device prefixes (to K={self.options.rounds} without them)"
        verdict = Verdict(self.name, prop, UNKNOWN, f"round {k}", self.seconds[prop], note=note)
        self._close(dataclasses.replace(verdict, shortfall=f"round {k}: {note}"))

    def _why(self, reason: str) -> str:
        """The solver's reason in words, with the budget it had."""
        if reason == WALL_CLOCK:
            return reason
        return f"{reason} ({self.options.rlimit:,} z3 resource units per query)"

    def _close(self, verdict: Verdict) -> None:
        self.verdicts[verdict.property] = verdict
        self.pending.remove(verdict.property)


def _unroll_and_solve(
    combo: Combo,
    config: EngineConfig,
    options: CheckOptions,
    sources: dict[str, str],
    name: str,
    props: list[str],
    seconds: dict[str, float],
    verdicts: dict[str, Verdict],
    enc: Encoder,
    unpinned: bool,
    stuck_only: bool = False,
) -> None:
    k_max, n = options.rounds, options.requests
    model = RoundModel(combo, config, enc, sources)
    inputs = make_inputs(enc, model, n, k_max, options.bounds, unpinned)
    u = Unrolling(combo, config, n, options.bounds, enc, inputs)
    search = _Deepening(
        u, options, name, list(props), seconds, verdicts, stuck_only=stuck_only, sources=sources
    )
    state = initial_state(inputs, combo.queue.arrival_order, config)
    for k in range(1, k_max + 1):
        t0 = time.perf_counter()
        state, violations = unroll_round(u, model, state, k)
        u.violations.append(violations)
        search.settle(k, violations, time.perf_counter() - t0)
        if not search.pending:
            break
    note = "bounded only: the unbounded induction does not go through for this combo"
    if not inputs.unpinned:
        note += "; every device prefix pinned (unpinned ones: see docs/spec.md)"
    for prop in search.pending:
        verdicts[prop] = Verdict(name, prop, PROVED, f"K={k_max},N={n}", seconds[prop], note=note)


def combo_label(combo: Combo) -> str:
    """The combo as the tool prints it everywhere (:func:`policykit.registry.format_combo`):
    ``admission/chunking/alignment``, the allocator phase only when it is not the default."""
    return str(combo)
