"""``policykit conformance sglang``: what SGLang 0.5.23's real scheduler does differently.

Runs each scenario through policykit's upstream-faithful combo and through upstream's own
``PrefillAdder`` (see :mod:`policykit.upstream.sglang`), and prints every difference. Exit 0 when
all are identical, 1 when any differs, 2 on bad input or when SGLang is not installed.
"""

from __future__ import annotations

import random
import sys
from datetime import UTC, datetime

import click

from policykit.cli.common import echo_json, json_option
from policykit.scenario import load_scenario, resolve_scenario_path

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
@json_option
def sglang(scenarios: tuple[str, ...], random_count: int, seed: int, as_json: bool) -> None:
    """Diff SCENARIO... (files or bundled names) against SGLang 0.5.23's PrefillAdder."""
    from policykit.upstream.conformance import UPSTREAM_COMBO, conform, random_scenario
    from policykit.upstream.sglang import SUPPORTED_VERSION, load

    if not scenarios and not random_count:
        raise click.UsageError("give SCENARIO files or bundled names, or --random N")
    loaded = [load_scenario(resolve_scenario_path(s)) for s in scenarios]
    load()  # fail early, with the install hint, when SGLang is missing
    rng = random.Random(seed)
    loaded += [random_scenario(rng, i) for i in range(random_count)]
    verdicts = [conform(sc) for sc in loaded]
    different = [v for v in verdicts if v.differences]
    if as_json:
        echo_json(
            {
                "schema": "policykit.conformance/1",
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "engine": f"sglang=={SUPPORTED_VERSION}",
                "combo": UPSTREAM_COMBO,
                "seed": seed if random_count else None,
                "scenarios": [v.to_dict() for v in verdicts],
                "identical": sum(v.identical for v in verdicts),
                "different": len(different),
                "not_expressible": sum(v.not_expressible is not None for v in verdicts),
            }
        )
    else:
        for v in verdicts:
            if v.not_expressible:
                click.echo(f"{v.scenario}: not expressible: {v.not_expressible}")
            elif v.differences:
                click.echo(f"{v.scenario}: {len(v.differences)} difference(s)")
                for line in v.differences:
                    click.echo(f"  {line}")
            else:
                click.echo(f"{v.scenario}: identical ({v.rounds} rounds)")
        click.echo(
            f"{len(verdicts)} scenario(s) against sglang=={SUPPORTED_VERSION} with "
            f"{UPSTREAM_COMBO}: {sum(v.identical for v in verdicts)} identical, "
            f"{len(different)} different"
        )
    if different:
        sys.exit(EXIT_DIFFERENT)
