"""Checking one combo: induction first, bounded model checking for what it cannot prove.

Verdicts are honest about their reach:

* ``proved`` with bound ``unbounded`` — the induction of :mod:`policykit.spec.induction`
  went through: any number of rounds and requests (within the model);
* ``proved`` with bound ``K rounds x N requests`` — no violation in the unrolling, nothing more;
* ``violated`` — a concrete counterexample, with the round it fails in;
* ``unknown`` — the solver gave up or timed out. Never reported as passing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3

from policykit.registry import Combo
from policykit.spec.bmc import (
    PROPERTIES,
    Bounds,
    Unrolling,
    initial_state,
    make_inputs,
    unroll_round,
)
from policykit.spec.counterexample import Counterexample, extract, minimise
from policykit.spec.induction import Obligations
from policykit.spec.model import Encoder, ModelConfig, RoundModel
from policykit.spec.symbolic import solve

PROVED, VIOLATED, UNKNOWN = "proved", "violated", "unknown"


@dataclass(frozen=True)
class CheckOptions:
    rounds: int = 4
    requests: int = 3
    timeout_s: float = 10.0
    bounds: Bounds = field(default_factory=Bounds)
    minimise: bool = True
    properties: tuple[str, ...] | None = None


@dataclass
class Verdict:
    combo: str
    property: str
    verdict: str
    bound: str
    seconds: float
    counterexample: Counterexample | None = None
    note: str = ""

    @property
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
            "counterexample": None
            if self.counterexample is None
            else self.counterexample.to_dict(),
        }


def properties_for(config: ModelConfig, wanted: tuple[str, ...] | None = None) -> list[str]:
    props = [p for p in PROPERTIES if config.hybrid or p != "swa-no-oom"]
    return props if wanted is None else [p for p in props if p in wanted]


def check_combo(
    combo: Combo,
    config: ModelConfig,
    options: CheckOptions,
    sources: dict[str, str] | None = None,
) -> list[Verdict]:
    """All verdicts for one combo."""
    sources = sources or {}
    name = str(_short(combo))
    props = properties_for(config, options.properties)
    timeout_ms = int(options.timeout_s * 1000)
    verdicts: dict[str, Verdict] = {}
    open_props: list[str] = []
    seconds: dict[str, float] = {}
    ob = Obligations(combo, config, sources, timeout_ms)
    for prop in props:
        t0 = time.perf_counter()
        outcome = ob.prove(prop)
        seconds[prop] = time.perf_counter() - t0
        if outcome == "proved":
            verdicts[prop] = Verdict(name, prop, PROVED, "unbounded", seconds[prop])
        else:
            open_props.append(prop)
    if open_props:
        with Encoder() as enc:
            _unroll_and_solve(
                combo, config, options, sources, name, open_props, seconds, verdicts, enc
            )
    return [verdicts[p] for p in props]


def _unroll_and_solve(
    combo: Combo,
    config: ModelConfig,
    options: CheckOptions,
    sources: dict[str, str],
    name: str,
    props: list[str],
    seconds: dict[str, float],
    verdicts: dict[str, Verdict],
    enc: Encoder,
) -> None:
    k_max, n = options.rounds, options.requests
    bound = f"K={k_max},N={n}"
    inputs = make_inputs(enc, config, n, k_max, options.bounds)
    u = Unrolling(combo, config, n, options.bounds, enc, inputs)
    model = RoundModel(combo, config, enc, sources)
    timeout_ms = int(options.timeout_s * 1000)
    state = initial_state(inputs)
    pending = list(props)
    for k in range(1, k_max + 1):
        t0 = time.perf_counter()
        state, violations = unroll_round(u, model, state, k)
        u.violations.append(violations)
        share = (time.perf_counter() - t0) / max(1, len(pending))
        for prop in list(pending):
            t1 = time.perf_counter()
            result, found, reason = solve([*enc.facts, violations[prop]], timeout_ms)
            if result == z3.sat:
                if options.minimise:
                    found = minimise([*enc.facts, violations[prop]], u, found)
                cx = extract(u, found, prop, k, combo)
                verdicts[prop] = Verdict(
                    name,
                    prop,
                    VIOLATED,
                    f"round {k}",
                    seconds[prop] + share + time.perf_counter() - t1,
                    cx,
                )
                pending.remove(prop)
            elif result != z3.unsat:
                verdicts[prop] = Verdict(
                    name,
                    prop,
                    UNKNOWN,
                    f"round {k}",
                    seconds[prop] + share + time.perf_counter() - t1,
                    note=f"solver: {reason}",
                )
                pending.remove(prop)
            seconds[prop] += share + time.perf_counter() - t1
        if not pending:
            break
    for prop in pending:
        verdicts[prop] = Verdict(
            name,
            prop,
            PROVED,
            bound,
            seconds[prop],
            note="bounded only: the unbounded induction does not go through for this combo",
        )


def _short(combo: Combo) -> str:
    d = combo.as_dict()
    return f"{d['admission']}+{d['chunking']}+{d['alignment']}"
