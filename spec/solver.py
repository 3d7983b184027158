"""Running z3 on the checker's queries: short restarts over a small portfolio.

The time z3 needs for one of these queries is not a property of the query alone. It depends on
the random seed, on which arithmetic solver runs, and on the order terms were created in. Measured
on the induction obligations of every built-in combo (``--all``, page 64, 1.5 s per try), the
distribution is two-humped: a try either finishes in under half a second or does not finish in
1.5 s, and which seeds fall in which hump differs between z3's default arithmetic solver and its
older simplex (``arith.solver=2``). Neither solver alone is fast on every query: for
``reserve-tail+defer+truncation:192``'s step the default solver timed out on 10 of 20 seeds
while the old simplex solved 18 of 20 in under 0.2 s; on the unrolled BMC formulas the old
simplex times out where the default needs 1.5 s. One long try on a bad seed turns a 0.1 s proof
into a 10 s ``unknown``, so queries run as a series of tries with fresh seeds, alternating
solvers where both help, each try longer than the last (a heavy-tailed search wants restarts).

:class:`Portfolio` says which solvers and how long the first try; :func:`solve` runs a query.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import z3

#: The preprocessing before the arithmetic core: the bound names (``v == term``) are solved away
#: and unconstrained terms dropped, which is what makes the round formulas tractable (an
#: incremental solver skips it, so every try is a one-shot solver).
PREPROCESS = ("simplify", "propagate-values", "solve-eqs", "elim-uncnstr")

DEFAULT_ARITH = None  #: z3's default arithmetic solver
LEGACY_ARITH = 2  #: z3's older simplex-based arithmetic solver (``smt.arith.solver=2``)


@dataclass(frozen=True)
class Try:
    """One attempt at a query."""

    arith: int | None
    seed: int
    limit_ms: int


@dataclass(frozen=True)
class Portfolio:
    """How a query is attempted: the solvers to alternate and the first try's length.

    Each try length is given to every solver in turn, then doubles (the first length is used
    twice: most obligations fall on a fast seed within a few short tries).
    """

    first_ms: int
    solvers: tuple[int | None, ...]

    def tries(self, budget_ms: int) -> Iterator[Try]:
        """Tries until ``budget_ms`` is used; a try gets the whole remainder rather than leave
        one shorter than itself."""
        left, seed, limit = budget_ms, 0, self.first_ms
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
OBLIGATION = Portfolio(first_ms=250, solvers=(DEFAULT_ARITH, LEGACY_ARITH))


def unrolled(expected_ms: float) -> Portfolio:
    """Unrolled BMC formulas: the default solver only (the older one times out on them),
    first try sized from what a similar query took (``expected_ms``)."""
    return Portfolio(first_ms=max(250, int(expected_ms)), solvers=(DEFAULT_ARITH,))


def make_solver(attempt: Try) -> z3.Solver:
    core = z3.Tactic("smt")
    if attempt.arith is not None:
        core = z3.With(core, "arith.solver", attempt.arith)
    solver = z3.Then(*PREPROCESS, core).solver()
    solver.set("timeout", max(1, attempt.limit_ms))
    solver.set("random_seed", attempt.seed)
    return solver


def solve(
    facts: list[z3.BoolRef], timeout_ms: int, portfolio: Portfolio = OBLIGATION
) -> tuple[z3.CheckSatResult, z3.ModelRef | None, str]:
    """Check ``facts`` within ``timeout_ms`` in all. Returns the result, the model when
    satisfiable, and z3's reason for the last try when the answer is unknown."""
    deadline = time.monotonic() + timeout_ms / 1000
    reason = "timeout"
    for attempt in portfolio.tries(timeout_ms):
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        solver = make_solver(Try(attempt.arith, attempt.seed, min(attempt.limit_ms, left_ms)))
        solver.add(*facts)
        result = solver.check()
        if result == z3.sat:
            return result, solver.model(), ""
        if result == z3.unsat:
            return result, None, ""
        reason = solver.reason_unknown()
    return z3.unknown, None, reason
