"""``policykit check``: prove combos safe with z3, or print and export the counterexample.

Exit codes (documented in ``--help`` and docs): 0 every verdict proved; 1 some property
violated; 2 bad input, or a combo refused (the checker cannot vouch for one of its policies:
like bad input, it is the policy code that must change); 3 the solver gave up on something
(unknown). When several apply, the first in the order violated (1), refused (2), unknown (3)
wins: a counterexample is the most urgent news, and a refusal does not go away with a longer
timeout where an unknown may.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import click
import z3
from rich.console import Console, Group
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from policykit.cli.common import (
    check_out_path,
    combo_options,
    combo_texts,
    document,
    echo_json,
    json_option,
    load_registry,
    out_option,
    ray_address_option,
    write_json,
)
from policykit.errors import ComboError, PolicykitError
from policykit.fidelity import Holds, approximation_lines
from policykit.heartbeat import Heartbeat
from policykit.policy import EngineConfig
from policykit.registry import Combo, PolicyRegistry
from policykit.render import default_console, fold

EXIT_VIOLATED = 1
EXIT_UNKNOWN = 3
EXIT_REFUSED = 2
#: verdict -> exit code, in precedence order (the first present wins)
EXIT_CODES: dict[str, int] = {
    "violated": EXIT_VIOLATED,
    "refused": EXIT_REFUSED,
    "unknown": EXIT_UNKNOWN,
}
VERDICT_ORDER = ("proved", "violated", "unknown", "refused")
_STYLE = {"proved": "green", "violated": "bold red", "unknown": "yellow", "refused": "magenta"}
#: one glyph per verdict in the compact matrix (plain symbols every terminal font has)
_GLYPH = {"proved": "✓", "violated": "✗", "unknown": "?", "refused": "–"}
#: with --all, or above this many combos, the table is the compact matrix unless --verbose
_COMPACT_ABOVE = 3


def _combos(registry: PolicyRegistry, texts: list[str] | None, engine: EngineConfig) -> list[Combo]:
    if texts is None:
        return list(registry.all_combos(engine))
    return [registry.resolve(c, config=engine) for c in texts or [None]]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text.replace("/", "+"))


@click.command()
@combo_options
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
    "--max-prefill-tokens",
    type=click.IntRange(1, 1 << 24),
    default=None,
    help="The round's input budget (SGLang's max_prefill_tokens; default: none).",
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
    "--min-swa-pool",
    type=click.IntRange(1, 1 << 26),
    default=None,
    help="Bounded checking with --swa-window: the smallest sliding-window pool searched, in "
    "tokens (default: one page). SGLang 0.5.23 refuses to start with a pool of at most "
    "window + page; give window + page + 1 to search only pools it runs with.",
)
@click.option(
    "--config",
    "config_scenario",
    default=None,
    metavar="SCENARIO",
    help="Take page size, chunk size, SWA window, max_prefill_tokens and the pool cap from this "
    "scenario file (or bundled scenario name) instead of the options that set them.",
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
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="One row per combo and property, and every counterexample trace (the default for "
    "up to three --combo; --all prints one row per combo).",
)
@json_option
@out_option
def check(
    combos: tuple[str, ...],
    combo_list: tuple[str, ...],
    check_all: bool,
    rounds: int,
    requests: int,
    page_size: int,
    chunk_size: int,
    swa_window: int | None,
    max_prefill_tokens: int | None,
    granule: int | None,
    pool_cap: int | None,
    min_swa_pool: int | None,
    config_scenario: str | None,
    timeout: float,
    export_dir: Path | None,
    jobs: int | None,
    executor: str,
    ray_address: str | None,
    verbose: bool,
    as_json: bool,
    out: Path | None,
) -> None:
    """Check policy combos against the admission-safety properties with z3.

    Each verdict is `proved (unbounded)` (induction: any number of rounds and requests),
    `proved to K=..,N=..` (bounded model checking only), `violated` (with a counterexample),
    `unknown` (the solver gave up; never counted as passing) or `refused` (the checker cannot
    reason about a policy of the combo, e.g. one using floats; the reason is given, and the
    other combos are still checked).

    Exit code 0: everything proved; 1: a violation; 2: bad input, or a combo refused (the
    checker will not vouch for a policy outside its contract); 3: a timeout or unknown.
    Precedence when several apply: 1, then 2, then 3.
    """
    from policykit.spec.bmc import Bounds
    from policykit.spec.checker import CheckOptions, scope_text
    from policykit.spec.counterexample import trace_table
    from policykit.spec.model import ModelConfig

    if config_scenario is not None:
        page_size, chunk_size, swa_window, max_prefill_tokens, pool_cap = _from_scenario(
            config_scenario, pool_cap
        )
    pool_cap = pool_cap or Bounds.max_pool_tokens
    if pool_cap < page_size:
        raise ComboError(f"--pool-cap {pool_cap} is smaller than one {page_size}-token page.")
    if swa_window is not None and swa_window < page_size:
        raise ComboError(f"--swa-window {swa_window} is smaller than one {page_size}-token page.")
    if min_swa_pool is not None and swa_window is None:
        raise ComboError(
            "--min-swa-pool bounds the sliding-window pool, which only a hybrid-SWA check has: "
            "give --swa-window too (or a --config scenario with a sliding window)."
        )
    check_out_path(out)
    _, registry = load_registry()
    engine = EngineConfig(page_size, chunk_size, hybrid_swa=swa_window is not None)
    chosen = _combos(registry, combo_texts(combos, combo_list, check_all), engine)
    config = ModelConfig(page_size, chunk_size, swa_window, max_prefill_tokens)
    bounds = Bounds(max_pool_tokens=pool_cap, granule=granule, min_swa_pool_tokens=min_swa_pool)
    options = CheckOptions(rounds, requests, timeout, bounds)
    jobs = min(jobs or os.cpu_count() or 1, len(chosen))
    if executor != "pool":
        unit_args = {
            "page_size": page_size,
            "chunk_size": chunk_size,
            "swa_window": swa_window,
            "max_prefill_tokens": max_prefill_tokens,
            "rounds": rounds,
            "requests": requests,
            "timeout": timeout,
            "granule": granule,
            "pool_cap": pool_cap,
            "min_swa_pool": min_swa_pool,
        }
        verdicts, ran_on = _check_units(chosen, unit_args, executor, jobs, ray_address)
    else:
        verdicts = _check_pool(registry, chosen, config, options, jobs, quiet=as_json)
        ran_on = {"name": "pool", "jobs": jobs}
    rows = [_as_dict(v) for v in verdicts]
    notes = approximation_lines(chosen, Holds.of_checker(swa_window is not None))
    if export_dir is not None:
        _export(export_dir, rows)
    data = document(
        {
            "device": f"CPU (z3 {z3.get_version_string()})",
            "executor": ran_on,
            "config": {
                "page_size": page_size,
                "chunked_prefill_size": chunk_size,
                "swa_window": swa_window,
                "max_prefill_tokens": max_prefill_tokens,
                "rounds": rounds,
                "requests": requests,
                "granule": granule or page_size,
                "pool_cap_tokens": pool_cap,
                "min_swa_pool_tokens": min_swa_pool,
                "scope": scope_text(config, options),
            },
            "summary": summary_counts(rows),
            "verdicts": rows,
            "approximations": notes,
        },
        "policykit.check/1",
    )
    if out is not None:
        write_json(out, data)
    if as_json:
        echo_json(data)
    else:
        console = default_console()
        detailed = verbose or (not check_all and len(chosen) <= _COMPACT_ABOVE)
        console.print(_table(rows) if detailed else _matrix(rows))
        console.print(Text(f"Verdicts {scope_text(config, options)}.", style="dim"))
        for line in notes:
            console.print(Text(line, style="yellow"))
        _print_refusals(console, rows)
        if detailed:
            for v in verdicts:
                if getattr(v, "counterexample", None) is not None:
                    title = f"{v.combo}: {v.property} violated"
                    console.print(fold(trace_table(v.counterexample, title)))
        click.echo(summary_line(rows, len(chosen)))
    sys.exit(exit_code(rows))


def exit_code(rows: list[dict[str, Any]]) -> int:
    """The documented exit code of a set of verdicts (see the module docstring)."""
    present = {r["verdict"] for r in rows}
    return next((code for verdict, code in EXIT_CODES.items() if verdict in present), 0)


def summary_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts = Counter(r["verdict"] for r in rows)
    return {v: counts.get(v, 0) for v in VERDICT_ORDER}


def summary_line(rows: list[dict[str, Any]], combos: int) -> str:
    """``36 combos: 170 proved (160 unbounded), 10 violated, 0 unknown, 0 refused``."""
    counts = summary_counts(rows)
    unbounded = sum(r["verdict"] == "proved" and r["bound"] == "unbounded" for r in rows)
    parts = [f"{counts['proved']} proved ({unbounded} unbounded)"]
    parts += [f"{counts[v]} {v}" for v in VERDICT_ORDER[1:]]
    return f"{combos} combos: {', '.join(parts)}"


def _check_pool(
    registry: PolicyRegistry,
    chosen: list[Combo],
    config: Any,
    options: Any,
    jobs: int,
    *,
    quiet: bool,
) -> list:
    """Every combo here: in this process, or on ``jobs`` forked processes."""
    from policykit.spec import check_or_refuse

    console = Console(stderr=True)
    verdicts: list = []
    # z3 is single-threaded: separate processes use the cores; each re-resolves its combo
    # from the installed plugins (policies themselves are not sent across). The workers are
    # forked before the progress threads start, so that no child inherits a lock they hold.
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    futures = (
        [pool.submit(_check_in_worker, combo.as_dict(), config, options) for combo in chosen]
        if pool is not None
        else []
    )
    try:
        with (
            Progress(console=console, transient=True, disable=quiet or len(chosen) < 2) as bar,
            Heartbeat("check", len(chosen), enabled=len(chosen) > 1) as beat,
        ):
            task = bar.add_task("checking", total=len(chosen))
            for i, combo in enumerate(chosen):
                bar.update(task, description=str(combo))
                beat.describe(str(combo))
                if pool is None:
                    verdicts += check_or_refuse(combo, config, options, registry.sources(combo))
                else:
                    verdicts += futures[i].result()
                bar.advance(task)
                beat.advance()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return verdicts


def _from_scenario(arg: str, pool_cap: int | None) -> tuple[int, int, int | None, int | None, int]:
    """``--config``: page size, chunk size, SWA window, max_prefill_tokens and pool cap of a
    user's scenario (an explicit --pool-cap wins; an explicit option for any of the others is
    refused as ambiguous)."""
    from policykit.scenario import load_scenario, resolve_scenario_path
    from policykit.spec.checker import config_from_scenario

    ctx = click.get_current_context()
    clash = [
        f"--{name.replace('_', '-')}"
        for name in ("page_size", "chunk_size", "swa_window", "max_prefill_tokens")
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    ]
    if clash:
        raise ComboError(
            f"--config takes the engine configuration from {arg!r}; give it or "
            f"{', '.join(clash)}, not both."
        )
    config, pool = config_from_scenario(load_scenario(resolve_scenario_path(arg)))
    return (
        config.page_size,
        config.chunked_prefill_size,
        config.swa_window,
        config.max_prefill_tokens,
        pool_cap or pool,
    )


def _check_in_worker(combo: dict[str, str], config, options) -> list:
    from policykit.spec import check_or_refuse

    _, registry = load_registry()
    chosen = registry.resolve(combo)
    return check_or_refuse(chosen, config, options, registry.sources(chosen))


def _check_units(
    chosen: list[Combo],
    unit_args: dict,
    executor: str,
    workers: int | None,
    ray_address: str | None,
) -> tuple[list[dict], dict]:
    """One ``check_unit`` per combo on the executor seam; verdicts as dicts, in combo order.

    A refused combo comes back as ``refused`` verdicts (the unit itself succeeds). A unit that
    failed (the check itself could not run: a lost worker, a timeout) becomes ``unknown``
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


