"""``policykit simulate``: replay a scenario round by round under one combo."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from policykit.cli.common import (
    echo_json,
    json_option,
    load_registry,
    named_combo,
    warn_if_uncheckable,
)
from policykit.errors import PolicyError
from policykit.fidelity import Holds, approximations
from policykit.registry import COMBO_FORM
from policykit.render import default_console, print_run
from policykit.run_progress import RunProgress
from policykit.scenario import build_node, load_scenario, resolve_scenario_path
from policykit.scheduler import RunResult, Scheduler

EXIT_OOM = 1
EXIT_NEVER_COMPLETES = 3
EXIT_POLICY_FAULT = 4


@click.command()
@click.argument("scenario")
@click.option(
    "--combo",
    "combos",
    multiple=True,
    metavar="COMBO",
    help=f"{COMBO_FORM} or KIND=POLICY[,...]; overrides the scenario's. Repeatable: later "
    "ones override earlier ones kind by kind.",
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
    node would admit it, but the queue stops in front of it every round); 4: no OOM, but a
    policy fault (a policy raised, answered with the wrong type or broke its contract) failed
    a request or stopped the run: the combo's plugin is broken.
    """
    from policykit.devices import resolve_device

    combos = tuple(named_combo(text) for text in combos)
    path = resolve_scenario_path(scenario)
    sc = load_scenario(path)
    pm, registry = load_registry()
    chosen = registry.resolve(sc.combo, *combos, config=sc.config)
    if chosen.preempts:
        from policykit.cli.simulate_preempting import simulate_preempting

        simulate_preempting(sc, chosen, pm, max_rounds, as_json, resolve_device(device))
    warn_if_uncheckable(chosen, sc.config, as_json=as_json)
    notes = approximations(chosen, Holds.of_scenario(sc))
    node = build_node(sc, device=resolve_device(device))
    sched = Scheduler(node, chosen, pm=pm, starvation_rounds=starvation_rounds)
    try:
        with RunProgress(node) as progress:
            result = sched.run(max_rounds=max_rounds, on_round=progress.on_round)
    except PolicyError as err:
        # a fault that names no request stops the run: reported as the run's, not bad input
        result = sched.result
        result.policy_faults["*"] = " ".join(str(err).split())
        result.stopped_by = "policy-fault"
    if as_json:
        echo_json(
            {"scenario": sc.name, **result.to_dict(), "approximations": notes},
            "policykit.simulate/1",
        )
    else:
        console = default_console()
        print_run(result, title=f"{sc.name} — {chosen}", console=console)
        _print_faults(result, console)
        for line in notes:
            console.print(Text(line, style="yellow"))
    sys.exit(exit_code(result))


def _print_faults(result: RunResult, console) -> None:
    """One red line under the summary saying a policy fault failed the run (the reasons are on
    the ``failed:`` lines above): a CI log shows why ``simulate`` exited non-zero."""
    if not result.policy_faults:
        return
    who = [r for r in result.policy_faults if r != "*"]
    said = f"a policy failed {', '.join(who)} (reasons above)" if who else ""
    stopped = result.policy_faults.get("*")
    if stopped is not None:
        said += ("; " if said else "") + f"a policy stopped the run: {stopped}"
    console.print(Text(f"Policy fault (exit {EXIT_POLICY_FAULT}): {said}.", style="bold red"))


def exit_code(result: RunResult) -> int:
    """1 for an OOM (the worse failure, and the one that ends a run), else 4 for a policy
    fault (a broken plugin must not pass a CI gate), else 3 for an admitted request that can
    never complete or a waiting request that starves, else 0."""
    if result.oom is not None:
        return EXIT_OOM
    if result.policy_faults:
        return EXIT_POLICY_FAULT
    stuck = result.never_completes is not None or result.starvation is not None
    return EXIT_NEVER_COMPLETES if stuck else 0
