"""Running a scenario through the concrete scheduler and through the z3 encoding, side by side."""

from __future__ import annotations

from typing import Any

import z3

from policykit.registry import Combo
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler
from policykit.spec.bmc import Bounds, Unrolling, initial_state, make_inputs, unroll_round
from policykit.spec.counterexample import extract
from policykit.spec.model import Encoder, ModelConfig, RoundModel

Row = tuple[str, str, int, int, int]


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


def model_rounds(scenario: dict[str, Any], combo: Combo, rounds: int) -> tuple[list, int | None]:
    """The same, read from the z3 encoding with every input fixed to the scenario's values."""
    pool = scenario["pool"]
    config = ModelConfig(
        scenario["page_size"], scenario["chunked_prefill_size"], pool.get("sliding_window")
    )
    reqs = scenario["requests"]
    with Encoder() as enc:
        inp = make_inputs(enc, config, len(reqs), rounds, Bounds(granule=1))
        u = Unrolling(combo, config, len(reqs), Bounds(granule=1), enc, inp)
        model = RoundModel(combo, config, enc, {})
        state = initial_state(inp)
        for k in range(1, rounds + 1):
            state, _ = unroll_round(u, model, state, k)
    release = scenario["kv_release_rounds"]
    fix = [
        inp.free.t == pool["free_tokens"],
        inp.evictable.t == pool["evictable_tokens"],
        inp.release_never == (release is None),
    ]
    if release is not None:
        fix.append(inp.release_rounds.t == release)
    if config.hybrid:
        fix.append(inp.swa_free.t == pool["swa_free_tokens"])
    for q, r in zip(inp.requests, reqs, strict=True):
        fix += [
            q.prompt.t == r["prompt_tokens"],
            q.device.t == r.get("device_prefix_tokens", 0),
            q.host.t == r.get("host_prefix_tokens", 0),
            q.arrival.t == max(1, r.get("arrival_round", 1)),
        ]
    solver = z3.Solver()
    solver.add(*enc.facts, *fix)
    assert solver.check() == z3.sat, "the encoding has no run for a valid scenario"
    cx = extract(u, solver.model(), "conformance", rounds, combo)
    out, oom = [], None
    for r in cx.rounds:
        rows = sorted((row.request, row.kind, row.start, row.end, row.load_back) for row in r.rows)
        marks = {
            row.request: (row.rem_total, row.cur_rem) for row in r.rows if row.rem_total is not None
        }
        out.append((rows, marks))
        if r.oom and oom is None:
            oom = r.round
    return out, oom
