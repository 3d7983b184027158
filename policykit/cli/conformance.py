"""``policykit conformance sglang|vllm``: what an engine's real scheduler does differently.

``sglang`` runs each scenario through policykit's upstream-faithful combo and through upstream's
own ``PrefillAdder`` and storage (see :mod:`policykit.conformance.sglang.driver`), and prints
every difference: per round the first differing field of the decisions, then of the storage.
``vllm`` runs each through policykit's node that preempts under vLLM's combo and through vLLM
0.33.0's real v1 ``Scheduler`` (:mod:`policykit.conformance.vllm.compare`), and prints each
round's first differing decision. Exit 0 when all are identical, 1 when any differs, 2 on bad
input or when the engine is not installed.
"""

from __future__ import annotations

import dataclasses
import random
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import click
from click.core import ParameterSource

from policykit.cli.common import echo_json, json_option
from policykit.engines import unmodelled_refusal
from policykit.progress import ProgressBar
from policykit.scenario import Scenario, load_scenario, resolve_scenario_path

if TYPE_CHECKING:
    from policykit.conformance.sglang.compare import SglangComparison
    from policykit.conformance.vllm.compare import VllmComparison
    from policykit.conformance.vllm.engine import SchedulerKnobs
    from policykit.engines import Resolved

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
    hidden=True,
    help="Accepted for old scripts and ignored: hybrid SWA always runs on SGLang's own SWA "
    "radix tree and SWATokenToKVPoolAllocator.",
)
@click.option(
    "--swa-hicache",
    is_flag=True,
    hidden=True,
    help="Accepted and ignored: hybrid-SWA host prefixes always run on SGLang's own HiCache.",
)
@json_option
def sglang(
    scenarios: tuple[str, ...],
    random_count: int,
    seed: int,
    schedule_policy: str,
    swa_storage: bool,
    swa_hicache: bool,
    as_json: bool,
) -> None:
    """Diff SCENARIO... (files or bundled names) against SGLang 0.5.23's PrefillAdder and its
    own radix tree (with its SWA component under hybrid SWA), allocators and allocation
    path."""
    del swa_storage, swa_hicache  # no-op aliases: SGLang's SWA storage and HiCache always run
    from policykit.conformance.sglang.compare import conform, random_scenario, upstream_combo
    from policykit.conformance.sglang.driver import load, release

    if not scenarios and not random_count:
        raise click.UsageError("give SCENARIO files or bundled names, or --random N")
    loaded = [load_scenario(resolve_scenario_path(s)) for s in scenarios]
    load()  # fail early, with the install hint, when SGLang is missing
    used = release()
    rng = random.Random(seed)
    loaded += [random_scenario(rng, i) for i in range(random_count)]
    combo = upstream_combo(schedule_policy)
    with _progress("sglang", len(loaded), as_json) as bar:
        verdicts = []
        for sc in loaded:
            bar.describe(sc.name)
            verdicts.append(conform(sc, combo, schedule_policy=schedule_policy, storage=True))
            bar.advance()
    different = [v for v in verdicts if v.differences]
    unexpressible = sum(v.not_expressible is not None for v in verdicts)
    covered = _coverage(loaded, verdicts)
    if as_json:
        echo_json(
            {
                "schema": "policykit.conformance/1",
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "engine": used.engine,
                "engine_release": used.to_dict(),
                "combo": combo,
                "schedule_policy": schedule_policy,
                "seed": seed if random_count else None,
                "scenarios": [v.to_dict() for v in verdicts],
                "identical": sum(v.identical for v in verdicts),
                "different": len(different),
                "not_expressible": unexpressible,
                "coverage": covered,
            }
        )
    else:
        for v in verdicts:
            if v.not_expressible is not None:
                click.echo(
                    f"{v.scenario}: not expressible on SGLang's storage: {v.not_expressible}"
                )
            elif v.differences:
                click.echo(f"{v.scenario}: {len(v.differences)} difference(s)")
                for line in v.differences:
                    click.echo(f"  {line}")
            else:
                click.echo(f"{v.scenario}: identical ({v.rounds} rounds)")
        identical = sum(v.identical for v in verdicts)
        click.echo(
            f"{len(verdicts)} scenario(s) against {used.engine} "
            f"(--schedule-policy {schedule_policy}) with {combo}: {identical} identical, "
            f"{len(different)} different, {unexpressible} not expressible on SGLang's storage"
        )
        if used.assumption:
            click.echo(f"assumed: {used.assumption}")
        click.echo(
            "with host prefixes {host}, with an unpinned device prefix evicted while its "
            "request waited {evicted_prefix}, with hybrid SWA {hybrid_swa} (with host prefixes "
            "{hybrid_swa_host})".format(**covered)
        )
    if different:
        sys.exit(EXIT_DIFFERENT)


