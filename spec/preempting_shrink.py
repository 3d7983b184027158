"""Shrinking a counterexample of the node that preempts, by running it (as :mod:`.shrink` does for
SGLang's node).

The solver's first model is a valid lasso but rarely a small one: a pool of thousands of
tokens, prompts of odd sizes. Each input of the model (the pool in blocks, the prompts in the
length granule, the arrivals, the release delay) is lowered in turn by binary search, then each
prompt together with the pool (the pool must hold every prompt, so neither moves alone when
the pool is just the longest prompt). A candidate is kept when it keeps the declared bounds
(``PInputs.facts``: the pool cap, the granule, a pool that holds every prompt, arrival order)
and its scenario still ends, replayed on :class:`~policykit.preempting.PreemptingScheduler`,
in the same failure for the same request; for ``no-starvation`` that request must also be
scheduled in the first step when it is alone in the scenario (the property is about a request
the policies would start on an empty node, which the replay alone does not say). The sweep
repeats while something moves, within a fixed budget of replays.

The smallest candidate is then pinned in the model and the solver asked once (a budget in
resource units) for the model's run that violates the property with those inputs. Where there
is none, the search runs again asking the model of every candidate it keeps (about 20 such
queries, where the replay-only search needs one). The counterexample is read from that model,
as the unshrunk one is (the step it breaks in and the request it blames are the model's), and
replayed once more; where nothing was kept, or that replay fails, the unshrunk one stands.
Every value only goes down, so the result is never larger than the solver's.
"""

from __future__ import annotations

from typing import Any

import z3

from policykit.preempting_scenario import prepare
from policykit.scenario import parse_scenario
from policykit.spec.counterexample import Counterexample
from policykit.spec.encoding import t, value
from policykit.spec.preempting_bmc import PUnrolling
from policykit.spec.preempting_replay import counterexample, replay, scenario_of
from policykit.spec.shrink import PIN_RLIMIT, REPLAY_BUDGET, SWEEPS, descend, lower
from policykit.spec.solver import solve, unrolled
from policykit.spec.symbolic import Sym


def _inputs(u: PUnrolling, granule: int, never: bool) -> list[tuple[Sym, int, int]]:
    """The integer inputs as ``(input, step, floor)`` in the order they are shrunk: the pool
    (blocks), the prompts (the granule), then the timing (the release delay only where held
    KV is released at all)."""
    inp = u.inputs
    timing = [(q.arrival, 1, 1) for q in inp.requests]
    if not never:
        timing.append((inp.release_rounds, 1, 0))
    prompts = [(q.prompt, granule, granule) for q in inp.requests]
    return [(inp.pool_blocks, 1, 1), *prompts, *timing]


class _Search:
    """Replays candidates for one counterexample; ``values`` is the smallest that still fails."""

    def __init__(
        self,
        u: PUnrolling,
        cx: Counterexample,
        facts: list[z3.BoolRef],
        inputs: list[tuple[Sym, int, int]],
        never: bool,
        pinned: bool,
    ) -> None:
        assert cx.failure is not None
        self.u, self.prop, self.blamed, self.facts = u, cx.property, cx.failure, facts
        self.inputs, self.never, self.replays = inputs, never, 0
        #: ask the model of every candidate (else only the replay, and the caller pins once)
        self.pinned = pinned
        self.values: dict[int, int] = {}
        #: the model's run of the smallest candidate so far (None: nothing kept yet)
        self.model: z3.ModelRef | None = None
        self._bounds = z3.Solver()
        self._bounds.add(*u.inputs.facts)

    def read(self, values: dict[int, int]) -> Any:
        def read(x: Any) -> Any:
            term = t(x)
            if term.eq(self.u.inputs.release_never):
                return self.never
            return values[term.get_id()]

        return read

    def fails(self, values: dict[int, int]) -> bool:
        """Does this candidate keep the bounds and replay to the same failure of the same
        request?"""
        if self.replays >= REPLAY_BUDGET:
            return False
        pins = [t(x) == values[t(x).get_id()] for x, _, _ in self.inputs]
        if self._bounds.check(*pins) != z3.sat:
            return False
        self.replays += 1
        scenario = scenario_of(self.u, self.read(values), self.prop, 0)
        blamed = self.blamed.request
        assert blamed is not None  # a failure of a node that preempts names its request
        failure, _ = replay(scenario, self.u.combo, self.prop, [blamed])
        if failure is None or failure.kind != self.blamed.kind:
            return False
        if self.prop == "no-starvation" and not self.starts_alone(scenario):
            return False
        return not self.pinned or self.model_of(values) is not None

    def starts_alone(self, scenario: dict[str, Any]) -> bool:
        """``no-starvation`` is about a request the policies would start on an empty node: the
        blamed one, alone in the scenario, is scheduled in the first step."""
        alone = [
            {"id": r["id"], "prompt_tokens": r["prompt_tokens"]}
            for r in scenario["requests"]
            if r["id"] == self.blamed.request
        ]
        sched, _ = prepare(parse_scenario({**scenario, "requests": alone}), self.u.combo)
        return bool(sched.step().scheduled)

    def model_of(self, values: dict[int, int]) -> z3.ModelRef | None:
        """The model's run with these inputs pinned, violating the property (None: none
        within the budget); kept as the smallest so far."""
        pins = [t(x) == values[t(x).get_id()] for x, _, _ in self.inputs]
        pins.append(self.u.inputs.release_never == self.never)
        outcome = solve([*self.facts, *pins], PIN_RLIMIT, unrolled(0))
        if outcome.result != z3.sat:
            return None
        self.model = outcome.model
        return self.model


def _lower_with_pool(search: _Search, u: PUnrolling, prompt: Sym, granule: int) -> bool:
    """Lower a prompt and the pool together, the pool by the blocks the prompt gives up: the
    pool must hold every prompt, so a counterexample whose pool is just its longest prompt
    (and whose prompt fails only beside that pool's slack) shrinks only this way."""
    base, page = dict(search.values), u.config.page_size
    key, pool = t(prompt).get_id(), t(u.inputs.pool_blocks).get_id()

    def candidate(v: int) -> dict[int, int]:
        return {**base, key: v, pool: base[pool] - (base[key] - v) // page}

    return descend(search, base[key], granule, granule, candidate)


def shrunk(
    u: PUnrolling, found: z3.ModelRef, cx: Counterexample, facts: list[z3.BoolRef], granule: int
) -> Counterexample:
    """``cx`` (read from ``found``, a model of ``facts``) with its inputs as small as the replay
    allows, or ``cx`` itself when nothing shrinks or the model disagrees with the shrunk run."""
    if cx.failure is None:
        return cx
    never = bool(value(found, u.inputs.release_never))
    inputs = _inputs(u, granule, never)
    model = None
    for pinned in (False, True):
        search = _Search(u, cx, facts, inputs, never, pinned)
        search.values = {t(x).get_id(): value(found, x) for x, _, _ in inputs}
        for _ in range(SWEEPS):
            moved = [lower(search, x, step, floor) for x, step, floor in inputs]
            moved += [_lower_with_pool(search, u, q.prompt, granule) for q in u.inputs.requests]
            if not any(moved):
                break
        model = search.model if pinned else search.model_of(search.values)
        if model is not None:
            break
    if model is None:
        return cx
    out = counterexample(u, model, cx.property)
    return out if out.failure is not None else cx
