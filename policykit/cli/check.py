"""``policykit check``: prove combos safe with z3, or print and export the counterexample.

Exit codes (documented in ``--help`` and docs): 0 every verdict proved; 1 some property
violated; 2 bad input, or a combo refused (the checker cannot vouch for one of its policies:
like bad input, it is the policy code that must change); 3 the solver gave up on something
(unknown). When several apply, the first in the order violated (1), refused (2), unknown (3)
wins: a counterexample is the most urgent news, and a refusal does not go away with a longer
timeout where an unknown may. One failing member of a list is that combo's ``refused`` row
(:func:`policykit.spec.isolation.refused_rows`), never the end of the list.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

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
from policykit.config import EngineConfig
from policykit.errors import ComboError, PolicykitError, UnfitPolicyError
from policykit.fairness import DEFAULT_OVERTAKING, OVERTAKING
from policykit.fidelity import Holds, approximation_lines
from policykit.progress import ProgressBar
from policykit.registry import VERDICT_KINDS, Combo, PolicyRegistry
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
_STYLE = {"proved": "green", "violated": "bold red", "unknown": "yellow", "refused": "magenta"}
#: one glyph per verdict in the compact matrix (plain symbols every terminal font has)
_GLYPH = {"proved": "✓", "violated": "✗", "unknown": "?", "refused": "–"}
#: with --all, or above this many combos, the table is the compact matrix unless --verbose
_COMPACT_ABOVE = 3


def _combos(
    registry: PolicyRegistry, texts: list[str] | None, engine: EngineConfig
) -> tuple[list[Combo], list[tuple[str, str]]]:
    """The combos named, or with ``--all`` every combo of the verdict kinds, then every one
    that preempts (vLLM's kind of node) where the configuration is one that node has (no
    sliding window, no max_prefill_tokens).

    Also the named combos that cannot run on ``engine`` because one of their policies says so
    (:class:`~policykit.errors.UnfitPolicyError`), each with the reason: they become
    ``refused`` rows and the rest of the list is still checked. A misspelt name stays bad
    input for the whole command."""
    if texts is None:
        combos = list(registry.all_combos(engine))
        if engine.sliding_window is None and engine.max_prefill_tokens is None:
            kinds = (*VERDICT_KINDS, "preemption")
            combos += [c for c in registry.all_combos(engine, kinds=kinds) if c.preempts]
        return combos, []
    resolved: list[Combo] = []
    unfit: list[tuple[str, str]] = []
    wanted: list[str | None] = [*texts] if texts else [None]
    for text in wanted:
        try:
            resolved.append(registry.resolve(text, config=engine))
        except UnfitPolicyError as exc:
            unfit.append((str(text), " ".join(str(exc).split())))
    return resolved, unfit


@click.command()
@combo_options
@click.option(
    "--rounds",
    type=click.IntRange(1, 12),
    default=4,
    show_default=True,
    help="Bounded checking: rounds unrolled (combos that preempt: 3 unless given).",
)
@click.option(
    "--requests",
    type=click.IntRange(1, 8),
    default=3,
    show_default=True,
    help="Bounded checking: symbolic requests (combos that preempt: 2 unless given).",
)
@click.option(
    "--page-size", type=click.IntRange(1, 4096), default=EngineConfig.page_size, show_default=True
)
@click.option(
    "--chunked-prefill-size",
    "--chunk-size",
    "chunked_prefill_size",
    type=click.IntRange(1, 1 << 20),
    default=EngineConfig.chunked_prefill_size,
    show_default=True,
    help="The compute budget per round, SGLang's chunked_prefill_size (--chunk-size: its "
    "former name here).",
)
@click.option(
    "--sliding-window",
    "--swa-window",
    "sliding_window",
    type=click.IntRange(1, 1 << 24),
    default=None,
    help="Check a hybrid sliding-window model with this window (tokens; --swa-window: its "
    "former name).",
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
    help="Bounded checking with --sliding-window: the smallest sliding-window pool searched, in "
    "tokens (default: one page). SGLang 0.5.23 refuses to start with a pool of at most "
    "window + page; give window + page + 1 to search only pools it runs with.",
)
@click.option(
    "--overtaking",
    type=click.IntRange(0, 16),
    default=DEFAULT_OVERTAKING,
    show_default=True,
    metavar="K",
    help="bounded-overtaking: no request an idle node would admit is passed over by more than "
    "K later arrivals (its bounded search uses at least K + 3 requests).",
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
    "--rlimit",
    type=click.IntRange(1000, 1 << 50),
    default=None,
    help="z3 resource units per solver query: the budget every verdict is decided within, "
    "counted in z3's own steps, not seconds, so the answers do not depend on the machine's "
    'speed or load [default: 60000000; docs/spec.md, "Solver budgets"].',
)
@click.option(
    "--timeout",
    type=click.FloatRange(1, 7 * 24 * 3600),
    default=3600.0,
    show_default=True,
    help="Wall-clock safety net for the whole command, in seconds. A verdict it cuts short "
    "says so; raise --rlimit, not this, to let the solver try harder.",
)
@click.option(
    "--page-sizes",
    default=None,
    metavar="LIST",
    help="Check every combo at each of these page sizes (comma-separated) in one run and one "
    "table, e.g. 1,16,64,256.",
)
@click.option(
    "--sliding-windows",
    "--swa-windows",
    "sliding_windows",
    default=None,
    metavar="LIST",
    help="Check every combo without (0) and with each of these sliding windows, e.g. 0,4096. "
    "With --page-sizes, every pair. Sliding-window pools SGLang 0.5.23 refuses to start with "
    "(at most window + page) are left out unless --min-swa-pool says otherwise.",
)
@click.option(
    "--matrix",
    is_flag=True,
    help="The whole matrix as one gate: --page-sizes 1,16,64,256 --sliding-windows 0,4096.",
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
    "--no-cache",
    is_flag=True,
    help="Check every combo anew: neither read nor write the verdict cache "
    '($POLICYKIT_CACHE_DIR, else $XDG_CACHE_HOME/policykit/check; docs/spec.md, "The matrix '
    'in a minute"). Without it, a combo already checked with the same checker code, z3, '
    "policies, configuration and options takes its stored verdicts (--executor pool only).",
)
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
    chunked_prefill_size: int,
    sliding_window: int | None,
    max_prefill_tokens: int | None,
    granule: int | None,
    pool_cap: int | None,
    min_swa_pool: int | None,
    overtaking: int,
    config_scenario: str | None,
    rlimit: int | None,
    timeout: float,
    page_sizes: str | None,
    sliding_windows: str | None,
    matrix: bool,
    export_dir: Path | None,
    jobs: int | None,
    executor: str,
    ray_address: str | None,
    no_cache: bool,
    verbose: bool,
    as_json: bool,
    out: Path | None,
) -> None:
    """Check policy combos against the admission-safety properties with z3.

    Each verdict is `proved (unbounded)` (induction: any number of rounds and requests),
    `proved to K=..,N=..` (bounded model checking only), `violated` (with a counterexample),
    `unknown` (the solver gave up; never counted as passing) or `refused` (the checker cannot
    reason about a policy of the combo, e.g. one using floats, or a policy refuses the engine
    configuration itself; the reason is given, and the other combos are still checked).

    A combo that preempts (vLLM's node, sixth part `vllm`) is checked for admitted-completes
    (no request admitted and then left unfinished forever) and no-starvation, on a model of
    that node: by induction where it holds, else bounded; --all checks those combos too
    (bounded-overtaking is not modelled on that node).

    Exit code 0: everything proved; 1: a violation; 2: bad input, or a combo refused (the
    checker will not vouch for a policy outside its contract); 3: a timeout or unknown.
    Precedence when several apply: 1, then 2, then 3. A list (--combo ..., --combos, --all)
    is never cut short by one member: a combo whose policy refuses the configuration, fails
    while being made or checked, or ends the process checking it gets its own `refused` row
    with the reason, and the exit code of the mixed result is that of its worst verdict
    (refused beside proofs: 2; beside a violation: 1). Exit 2 with verdicts printed means
    refused; bad input prints no verdicts.
    """
    from policykit.spec.report import row_of

    config = EngineConfig(page_size, chunked_prefill_size, sliding_window, max_prefill_tokens)
    if config_scenario is not None:
        config, pool_cap = _from_scenario(config_scenario, pool_cap)
    configs = _matrix_configs(config, page_sizes, sliding_windows, matrix)
    check_out_path(out)
    _, registry = load_registry()
    texts = combo_texts(combos, combo_list, check_all)
    budget = _Budget(rounds, requests, rlimit, timeout, granule, pool_cap, min_swa_pool, overtaking)
    plans = [_plan(registry, texts, c, budget, len(configs) > 1) for c in configs]
    count = sum(len(p.combos) + len(p.unfit) for p in plans)
    run = _Run(executor, jobs, ray_address, cache=not no_cache, quiet=as_json)
    verdicts, ran_on, cached = run.check(registry, plans)
    rows = [row_of(v) for v in verdicts] + [r for p in plans for r in p.unfit_rows()]
    if export_dir is not None:
        _export(export_dir, rows)
    data = _document(rows, plans, timeout, ran_on, cached)
    holds = Holds.of_checker(any(c.hybrid_swa for c in configs))
    data["approximations"] = approximation_lines([c for p in plans for c in p.combos], holds)
    if out is not None:
        write_json(out, data)
    if as_json:
        echo_json(data)
    else:
        detailed = verbose or (not check_all and count <= _COMPACT_ABOVE)
        _print_text(data, detailed, export_dir, count)
    sys.exit(exit_code(rows))


@dataclass(frozen=True)
class _Run:
    """How a run's plans are checked: where, how many at once, and with the verdict cache."""

    executor: str
    jobs: int | None
    ray_address: str | None
    cache: bool
    quiet: bool

    def check(
        self, registry: PolicyRegistry, plans: list[_Plan]
    ) -> tuple[list[Any], dict[str, Any], dict[str, Any] | None]:
        """Every plan's verdicts, on the process pool (through the verdict cache) or on the
        executor's workers (at most one job per combo checked), what they ran on, and the
        cache's block for the document (None off the pool)."""
        checked = sum(len(p.combos) for p in plans)
        jobs = max(1, min(self.jobs or os.cpu_count() or 1, checked))
        if self.executor != "pool":
            units = _check_units(plans, self.executor, jobs, self.ray_address, quiet=self.quiet)
            return (*units, None)
        rows, cached = _check_pool(registry, plans, jobs, quiet=self.quiet, cache=self.cache)
        return rows, {"name": "pool", "jobs": jobs}, cached


def _document(
    rows: list[dict[str, Any]],
    plans: list[_Plan],
    timeout: float,
    ran_on: dict[str, Any],
    cached: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``policykit.check/1`` document; a run over several configurations has each one's
    block under ``configs`` and what they share under ``config``; a run on the process pool
    says what the verdict cache gave under ``cache``."""
    from policykit.spec.report import check_document, config_block

    blocks = [config_block(p.config, p.options, timeout) for p in plans]
    extra: dict[str, Any] = {} if cached is None else {"cache": cached}
    if len(blocks) == 1:
        return check_document(rows, blocks[0], ran_on, **extra)
    return check_document(rows, _matrix_block(blocks), ran_on, configs=blocks, **extra)


#: ``--matrix``: the page sizes and sliding windows (None: no SWA) of the whole gate
MATRIX_PAGES = (1, 16, 64, 256)
MATRIX_WINDOWS: tuple[int | None, ...] = (None, 4096)


@dataclass(frozen=True)
class _Budget:
    """The bounds and budget options, the same for every configuration of a run."""

    rounds: int
    requests: int
    rlimit: int | None
    timeout: float
    granule: int | None
    pool_cap: int | None
    min_swa_pool: int | None
    overtaking: int = DEFAULT_OVERTAKING


@dataclass(frozen=True)
class _Plan:
    """One configuration of a run and the combos checked under it."""

    config: EngineConfig
    options: Any
    combos: list[Combo]
    #: named combos a policy of which refused this configuration: (as named, the reason)
    unfit: list[tuple[str, str]] = field(default_factory=list)

    def unfit_rows(self) -> list[dict[str, Any]]:
        """One ``refused`` row per unfit combo, the policy's own reason as its note."""
        from policykit.spec.checkable import REFUSED
        from policykit.spec.checker import Verdict, config_dict

        scope = config_dict(self.config)
        return [
            Verdict(text, "*", REFUSED, "-", 0.0, note=reason, config=scope).to_dict()
            for text, reason in self.unfit
        ]


def _plan(
    registry: PolicyRegistry,
    texts: list[str] | None,
    config: EngineConfig,
    b: _Budget,
    matrix: bool,
) -> _Plan:
    """The combos and options of one configuration of a run. In a matrix, sliding-window
    pools SGLang refuses to start with are left out unless asked for."""
    from policykit.spec.bmc import Bounds
    from policykit.spec.checker import CheckOptions
    from policykit.spec.report import wall_deadline
    from policykit.spec.solver import QUERY_RLIMIT

    pool_cap = b.pool_cap or Bounds.max_pool_tokens
    _refuse_bad_bounds(config, pool_cap, b.min_swa_pool)
    floor = b.min_swa_pool
    if matrix and config.sliding_window is not None and floor is None:
        floor = config.sliding_window + config.page_size + 1
    bounds = Bounds(max_pool_tokens=pool_cap, granule=b.granule, min_swa_pool_tokens=floor)
    options = CheckOptions(
        b.rounds, b.requests, b.rlimit or QUERY_RLIMIT, bounds, deadline=wall_deadline(b.timeout)
    )
    options = replace(options, overtaking=b.overtaking)
    # the model of a node that preempts has its own, smaller default bounds; given ones hold
    # for every combo
    ctx = click.get_current_context()
    for name in ("rounds", "requests"):
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            options = replace(options, **{f"preempting_{name}": getattr(b, name)})
    return _Plan(config, options, *_combos(registry, texts, config))


def _matrix_configs(
    config: EngineConfig, page_sizes: str | None, sliding_windows: str | None, matrix: bool
) -> list[EngineConfig]:
    """The configurations a run covers: ``config``, or it at each page size and window asked
    for (every pair)."""
    ctx = click.get_current_context()
    for flag, given in (("--page-sizes", page_sizes), ("--sliding-windows", sliding_windows)):
        single = "page_size" if flag == "--page-sizes" else "sliding_window"
        explicit = ctx.get_parameter_source(single) is not click.core.ParameterSource.DEFAULT
        if (given is not None or matrix) and explicit:
            raise ComboError(
                f"{flag} (or --matrix) and --{single.replace('_', '-')} both set the "
                "configuration: give one."
            )
    pages = list(MATRIX_PAGES) if matrix else [config.page_size]
    windows = list(MATRIX_WINDOWS) if matrix else [config.sliding_window]
    if page_sizes is not None:
        pages = [_positive(x, "--page-sizes") for x in _items(page_sizes, "--page-sizes")]
    if sliding_windows is not None:
        windows = [
            _positive(x, "--sliding-windows", zero=True) or None
            for x in _items(sliding_windows, "--sliding-windows")
        ]
    return [replace(config, page_size=p, sliding_window=w) for p in pages for w in windows]


def _items(text: str, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ComboError(f"{flag} needs a comma-separated list of numbers, e.g. 1,16,64,256.")
    return list(dict.fromkeys(items))


def _positive(text: str, flag: str, *, zero: bool = False) -> int:
    if not text.isdigit() or (int(text) == 0 and not zero):
        allowed = "whole numbers (0: no sliding window)" if zero else "positive whole numbers"
        raise ComboError(f"{flag}: {text!r} is not a size; give {allowed}, comma-separated.")
    return int(text)


def _matrix_block(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The document's ``config`` for a run over several configurations: what they share, the
    axes, and each one's scope (``configs`` has each block in full)."""
    first = blocks[0]
    shared = ("chunked_prefill_size", "max_prefill_tokens", "rounds", "requests", "rlimit")
    return {
        **{k: first[k] for k in (*shared, "timeout_s", "pool_cap_tokens")},
        "page_sizes": list(dict.fromkeys(b["page_size"] for b in blocks)),
        "sliding_windows": list(dict.fromkeys(b["sliding_window"] for b in blocks)),
        "scope": " | ".join(b["scope"] for b in blocks),
    }


def _refuse_bad_bounds(config: EngineConfig, pool_cap: int, min_swa_pool: int | None) -> None:
    page_size, sliding_window = config.page_size, config.sliding_window
    if pool_cap < page_size:
        raise ComboError(f"--pool-cap {pool_cap} is smaller than one {page_size}-token page.")
    if sliding_window is not None and sliding_window < page_size:
        raise ComboError(
            f"--sliding-window {sliding_window} is smaller than one {page_size}-token page."
        )
    if min_swa_pool is not None and sliding_window is None:
        raise ComboError(
            "--min-swa-pool bounds the sliding-window pool, which only a hybrid-SWA check has: "
            "give --sliding-window too (or a --config scenario with a sliding window)."
        )


def _print_text(data: dict[str, Any], detailed: bool, export_dir: Path | None, combos: int) -> None:
    """The text report: the table, its scope, what was cut short and why, refusals, then each
    counterexample (detailed view) with its starting state and how to replay it."""
    from policykit.spec.counterexample import start_table, trace_table
    from policykit.spec.report import summary_line

    rows = data["verdicts"]
    configs = data.get("configs") or [data["config"]]
    blocks = {(b["page_size"], b["sliding_window"]): b for b in configs}
    console = default_console()
    console.print(_table(rows) if detailed else _matrix(rows))
    for block in configs:
        console.print(Text(f"Verdicts {block['scope']}.", style="dim"))
    if any((r.get("bounds") or {}).get("node") == "preempting" for r in rows):
        b = configs[0]
        console.print(
            Text(
                f"Combos that preempt (vLLM's node): up to {b['preempting_rounds']} rounds, "
                f"{b['preempting_requests']} requests, prefix-cache hits over-approximated "
                "(docs/spec.md).",
                style="dim",
            )
        )
    for line in data.get("approximations", ()):
        console.print(Text(line, style="yellow"))
    _print_shortfalls(console, rows)
    _print_refusals(console, rows)
    _print_cache(console, data.get("cache"))
    if detailed:
        for v in rows:
            cx = v.get("counterexample")
            if cx is None or not cx.get("rounds"):
                continue
            title = f"{v['combo']}: {v['property']} violated"
            console.print(Text(f"{title}: starting state", style="bold"))
            console.print(fold(start_table(cx["scenario"])))
            console.print(fold(trace_table(cx, title)))
            c = v.get("config") or {}
            block = blocks.get((c.get("page_size"), c.get("sliding_window")), data["config"])
            hint = _replay_hint(v, block, export_dir)
            console.print(Text(hint, style="cyan"), soft_wrap=True)
    click.echo(summary_line(rows, combos))


def _replay_hint(row: dict[str, Any], block: dict[str, Any], export_dir: Path | None) -> str:
    """The commands that write this counterexample to a file and replay it in the scheduler:
    the same check of this one combo (the same configuration, bounds and budget give the same
    counterexample), then ``policykit simulate``."""
    from policykit.spec.counterexample import export_name

    folder = str(export_dir) if export_dir is not None else "counterexamples"
    path = shlex.quote(f"{folder.rstrip('/')}/{export_name(row['combo'], row['property'])}")
    replay = f"policykit simulate {path}"
    if export_dir is not None:
        return f"Replay it:\n  {replay}"
    flags = [("--combo", row["combo"]), ("--page-size", block["page_size"])]
    flags.append(("--chunked-prefill-size", block["chunked_prefill_size"]))
    for flag, key in (
        ("--sliding-window", "sliding_window"),
        ("--max-prefill-tokens", "max_prefill_tokens"),
        ("--min-swa-pool", "min_swa_pool_tokens"),
    ):
        if block.get(key) is not None:
            flags.append((flag, block[key]))
    if row["property"] == OVERTAKING:
        flags.append(("--overtaking", block.get("overtaking", DEFAULT_OVERTAKING)))
    preempting = (row.get("bounds") or {}).get("node") == "preempting"
    rounds, requests = (
        ("preempting_rounds", "preempting_requests") if preempting else ("rounds", "requests")
    )
    flags += [
        ("--rounds", block.get(rounds, block["rounds"])),
        ("--requests", block.get(requests, block["requests"])),
        ("--granule", block["granule"]),
        ("--pool-cap", block["pool_cap_tokens"]),
        ("--rlimit", block["rlimit"]),
        ("--export-counterexample", folder),
    ]
    words = ["policykit check", *(f"{f} {shlex.quote(str(v))}" for f, v in flags)]
    words += ["&&", "policykit simulate", path]
    return "Replay it:\n" + _shell_lines(words)


def _shell_lines(words: list[str], width: int = 76) -> str:
    """``words`` as a shell command folded with ``\\`` continuations, each line within
    ``width`` where a word allows: copied whole, it runs as one command; a terminal of 80
    columns shows it without breaking a flag from its value."""
    lines: list[str] = []
    line = ""
    for word in words:
        if line and len(line) + 1 + len(word) + 2 > width:
            lines.append(line)
            line = "    " + word
        else:
            line = f"{line} {word}" if line else "  " + word
    lines.append(line)
    return " \\\n".join(lines)


def _print_shortfalls(console: Console, rows: list[dict[str, Any]]) -> None:
    """Every verdict that reached less than was asked, or is unknown, with the reason in
    words (the table's glyph alone would hide it)."""
    from policykit.spec.report import shortfall_words

    several = _several_configs(rows)
    for r in rows:
        words = shortfall_words(r)
        if words and r["verdict"] != "refused":
            style = _STYLE.get(r["verdict"], "")
            console.print(Text(f"{_who(r, several)} {r['property']}: {words}", style=style))


def exit_code(rows: list[dict[str, Any]]) -> int:
    """The documented exit code of a set of verdicts (see the module docstring)."""
    present = {r["verdict"] for r in rows}
    return next((code for verdict, code in EXIT_CODES.items() if verdict in present), 0)


def _check_pool(
    registry: PolicyRegistry, plans: list[_Plan], jobs: int, *, quiet: bool, cache: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every combo in a fresh process of its own, ``jobs`` at a time
    (:mod:`policykit.spec.isolation`: the same verdicts whatever ``--jobs`` and the order),
    except those the verdict cache holds and those that repeat a member of the run
    (:mod:`policykit.spec.proof_cache`); also the document's ``cache`` block."""
    from policykit.spec.isolation import Task, check_isolated

    run = _cache_plan(registry, plans, cache)
    tasks = [
        Task(m.combo.as_dict(), m.config, m.options) for m in map(run.members.__getitem__, run.todo)
    ]
    # the zygote is forked here, before the progress threads start, so that no child inherits
    # a lock they hold
    injected = registry if _pm_injected() else None
    finished = check_isolated(tasks, min(jobs, len(tasks)), injected) if tasks else iter(())
    total = len(run.members)
    # one combo: no bar (it would only go from 0/1 to 1/1)
    with ProgressBar("check", total, unit="combos", quiet=quiet or total < 2) as bar:
        bar.advance(total - len(tasks))
        for j, found in finished:
            i = run.todo[j]
            run.record(i, found)
            bar.describe(str(run.members[i].combo))
            bar.advance()
    return [row for rows in run.all_rows() for row in rows], run.summary()


def _cache_plan(registry: PolicyRegistry, plans: list[_Plan], cache: bool) -> Any:
    """The run against the verdict cache (:class:`policykit.spec.proof_cache.RunCache`). With
    policies that exist in this process only, every member is checked: nothing is keyed."""
    from policykit.spec.proof_cache import Member, ProofCache, RunCache, cache_dir

    members = [Member(c, p.config, p.options) for p in plans for c in p.combos]
    if _pm_injected():
        return RunCache(members, None, todo=list(range(len(members))))
    store = ProofCache(cache_dir()) if cache else None
    return RunCache.plan(members, [registry.sources(m.combo) for m in members], store)


def _prefix(plan: _Plan, plans: list[_Plan]) -> str:
    """A unit id's configuration part, where a run has several."""
    if len(plans) == 1:
        return ""
    return f"page{plan.config.page_size}/swa{plan.config.sliding_window or 0}/"


def _pm_injected() -> bool:
    """A plugin manager handed in by the caller (``main(obj={"pm": pm})``): its policies may
    exist in this process only, so the checking processes are forked from it."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return isinstance(obj, dict) and obj.get("pm") is not None


def _from_scenario(arg: str, pool_cap: int | None) -> tuple[EngineConfig, int]:
    """``--config``: the engine configuration of a user's scenario and its pool as the pool
    cap (an explicit --pool-cap wins; an explicit option for any of the configuration's
    numbers is refused as ambiguous)."""
    from policykit.scenario import load_scenario, pool_tokens, resolve_scenario_path

    ctx = click.get_current_context()
    clash = [
        f"--{name.replace('_', '-')}"
        for name in ("page_size", "chunked_prefill_size", "sliding_window", "max_prefill_tokens")
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    ]
    if clash:
        raise ComboError(
            f"--config takes the engine configuration from {arg!r}; give it or "
            f"{', '.join(clash)}, not both."
        )
    scenario = load_scenario(resolve_scenario_path(arg))
    return scenario.config, pool_cap or pool_tokens(scenario)


def _check_units(
    plans: list[_Plan],
    executor: str,
    workers: int | None,
    ray_address: str | None,
    *,
    quiet: bool,
) -> tuple[list[dict], dict]:
    """One ``check_unit`` per combo on the executor seam; verdicts as dicts, in combo order.

    A refused combo comes back as ``refused`` verdicts (the unit itself succeeds). A unit that
    failed (the check itself could not run: a lost worker, a timeout) becomes an ``unknown``
    row saying why, so it is never reported as passing.
    """
    from policykit.executor import Status, SweepProgress, Unit, open_executor, run_units
    from policykit.spec.report import failed_unit_row, unit_args

    target = "policykit.executor.units:check_unit"
    units = [
        Unit(
            f"check/{_prefix(p, plans)}{c}",
            "check",
            target,
            {**unit_args(p.config, p.options), "combo": str(c)},
        )
        for p in plans
        for c in p.combos
    ]
    with (
        open_executor(executor, workers=workers, ray_address=ray_address) as pool,
        SweepProgress(len(units), label="check", quiet=quiet) as progress,
    ):
        results = run_units(units, pool, listener=progress)
    verdicts: list[dict] = []
    for r in results.units:
        if r.status is Status.OK and r.result is not None:
            verdicts += [
                {**v, "executor": r.executor, "node": r.node} for v in r.result["verdicts"]
            ]
        else:
            verdicts.append(failed_unit_row(r.unit.args["combo"], r.status.value, r.error))
    return verdicts, results.executor


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
    several = _several_configs(rows)
    for v in rows:
        seconds = f"{v['seconds']:.2f}"
        table.add_row(_who(v, several), v["property"], _verdict_text(v), v["bound"], seconds)
    return fold(table)


def _config_label(row: dict[str, Any]) -> str:
    """``page 64`` or ``page 64, SWA 4096``: a row's configuration, for runs over several."""
    c = row.get("config") or {}
    if "page_size" not in c:
        return ""
    return f"page {c['page_size']}" + (
        f", SWA {c['sliding_window']}" if c.get("sliding_window") else ""
    )


def _several_configs(rows: list[dict[str, Any]]) -> bool:
    return len({_config_label(r) for r in rows}) > 1


def _who(row: dict[str, Any], several: bool) -> str:
    """The combo, with its configuration where a run has several."""
    return f"{_config_label(row)}: {row['combo']}" if several else row["combo"]


def _matrix(rows: list[dict[str, Any]]) -> Group:
    """One row per combo, one glyph per property: readable at 80 columns for 80 combos."""
    props = list(dict.fromkeys(r["property"] for r in rows if r["property"] != "*"))
    several = _several_configs(rows)
    by_combo: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_combo.setdefault(_who(r, several), {})[r["property"]] = r
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


def _print_cache(console: Console, block: dict[str, Any] | None) -> None:
    """Where verdicts came from the cache, how many and from where: a reader of a gate's log
    should know which verdicts this run computed."""
    if not block or not (block.get("hits") or block.get("shared")):
        return
    parts = []
    if block.get("hits"):
        parts.append(
            f"{block['hits']} combos' verdicts from the cache in {block['dir']} (checked before "
            "with the same checker code, z3, policies, configuration and options; --no-cache "
            "checks them anew)"
        )
    if block.get("shared"):
        parts.append(f"{block['shared']} combos named twice were checked once")
    console.print(Text("; ".join(parts) + ".", style="dim"))


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
    from policykit.spec.counterexample import export_name

    try:
        folder.mkdir(parents=True, exist_ok=True)
        for v in rows:
            # only counterexamples that replay to their failure (``simulate`` exits non-zero)
            if v["counterexample"] is not None and v["counterexample"].get("failure"):
                path = folder / export_name(v["combo"], v["property"])
                path.write_text(json.dumps(v["counterexample"]["scenario"], indent=2) + "\n")
    except OSError as exc:
        raise PolicykitError(f"Cannot write counterexamples to {str(folder)!r}: {exc}.") from None
