"""``bounded-overtaking``: no request an idle node would admit is passed over by more than K
later arrivals (:mod:`policykit.fairness` is the definition, and what the replay counts).

A later arrival can only pass a waiting request by coming before it in the queue's order: the
planner looks at the queue in that order and stops at the first request it refuses, unless the
queue skips requests that can never fit, which a request that fits an idle node is not. So:

* where the queue's order is arrival order (the policy's ``arrival_order``, or a priority no
  two requests can differ in, which z3 decides over the policy's own lifted ``priority``) and
  the turn of a request that fits an idle node, from any ledger, either places it or stops the
  queue (one obligation over the model's :meth:`RoundModel.admit`), no request is ever
  overtaken: ``proved`` for any number of rounds and requests, whatever K;
* otherwise the bounded search unrolls the rounds with K + 3 requests at least (a violation
  needs the request passed over, K + 1 later arrivals and one request in front that holds it
  back) and counts the overtakes per round, in its own formula, so no other property's queries
  change. A violation is shrunk and replayed like any other; no violation is ``unknown`` where
  the order can put a later arrival first (more arrivals than the search had may pass it), and
  a bounded ``proved`` only for a queue in arrival order.

The node that preempts is not modelled: a preempted request goes back to the front of the
queue, and the count's meaning there is not settled (docs/spec.md).
"""

from __future__ import annotations

import dataclasses
import time

import z3

from policykit.config import EngineConfig
from policykit.fairness import OVERTAKING
from policykit.liveness import idle_capacity
from policykit.registry import Combo
from policykit.spec.bmc import Unrolling, initial_state, make_inputs, unroll_round
from policykit.spec.checker import (
    PROVED,
    UNKNOWN,
    VIOLATED,
    CheckOptions,
    Verdict,
    bounds_dict,
    combo_label,
    config_dict,
)
from policykit.spec.encoding import Encoder, ite
from policykit.spec.induction import Obligations
from policykit.spec.model import (
    TRUNCATED,
    WHOLE,
    IdleNode,
    RoundModel,
    unconstrained_request,
)
from policykit.spec.shrink import shrunk_counterexample
from policykit.spec.solver import WALL_CLOCK, solve, unrolled
from policykit.spec.symbolic import Sym, num

#: the note of a violation whose counterexample the real scheduler does not replay
NOT_REPLAYED = (
    "the counterexample does not replay to this failure in the real scheduler (the model and "
    "the scheduler disagree); it is not exported"
)


def check_overtaking(
    combo: Combo, config: EngineConfig, options: CheckOptions, sources: dict[str, str]
) -> Verdict:
    """The ``bounded-overtaking`` verdict of a combo on SGLang's node, with its bound K."""
    t0 = time.perf_counter()
    name, bound = combo_label(combo), options.overtaking
    ob = QueueObligations(combo, config, sources, options.rlimit, deadline=options.deadline)
    order = "arrival" if combo.queue.arrival_order else ob.order_keeps_arrival()
    stops = ob.stops_at_fitting()
    if order == "arrival" and stops == "valid":
        note = (
            f"K={bound}: no request is ever overtaken: the queue keeps arrival order and stops "
            "at a refused request that fits an idle node"
        )
        seconds = time.perf_counter() - t0
        scope = config_dict(config)
        return Verdict(name, OVERTAKING, PROVED, "unbounded", seconds, note=note, config=scope)
    n = max(options.requests, bound + 3)
    wider = dataclasses.replace(options, requests=n)
    verdict = _search(combo, config, wider, sources, ahead_only=stops == "valid")
    verdict.seconds = time.perf_counter() - t0
    if verdict.verdict == PROVED and order != "arrival":
        why = (
            "the queue's order can put a later arrival first"
            if order == "inverts"
            else "the solver could not decide whether the queue's order keeps arrival order"
        )
        verdict.verdict, verdict.bound = UNKNOWN, f"round {options.rounds}"
        verdict.note = (
            f"K={bound}: {why} (priority); no request was overtaken more than K times in "
            f"{options.rounds} rounds with {n} requests, but more arrivals than that may pass it"
        )
        verdict.shortfall = verdict.note
    if ob.cut_by_wall_clock and verdict.verdict != VIOLATED:
        verdict.note = f"{verdict.note}; the induction was {WALL_CLOCK}"
    return verdict