def _coverage(scenarios: list[Scenario], verdicts: list[SglangComparison]) -> dict[str, int]:
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


def _progress(engine: str, total: int, as_json: bool) -> ProgressBar:
    """The scenarios compared against ``engine`` (no bar for one: it would only go from 0/1
    to 1/1)."""
    quiet = as_json or total < 2
    return ProgressBar(f"conformance {engine}", total, unit="scenarios", quiet=quiet)


def _given(**options: tuple[str, Any]) -> dict[str, Any]:
    """The vLLM settings given on the command line (option name -> (knob, value)): they hold
    for the random scenarios too, in place of the drawn ones. Values of several types, one per
    knob, so ``Any``: ``dataclasses.replace`` checks the names."""
    ctx = click.get_current_context()
    return {
        knob: value
        for name, (knob, value) in options.items()
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }


@conformance.command()
@click.argument("scenarios", nargs=-1)
@click.option(
    "--random",
    "random_count",
    type=click.IntRange(min=0),
    default=0,
    help="Also compare this many random scenarios, each under random vLLM settings (those "
    "given below replace the drawn ones).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --random.")
@click.option(
    "--long-prefill-token-threshold",
    "threshold",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="vLLM's long_prefill_token_threshold (0: off); for the random scenarios too when given.",
)
@click.option(
    "--reserve-full-isl/--no-reserve-full-isl",
    default=True,
    show_default=True,
    help="vLLM's scheduler_reserve_full_isl; for the random scenarios too when given.",
)
@click.option(
    "--scheduling-policy",
    type=click.Choice(["fcfs", "priority"]),
    default="fcfs",
    show_default=True,
    help="vLLM's --scheduling-policy (priority: every request's priority is 0, so arrival time "
    "orders; compared with the same combo); for the random scenarios too when given.",
)
@json_option
def vllm(
    scenarios: tuple[str, ...],
    random_count: int,
    seed: int,
    threshold: int,
    reserve_full_isl: bool,
    scheduling_policy: Literal["fcfs", "priority"],
    as_json: bool,
) -> None:
    """Diff SCENARIO... (files or bundled names) against the installed vLLM's real v1
    Scheduler (a release docs/engine-versions.md lists), run on a CPU as a prefill-only node:
    per round the tokens scheduled per request, preemptions, finished prefills, released KV
    and blocks in use, under policykit's vLLM combo."""
    from policykit.conformance.vllm import VllmUnavailable, load
    from policykit.conformance.vllm.compare import conform, coverage, random_scenario
    from policykit.conformance.vllm.engine import SchedulerKnobs, release
    from policykit.errors import PolicykitError
    from policykit.preempting_scenario import refuse_unmappable

    if not scenarios and not random_count:
        raise click.UsageError("give SCENARIO files or bundled names, or --random N")
    knobs = SchedulerKnobs(
        long_prefill_token_threshold=threshold,
        scheduler_reserve_full_isl=reserve_full_isl,
        scheduling_policy=scheduling_policy,
    )
    runs = [(load_scenario(resolve_scenario_path(s)), knobs) for s in scenarios]
    for sc, _ in runs:
        refuse_unmappable(sc)
    try:
        load()  # fail early, with the install hint, when vLLM is missing or not listed
        used = release()
    except VllmUnavailable as exc:
        raise PolicykitError(str(exc)) from None
    rng = random.Random(seed)
    chosen = _given(
        threshold=("long_prefill_token_threshold", threshold),
        reserve_full_isl=("scheduler_reserve_full_isl", reserve_full_isl),
        scheduling_policy=("scheduling_policy", scheduling_policy),
    )
    for i in range(random_count):
        sc, drawn = random_scenario(rng, i)
        runs.append((sc, dataclasses.replace(drawn, **chosen)))
    _refuse_unmodelled(used, runs)
    with _progress("vllm", len(runs), as_json) as bar:
        verdicts = []
        for sc, k in runs:
            bar.describe(sc.name)
            verdicts.append(conform(sc, k))
            bar.advance()
    different = [v for v in verdicts if v.differences]
    covered = coverage(runs, verdicts)
    engine = used.engine
    if as_json:
        echo_json(
            {
                "schema": "policykit.conformance.vllm/1",
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "engine": engine,
                "engine_release": used.to_dict(),
                "seed": seed if random_count else None,
                "settings": chosen,
                "scenarios": [v.to_dict() for v in verdicts],
                "identical": len(verdicts) - len(different),
                "different": len(different),
                "coverage": covered,
            }
        )
    else:
        _print_vllm(verdicts, different, covered, engine)
        if used.assumption:
            click.echo(f"assumed: {used.assumption}")
    if different:
        sys.exit(EXIT_DIFFERENT)


