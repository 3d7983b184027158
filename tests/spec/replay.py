"""Running a scenario through the concrete scheduler and through the z3 encoding, side by side.

The encoding of one configuration (page, chunk, window) and combo is built once with symbolic
inputs and compiled to Python (:mod:`tests.spec.evaluation`); a scenario is then *evaluated* on
it rather than solved, and the values are checked to satisfy every fact of the formula: a model
of the very formula the checker solves, at a small fraction of a solver call's cost. That is
what lets the conformance test run hundreds of examples per combo.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from policykit.config import EngineConfig
from policykit.registry import Combo
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler
from policykit.spec.bmc import Bounds, Unrolling, initial_state, make_inputs, unroll_round
from policykit.spec.encoding import Encoder
from policykit.spec.model import FINAL, KIND_NAMES, NONE, RESUMED, TRUNCATED, WHOLE, RoundModel
from tests.spec.evaluation import Program

Row = tuple[str, str, int, int, int]
#: requests per encoding; a scenario with fewer pads the rest with requests that never arrive
MAX_REQUESTS = 3


def concrete_rounds(scenario: dict[str, Any], combo: Combo, rounds: int) -> tuple[list, int | None]:
    """Per round: the rows (id, kind, start, end, load_back) the real scheduler produced, the
    marks, and the OOM round (or None)."""
    sc = parse_scenario(scenario)
    result = Scheduler(build_node(sc), combo).run(max_rounds=rounds)
    out = []
    for record in result.rounds:
        plan = record.plan
        rows: list[Row] = [
            (e.request_id, e.kind.value, e.start, e.end, e.load_back) for e in plan.entries
        ]
        rows += [(r.request_id, f"rejected {r.verdict}", 0, 0, 0) for r in plan.rejected]
        marks = {m.request_id: (m.rem_total_tokens, m.cur_rem_tokens) for m in plan.marks}
        out.append((sorted(rows), marks))
    return out, None if result.oom is None else result.oom.round


#: entry fields read per request per round (as ``extract`` reads them)
_FIELDS = ("kind", "start", "end", "load_back", "rem_total", "cur_rem")


@dataclass(frozen=True)
class Compiled:
    """An encoding, its facts as a Python program, and a reader of its per-round trace."""

    u: Unrolling
    program: Program
    read: Callable[[list], tuple]


#: encodings built in the current z3 context (each test gets a fresh one: see conftest)
_BUILT: dict[tuple[Any, ...], Compiled] = {}


def unrolling(combo: Combo, config: EngineConfig, rounds: int) -> Compiled:
    """The encoding of ``rounds`` rounds with :data:`MAX_REQUESTS` symbolic requests (arrivals
    allowed up to ``rounds + 1``, which is how padding requests stay away), compiled, built
    once per z3 context."""
    key = (id(z3.main_ctx()), str(combo), config, rounds)
    if key not in _BUILT:
        if any(k[0] != key[0] for k in _BUILT):
            _BUILT.clear()
        u = _build(combo, config, rounds)
        program = Program(u.enc.facts, _input_terms(u, config))
        terms = [
            term
            for rt in u.rounds
            for e in rt.entries
            for term in (getattr(e, f).t for f in _FIELDS)
        ] + [flag for rt in u.rounds for flag in (rt.oom_full, rt.oom_swa)]
        _BUILT[key] = Compiled(u, program, program.reader(terms))
    return _BUILT[key]


def _input_terms(u: Unrolling, config: EngineConfig) -> list[z3.ExprRef]:
    inp = u.inputs
    out = [inp.free.t, inp.evictable.t, inp.release_never, inp.release_rounds.t]
    if config.hybrid_swa:
        out.append(inp.swa_free.t)
    for q in inp.requests:
        out += [q.prompt.t, q.device.t, q.unpinned.t, q.host.t, q.arrival.t]
    return out


def _build(combo: Combo, config: EngineConfig, rounds: int) -> Unrolling:
    bounds = Bounds(granule=1)
    with Encoder() as enc:
        model = RoundModel(combo, config, enc, {})
        inp = make_inputs(enc, model, MAX_REQUESTS, rounds + 1, bounds)
        u = Unrolling(combo, config, MAX_REQUESTS, bounds, enc, inp)
        state = initial_state(inp, combo.queue.arrival_order, config)
        for k in range(1, rounds + 1):
            state, _ = unroll_round(u, model, state, k)
    return u


def model_rounds(scenario: dict[str, Any], combo: Combo, rounds: int) -> tuple[list, int | None]:
    """The same, read from the z3 encoding with every input fixed to the scenario's values."""
    pool = scenario["pool"]
    config = EngineConfig(
        scenario["page_size"],
        scenario["chunked_prefill_size"],
        scenario.get("sliding_window", pool.get("sliding_window")),  # older scenarios: the pool
        scenario.get("max_prefill_tokens"),
    )
    compiled = unrolling(combo, config, rounds)
    inp = compiled.u.inputs
    release = scenario["kv_release_rounds"]
    values: list[tuple[z3.ExprRef, int | bool]] = [
        (inp.free.t, pool["free_tokens"]),
        (inp.evictable.t, pool["evictable_tokens"]),
        (inp.release_never, release is None),
        (inp.release_rounds.t, release or 0),
    ]
    if config.hybrid_swa:
        values.append((inp.swa_free.t, pool["swa_free_tokens"]))
    reqs = scenario["requests"]
    padding = [{"prompt_tokens": 1, "arrival_round": rounds + 1}] * (MAX_REQUESTS - len(reqs))
    for q, r in zip(inp.requests, [*reqs, *padding], strict=True):
        device = r.get("device_prefix_tokens", 0)
        pinned = r.get("device_prefix_pinned", False)
        values += [
            (q.prompt.t, r["prompt_tokens"]),
            (q.device.t, device if pinned else 0),
            (q.unpinned.t, 0 if pinned else device),
            (q.host.t, r.get("host_prefix_tokens", 0)),
            (q.arrival.t, max(1, r.get("arrival_round", 1))),
        ]
    values = compiled.program.run({x.decl().name(): v for x, v in values}).read(compiled.read)
    width = len(_FIELDS) * MAX_REQUESTS
    out, oom = [], None
    for k in range(rounds):
        rows, marks = [], {}
        for j, name in enumerate(r["id"] for r in reqs):
            kind, start, end, load_back, rem_total, cur_rem = values[
                k * width + j * len(_FIELDS) : k * width + (j + 1) * len(_FIELDS)
            ]
            if kind == NONE:
                continue
            rows.append((name, KIND_NAMES[kind], start, end, load_back))
            if kind in (WHOLE, TRUNCATED, RESUMED, FINAL):
                marks[name] = (rem_total, cur_rem)
        out.append((sorted(rows), marks))
        full, swa = values[rounds * width + 2 * k : rounds * width + 2 * k + 2]
        if (full or swa) and oom is None:
            oom = k + 1
    return out, oom