class QueueObligations(Obligations):
    """The two facts about the queue an unbounded proof of bounded overtaking rests on."""

    def order_keeps_arrival(self) -> str:
        """'arrival' where no two requests can get priorities that put the later one first
        (z3 over the policy's lifted ``priority``), 'inverts' where two can, else 'unknown'."""
        page = self.config.page_size
        with Encoder() as enc:
            model = RoundModel(self.combo, self.config, enc, self.sources)
            ranks = []
            for name in ("A", "B"):
                inputs = tuple(enc.var(f"{v}_{name}") for v in ("p", "d", "h"))
                q = unconstrained_request(enc, name, (*inputs, Sym(num(1))), page)
                ranks.append(model.priority(q))
            a, b = ranks
            assert a is not None and b is not None  # (a queue not in arrival order has ranks)
            out = self._valid(enc, z3.Not(b.t < a.t))
        return {"valid": "arrival", "invalid": "inverts"}.get(out, "unknown")

    def stops_at_fitting(self) -> str:
        """From any mid-round ledger, the turn of a request an idle node would admit places it
        or stops the queue; and once stopped, no turn places anything. So nothing behind such
        a request in the queue's order is placed while it waits."""
        with Encoder() as enc:
            model = RoundModel(self.combo, self.config, enc, self.sources)
            mid = self._arbitrary_mid(enc, model)
            idle = self._idle_node(enc)
            x, hit = self._request(enc, "X")
            enc.facts.append(model.fits_idle(x, idle))
            _, placed, _ = model.admit(mid.state, z3.BoolVal(True), x, idle, hit, reselect=False)
            enc.facts.append(z3.Not(mid.state.bad_contract))
            first = self._valid(enc, z3.Or(placed, z3.Not(mid.state.active)))
        with Encoder() as enc:
            model = RoundModel(self.combo, self.config, enc, self.sources)
            state = dataclasses.replace(
                self._arbitrary_mid(enc, model).state, active=z3.BoolVal(False)
            )
            y, hit = self._request(enc, "Y")
            _, placed, _ = model.admit(state, z3.BoolVal(True), y, self._idle_node(enc), hit)
            second = self._valid(enc, z3.Not(placed))
        if "unknown" in (first, second):
            return "unknown"
        return "valid" if first == second == "valid" else "invalid"

    def _idle_node(self, enc: Encoder) -> IdleNode:
        """Any idle node: a capacity in whole pages and, with hybrid SWA, a window pool."""
        page = self.config.page_size
        capacity, swa = enc.var("C"), enc.var("C_swa")
        enc.facts += [capacity.t >= 0, (capacity % page).t == 0]
        enc.facts.append(swa.t >= page if self.config.hybrid_swa else swa.t == 0)
        return IdleNode(capacity, swa)


def _search(
    combo: Combo,
    config: EngineConfig,
    options: CheckOptions,
    sources: dict[str, str],
    ahead_only: bool,
) -> Verdict:
    """The bounded search: a round at a time, is some request that fits an idle node passed
    over by more than K later arrivals by the end of it (no OOM and no broken contract so
    far)? Every device prefix pinned: the queues this search is for sort (docs/spec.md).

    ``ahead_only``: the queue stops at a fitting request it does not place
    (:meth:`QueueObligations.stops_at_fitting` is valid), so only a request ahead of it in
    the model's numbering, the queue's order, can pass it: counting those alone halved the
    round-2 query of the ``lpm`` combos (5.1 s to 2.1 s on ``sglang/sglang/checkpoint:256``),
    and a request with K or fewer ahead of it is not asked about."""
    name, bound = combo_label(combo), options.overtaking
    n, k_max, spent = options.requests, options.rounds, 0
    bounds = {**bounds_dict(config, options), "overtaking": bound}
    base = Verdict(name, OVERTAKING, PROVED, "", 0.0, config=config_dict(config), bounds=bounds)
    with Encoder() as enc:
        model = RoundModel(combo, config, enc, sources)
        inputs = make_inputs(enc, model, n, k_max, options.bounds, unpinned=False)
        u = Unrolling(combo, config, n, options.bounds, enc, inputs, overtaking=bound)
        state = initial_state(inputs, combo.queue.arrival_order, config)
        swa = inputs.swa_pool if config.hybrid_swa else inputs.swa_free
        idle = IdleNode(idle_capacity(inputs.pool_total, inputs.pinned), swa)
        fits = [model.fits_idle(q, idle) for q in inputs.requests]
        counts: list[Sym] = [Sym(num(0)) for _ in range(n)]
        victims = range(bound + 1 if ahead_only else 0, n)
        for k in range(1, k_max + 1):
            state, violations = unroll_round(u, model, state, k)
            u.violations.append(violations)
            counts = _count_round(u, state.left, counts, k, ahead_only)
            over = z3.Or(*(z3.And(fits[i], counts[i].t > bound) for i in victims))
            violation = z3.And(state.alive, over)
            budget = (options.rlimit, unrolled(3 * spent), options.deadline)
            outcome = solve([*enc.facts, violation], *budget)
            spent = outcome.spent
            if outcome.result == z3.sat:
                cx = shrunk_counterexample(u, OVERTAKING, k, outcome.model, violation)
                note = "" if cx.failure is not None else NOT_REPLAYED
                return dataclasses.replace(
                    base, verdict=VIOLATED, bound=f"round {k}", counterexample=cx, note=note
                )
            if outcome.result != z3.sat and outcome.result != z3.unsat:
                why = f"round {k}: solver: {outcome.reason}"
                return dataclasses.replace(
                    base, verdict=UNKNOWN, bound=f"round {k}", note=why, shortfall=why
                )
    return dataclasses.replace(
        base, bound=f"K={k_max},N={n}", note=f"K={bound}: bounded only; every device prefix pinned"
    )


def _count_round(
    u: Unrolling, left: list[z3.BoolRef], counts: list[Sym], r: int, ahead_only: bool
) -> list[Sym]:
    """``counts`` plus round ``r``'s overtakes: per request ``i`` that has arrived and still
    waits after the round (``left`` is the next state's), the requests that arrived strictly
    later and were admitted in it (:class:`policykit.fairness.Overtaking`); ``ahead_only``:
    of the requests before ``i`` in the queue's order only."""
    reqs, entries = u.inputs.requests, u.rounds[r - 1].entries
    admitted = [z3.Or(e.kind.t == WHOLE, e.kind.t == TRUNCATED) for e in entries]
    out = []
    for i, qi in enumerate(reqs):
        waits = z3.And(qi.arrival.t <= r, z3.Not(left[i]))
        passed = [
            ite(z3.And(waits, admitted[j], qj.arrival.t > qi.arrival.t), 1, 0)
            for j, qj in enumerate(reqs)
            if j < i or (j > i and not ahead_only)
        ]
        out.append(sum(passed, counts[i]))
    return out
