"""A counterexample of the node that preempts: the model's inputs as a scenario file, replayed on
:class:`policykit.preempting.PreemptingScheduler` (what ``policykit simulate`` runs).

:func:`replay` is the one replay of such a counterexample: the checker calls it to decide
whether a run of the model is one the scheduler takes, the shrinker to keep a smaller scenario,
and ``policykit docs`` to render the counterexample's page.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import z3

from policykit.preempting import Step
from policykit.preempting_scenario import prepare, run
from policykit.registry import Combo
from policykit.scenario import config_fields, parse_scenario
from policykit.spec.counterexample import Counterexample, Failure, Row, TraceRound
from policykit.spec.encoding import value
from policykit.spec.preempting_bmc import PUnrolling

#: steps the replay of a counterexample runs at most: a lasso of the model repeats forever,
#: and the scheduler must still have the request unfinished after this many
REPLAY_ROUNDS = 200

#: one replayed step and each request's computed tokens after it (where its chunks ended)
Traced = tuple[Step, dict[str, int]]


def counterexample(u: PUnrolling, found: z3.ModelRef, prop: str) -> Counterexample:
    """The violating run as a scenario, replayed on the node that preempts."""
    k = next(i for i, v in enumerate(u.violations, start=1) if value(found, v[prop]))
    scenario = scenario_of(u, lambda x: value(found, x), prop, k)
    who = [
        q.name
        for q, c in zip(u.inputs.requests, u.culprits[k - 1][prop], strict=True)
        if value(found, c)
    ]
    failure, steps = replay(scenario, u.combo, prop, who)
    page = u.config.page_size
    return Counterexample(prop, k, scenario, trace_rounds(steps[: max(k, 1)], page), failure)


def scenario_of(u: PUnrolling, read: Callable[[Any], Any], prop: str, k: int) -> dict[str, Any]:
    """The scenario file of the model's inputs, each input's value given by ``read`` (a z3
    model's, or a shrunk candidate's); ``policykit simulate`` replays it."""
    inp, cfg = u.inputs, u.config
    requests = []
    for q in inp.requests:
        item: dict[str, Any] = {"id": q.name, "prompt_tokens": read(q.prompt)}
        arrival = read(q.arrival)
        if arrival > 1:
            item["arrival_round"] = arrival
        requests.append(item)
    release = None if read(inp.release_never) else read(inp.release_rounds)
    scenario = {
        "name": f"counterexample-{prop}",
        "description": f"Found by policykit check: {prop} violated in round {k} under {u.combo}.",
        **config_fields(dataclasses.replace(cfg, kv_release_rounds=release)),
        "pool": {
            "free_tokens": read(inp.pool_blocks) * cfg.page_size,
            "evictable_tokens": 0,
        },
        "combo": u.combo.as_dict(),
        "requests": requests,
    }
    parse_scenario(scenario, source="the exported counterexample")  # must be replayable
    return scenario


def replay(
    scenario: dict[str, Any], combo: Combo, prop: str, who: list[str]
) -> tuple[Failure | None, list[Traced]]:
    """Run ``scenario`` on the node that preempts (as ``policykit simulate`` does) and name the
    failure ``prop`` is about, if the run ends in it for one of the requests ``who`` the model
    blames: admitted and unfinished when the run stops (``admitted-completes``), or unfinished
    on a drained node where nothing can change any more (``no-starvation``)."""
    sc = parse_scenario(scenario, source="the counterexample")
    sched, _ = prepare(sc, combo)
    requests, ends = list(sched.node.future), []
    step = sched.step

    def recorded() -> Step:
        """A step, and each request's computed tokens after it (where its chunks ended)."""
        out = step()
        ends.append({r.id: r.computed for r in requests})
        return out

    sched.step = recorded  # type: ignore[method-assign]  # this run's steps, recorded
    steps = run(sched, len(sc.requests), REPLAY_ROUNDS)
    finished = {r.id for r in sched.node.finished}
    scheduled = {rid for s in steps for rid in s.scheduled}
    preempted = {rid: sum(rid in s.preempted for s in steps) for rid in scheduled}
    idle = len(steps) < REPLAY_ROUNDS
    drained = not sched.node.running and not sched.node.held
    traced = list(zip(steps, ends, strict=True))
    how = "the node went idle" if idle else f"still changing after {REPLAY_ROUNDS} rounds"
    for rid in who:
        if rid in finished:
            continue
        if prop == "admitted-completes" and rid in scheduled:
            message = (
                f"request {rid} was admitted, preempted {preempted[rid]} time(s), and is "
                f"unfinished when the run stops ({how})"
            )
            detail = "stalled" if idle else "livelock"
            return Failure("never-completes", len(steps), rid, detail, message), traced
        if prop == "no-starvation" and idle and drained:
            before = "never admitted" if rid not in scheduled else "admitted and preempted"
            message = f"request {rid} was {before}, and waits on a drained node ({how})"
            return Failure("starves", len(steps), rid, "blocked", message), traced
    return None, traced


def trace_rounds(traced: list[Traced], page: int) -> tuple[TraceRound, ...]:
    """The replayed steps as the counterexample's rows (what ``check`` prints): each chunk
    ``[start, end)`` (a request back after a preemption starts at its prefix-cache hit)."""
    out = []
    for s, ends in traced:
        rows = [Row(rid, "preempted", 0, 0, 0, None, None) for rid in s.preempted]
        for rid, tokens in s.scheduled.items():
            kind = "final" if rid in s.completed else "chunk"
            rows.append(Row(rid, kind, ends[rid] - tokens, ends[rid], 0, None, None))
        pool = (s.blocks_used + s.blocks_free) * page
        used, free = s.blocks_used * page, s.blocks_free * page
        out.append(TraceRound(s.round, pool, tuple(s.released), tuple(rows), used, free, None, 0))
    return tuple(out)
