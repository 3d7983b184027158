"""Checking a combo that preempts: the bounded model of :mod:`.preempting_bmc`, its
counterexamples replayed on the node that preempts.

A verdict per property, as for SGLang's node (:mod:`.checker`): ``proved`` to the bound (no run
of the model violates it within ``rounds`` steps of ``requests`` requests), ``violated`` (a
counterexample that replays to the failure on :class:`policykit.preempting.PreemptingScheduler`,
the scheduler ``policykit simulate`` and ``policykit conformance vllm`` run), or ``unknown``
(the solver's budget ran out, or the model's run does not replay: the model over-approximates
the prefix cache, so a run of it may be one the scheduler never takes).

One query per property covers every step to the bound (a violation in any of them); the step
it fails in is read from the solver's model.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import z3

from policykit.config import EngineConfig
from policykit.preempting import Step
from policykit.preempting_scenario import prepare, run
from policykit.registry import Combo
from policykit.scenario import config_fields, parse_scenario
from policykit.spec.checker import (
    PROVED,
    UNKNOWN,
    VIOLATED,
    CheckOptions,
    Verdict,
    combo_label,
    config_dict,
)
from policykit.spec.counterexample import Counterexample, Failure, Row, TraceRound
from policykit.spec.crossval import check_lifted, check_policies
from policykit.spec.model import Encoder
from policykit.spec.preempting_bmc import (
    PREEMPTING_PROPERTIES,
    PUnrolling,
    drained_head_refused,
    unroll,
    value,
)
from policykit.spec.solver import WALL_CLOCK, solve, unrolled

#: steps the replay of a counterexample runs at most: a lasso of the model repeats forever,
#: and the scheduler must still have the request unfinished after this many
REPLAY_ROUNDS = 200


def preempting_properties(wanted: tuple[str, ...] | None = None) -> list[str]:
    props = list(PREEMPTING_PROPERTIES)
    return props if wanted is None else [p for p in props if p in wanted]


def refuse_unmodelled(config: EngineConfig) -> None:
    """A node that preempts has one full-attention KV cache group and one token budget: the
    configurations the model has no meaning for are refused, as ``simulate`` refuses them."""
    from policykit.spec.crossval import PolicyRefused

    if config.sliding_window is not None:
        raise PolicyRefused(
            "The combo preempts, so it runs on a node that preempts (vLLM's v1 scheduler), "
            "which policykit models with one full-attention KV cache group; a hybrid "
            "sliding-window check (--sliding-window) has no meaning there. Check it without "
            "a sliding window."
        )
    if config.max_prefill_tokens is not None:
        raise PolicyRefused(
            "The combo preempts, so it runs on a node that preempts (vLLM's v1 scheduler), "
            "which has one token budget per step (--chunked-prefill-size, vLLM's "
            "max_num_batched_tokens) and nothing like SGLang's max_prefill_tokens. Check it "
            "without --max-prefill-tokens."
        )


def check_preempting(
    combo: Combo, config: EngineConfig, options: CheckOptions, sources: dict[str, str]
) -> list[Verdict]:
    """All verdicts for one combo that preempts."""
    refuse_unmodelled(config)
    check_policies(combo, config, sources)
    name, props = combo_label(combo), preempting_properties(options.properties)
    n, k = options.preempting_requests, options.preempting_rounds
    granule = options.bounds.granule_for(config)
    verdicts = []
    with Encoder() as enc:
        t0 = time.perf_counter()
        u = unroll(
            combo,
            config,
            enc,
            sources,
            requests=n,
            rounds=k,
            pool_cap=options.bounds.max_pool_tokens,
            granule=granule,
        )
        share = (time.perf_counter() - t0) / max(1, len(props))
        for prop in props:
            unbounded = None
            if prop == "no-starvation":
                unbounded = _never_starves(combo, config, options, sources)
            if unbounded is not None:
                verdicts.append(dataclasses.replace(unbounded, combo=name))
                continue
            verdicts.append(_decide(u, prop, name, options, share))
    check_lifted(combo, config, sources)
    scope = config_dict(config)
    bounds = {
        "rounds": k,
        "requests": n,
        "pool_cap_tokens": options.bounds.max_pool_tokens,
        "granule": granule,
        "node": "preempting",
    }
    for v in verdicts:
        v.config, v.bounds = scope, None if v.bound == "unbounded" else bounds
    return verdicts


def _never_starves(
    combo: Combo, config: EngineConfig, options: CheckOptions, sources: dict[str, str]
) -> Verdict | None:
    """``no-starvation`` proved unbounded (:func:`drained_head_refused` cannot be), or None."""
    t0 = time.perf_counter()
    with Encoder() as enc:
        refused = drained_head_refused(combo, config, enc, sources)
        result, _, _ = solve([*enc.facts, refused], options.rlimit, deadline=options.deadline)
    if result != z3.unsat:
        return None
    note = "on a drained node the policies admit the head of the queue, whatever it is"
    seconds = time.perf_counter() - t0
    return Verdict("", "no-starvation", PROVED, "unbounded", seconds, note=note)


def _decide(u: PUnrolling, prop: str, name: str, options: CheckOptions, share: float) -> Verdict:
    """One property: the query over every step; a model replayed; where it does not replay,
    the run with nothing evicted from the prefix cache is asked for instead."""
    t0 = time.perf_counter()
    bound = f"K={len(u.states)},N={len(u.inputs.requests)}"
    violated = z3.Or(*(v[prop] for v in u.violations))
    tried: list[str] = []
    for extra in ([], u.exact_hits):
        outcome = solve(
            [*u.enc.facts, *extra, violated], options.rlimit, unrolled(0), options.deadline
        )
        result, found, reason = outcome
        seconds = share + time.perf_counter() - t0
        if result == z3.unsat and not extra:
            note = (
                "bounded only: every run of the model of the node that preempts, to the "
                "bound (the prefix cache over-approximated)"
            )
            return Verdict(name, prop, PROVED, bound, seconds, note=note)
        if result == z3.unsat:
            break
        if result != z3.sat:
            why = reason if reason == WALL_CLOCK else f"{reason} ({options.rlimit:,} z3 resource"
            why += "" if reason == WALL_CLOCK else " units per query)"
            return Verdict(
                name, prop, UNKNOWN, bound, seconds, note=f"solver: {why}", shortfall=why
            )
        assert found is not None
        cx = counterexample(u, found, prop)
        if cx.failure is not None:
            return Verdict(name, prop, VIOLATED, f"round {cx.round}", seconds, cx)
        tried.append(f"round {cx.round}")
    note = (
        "the model found a violation the node that preempts does not replay (its prefix-cache "
        "hits are over-approximated), and none with nothing evicted"
    )
    seconds = share + time.perf_counter() - t0
    return Verdict(name, prop, UNKNOWN, bound, seconds, note=note, shortfall=note)


def counterexample(u: PUnrolling, found: z3.ModelRef, prop: str) -> Counterexample:
    """The violating run as a scenario, replayed on the node that preempts."""
    k = next(i for i, v in enumerate(u.violations, start=1) if value(found, v[prop]))
    scenario = scenario_of(u, found, prop, k)
    who = [
        q.name
        for q, c in zip(u.inputs.requests, u.culprits[k - 1][prop], strict=True)
        if value(found, c)
    ]
    failure, steps = replay(scenario, u.combo, prop, who)
    page = u.config.page_size
    return Counterexample(prop, k, scenario, trace_rounds(steps[: max(k, 1)], page), failure)


def scenario_of(u: PUnrolling, found: z3.ModelRef, prop: str, k: int) -> dict[str, Any]:
    """The scenario file of the model's inputs (``policykit simulate`` replays it)."""
    inp, cfg = u.inputs, u.config
    requests = []
    for q in inp.requests:
        item: dict[str, Any] = {"id": q.name, "prompt_tokens": value(found, q.prompt)}
        arrival = value(found, q.arrival)
        if arrival > 1:
            item["arrival_round"] = arrival
        requests.append(item)
    release = None if value(found, inp.release_never) else value(found, inp.release_rounds)
    scenario = {
        "name": f"counterexample-{prop}",
        "description": f"Found by policykit check: {prop} violated in round {k} under {u.combo}.",
        **config_fields(dataclasses.replace(cfg, kv_release_rounds=release)),
        "pool": {
            "free_tokens": value(found, inp.pool_blocks) * cfg.page_size,
            "evictable_tokens": 0,
        },
        "combo": u.combo.as_dict(),
        "requests": requests,
    }
    parse_scenario(scenario, source="the exported counterexample")  # must be replayable
    return scenario


def replay(
    scenario: dict[str, Any], combo: Combo, prop: str, who: list[str]
) -> tuple[Failure | None, list[tuple[Step, dict[str, int]]]]:
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

    sched.step = recorded  # type: ignore[method-assign]
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


def trace_rounds(traced: list[tuple[Step, dict[str, int]]], page: int) -> tuple[TraceRound, ...]:
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
