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

import z3

from policykit.config import EngineConfig
from policykit.registry import Combo
from policykit.spec.checker import (
    PROVED,
    UNKNOWN,
    VIOLATED,
    CheckOptions,
    Verdict,
    combo_label,
    config_dict,
)
from policykit.spec.crossval import check_lifted, check_policies
from policykit.spec.encoding import Encoder
from policykit.spec.preempting_bmc import (
    PREEMPTING_PROPERTIES,
    PUnrolling,
    drained_head_refused,
    unroll,
)
from policykit.spec.preempting_induction import step_breaks_it
from policykit.spec.preempting_replay import counterexample
from policykit.spec.preempting_shrink import shrunk
from policykit.spec.solver import WALL_CLOCK, solve, unrolled


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
            unbounded = _unbounded(prop, combo, config, options, sources)
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


#: per property, the one-step induction that proves it for any depth (the solver cannot
#: satisfy the formula), and what the proof says
INDUCTIONS = {
    "no-starvation": (
        drained_head_refused,
        "on a drained node the policies admit the head of the queue, whatever it is",
    ),
    "admitted-completes": (
        step_breaks_it,
        "no step preempts: at most one request is part-way after a step, and the rest of its "
        "prompt fits in the free blocks",
    ),
}


def _unbounded(
    prop: str, combo: Combo, config: EngineConfig, options: CheckOptions, sources: dict[str, str]
) -> Verdict | None:
    """``prop`` proved for any depth by its induction (:data:`INDUCTIONS`), or None."""
    t0 = time.perf_counter()
    broken, note = INDUCTIONS[prop]
    with Encoder() as enc:
        goal = broken(combo, config, enc, sources)
        result, _, _ = solve([*enc.facts, goal], options.rlimit, deadline=options.deadline)
    if result != z3.unsat:
        return None
    seconds = time.perf_counter() - t0
    return Verdict("", prop, PROVED, "unbounded", seconds, note=note)


def _decide(u: PUnrolling, prop: str, name: str, options: CheckOptions, share: float) -> Verdict:
    """One property: the query over every step; a model replayed; where it does not replay,
    the run with nothing evicted from the prefix cache is asked for instead."""
    t0 = time.perf_counter()
    bound = f"K={len(u.states)},N={len(u.inputs.requests)}"
    violated = z3.Or(*(v[prop] for v in u.violations))
    tried: list[str] = []
    for extra in ([], u.exact_hits):
        facts = [*u.enc.facts, *extra, violated]
        outcome = solve(facts, options.rlimit, unrolled(0), options.deadline)
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
            if options.shrink:
                cx = shrunk(u, found, cx, facts, options.bounds.granule_for(u.config))
                seconds = share + time.perf_counter() - t0
            return Verdict(name, prop, VIOLATED, f"round {cx.round}", seconds, cx)
        tried.append(f"round {cx.round}")
    note = (
        "the model found a violation the node that preempts does not replay (its prefix-cache "
        "hits are over-approximated), and none with nothing evicted"
    )
    seconds = share + time.perf_counter() - t0
    return Verdict(name, prop, UNKNOWN, bound, seconds, note=note, shortfall=note)
