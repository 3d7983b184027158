"""``policykit findings``: the engine failures policykit found, their status per release, and
their reproducers (:mod:`policykit.findings`)."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table

from policykit import engines
from policykit.cli.common import echo_json, json_option
from policykit.errors import PolicykitError
from policykit.findings import FINDINGS, Finding, find, status, versions
from policykit.findings.run import Outcome, run
from policykit.render import default_console

EXIT_NOT_SHOWN = 1
EXIT_ENGINE_ABSENT = 3


def _installed() -> dict[str, str | None]:
    return {engine: engines.installed_version(engine) for engine in engines.NAMES}


def describe(finding: Finding) -> dict[str, Any]:
    """A finding as the JSON document lists it."""
    avoid = finding.avoid
    return {
        "id": finding.id,
        "engine": finding.engine,
        "title": finding.title,
        "failure": finding.failure,
        "settings": finding.settings,
        "summary": finding.summary,
        "page": finding.page,
        "reproducer": f"python -m policykit.findings.repro.{finding.reproducer[0]} "
        f"{finding.reproducer[1]}",
        "status": {v: status(finding, v) for v in versions(finding)},
        "fixed_in": finding.fixed_in,
        "checks": [vars(c) for c in finding.checks],
        "upstream": [vars(t) | {"url": t.url} for t in finding.upstream],
        "avoid": None
        if avoid is None
        else {
            "combo": avoid.combo,
            "settings": avoid.settings,
            "verdicts": dict(avoid.verdicts),
            "command": avoid.command,
        },
        "no_avoid": finding.no_avoid or None,
    }


def _selected(ids: tuple[str, ...]) -> list[Finding]:
    """The findings ``--run`` names (``all``: every one); an unknown id is bad input."""
    if "all" in ids:
        return list(FINDINGS)
    chosen = []
    for fid in ids:
        found = find(fid)
        if found is None:
            known = ", ".join(f.id for f in FINDINGS)
            raise PolicykitError(
                f"No finding is named {fid!r}; the findings are {known} (`policykit findings` "
                "lists them, `--run all` runs every one)."
            )
        chosen.append(found)
    return chosen


def _print_list(installed: dict[str, str | None]) -> None:
    console = default_console()
    table = Table(box=None, title="policykit findings", title_justify="left")
    for column in ("finding", "engine release", "status", "what fails"):
        table.add_column(column, overflow="fold")
    for f in FINDINGS:
        for i, version in enumerate(versions(f)):
            here = " (installed)" if installed.get(f.engine) == version else ""
            label = f"{engines.NAMES[f.engine]} {version}{here}"
            table.add_row(
                f.id if i == 0 else "", label, status(f, version), f.failure if i == 0 else ""
            )
        table.add_row("", "", "", "")
    console.print(table)
    for f in FINDINGS:
        console.print(f"{f.id}: {f.title} ({f.page})", highlight=False)


def _print_outcome(outcome: Outcome) -> None:
    click.echo(f"== {outcome.finding}")
    if not outcome.ran:
        click.echo(outcome.reason)
        return
    click.echo("\n".join(outcome.lines))
    shown = "shows the failure" if outcome.shows_failure else "does NOT show the failure"
    click.echo(f"{engines.NAMES[outcome.engine]} {outcome.installed} {shown}.")


def _exit_code(outcomes: list[Outcome]) -> int:
    if any(o.ran and not o.shows_failure for o in outcomes):
        return EXIT_NOT_SHOWN
    if any(not o.ran for o in outcomes):
        return EXIT_ENGINE_ABSENT
    return 0


@click.command()
@click.option(
    "--run",
    "run_ids",
    multiple=True,
    metavar="ID",
    help="Run this finding's reproducer on the installed engine and print what the engine's "
    "own objects show (repeatable; `all` runs every one).",
)
@json_option
def findings(run_ids: tuple[str, ...], as_json: bool) -> None:
    """List the failures policykit found in the engines' own schedulers, with their status on
    each supported release, or run their reproducers.

    Each finding's status on a release is `affected` or `not affected` where its reproducer was
    run on that release (the runs are recorded in policykit.findings), `fixed in X` for a
    release at or after the one that fixed it, and `not checked: engine absent` where it was
    never run. A finding a newer release fixes stays in the list. Each has a page under
    docs/findings/.

    Exit code 0: listed, or every reproducer run showed its failure; 1: a reproducer ran and
    the engine did not show the failure (a fix, or a change to check); 2: bad input (an
    unknown finding); 3: an engine a reproducer needs is not installed (nothing ran for it).
    Precedence when several apply: 1, then 3.
    """
    chosen = _selected(run_ids) if run_ids else []
    installed = _installed()
    outcomes = [run(f) for f in chosen]
    if as_json:
        data: dict[str, Any] = {
            "installed": installed,
            "findings": [describe(f) for f in FINDINGS],
        }
        if run_ids:
            data["runs"] = [o.to_dict() for o in outcomes]
        echo_json(data, "policykit.findings/1")
    elif outcomes:
        for outcome in outcomes:
            _print_outcome(outcome)
    else:
        _print_list(installed)
    code = _exit_code(outcomes)
    if code:
        sys.exit(code)
