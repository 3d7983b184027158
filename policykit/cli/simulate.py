"""``policykit simulate``: replay a scenario round by round under one combo."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.text import Text

from policykit.cli.common import (
    echo_json,
    json_option,
    load_registry,
    named_combo,
    warn_if_uncheckable,
)
from policykit.cli.simulate_outcome import (
    exit_code,
    print_faults,
    print_overtaken,
    print_starved,
    run_to_end,
)
from policykit.errors import PolicykitError
from policykit.fidelity import Holds, approximations
from policykit.registry import COMBO_FORM
from policykit.render import default_console, print_run
from policykit.scenario import build_node, load_scenario, resolve_scenario_path
from policykit.scheduler import Scheduler


@click.command()
@click.argument("scenario", required=False)
@click.option(
    "--workload",
    default=None,
    metavar="NAME",
    help="Instead of SCENARIO: what bench --workload takes, looked up the same way: a bundled "
    "production trace (mooncake-conversation, mooncake-synthetic, azure-code, azure-conv) or a "
    "Mooncake/Azure trace file, replayed through the roofline clock without the model; a "
    "generated workload (long-prompts, ...) or a policykit-trace .jsonl, run round by round; "
    "or a scenario.",
)
@click.option(
    "--pool-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="--workload only: the KV pool in tokens (generated workloads: 8192; production "
    "traces: what plan-memory gives llama3-8b on an H200).",
)
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
    help="Fail (exit 5) on a request that waited more than this many rounds for its first "
    "chunk, or deferred that many rounds in a row, or was still waiting that long when the run "
    "stopped; each is listed as starved.",
)
@click.option(
    "--overtaking",
    type=click.IntRange(min=0),
    default=None,
    metavar="K",
    help="Fail (exit 5) on a request an idle node would admit that more than K requests "
    "arriving after it were admitted ahead of (listed as overtaken). Default: the scenario's "
    "overtaking_bound (a check counterexample of bounded-overtaking carries it), else none.",
)
@json_option
def simulate(
    scenario: str | None,
    workload: str | None,
    pool_tokens: int | None,
    combos: tuple[str, ...],
    max_rounds: int,
    device: str,
    starvation_rounds: int,
    overtaking: int | None,
    as_json: bool,
) -> None:
    """Replay SCENARIO (a JSON file, or a bundled name such as seed-incident-1keim), or the
    workload --workload names (what bench replays, without the model).

    Exit code 0: no OOM and every admitted request can complete (requests that never fit
    are listed as pending); 1: the simulated engine ran out of memory; 2: bad input; 3: no
    OOM, but an admitted request can never complete (it owes more KV than the node can ever
    free again, or it was failed for waiting forever), or a waiting request starves (an idle
    node would admit it, but the queue stops in front of it every round); 4: no OOM, but a
    policy fault (a policy raised, answered with the wrong type or broke its contract) failed
    a request or stopped the run: the combo's plugin is broken; 5: none of those, but a
    request starved: it waited more than --starvation-rounds rounds (listed as `starved` in the
    text and in the JSON, whose `starvation_rounds` gives the bound), though it may have been
    served in the end, or more than --overtaking later arrivals were admitted while a request
    an idle node would admit waited (listed as `overtaken`). Precedence when several apply: 1,
    4, 3, 5.
    """
    from policykit.devices import resolve_device

    combos = tuple(named_combo(text) for text in combos)
    run = (max_rounds, starvation_rounds, as_json)
    if workload is not None and overtaking is not None:
        raise PolicykitError("--overtaking applies to a SCENARIO, not to --workload.")
    path = _scenario_path(scenario, workload, pool_tokens, combos, run)
    path = path if path is not None else resolve_scenario_path(scenario or "")
    sc = load_scenario(path)
    pm, registry = load_registry()
    chosen = registry.resolve(sc.combo, *combos, config=sc.config)
    overtaking = sc.overtaking_bound if overtaking is None else overtaking
    if chosen.preempts and overtaking is not None:
        raise PolicykitError(
            "--overtaking (or the scenario's overtaking_bound) is not counted on the node that "
            f"preempts ({chosen}): a preempted request goes back to the front of the queue, "
            "which the overtaking count does not define yet."
        )
    if chosen.preempts:
        from policykit.cli.simulate_preempting import simulate_preempting

        bounds = (max_rounds, starvation_rounds)
        simulate_preempting(sc, chosen, pm, bounds, as_json, resolve_device(device))
    warn_if_uncheckable(chosen, sc.config, as_json=as_json)
    notes = approximations(chosen, Holds.of_scenario(sc))
    node = build_node(sc, device=resolve_device(device))
    sched = Scheduler(
        node, chosen, pm=pm, starvation_rounds=starvation_rounds, overtaking_bound=overtaking
    )
    result = run_to_end(sched, max_rounds, quiet=as_json)
    if as_json:
        echo_json(
            {
                "scenario": sc.name,
                **result.to_dict(),
                "starvation_rounds": starvation_rounds,
                "overtaking_bound": overtaking,
                "approximations": notes,
            },
            "policykit.simulate/1",
        )
    else:
        console = default_console()
        print_run(result, title=f"{sc.name} — {chosen}", console=console)
        print_faults(result, console)
        print_starved(result.starved, starvation_rounds, console)
        print_overtaken(result, console)
        for line in notes:
            console.print(Text(line, style="yellow"))
    sys.exit(exit_code(result))


def _scenario_path(
    scenario: str | None,
    workload: str | None,
    pool_tokens: int | None,
    combos: tuple[str, ...],
    run: tuple[int, int, bool],
) -> Path | None:
    """The scenario file ``--workload`` names, or None for SCENARIO; any other workload is run
    here and the process exits (:mod:`policykit.cli.simulate_workload`)."""
    if (scenario is None) == (workload is None):
        raise PolicykitError(
            "simulate takes one input: a SCENARIO (a file or a bundled name) or --workload NAME "
            "(what bench --workload takes), not both and not neither."
        )
    if workload is None:
        if pool_tokens is not None:
            raise PolicykitError("--pool-tokens applies to --workload; a scenario sets its pool.")
        return None
    from policykit.harness.lookup import WorkloadKind, find_workload

    ref = find_workload(workload)
    if ref.kind is WorkloadKind.SCENARIO and pool_tokens is None:
        return ref.path
    if ref.kind is WorkloadKind.SCENARIO:
        raise PolicykitError(f"--pool-tokens: the scenario {workload!r} sets its own pool.")
    from policykit.cli.simulate_workload import simulate_workload

    simulate_workload(ref, combos, pool_tokens, *run)
    return None  # pragma: no cover - simulate_workload exits
