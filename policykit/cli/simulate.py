"""``policykit simulate``: replay a scenario round by round under one combo."""

from __future__ import annotations

import sys

import click

from policykit.cli.common import echo_json, json_option, load_registry, warn_if_uncheckable
from policykit.render import print_run
from policykit.run_progress import RunProgress
from policykit.scenario import build_node, load_scenario, resolve_scenario_path
from policykit.scheduler import RunResult, Scheduler

EXIT_OOM = 1
EXIT_NEVER_COMPLETES = 3


@click.command()
@click.argument("scenario")
@click.option(
    "--combo",
    "combos",
    multiple=True,
    metavar="COMBO",
    help="ADMISSION/CHUNKING/ALIGNMENT[/ALLOCATOR-PHASE] or KIND=POLICY[,...]; overrides the "
    "scenario's. Repeatable: later ones override earlier ones kind by kind.",
)
@click.option("--max-rounds", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="Where the KV pool lives.")
@click.option(
    "--starvation-rounds",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Report requests that waited more than this many rounds.",
)
@json_option
def simulate(
    scenario: str,
    combos: tuple[str, ...],
    max_rounds: int,
    device: str,
    starvation_rounds: int,
    as_json: bool,
) -> None:
    """Replay SCENARIO (a JSON file, or a bundled name such as seed-incident-1keim).

    Exit code 0: no OOM and every admitted request can complete (requests that never fit
    are listed as pending); 1: the simulated engine ran out of memory; 2: bad input; 3: no
    OOM, but an admitted request can never complete (it owes more KV than the node can ever
    free again, or it was failed for waiting forever), or a waiting request starves (an idle
    node would admit it, but the queue stops in front of it every round).
    """
    from policykit.devices import resolve_device

    path = resolve_scenario_path(scenario)
    sc = load_scenario(path)
    pm, registry = load_registry()
    chosen = registry.resolve(sc.combo, *combos, config=sc.config.engine)
    warn_if_uncheckable(chosen, sc.config.engine, as_json=as_json)
    node = build_node(sc, device=resolve_device(device))
    sched = Scheduler(node, chosen, pm=pm, starvation_rounds=starvation_rounds)
    with RunProgress(node) as progress:
        result = sched.run(max_rounds=max_rounds, on_round=progress.on_round)
    if as_json:
        echo_json({"scenario": sc.name, **result.to_dict()}, "policykit.simulate/1")
    else:
        print_run(result, title=f"{sc.name} — {chosen}")
    sys.exit(exit_code(result))


def exit_code(result: RunResult) -> int:
    """1 for an OOM (the worse failure, and the one that ends a run), else 3 for an admitted
    request that can never complete or a waiting request that starves, else 0."""
    if result.oom is not None:
        return EXIT_OOM
    stuck = result.never_completes is not None or result.starvation is not None
    return EXIT_NEVER_COMPLETES if stuck else 0
