"""Shrinking a counterexample by running it, not by asking the solver.

The solver's first model is a valid counterexample but rarely a readable one: a pool of a few
hundred thousand tokens, prompts of odd sizes. Asking z3 for smaller and smaller ones ("is
there one with a pool under X?") costs an unrolled query per step, often runs out of time, and
gives a different answer on a faster machine. Here every candidate is *run* instead: the
scheduler ``policykit simulate`` uses replays a scenario in a few milliseconds, and a smaller
candidate is kept when it still ends in the same failure in the same round. The search is a
fixed sequence of steps with a fixed budget of replays, so the counterexample is the same on
every machine, and whatever it keeps has already been replayed.

Order: the pool first (free, evictable, pinned prefixes), then the prompts (lengths and host
prefixes), then the timing (arrivals, release delay); each input is lowered by binary search in
its step (pages, or the length granule), and the sweep repeats while something still moves. A
candidate must also keep the declared bounds (``Inputs.facts``: the pool cap, the granule,
arrival order), or it would be a counterexample to a question nobody asked.

The trace printed with the result is then read from the model with the inputs pinned to the
shrunk values: the rows are the model's, the scenario is the scheduler's, and both agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import z3

from policykit.registry import Combo
from policykit.spec.bmc import Unrolling
from policykit.spec.counterexample import Counterexample, extract, replay, scenario_of
from policykit.spec.encoding import t, value
from policykit.spec.solver import QUERY_RLIMIT, solve, unrolled
from policykit.spec.symbolic import Sym

#: replays one shrink may spend (each is a few milliseconds of the real scheduler)
REPLAY_BUDGET = 160
#: sweeps over the inputs at most (the second one rarely moves anything)
SWEEPS = 2
#: z3 resource units for reading the trace back with the shrunk inputs pinned (a small query:
#: every input is fixed); a resource count, not seconds, so the result is the same everywhere
PIN_RLIMIT = QUERY_RLIMIT // 4


@dataclass
class _Search:
    """Replays candidates for one counterexample; ``values`` is the smallest that still fails."""

    u: Unrolling
    prop: str
    depth: int
    combo: Combo
    values: dict[int, int]  #: input term id -> value
    never: bool  #: held KV is never released (not shrunk)
    replays: int = 0
    _bounds: z3.Solver = field(default_factory=z3.Solver)

    def __post_init__(self) -> None:
        self._bounds.add(*self.u.inputs.facts)

    def read(self, values: dict[int, int]) -> Callable[[object], object]:
        def read(x: object) -> object:
            term = t(x)
            if term.eq(self.u.inputs.release_never):
                return self.never
            return values[term.get_id()]

        return read

    def keeps_bounds(self, values: dict[int, int]) -> bool:
        pins = [x == v for x, v in self.pinned(values)]
        return self._bounds.check(*pins) == z3.sat

    def pinned(self, values: dict[int, int]) -> list[tuple[z3.ArithRef, int]]:
        return [(t(x), values[t(x).get_id()]) for x, _, _ in self.inputs()]

    def inputs(self) -> list[tuple[Sym, int, int]]:
        return self.u.inputs.shrinkable(self.u.config, self.u.bounds.granule_for(self.u.config))

    def fails(self, values: dict[int, int]) -> bool:
        """Does this candidate keep the bounds and replay to the same failure, same round?"""
        if self.replays >= REPLAY_BUDGET or not self.keeps_bounds(values):
            return False
        self.replays += 1
        scenario = scenario_of(self.u, self.read(values), self.prop, self.depth, self.combo)
        cx = replay(Counterexample(self.prop, self.depth, scenario, ()), self.combo)
        return cx.failure is not None and cx.failure.round == self.depth


class Candidates(Protocol):
    """A shrink in progress: ``values`` (input term id -> value) is the smallest candidate
    so far that ``fails``."""

    values: dict[int, int]

    def fails(self, values: dict[int, int]) -> bool: ...


def lower(search: Candidates, x: Sym, step: int, floor: int) -> bool:
    """Binary-search ``x`` down to the smallest value (in ``step``s above ``floor``) that
    still fails, keeping it in ``search.values``; True if it moved."""
    key, base = t(x).get_id(), dict(search.values)
    return descend(search, base[key], step, floor, lambda v: {**base, key: v})


def descend(
    search: Candidates,
    start: int,
    step: int,
    floor: int,
    candidate: Callable[[int], dict[int, int]],
) -> bool:
    """Binary-search a value down from ``start`` (in ``step``s above ``floor``) to the smallest
    whose ``candidate`` still fails, keeping that candidate in ``search.values``; True if it
    moved. ``fails`` answers False once its replay budget is spent, so the search ends there
    with what it had."""
    best, lo = start, floor
    while lo < best:
        mid = lo + (best - lo) // 2 // step * step
        values = candidate(mid)
        if search.fails(values):
            search.values, best = values, mid
        else:
            lo = mid + step
    return best < start


def shrink(
    u: Unrolling, prop: str, depth: int, model: z3.ModelRef, violation: z3.BoolRef
) -> z3.ModelRef | None:
    """A model of ``violation`` at round ``depth`` with inputs as small as the replay allows,
    or None when nothing could be shrunk (or the model disagrees with the shrunk inputs)."""
    inputs = u.inputs.shrinkable(u.config, u.bounds.granule_for(u.config))
    values = {t(x).get_id(): value(model, x) for x, _, _ in inputs}
    never = bool(value(model, u.inputs.release_never))
    search = _Search(u, prop, depth, u.combo, dict(values), never)
    if not search.fails(values):
        return None  # the solver's own model does not replay: nothing to shrink from
    for _ in range(SWEEPS):
        moved = [lower(search, x, step, floor) for x, step, floor in inputs]
        if not any(moved):
            break
    if search.values == values:
        return None
    pins = [x == v for x, v in search.pinned(search.values)]
    pins.append(u.inputs.release_never == never)
    result, found, _ = solve([*u.enc.facts, violation, *pins], PIN_RLIMIT, unrolled(0))
    return found if result == z3.sat else None


def shrunk_counterexample(
    u: Unrolling, prop: str, depth: int, model: z3.ModelRef, violation: z3.BoolRef
) -> Counterexample:
    """The counterexample to report: shrunk where that works, else the solver's, replayed."""
    small = shrink(u, prop, depth, model, violation)
    if small is not None:
        cx = replay(extract(u, small, prop, depth, u.combo), u.combo)
        if cx.failure is not None:
            return cx
    return replay(extract(u, model, prop, depth, u.combo), u.combo)
