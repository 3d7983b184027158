"""``policykit sweep``: simulate scenarios x combos in parallel, locally or on a Ray cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from policykit.cli.common import (
    check_out_path,
    combo_options,
    combo_texts,
    echo_json,
    json_option,
    load_registry,
    out_option,
    ray_address_option,
    write_json,
)
from policykit.errors import ComboError, ScenarioError
from policykit.executor import (
    EXECUTORS,
    Status,
    SweepProgress,
    SweepResults,
    Unit,
    UnitResult,
    open_executor,
    run_units,
)
from policykit.preempting_scenario import refuse_unmappable
from policykit.registry import PolicyRegistry
from policykit.render import default_console, fold
from policykit.scenario import Scenario, load_scenario, resolve_scenario_path

SIMULATE_TARGET = "policykit.executor.units:simulate_unit"
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
#: failed or missing unit ids printed after the table; the results file has them all
_LISTED = 5


def sweep_units(
    scenarios: list[Scenario],
    combos: list[str] | None,
    registry: PolicyRegistry,
    max_rounds: int,
) -> list[Unit]:
    """One simulate unit per scenario and combo (``None``: every registered combo), each combo
    fully resolved here and written in its printed form.

    Resolving on the driver turns a bad combo into exit code 2 before anything runs, and
    ships the scenario itself (not its path) so that a remote node needs no copy of the file.
    """
    names = [sc.name for sc in scenarios]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ScenarioError(
            f"More than one scenario is named {', '.join(map(repr, twice))}; unit ids are built "
            "from scenario names, so give each scenario a distinct 'name'."
        )
    units = []
    for sc in scenarios:
        config = sc.config
        if not combos:
            chosen = [str(c) for c in registry.all_combos(config)]
        else:
            chosen = [str(registry.resolve(sc.combo, p, config=config)) for p in combos]
        if any(registry.resolve(c, config=config).preempts for c in chosen):
            # a node that preempts has no meaning for some scenario fields: say so before
            # anything runs, as for a bad combo
            refuse_unmappable(sc)
        if len(set(chosen)) != len(chosen):
            raise ComboError(
                f"--combo names the same combination twice for scenario {sc.name!r} (after "
                "filling in defaults and the scenario's own combo)."
            )
        args = {"scenario": sc.to_dict(), "max_rounds": max_rounds}
        units += [
            Unit(f"simulate/{sc.name}/{c}", "simulate", SIMULATE_TARGET, {**args, "combo": c})
            for c in chosen
        ]
    return units


@click.command()
@click.option("--scenarios", required=True, help="Comma-separated scenario files or bundled names.")
@combo_options
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True)
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Local workers [default: CPUs]."
)
@ray_address_option
@click.option("--retries", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds one unit may run before it is stopped and counted failed.",
)
@click.option("--max-rounds", type=click.IntRange(min=1), default=100_000, show_default=True)
@json_option
@out_option
def sweep(
    scenarios: str,
    combos: tuple[str, ...],
    combo_list: tuple[str, ...],
    check_all: bool,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    retries: int,
    timeout: float | None,
    max_rounds: int,
    as_json: bool,
    out: Path | None,
) -> None:
    """Simulate every scenario under each combo (every registered one unless --combo names
    some), each pair an independent unit of work.

    Exit code 0: every unit ran (a simulated OOM is a result, not a failure); 1: some unit
    still failed after its retries; 2: bad input; 130: interrupted, partial results written.
    """
    names = [s.strip() for s in scenarios.split(",") if s.strip()]
    if not names:
        raise ScenarioError("--scenarios is empty; name at least one scenario.")
    check_out_path(out)
    loaded = [load_scenario(resolve_scenario_path(n)) for n in names]
    _, registry = load_registry()
    units = sweep_units(loaded, combo_texts(combos, combo_list, check_all), registry, max_rounds)
    with (
        open_executor(executor, workers=workers, ray_address=ray_address, timeout=timeout) as pool,
        SweepProgress(len(units), label="simulate", quiet=as_json) as progress,
    ):
        results = run_units(units, pool, retries=retries, listener=progress)
    if out is not None:
        write_json(out, results.to_dict())
    if as_json:
        echo_json(results.to_dict())
    else:
        _print_table(results)
    if results.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(0 if results.all_ok else EXIT_FAILED)


def _print_table(results: SweepResults) -> None:
    table = Table(title=f"sweep on {results.executor['name']} ({results.wall_seconds:.1f} s)")
    table.add_column("scenario")
    table.add_column("combo (admission/chunking/alignment)")
    for column in ("outcome", "rounds", "node", "tries"):
        table.add_column(column)
    for r in results.units:
        scenario = r.unit.args["scenario"]
        name = scenario.get("name", "?") if isinstance(scenario, dict) else str(scenario)
        row = (name, r.unit.args["combo"], _outcome(r), _rounds(r), r.host or "-", str(r.attempts))
        table.add_row(*row)
    default_console().print(fold(table))
    if results.interrupted:
        click.echo("Interrupted: units that had not finished are listed as missing.", err=True)
    for label, ids in (("failed", results.failed), ("missing", results.missing)):
        if ids:
            shown = ", ".join(ids[:_LISTED])
            rest = len(ids) - _LISTED
            more = f" and {rest} more (all in --json and --out)" if rest > 0 else ""
            click.echo(f"{len(ids)} unit(s) {label}: {shown}{more}", err=True)


def _outcome(r: UnitResult) -> str:
    if r.status is Status.FAILED:
        return f"[red]failed: {r.error}[/]"
    if r.status is Status.MISSING:
        return "[yellow]missing[/]"
    res = _result(r)
    if res["oom"] is not None:
        return f"[red]OOM in round {res['oom']['round']}[/]"
    done = len(res["completed"])
    text = f"completed {done}/{done + len(res['pending']) + len(res['rejected'])}"
    # a node that preempts never runs out of memory; how often it preempted is its cost
    return f"{text}, {res['preemptions']} preempted" if "preemptions" in res else text


def _rounds(r: UnitResult) -> str:
    return str(_result(r)["rounds"]) if r.status is Status.OK else "-"


def _result(r: UnitResult) -> dict[str, Any]:
    """The result of a unit that did not fail and is not missing: the executor records one."""
    assert r.result is not None
    return r.result