def _verdict_text(v: dict[str, Any]) -> Text:
    return Text(v["verdict"], style=_STYLE.get(v["verdict"], ""))


def _table(rows: list[dict[str, Any]]) -> Table:
    """One row per combo and property (``--verbose``, or a handful of combos)."""
    table = Table(title="policykit check", title_justify="left", header_style="bold")
    widest = max((len(v["combo"]) for v in rows), default=5)
    table.add_column("combo", min_width=min(widest, 34))
    table.add_column("property")
    table.add_column("verdict")
    table.add_column("bound")
    table.add_column("s", justify="right")
    for v in rows:
        seconds = f"{v['seconds']:.2f}"
        table.add_row(v["combo"], v["property"], _verdict_text(v), v["bound"], seconds)
    return fold(table)


def _matrix(rows: list[dict[str, Any]]) -> Group:
    """One row per combo, one glyph per property: readable at 80 columns for 80 combos."""
    props = list(dict.fromkeys(r["property"] for r in rows if r["property"] != "*"))
    by_combo: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_combo.setdefault(r["combo"], {})[r["property"]] = r
    legend = "  ".join(f"{g} {v}" for v, g in _GLYPH.items()) + "  (b: proved bounded only)"
    keys = "  ".join(f"{chr(ord('A') + i)} {p}" for i, p in enumerate(props))
    table = Table(title="policykit check", title_justify="left", header_style="bold")
    # the backslash keeps rich from reading "[/phase/queue]" as a closing markup tag
    table.add_column("combo (admission/chunking/alignment\\[/phase/queue])", overflow="fold")
    for i in range(len(props)):
        table.add_column(f"{chr(ord('A') + i)}", justify="center", no_wrap=True)
    for combo, cells in by_combo.items():
        glyphs = []
        for prop in props:
            v = cells.get(prop) or cells.get("*")
            if v is None:
                glyphs.append(Text(" "))
                continue
            mark = _GLYPH.get(v["verdict"], "?")
            if v["verdict"] == "proved" and v["bound"] != "unbounded":
                mark += "b"
            glyphs.append(Text(mark, style=_STYLE.get(v["verdict"], "")))
        table.add_row(combo, *glyphs)
    return Group(fold(table), Text(keys), Text(legend))


def _print_refusals(console: Console, rows: list[dict[str, Any]]) -> None:
    """Each distinct refusal reason once, with the combos it refused."""
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r["verdict"] == "refused":
            combos = reasons.setdefault(r["note"], [])
            if r["combo"] not in combos:
                combos.append(r["combo"])
    for reason, combos in reasons.items():
        shown = ", ".join(combos[:3]) + (f" and {len(combos) - 3} more" if len(combos) > 3 else "")
        console.print(Text(f"refused ({shown}): {reason}", style="magenta"))


def _export(folder: Path, rows: list[dict[str, Any]]) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for v in rows:
            # only counterexamples that replay to their failure (``simulate`` exits non-zero)
            if v["counterexample"] is not None and v["counterexample"].get("failure"):
                path = folder / f"{_slug(v['combo'])}.{v['property']}.json"
                path.write_text(json.dumps(v["counterexample"]["scenario"], indent=2) + "\n")
    except OSError as exc:
        raise PolicykitError(f"Cannot write counterexamples to {str(folder)!r}: {exc}.") from None
