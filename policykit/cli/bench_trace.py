"""``policykit bench`` on a production trace: options, progress, the run and its table.

A trace replay is scheduler-level for every request (the roofline clock prices each round), with
the model forward on a declared slice; see :mod:`policykit.harness.trace_bench`. A replay of a
whole trace takes minutes, so it draws a bar on a terminal (requests done, rounds, the clock,
ETA); nothing under ``--json``, in a log or in CI.
"""

from __future__ import annotations

import datetime as dt
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from policykit.cli.common import load_registry, warn_if_uncheckable
from policykit.errors import PolicykitError
from policykit.progress import ProgressBar
from policykit.render import fold

if TYPE_CHECKING:
    import torch

    from policykit.harness.presets import ModelPreset
    from policykit.harness.trace_replay import ReplayConfig
    from policykit.harness.traces import Trace
    from policykit.registry import Combo

#: requests of a trace the CPU runs the real model on when --forward-requests is not given
CPU_FORWARD_REQUESTS = 1
#: rounds between two progress redraws (a replay runs thousands of rounds a second)
_REDRAW_ROUNDS = 64


def trace_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options only a production trace uses."""
    f = click.option(
        "--forward-requests",
        type=click.IntRange(min=0),
        default=None,
        help=f"Production traces: run the real model forward (--model) on the first N requests "
        f"of every combo and check that its outcomes match the scheduler-level replay (default "
        f"{CPU_FORWARD_REQUESTS} on the CPU, the whole trace on CUDA; 0: none).",
    )(f)
    f = click.option(
        "--requests",
        type=click.IntRange(min=1),
        default=None,
        help="Production traces: replay only the first N requests (a declared slice).",
    )(f)
    f = click.option(
        "--host-tier",
        type=click.Choice(["write-through", "off"]),
        default="write-through",
        show_default=True,
        help="Production traces: keep every computed block in an unbounded host store "
        "(loaded back on a later hit), or no host tier (docs/traces.md). A combo that preempts "
        "replays on vLLM's kind of node, which has none: give off.",
    )(f)
    f = click.option(
        "--gpu",
        default="H200",
        show_default=True,
        help="Production traces: the GPU whose roofline clocks the rounds (H100, H200, B200) "
        "and, with --predict-model, sizes the default pool.",
    )(f)
    return click.option(
        "--time-scale",
        type=click.FloatRange(min=0, min_open=True),
        default=1.0,
        show_default=True,
        help="Production traces: arrivals happen at timestamp x SCALE (0.5 doubles the load).",
    )(f)


@dataclass(frozen=True)
class TraceArgs:
    time_scale: float
    gpu: str
    host_tier: str
    requests: int | None
    forward_requests: int | None

    def refuse_for(self, workload: str) -> None:
        """These options mean nothing for a round-based workload: say so, do not ignore."""
        given = [
            name
            for name, value, default in (
                ("--time-scale", self.time_scale, 1.0),
                ("--gpu", self.gpu, "H200"),
                ("--host-tier", self.host_tier, "write-through"),
                ("--requests", self.requests, None),
                ("--forward-requests", self.forward_requests, None),
            )
            if value != default
        ]
        if given:
            raise PolicykitError(
                f"{', '.join(given)} only apply to a production trace (a bundled one, a Mooncake "
                f"JSONL or an Azure CSV file); {workload!r} is a round-based workload."
            )


def is_trace(workload: str) -> bool:
    """Whether ``workload`` is a timed production trace (the lookup ``simulate`` shares)."""
    from policykit.harness.lookup import WorkloadKind, find_workload

    return find_workload(workload).kind is WorkloadKind.TRACE


def bench_trace(
    workload: str,
    combo_texts: list[str] | None,
    shape: ModelPreset,
    priced: ModelPreset,
    dev: torch.device,
    seed: int,
    pool_tokens: int | None,
    max_rounds: int | None,
    args: TraceArgs,
    *,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    as_json: bool,
) -> dict[str, Any]:
    """Replay ``workload`` through the chosen combos; the ``policykit.trace-bench/1`` document."""
    from policykit.harness.roofline import get_gpu
    from policykit.harness.trace_bench import replay_config
    from policykit.harness.trace_formats import resolve_trace

    trace = resolve_trace(workload)
    if args.requests:
        trace = trace.head(args.requests)
    config, source = replay_config(
        priced,
        get_gpu(args.gpu),
        pool_tokens=pool_tokens,
        time_scale=args.time_scale,
        max_rounds=max_rounds,
        host_tier=args.host_tier,
    )
    pm, registry = load_registry()
    engine = config.engine
    chosen = (
        list(registry.all_combos(engine))
        if not combo_texts
        else [registry.resolve(t, config=engine) for t in combo_texts]
    )
    refuse_preempting(chosen, workload, args.host_tier)
    warned: set[str] = set()
    for combo in chosen:
        warn_if_uncheckable(combo, engine, as_json=as_json, seen=warned)
    if executor != "inline":
        where = (executor, workers, ray_address)
        return _trace_units(trace, workload, chosen, config, source, args, *where, quiet=as_json)
    forward = args.forward_requests
    if forward is None:
        forward = CPU_FORWARD_REQUESTS if dev.type == "cpu" else len(trace.requests)
    model = None
    if forward:
        from policykit.harness.model import Decoder

        model = Decoder(shape, dev, seed=seed)
    return _inline(trace, chosen, config, source, pm, model, forward, quiet=as_json)


def refuse_preempting(chosen: list[Combo], workload: str, host_tier: str) -> None:
    """A combo that preempts replays a trace on vLLM's kind of node (:mod:`.trace_paged`),
    which has no host tier: with the write-through one it is refused, with the way out."""
    preempting = [str(c) for c in chosen if c.preempts]
    if preempting and host_tier != "off":
        raise PolicykitError(
            f"The combo {preempting[0]} preempts, so it replays {workload} on vLLM's kind of "
            "node, which has no host tier of its own (a host-side KV cache is a KV connector, "
            "outside the scheduler). Replay with --host-tier off: every combo of the run then "
            "has no host tier, so the rows compare."
        )


def _inline(trace, chosen, config, source, pm, model, forward, *, quiet: bool) -> dict[str, Any]:
    from policykit.harness.trace_bench import run_trace_bench

    total = len(trace.requests) * len(chosen)
    with ProgressBar(f"bench {trace.name}", total, unit="requests", quiet=quiet) as bar:

        def on_combo(combo: Combo, rows_done: int):
            # a replay's shadows and twins get their rows with it, so the count jumps
            base = rows_done * len(trace.requests)

            def tick(done: int, _total: int, rounds: int, clock: float) -> None:
                if rounds % _REDRAW_ROUNDS:
                    return
                bar.done = base + done
                bar.describe(f"{combo}: round {rounds:,}, {clock:,.0f} s predicted")

            return tick

        doc = run_trace_bench(
            trace,
            chosen,
            config,
            pm=pm,
            pool_source=source,
            model=model,
            forward_requests=forward,
            on_combo=on_combo,
        )
        bar.done = total
    doc["executor"] = {"name": "inline", "host": socket.gethostname()}
    return doc


def _trace_units(
    trace: Trace,
    workload,
    chosen,
    config: ReplayConfig,
    source,
    args,
    name,
    workers,
    ray_address,
    *,
    quiet: bool,
):
    from policykit.executor import Status, SweepProgress, Unit, open_executor, run_units
    from policykit.harness.trace_bench import trace_document
    from policykit.harness.trace_groups import unit_groups

    unit_args = {
        "trace": workload,
        "model": config.preset.name,
        "gpu": config.gpu.name,
        "pool_tokens": config.pool_tokens,
        "time_scale": config.time_scale,
        "host_tier": config.host_tier,
        "requests": args.requests,
        "max_rounds": config.max_rounds,
    }
    units = [
        Unit(
            f"trace/{trace.name}/{group[0]}",
            "trace",
            "policykit.harness.trace_bench:replay_unit",
            {**unit_args, "combos": group},
        )
        for group in unit_groups(chosen)
    ]
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    with (
        open_executor(name, workers=workers, ray_address=ray_address) as pool,
        SweepProgress(len(units), label=f"bench {trace.name}", quiet=quiet) as progress,
    ):
        results = run_units(units, pool, listener=progress)
    got = {
        row["combo"]: row | {"executor": r.executor, "node": r.node}
        for r in results.units
        if r.status is Status.OK and r.result is not None
        for row in r.result["rows"]
    }
    rows = [got[str(c)] for c in chosen if str(c) in got]
    doc = trace_document(trace, config, rows, source, created, time.perf_counter() - t0)
    doc["executor"] = results.executor
    doc["failed"] = [
        {"id": r.unit.id, "error": r.error} for r in results.units if r.status is Status.FAILED
    ]
    return doc


def _sig(x: float | None, unit: str = "") -> str:
    """Three significant digits (predicted figures are not more precise than that)."""
    return "-" if x is None else f"{x:.3g}{unit}"


def trace_table(doc: dict[str, Any]) -> Table:
    """One row per group of combos that behave identically."""
    t, r = doc["trace"], doc["replay"]
    table = Table(
        title=(
            f"{t['name']}: {t['requests']:,} requests, {t['prompt_tokens']:,} prompt tokens; "
            f"pool {r['pool_tokens']:,} tokens ({r['pool_source']}), time scale "
            f"{r['time_scale']:g}; predicted on {r['clock']['gpu']} for {r['clock']['model']}"
        ),
        title_justify="left",
        header_style="bold",
    )
    for name in (
        "combos",
        "status",
        "done/rej/fail/pend",
        "TTFT p50/p99 s",
        "TTFT p50/p99 rounds",
        "hit rate",
        "recomputed",
        "loaded back",
        "peak pool",
    ):
        table.add_column(name, justify="left" if name in ("combos", "status") else "right")
    rows = {row["combo"]: row for row in doc["combos"]}
    for group in doc["groups"]:
        row = rows[group["representative"]]
        o, p = row["outcomes"], row["predicted"]
        req = o["requests"]
        waiting = req["pending"] + req["not_arrived"]
        if row["crash"] is not None:
            status = Text(f"OOM at round {row['crash']['round']:,}", style="bold red")
        else:
            status = Text(
                row["status"], style="green" if row["status"] == "completed" else "yellow"
            )
        who = group["representative"]
        if group["size"] > 1:
            who += f" (+{group['size'] - 1} identical)"
        table.add_row(
            who,
            status,
            f"{req['completed']}/{req['rejected']}/{req['failed']}/{waiting}",
            f"{_sig(p['ttft_s']['p50'])}/{_sig(p['ttft_s']['p99'])}",
            f"{_sig(o['ttft_rounds']['p50'])}/{_sig(o['ttft_rounds']['p99'])}",
            f"{o['prefix_hit_rate']:.1%}",
            f"{o['recomputed_tokens']:,}",
            f"{o['load_back_tokens']:,}",
            f"{o['pool_use']['peak']:.0%}",
        )
    return fold(table)