def _refuse_unmodelled(used: Resolved, runs: list[tuple[Scenario, SchedulerKnobs]]) -> None:
    """Refuse the comparison (bad input, exit 2) where the installed release is listed but not
    modelled and one of its unmodelled behaviours matters under some run's settings: the vLLM
    combo claims vLLM's decisions, and a run there would report an approximation as them."""
    from policykit.conformance.vllm.compare import vllm_combo
    from policykit.conformance.vllm.engine import settings_of
    from policykit.errors import PolicykitError

    for _, knobs in runs:
        refusal = unmodelled_refusal(used, settings_of(knobs), vllm_combo(knobs))
        if refusal is not None:
            raise PolicykitError(refusal)


def _print_vllm(
    verdicts: list[VllmComparison],
    different: list[VllmComparison],
    covered: dict[str, Any],
    engine: str,
) -> None:
    """``conformance vllm``'s text report: each scenario's verdict, the totals, and what the
    runs covered (so a reader sees whether a zero covers preemptions at all)."""
    for v in verdicts:
        if v.differences:
            click.echo(f"{v.scenario} ({v.combo}): {len(v.differences)} difference(s)")
            for line in v.differences:
                click.echo(f"  {line}")
        else:
            click.echo(f"{v.scenario} ({v.combo}): identical ({v.rounds} rounds)")
    click.echo(
        f"{len(verdicts)} scenario(s) against {engine}: "
        f"{len(verdicts) - len(different)} identical, {len(different)} different"
    )
    click.echo(
        "with preemptions {preemption}, with the long-prefill threshold "
        "{long_prefill_threshold}, with full-sequence reservation off {reserve_full_isl_off}, "
        "with priority scheduling {priority}, with device prefixes {device_prefix}".format(
            **covered
        )
    )
    sizes = ", ".join(f"{n} x {size}" for size, n in covered["block_size"].items())
    click.echo(
        "layout: with cached filler {filler}, with several device prefixes warmed under the "
        "threshold {prefixes_under_threshold} (without reservation "
        "{prefixes_without_reservation}), with a request in progress {in_progress}; "
        "block sizes: {sizes}".format(sizes=sizes, **covered)
    )
