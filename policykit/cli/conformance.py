"""``policykit conformance sglang``: what SGLang 0.5.23's real scheduler does differently.

Runs each scenario through policykit's upstream-faithful combo and through upstream's own
``PrefillAdder`` and storage (see :mod:`policykit.conformance.sglang.driver`), and prints every
difference: per round the first differing field of the decisions, then of the storage.
Exit 0 when all are identical, 1 when any differs, 2 on bad input or when SGLang is not
installed.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from policykit.cli.common import echo_json, json_option
from policykit.scenario import Scenario, load_scenario, resolve_scenario_path

if TYPE_CHECKING:
    from policykit.conformance.sglang.compare import Verdict

EXIT_DIFFERENT = 1


@click.group()
def conformance() -> None:
    """Compare policykit's built-ins with an engine's real scheduler code."""


@conformance.command()
@click.argument("scenarios", nargs=-1)
@click.option(
    "--random",
    "random_count",
    type=click.IntRange(min=0),
    default=0,
    help="Also compare this many random scenarios.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --random.")
@click.option(
    "--schedule-policy",
    type=click.Choice(["fcfs", "lpm"]),
    default="fcfs",
    show_default=True,
    help="SGLang's --schedule-policy, compared with policykit's queue policy of that name "
    "(lpm: see its documented differences in `policykit policies`).",
)
@click.option(
    "--swa-storage",
    is_flag=True,
    help="Under hybrid SWA, run SGLang's own SWA radix tree and SWATokenToKVPoolAllocator too "
    "(policykit does not model them yet: see docs/conformance.md).",
)
@json_option
def sglang(
    scenarios: tuple[str, ...],
    random_count: int,
    seed: int,
    schedule_policy: str,
    swa_storage: bool,
    as_json: bool,
) -> None:
    """Diff SCENARIO... (files or bundled names) against SGLang 0.5.23's PrefillAdder, and
    (without hybrid SWA) against its own radix tree, allocator and allocation path."""
    from policykit.conformance.sglang.compare import conform, random_scenario, upstream_combo
    from policykit.conformance.sglang.driver import SUPPORTED_VERSION, load

    if not scenarios and not random_count:
        raise click.UsageError("give SCENARIO files or bundled names, or --random N")
    loaded = [load_scenario(resolve_scenario_path(s)) for s in scenarios]
    load()  # fail early, with the install hint, when SGLang is missing
    rng = random.Random(seed)
    loaded += [random_scenario(rng, i) for i in range(random_count)]
    combo = upstream_combo(schedule_policy)
    with _progress(len(loaded)) as advance:
        verdicts = []
        for sc in loaded:
            verdicts.append(
                conform(
                    sc,
                    combo,
                    schedule_policy=schedule_policy,
                    storage=True,
                    swa_storage=swa_storage,
                )
            )
            advance()
    different = [v for v in verdicts if v.differences]
    covered = _coverage(loaded, verdicts)
    if as_json:
        echo_json(
            {
                "schema": "policykit.conformance/1",
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "engine": f"sglang=={SUPPORTED_VERSION}",
                "combo": combo,
                "schedule_policy": schedule_policy,
                "seed": seed if random_count else None,
                "scenarios": [v.to_dict() for v in verdicts],
                "identical": sum(v.identical for v in verdicts),
                "different": len(different),
                "coverage": covered,
            }
        )
    else:
        for v in verdicts:
            if v.differences:
                click.echo(f"{v.scenario}: {len(v.differences)} difference(s)")
                for line in v.differences:
                    click.echo(f"  {line}")
            else:
                click.echo(f"{v.scenario}: identical ({v.rounds} rounds)")
        identical = sum(v.identical for v in verdicts)
        click.echo(
            f"{len(verdicts)} scenario(s) against sglang=={SUPPORTED_VERSION} "
            f"(--schedule-policy {schedule_policy}) with {combo}: {identical} identical, "
            f"{len(different)} different"
        )
        click.echo(
            "with host prefixes {host}, with an unpinned device prefix evicted while its "
            "request waited {evicted_prefix}, with hybrid SWA {hybrid_swa} (with host prefixes "
            "{hybrid_swa_host})".format(**covered)
        )
    if different:
        sys.exit(EXIT_DIFFERENT)


def _coverage(scenarios: list[Scenario], verdicts: list[Verdict]) -> dict[str, int]:
    """How many of the compared scenarios exercise each storage path."""
    return {
        "host": sum(any(r.host_prefix_tokens for r in sc.requests) for sc in scenarios),
        "evicted_prefix": sum(v.evicted_prefix for v in verdicts),
        "hybrid_swa": sum(sc.config.hybrid_swa for sc in scenarios),
        "hybrid_swa_host": sum(
            sc.config.sliding_window is not None and any(r.host_prefix_tokens for r in sc.requests)
            for sc in scenarios
        ),
    }


@contextmanager
def _progress(total: int) -> Iterator[Callable[[], None]]:
    """A bar on stderr (gone when done; nothing when stderr is not a terminal), advanced once
    per scenario compared."""
    console = Console(stderr=True)
    if total < 2 or not console.is_terminal:
        yield lambda: None
        return
    columns = (TextColumn("conformance"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("scenarios", total=total)
        yield lambda: progress.advance(task)
