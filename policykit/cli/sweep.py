"""``policykit sweep``: simulate scenarios x combos in parallel, locally or on a Ray cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from policykit.cli.common import echo_json, load_registry, ray_address_option
from policykit.cli.simulate import resolve_scenario_path
from policykit.errors import ComboError, PolicykitError, ScenarioError
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
from policykit.policy import KINDS
from policykit.registry import PolicyRegistry, parse_combo
from policykit.scenario import Scenario, load_scenario

SIMULATE_TARGET = "policykit.executor.units:simulate_unit"
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
#: failed or missing unit ids printed after the table; the results file has them all
_LISTED = 5


def sweep_units(
    scenarios: list[Scenario], combos: str, registry: PolicyRegistry, max_rounds: int
) -> list[Unit]:
    """One simulate unit per scenario and combo, each combo fully resolved here.

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
        config = sc.config.engine
        if combos.strip() == "all":
            chosen = [str(c) for c in registry.all_combos(config)]
        else:
            parts = [p for p in combos.split(";") if p.strip()]
            if not parts:
                raise ComboError("--combos is empty; give 'all' or combos separated by ';'.")
            chosen = [str(registry.resolve(sc.combo, p, config=config)) for p in parts]
        if len(set(chosen)) != len(chosen):
            raise ComboError(
                f"--combos names the same combination twice for scenario {sc.name!r} (after "
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
@click.option(
    "--combos",
    default="all",
    show_default=True,
    help="'all' (every registered combination) or combos separated by ';'.",
)
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
@click.option(
    "--json", "json_out", default=None, metavar="OUT", help="Write merged results ('-': stdout)."
)
def sweep(
    scenarios: str,
    combos: str,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    retries: int,
    timeout: float | None,
    max_rounds: int,
    json_out: str | None,
) -> None:
    """Simulate every scenario under every combo, each pair an independent unit of work.

    Exit code 0: every unit ran (a simulated OOM is a result, not a failure); 1: some unit
    still failed after its retries; 2: bad input; 130: interrupted, partial results written.
    """
    names = [s.strip() for s in scenarios.split(",") if s.strip()]
    if not names:
        raise ScenarioError("--scenarios is empty; name at least one scenario.")
    loaded = [load_scenario(resolve_scenario_path(n)) for n in names]
    _, registry = load_registry()
    units = sweep_units(loaded, combos, registry, max_rounds)
    with (
        open_executor(executor, workers=workers, ray_address=ray_address, timeout=timeout) as pool,
        SweepProgress(len(units), label="simulate") as progress,
    ):
        results = run_units(units, pool, retries=retries, listener=progress)
    if json_out == "-":
        echo_json(results.to_dict())
    else:
        if json_out is not None:
            _write(results, Path(json_out))
        _print_table(results)
    if results.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(0 if results.all_ok else EXIT_FAILED)


def _write(results: SweepResults, path: Path) -> None:
    try:
        results.write(path)
    except OSError as exc:
        raise PolicykitError(f"Cannot write results to {str(path)!r}: {exc.strerror}.") from None


def _print_table(results: SweepResults) -> None:
    table = Table(
        title=f"sweep on {results.executor['name']} ({results.wall_seconds:.1f} s)",
        caption=f"combo: {' · '.join(KINDS)}",
    )
    table.add_column("scenario")
    table.add_column("combo", overflow="fold")
    for column in ("outcome", "rounds", "node", "tries"):
        table.add_column(column)
    for r in results.units:
        _, scenario, combo = r.unit.id.split("/", 2)
        policies = " · ".join(parse_combo(combo).values())
        table.add_row(scenario, policies, _outcome(r), _rounds(r), r.host or "-", str(r.attempts))
    Console().print(table)
    if results.interrupted:
        click.echo("Interrupted: units that had not finished are listed as missing.", err=True)
    for label, ids in (("failed", results.failed), ("missing", results.missing)):
        if ids:
            shown = ", ".join(ids[:_LISTED])
            more = f" and {len(ids) - _LISTED} more (all in --json)" if len(ids) > _LISTED else ""
            click.echo(f"{len(ids)} unit(s) {label}: {shown}{more}", err=True)


def _outcome(r: UnitResult) -> str:
    if r.status is Status.FAILED:
        return f"[red]failed: {r.error}[/]"
    if r.status is Status.MISSING:
        return "[yellow]missing[/]"
    res = r.result
    if res["oom"] is not None:
        return f"[red]OOM in round {res['oom']['round']}[/]"
    done = len(res["completed"])
    return f"completed {done}/{done + len(res['pending']) + len(res['rejected'])}"


def _rounds(r: UnitResult) -> str:
    return str(r.result["rounds"]) if r.status is Status.OK else "-"
