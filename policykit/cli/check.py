"""``policykit check``: prove combos safe with z3, or print and export the counterexample."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import click
import z3
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from policykit.cli.common import echo_json, json_option, load_registry, ray_address_option
from policykit.errors import ComboError, PolicykitError
from policykit.policy import EngineConfig
from policykit.registry import Combo, PolicyRegistry

EXIT_VIOLATED = 1
EXIT_UNKNOWN = 3
_STYLE = {"proved": "green", "violated": "bold red", "unknown": "yellow"}


def _combos(
    registry: PolicyRegistry, combos: tuple[str, ...], check_all: bool, engine: EngineConfig
) -> list[Combo]:
    if check_all and combos:
        raise ComboError("Give either --all or --combo, not both.")
    if check_all:
        return list(registry.all_combos(engine))
    return [registry.resolve(c, config=engine) for c in combos or (None,)]


def _sources(registry: PolicyRegistry, combo: Combo) -> dict[str, str]:
    """Where each policy of the combo comes from, for error messages."""
    return {
        "admission": str(registry.entry("admission", combo.admission.name).source),
        "chunking": str(registry.entry("chunking", combo.chunking.name).source),
        "alignment": str(registry.entry("alignment", combo.alignment.name).source),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text)


@click.command()
@click.option("--combo", "combos", multiple=True, help="KIND=POLICY[,...]; repeatable.")
@click.option("--all", "check_all", is_flag=True, help="Every registered combination.")
@click.option("--rounds", type=click.IntRange(1, 12), default=4, show_default=True)
@click.option("--requests", type=click.IntRange(1, 8), default=3, show_default=True)
@click.option("--page-size", type=click.IntRange(1, 4096), default=64, show_default=True)
@click.option(
    "--chunk-size",
    type=click.IntRange(1, 1 << 20),
    default=4096,
    show_default=True,
    help="chunked_prefill_size (the compute budget per round).",
)
@click.option(
    "--swa-window",
    type=click.IntRange(1, 1 << 24),
    default=None,
    help="Check a hybrid sliding-window model with this window (tokens).",
)
@click.option(
    "--granule",
    type=click.IntRange(1, 1 << 20),
    default=None,
    help="Prompt and host-prefix lengths are multiples of this (default: the page size).",
)
@click.option(
    "--pool-cap",
    type=click.IntRange(1, 1 << 26),
    default=None,
    help="Bounded checking: the largest KV pool searched, in tokens (default 262144 = 2^18, "
    "or the --config scenario's pool). Unbounded proofs do not depend on it.",
)
@click.option(
    "--config",
    "config_scenario",
    default=None,
    metavar="SCENARIO",
    help="Take page size, chunk size, SWA window and the pool cap from this scenario file "
    "(or bundled scenario name) instead of --page-size/--chunk-size/--swa-window.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 3600),
    default=10.0,
    show_default=True,
    help="Seconds per solver query.",
)
@click.option(
    "--export-counterexample",
    "export_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write each counterexample as a scenario file `policykit simulate` replays.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=None,
    help="Combos checked in parallel (default: one per CPU core).",
)
@click.option(
    "--executor",
    type=click.Choice(["pool", "local", "ray"]),
    default="pool",
    show_default=True,
    help="pool: --jobs forked processes here; local/ray: one unit per combo on the executor "
    "seam (a spawned process pool, or a Ray cluster; see docs/cluster.md).",
)
@ray_address_option
@json_option
def check(
    combos: tuple[str, ...],
    check_all: bool,
    rounds: int,
    requests: int,
    page_size: int,
    chunk_size: int,
    swa_window: int | None,
    granule: int | None,
    pool_cap: int | None,
    config_scenario: str | None,
    timeout: float,
    export_dir: Path | None,
    jobs: int | None,
    executor: str,
    ray_address: str | None,
    as_json: bool,
) -> None:
    """Check policy combos against the admission-safety properties with z3.

    Each verdict is `proved (unbounded)` (induction: any number of rounds and requests),
    `proved to K=..,N=..` (bounded model checking only), `violated` (with a counterexample)
    or `unknown` (the solver gave up; never counted as passing).

    Exit code 0: nothing violated; 1: a violation; 2: bad input; 3: a timeout or unknown.
    """
    from policykit.spec.bmc import Bounds
    from policykit.spec.checker import CheckOptions, check_combo, scope_text
    from policykit.spec.counterexample import trace_table
    from policykit.spec.model import ModelConfig

    if config_scenario is not None:
        page_size, chunk_size, swa_window, pool_cap = _from_scenario(config_scenario, pool_cap)
    pool_cap = pool_cap or Bounds.max_pool_tokens
    if pool_cap < page_size:
        raise ComboError(f"--pool-cap {pool_cap} is smaller than one {page_size}-token page.")
    if swa_window is not None and swa_window < page_size:
        raise ComboError(f"--swa-window {swa_window} is smaller than one {page_size}-token page.")
    _, registry = load_registry()
    engine = EngineConfig(page_size, chunk_size, hybrid_swa=swa_window is not None)
    chosen = _combos(registry, combos, check_all, engine)
    config = ModelConfig(page_size, chunk_size, swa_window)
    options = CheckOptions(
        rounds, requests, timeout, Bounds(max_pool_tokens=pool_cap, granule=granule)
    )
    console = Console(stderr=True)
    jobs = min(jobs or os.cpu_count() or 1, len(chosen))
    verdicts: list = []
    if executor != "pool":
        unit_args = {
            "page_size": page_size,
            "chunk_size": chunk_size,
            "swa_window": swa_window,
            "rounds": rounds,
            "requests": requests,
            "timeout": timeout,
            "granule": granule,
            "pool_cap": pool_cap,
        }
        verdicts, ran_on = _check_units(chosen, unit_args, executor, jobs, ray_address)
    else:
        ran_on = {"name": "pool", "jobs": jobs}
    with Progress(
        console=console, transient=True, disable=as_json or len(chosen) < 2 or bool(verdicts)
    ) as bar:
        task = bar.add_task("checking", total=len(chosen))
        if verdicts:
            pass  # already checked on the executor
        elif jobs == 1:
            for combo in chosen:
                bar.update(task, description=str(combo))
                verdicts += check_combo(combo, config, options, _sources(registry, combo))
                bar.advance(task)
        else:
            # z3 is single-threaded: separate processes use the cores; each re-resolves its
            # combo from the installed plugins (policies themselves are not sent across)
            with ProcessPoolExecutor(jobs) as pool:
                futures = [
                    pool.submit(_check_in_worker, combo.as_dict(), config, options)
                    for combo in chosen
                ]
                for future in futures:
                    verdicts += future.result()
                    bar.advance(task)
    if export_dir is not None:
        _export(export_dir, verdicts)
    if as_json:
        echo_json(
            {
                "schema": "policykit.check/1",
                "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "device": f"CPU (z3 {z3.get_version_string()})",
                "executor": ran_on,
                "config": {
                    "page_size": page_size,
                    "chunked_prefill_size": chunk_size,
                    "swa_window": swa_window,
                    "rounds": rounds,
                    "requests": requests,
                    "granule": granule or page_size,
                    "pool_cap_tokens": pool_cap,
                    "scope": scope_text(config, options),
                },
                "verdicts": [_as_dict(v) for v in verdicts],
            }
        )
    else:
        out = Console()
        table = _table(verdicts)
        table.caption = f"Verdicts {scope_text(config, options)}."
        out.print(table)
        for v in verdicts:
            if getattr(v, "counterexample", None) is not None:
                out.print(trace_table(v.counterexample, f"{v.combo}: {v.property} violated"))
    labels = {_as_dict(v)["verdict"] for v in verdicts}
    if "violated" in labels:
        sys.exit(EXIT_VIOLATED)
    if "unknown" in labels:
        sys.exit(EXIT_UNKNOWN)


def _from_scenario(arg: str, pool_cap: int | None) -> tuple[int, int, int | None, int]:
    """``--config``: page size, chunk size, SWA window and pool cap of a user's scenario (an
    explicit --pool-cap wins; an explicit --page-size, --chunk-size or --swa-window is refused
    as ambiguous)."""
    from policykit.scenario import load_scenario, resolve_scenario_path
    from policykit.spec.checker import config_from_scenario

    ctx = click.get_current_context()
    clash = [
        f"--{name.replace('_', '-')}"
        for name in ("page_size", "chunk_size", "swa_window")
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    ]
    if clash:
        raise ComboError(
            f"--config takes the engine configuration from {arg!r}; give it or "
            f"{', '.join(clash)}, not both."
        )
    config, pool = config_from_scenario(load_scenario(resolve_scenario_path(arg)))
    return config.page_size, config.chunked_prefill_size, config.swa_window, pool_cap or pool


def _check_in_worker(combo: dict[str, str], config, options) -> list:
    from policykit.spec.checker import check_combo

    _, registry = load_registry()
    chosen = registry.resolve(combo)
    return check_combo(chosen, config, options, _sources(registry, chosen))


def _check_units(
    chosen: list[Combo],
    unit_args: dict,
    executor: str,
    workers: int | None,
    ray_address: str | None,
) -> tuple[list[dict], dict]:
    """One ``check_unit`` per combo on the executor seam; verdicts as dicts, in combo order.

    A unit that failed (not a violation: the check itself could not run) becomes ``unknown``
    verdicts saying why, so it is never reported as passing.
    """
    from policykit.executor import Status, SweepProgress, Unit, open_executor, run_units

    units = [
        Unit(
            f"check/{c}",
            "check",
            "policykit.executor.units:check_unit",
            {**unit_args, "combo": str(c)},
        )
        for c in chosen
    ]
    with (
        open_executor(executor, workers=workers, ray_address=ray_address) as pool,
        SweepProgress(len(units), label="check") as progress,
    ):
        results = run_units(units, pool, listener=progress)
    verdicts: list[dict] = []
    for r in results.units:
        if r.status is Status.OK and r.result is not None:
            verdicts += [
                {**v, "executor": r.executor, "node": r.node} for v in r.result["verdicts"]
            ]
        else:
            verdicts.append(
                {
                    "combo": r.unit.args["combo"],
                    "property": "*",
                    "verdict": "unknown",
                    "bound": "-",
                    "seconds": 0.0,
                    "note": f"unit {r.status.value}: {r.error}",
                    "counterexample": None,
                }
            )
    return verdicts, results.executor


def _as_dict(v: object) -> dict:
    """A verdict as JSON-able data, whether checked here (``Verdict``) or on an executor."""
    return v if isinstance(v, dict) else v.to_dict()  # type: ignore[attr-defined]


def _table(verdicts: list) -> Table:
    table = Table(title="policykit check", title_justify="left", header_style="bold")
    for col in ("combo", "property", "verdict", "bound", "seconds"):
        table.add_column(col, justify="right" if col == "seconds" else "left")
    for v in map(_as_dict, verdicts):
        table.add_row(
            v["combo"],
            v["property"],
            Text(v["verdict"], style=_STYLE[v["verdict"]]),
            v["bound"],
            f"{v['seconds']:.2f}",
        )
    return table


def _export(folder: Path, verdicts: list) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for v in map(_as_dict, verdicts):
            # only counterexamples that replay to their failure (``simulate`` exits non-zero)
            if v["counterexample"] is not None and v["counterexample"].get("failure"):
                path = folder / f"{_slug(v['combo'])}.{v['property']}.json"
                path.write_text(json.dumps(v["counterexample"]["scenario"], indent=2) + "\n")
    except OSError as exc:
        raise PolicykitError(f"Cannot write counterexamples to {str(folder)!r}: {exc}.") from None
