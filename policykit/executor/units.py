"""Unit functions policykit ships: what a worker runs for one unit of a sweep.

``simulate_unit`` is the unit of ``policykit sweep``: one scenario under one combo, on the same
core ``policykit simulate`` uses (scenario -> node -> scheduler with the registered policies;
a combo that preempts on the node that preempts).
``bench_unit`` is one combination of one ``policykit bench`` workload on the real model, through
the harness's own ``run_combo``: what ``bench --executor`` hands out per combination.
``check_unit`` is one combination's SMT verdicts: what ``check --executor`` hands out.
"""

from __future__ import annotations

from typing import Any

from policykit.errors import PolicyError
from policykit.plan import Entry
from policykit.plugin_manager import PolicykitPluginManager, make_plugin_manager
from policykit.preempting import Step
from policykit.preempting_scenario import prepare, run
from policykit.registry import Combo, PolicyRegistry
from policykit.scenario import (
    Scenario,
    build_node,
    load_scenario,
    parse_scenario,
    resolve_scenario_path,
)
from policykit.scheduler import Scheduler


def simulate_unit(args: dict[str, Any]) -> dict[str, Any]:
    """Replay one scenario under one combo and summarise the run.

    ``args``: ``scenario`` is a path, a bundled scenario name, or the scenario itself as a JSON
    object (what ``policykit sweep`` sends, so that a remote node needs no copy of the file);
    ``combo`` is a combo string layered over the scenario's own combo, as in ``simulate
    --combo``; ``max_rounds`` is optional.

    The summary keeps what a comparison needs (the outcome, which requests completed, the
    tokens computed, taken from cache and loaded back in the rounds that ran) and leaves out
    the per-round trace, which ``policykit simulate --json`` prints for any one unit worth a
    closer look.
    """
    scenario = _scenario(args["scenario"])
    pm = make_plugin_manager()
    registry = PolicyRegistry.from_plugins(pm)
    combo = registry.resolve(scenario.combo, args.get("combo"), config=scenario.config)
    max_rounds = int(args.get("max_rounds", 100_000))
    if combo.preempts:
        return _simulate_preempting(scenario, combo, pm, max_rounds)
    node = build_node(scenario)
    run = Scheduler(node, combo, pm=pm).run(max_rounds=max_rounds)
    # the round that ran out of memory planned its batch but computed nothing
    ran = run.rounds[:-1] if run.oom is not None else run.rounds
    entries = [e for r in ran for e in r.plan.batch]
    return {
        "scenario": scenario.name,
        "combo": combo.as_dict(),
        "oom": None if run.oom is None else dict(run.oom.__dict__),
        "completed": run.completed,
        "pending": run.pending,
        "rejected": sorted(run.rejected),
        "rounds": len(run.rounds),
        "stopped_by": run.stopped_by,
        "tokens": {
            "computed": sum(e.tokens for e in entries),
            "cached": sum(e.cached for e in entries),
            "load_back": sum(e.load_back for e in entries),
        },
    }


def _simulate_preempting(
    scenario: Scenario, combo: Combo, pm: PolicykitPluginManager, max_rounds: int
) -> dict[str, Any]:
    """:func:`simulate_unit` for a combo that preempts: the scenario on a node that preempts
    (as ``simulate`` runs it), summarised in the same keys plus ``preemptions``. It never runs
    out of memory (``oom`` is None); a policy fault stops it (``stopped_by``)."""
    sched, _ = prepare(scenario, combo, pm=pm)
    entries: list[Entry] = []
    preemptions = 0

    def seen(step: Step) -> None:
        nonlocal preemptions
        entries.extend(sched.last_plan.batch)
        preemptions += len(step.preempted)

    try:
        steps = run(sched, len(scenario.requests), max_rounds, on_step=seen)
        stopped_by = "max_rounds" if len(steps) >= max_rounds else "idle"
    except PolicyError:
        stopped_by = "policy-fault"
    done = {r.id for r in sched.node.finished}
    return {
        "scenario": scenario.name,
        "combo": combo.as_dict(),
        "node": "preempting",
        "oom": None,
        "completed": [r.id for r in scenario.requests if r.id in done],
        "pending": [r.id for r in scenario.requests if r.id not in done],
        "rejected": [],
        "rounds": sched.round_no,
        "stopped_by": stopped_by,
        "preemptions": preemptions,
        "tokens": {
            "computed": sum(e.tokens for e in entries),
            "cached": sum(e.cached for e in entries),
            "load_back": 0,
        },
    }


def _scenario(spec: str | dict[str, Any]) -> Scenario:
    if isinstance(spec, dict):
        return parse_scenario(spec, source=f"scenario {spec.get('name', '?')!r}")
    return load_scenario(resolve_scenario_path(spec))


def bench_unit(args: dict[str, Any]) -> dict[str, Any]:
    """Run one combination of one workload on the harness model; return its results row.

    ``args``: ``workload`` (a named workload, trace or scenario, as for ``bench --workload``),
    ``combo``, and optionally ``model`` (preset, default ``tiny``), ``device`` (default
    ``auto``: the GPU the executor gave this worker, else the CPU), ``pool_tokens``, ``seed``,
    ``cpu_threads`` and ``max_rounds`` with ``bench``'s defaults. The row is the one
    ``policykit bench`` writes under ``combos`` (schema ``policykit.bench/1``), plus the
    workload's name and the device it ran on.
    """
    import torch

    from policykit.devices import resolve_device
    from policykit.harness.build import PrefixKV
    from policykit.harness.model import Decoder
    from policykit.harness.presets import get_preset
    from policykit.harness.runner import resolve_input, run_combo

    device = resolve_device(args.get("device", "auto"))
    if device.type == "cpu":
        torch.set_num_threads(int(args.get("cpu_threads", 1)))
    seed = int(args.get("seed", 0))
    bench = resolve_input(args["workload"], int(args.get("pool_tokens", 8192)), seed)
    pm = make_plugin_manager()
    combo = PolicyRegistry.from_plugins(pm).resolve(args["combo"], config=bench.config)
    model = Decoder(get_preset(args.get("model", "tiny")), device, seed=seed)
    run = run_combo(
        bench, combo, PrefixKV(model), pm=pm, max_rounds=int(args.get("max_rounds", 10_000))
    )
    return {
        "workload": bench.name,
        "pool_tokens": run.pool_tokens,
        "device": str(device),
        **run.row,
    }


def check_unit(args: dict[str, Any]) -> dict[str, Any]:
    """Check one combo against every property with z3; return its verdicts.

    ``args``: ``combo`` (a combo string) and what :func:`policykit.spec.report.unit_args`
    writes: ``config`` (the engine configuration, :meth:`EngineConfig.to_dict
    <policykit.config.EngineConfig.to_dict>`) and optionally ``rounds``, ``requests``,
    ``rlimit`` (z3 resource units per solver query), ``deadline`` (the wall-clock safety net),
    ``granule``, ``pool_cap``, ``min_swa_pool`` and ``properties``, with ``policykit check``'s
    defaults. A violated property is a result, not a failure, and so is a refusal (``refused``
    verdicts with the reason): the unit raises only when the check itself cannot run.
    """
    from policykit.spec.report import from_unit_args, isolated_rows

    config, options = from_unit_args(args)
    registry = PolicyRegistry.from_plugins(make_plugin_manager())
    combo = registry.resolve(args["combo"], config=config)
    rows = isolated_rows([combo], config, options)
    return {"combo": args["combo"], "verdicts": rows}
