"""Running z3 on the checker's queries: short restarts over a small portfolio, counted in z3's
resource units so that the same query gets the same answer on any machine and under any load.

The effort z3 needs for one of these queries is not a property of the query alone. It depends
on the random seed, on which arithmetic solver runs, and on the order terms were created in.
Measured on the induction obligations of every built-in combo, the distribution is two-humped:
a try either finishes quickly or not for a long while, and which seeds fall in which hump
differs between z3's default arithmetic solver and its older simplex (``arith.solver=2``).
Neither solver alone is fast on every query: for ``reserve-tail+defer+truncation:192``'s step
the default solver gave up on 10 of 20 seeds while the old simplex solved 18 of 20 quickly; on
the unrolled BMC formulas the old simplex gives up where the default one succeeds. One long try
on a bad seed turns a quick proof into an ``unknown``, so queries run as a series of tries with
fresh seeds, alternating solvers where both help, each try longer than the last (a heavy-tailed
search wants restarts).

Determinism: every limit is a z3 *resource limit* (``rlimit``: a count of the solver's basic
steps), never seconds, and every try runs in a fresh z3 context into which the query is
translated. A fresh context numbers the query's terms in the order of the query itself, not in
the order a long-running process happened to create terms before (z3 sorts some arguments by
that number), and its step count starts at zero. So the tries, their seeds, their limits and
their answers are a function of the query alone. Wall-clock time is only an outer safety net
(``deadline``): a try it interrupts says so (:data:`WALL_CLOCK`), and the caller reports it.

:class:`Portfolio` says which solvers and how long the first try; :func:`solve` runs a query.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import z3

#: The preprocessing before the arithmetic core: the bound names (``v == term``) are solved away
#: and unconstrained terms dropped, which is what makes the round formulas tractable (an
#: incremental solver skips it, so every try is a one-shot solver).
PREPROCESS = ("simplify", "propagate-values", "solve-eqs", "elim-uncnstr")

DEFAULT_ARITH = None  #: z3's default arithmetic solver
LEGACY_ARITH = 2  #: z3's older simplex-based arithmetic solver (``smt.arith.solver=2``)

#: The default budget of one query, in z3 resource units, and the first try of each kind. The
#: figures and how they were measured are in docs/spec.md ("Solver budgets").
QUERY_RLIMIT = 60_000_000
FIRST_TRY_RLIMIT = 1_500_000

#: the reason of an ``unknown`` that the wall-clock safety net, not the budget, cut short
WALL_CLOCK = "stopped by the wall-clock safety net (--timeout)"
#: the reason of an ``unknown`` whose tries spent the whole resource budget
BUDGET_SPENT = "resource budget spent"


@dataclass(frozen=True)
class Try:
    """One attempt at a query: arithmetic solver, seed, and resource limit."""

    arith: int | None
    seed: int
    rlimit: int


@dataclass(frozen=True)
class Portfolio:
    """How a query is attempted: the solvers to alternate and the first try's resource limit.

    Each try length is given to every solver in turn, then doubles (the first length is used
    twice: most obligations fall on a fast seed within a few short tries).
    """

    first: int
    solvers: tuple[int | None, ...]

    def tries(self, budget: int) -> Iterator[Try]:
        """Tries until ``budget`` is used; a try gets the whole remainder rather than leave
        one shorter than itself."""
        left, seed, limit = budget, 0, self.first
        rounds = 0
        while left > 0:
            for arith in self.solvers:
                this = limit if left - limit >= limit else left
                left -= this
                yield Try(arith, seed, this)
                seed += 1
                if left <= 0:
                    return
            rounds += 1
            if rounds > 1:
                limit *= 2


#: Small obligations (the induction): short tries, both arithmetic solvers.
OBLIGATION = Portfolio(first=FIRST_TRY_RLIMIT, solvers=(DEFAULT_ARITH, LEGACY_ARITH))


def unrolled(expected: int) -> Portfolio:
    """Unrolled BMC formulas: the default solver only (the older one gives up on them), first
    try sized from what a similar query spent (``expected``, resource units)."""
    return Portfolio(first=max(FIRST_TRY_RLIMIT, int(expected)), solvers=(DEFAULT_ARITH,))


@dataclass(frozen=True)
class Outcome:
    """A query's answer: the result, the model when satisfiable (in the caller's z3 context),
    z3's reason when unknown, and the resource units all tries spent."""

    result: z3.CheckSatResult
    model: z3.ModelRef | None
    reason: str
    spent: int

    def __iter__(self) -> Iterator[Any]:
        """``result, model, reason = solve(...)``: the three a caller usually needs."""
        return iter((self.result, self.model, self.reason))


def make_solver(attempt: Try, ctx: z3.Context, timeout_ms: int | None = None) -> z3.Solver:
    core = z3.Tactic("smt", ctx=ctx)
    if attempt.arith is not None:
        core = z3.With(core, "arith.solver", attempt.arith)
    solver = z3.Then(*(z3.Tactic(name, ctx=ctx) for name in PREPROCESS), core, ctx=ctx).solver()
    solver.set("rlimit", max(1, attempt.rlimit))
    solver.set("random_seed", attempt.seed)
    if timeout_ms is not None:
        solver.set("timeout", max(1, timeout_ms))
    return solver


def _spent(solver: z3.Solver) -> int:
    try:
        return int(solver.statistics().get_key_value("rlimit count"))
    except z3.Z3Exception:  # nothing ran (the preprocessing alone answered)
        return 0


def solve(
    facts: list[z3.BoolRef],
    budget: int = QUERY_RLIMIT,
    portfolio: Portfolio = OBLIGATION,
    deadline: float | None = None,
) -> Outcome:
    """Check ``facts`` within ``budget`` resource units in all (and before ``deadline``, a
    ``time.time()`` instant, if given: the safety net). Each try runs in a fresh context."""
    query = z3.And(*facts) if facts else z3.BoolVal(True)
    spent, reason = 0, BUDGET_SPENT
    for attempt in portfolio.tries(budget):
        left_ms = None
        if deadline is not None:
            left_ms = int((deadline - time.time()) * 1000)
            if left_ms <= 0:
                return Outcome(z3.unknown, None, WALL_CLOCK, spent)
        ctx = z3.Context()
        solver = make_solver(attempt, ctx, left_ms)
        solver.add(query.translate(ctx))
        result = solver.check()
        spent += _spent(solver)
        if result == z3.sat:
            return Outcome(result, solver.model().translate(query.ctx), "", spent)
        if result == z3.unsat:
            return Outcome(result, None, "", spent)
        if deadline is not None and time.time() >= deadline:
            return Outcome(z3.unknown, None, WALL_CLOCK, spent)
        reason = _reason(solver.reason_unknown())
    return Outcome(z3.unknown, None, reason, spent)


def _reason(z3_reason: str) -> str:
    """z3 says ``canceled`` or ``max. resource limit exceeded`` when the rlimit runs out."""
    if z3_reason in ("canceled", "max. resource limit exceeded", "resource limit exceeded"):
        return BUDGET_SPENT
    return z3_reason or BUDGET_SPENT
