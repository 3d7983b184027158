"""``policykit bench``: a workload through policy combinations on a real model.

The comparison a user picks a policy by: which combinations crash (and when), and what the safe
ones cost in throughput and time to first token.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from policykit.cli.bench_trace import TraceArgs, bench_trace, is_trace, trace_options, trace_table
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
    warn_if_uncheckable,
    write_json,
)
from policykit.errors import PolicykitError
from policykit.fidelity import Holds, approximation_lines
from policykit.progress import ProgressBar
from policykit.registry import Combo, PolicyRegistry, format_combo
from policykit.render import default_console, fold

DEFAULT_POOL_TOKENS = 8192


def _combos(registry: PolicyRegistry, texts: list[str] | None, config) -> list[Combo]:
    """The combos to run: every registered one unless some were named."""
    if not texts:
        return list(registry.all_combos(config))
    return [registry.resolve(text, config=config) for text in texts]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.0f}"


def results_table(result: dict[str, Any]) -> Table:
    w = result["workload"]
    cuda = result["device"]["type"] == "cuda"
    table = Table(
        title=(
            f"{w['name']}: {w['requests']} requests, {w['prompt_tokens']:,} prompt tokens, "
            f"pool {w['pool_tokens']:,} tokens — {result['model']['preset']} on "
            f"{result['device']['name']}"
        ),
        title_justify="left",
        header_style="bold",
    )
    table.add_column("admission/chunking/alignment")
    table.add_column("status")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("done/rej/fail/def/pend", "right"),
        ("rounds", "right"),
        ("prompt tok/s", "right"),
        ("TTFT p50 ms", "right"),
        ("TTFT p99 ms", "right"),
        ("peak KV", "right"),
        ("plan share", "right"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify)
    # a node that preempts: how often, and what it computed again (only when a row preempts)
    preempting = any("preemptions" in row for row in result["combos"])
    if preempting:
        table.add_column("preempt/recomp tok", justify="right")
    if cuda:
        for name in ("TFLOP/s", "MFU", "reserved GiB", "frag GiB"):
            table.add_column(name, justify="right")
    for row in result["combos"]:
        req = row["requests"]
        if row["crash"] is not None:
            status = Text(f"crashed at round {row['crash']['round']}", style="bold red")
        elif row["status"] == "completed":
            status = Text("completed", style="green")
        else:
            status = Text(row["status"], style="yellow")
        cells: list[RenderableType] = [
            format_combo(row["policies"]),
            status,
            f"{req['completed']}/{req['rejected']}/{req.get('failed', 0)}/{req['deferred']}"
            f"/{req['pending']}",
            str(row["rounds"]),
            "-" if row["prompt_tokens_per_s"] is None else f"{row['prompt_tokens_per_s']:,.0f}",
            _ms(row["ttft_s"]["p50"]),
            _ms(row["ttft_s"]["p99"]),
            f"{row['peak_kv_utilisation']:.0%}",
            "-" if row["planning_share"] is None else f"{row['planning_share']:.2%}",
        ]
        if preempting:
            cells.append(
                f"{row['preemptions']}/{row['recomputed_after_preemption']:,}"
                if "preemptions" in row
                else "-"
            )
        if cuda:
            mark = row["watermark"] or {}
            cells += [
                "-" if row["tflops"] is None else f"{row['tflops']:.0f}",
                "-" if row["mfu"] is None else f"{row['mfu']:.0%}",
                f"{mark.get('reserved', 0) / 2**30:.1f}",
                f"{mark.get('frag_gap', 0) / 2**30:.2f}",
            ]
        table.add_row(*cells)
    return fold(table)


if TYPE_CHECKING:
    import torch

    from policykit.harness.presets import ModelPreset
    from policykit.harness.runner import BenchInput
    from policykit.plugin_manager import PolicykitPluginManager


@click.command()
@click.option(
    "--workload",
    required=True,
    help="A named workload (long-prompts, host-hit-heavy, shared-prefix, mixed, "
    "seed-incident), a bundled production trace (mooncake-conversation, mooncake-synthetic, "
    "azure-code, azure-conv), a trace file (Mooncake JSONL, Azure CSV, plain or .gz; or a "
    "policykit-trace .jsonl) or a scenario file / bundled scenario name. See docs/traces.md.",
)
@combo_options
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda.")
@click.option("--model", "preset", default="tiny", show_default=True, help="Model preset.")
@click.option(
    "--pool-tokens",
    type=int,
    default=None,
    help=f"KV pool size in tokens (whole 64-token pages); named workloads are sized to it "
    f"(default {DEFAULT_POOL_TOKENS}); production traces default to what plan-memory gives "
    "--predict-model on one --gpu; scenario files bring their own.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Workload and weight seed.")
@click.option(
    "--cpu-threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="torch intra-op threads on the CPU. One by default: the tiny model's operations are "
    "too small to gain from more, and on a busy machine OpenMP spin-waits made a run 4x slower.",
)
@click.option(
    "--max-rounds",
    type=click.IntRange(min=1),
    default=None,
    help="Stop a run after this many rounds (default 10,000; a production trace runs until it "
    "drains).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run each combination this many times (inline executor): measured times are "
    "reported as median and range; the scheduler's outcomes must not change between repeats.",
)
@click.option(
    "--predict-model",
    default="llama3-8b",
    show_default=True,
    help="Model preset whose roofline-predicted time on H100/H200/B200 is reported for the "
    "same schedule (the schedule does not depend on the model: the pool is sized in tokens).",
)
@trace_options
@click.option(
    "--executor",
    type=click.Choice(["inline", "local", "ray"]),
    default="inline",
    show_default=True,
    help="inline: every combo in this process, one model; local/ray: one unit per combo on a "
    "process pool or a Ray cluster (see docs/cluster.md).",
)
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Local workers.")
@ray_address_option
@json_option
@out_option
def bench(
    workload: str,
    combos: tuple[str, ...],
    combo_list: tuple[str, ...],
    check_all: bool,
    device: str,
    preset: str,
    pool_tokens: int | None,
    seed: int,
    cpu_threads: int,
    max_rounds: int | None,
    repeats: int,
    predict_model: str,
    time_scale: float,
    gpu: str,
    host_tier: str,
    requests: int | None,
    forward_requests: int | None,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    as_json: bool,
    out: Path | None,
) -> None:
    """Run WORKLOAD through policy combinations on a real model and compare them.

    Every registered combination runs unless --combo names some. Each combination gets a fresh
    node; a pool or torch out-of-memory marks it crashed at that round and the next one runs.
    A combination `policykit check` would refuse is run, with a warning. Exit code 0 when the
    benchmark ran (crashes are results); 2 on bad input.
    """
    import torch

    from policykit.devices import resolve_device
    from policykit.harness.presets import get_preset

    shape = get_preset(preset)
    priced = get_preset(predict_model)
    if repeats > 1 and executor != "inline":
        raise PolicykitError(
            f"--repeats {repeats} needs --executor inline: repeated timings are only comparable "
            "when every repeat runs in the same process on the same model."
        )
    check_out_path(out)
    dev = resolve_device(device)
    if dev.type == "cpu":
        torch.set_num_threads(cpu_threads)
    texts = combo_texts(combos, combo_list, check_all)
    run: dict[str, Any] = {
        "executor": executor,
        "workers": workers,
        "ray_address": ray_address,
        "as_json": as_json,
    }
    trace_args = TraceArgs(time_scale, gpu, host_tier, requests, forward_requests)
    if is_trace(workload):
        args = (workload, texts, shape, priced, dev, seed, pool_tokens, max_rounds, trace_args)
        _report(bench_trace(*args, **run), as_json, out, Console(stderr=True), trace_table)
        return
    trace_args.refuse_for(workload)
    unit_args = {
        "workload": workload,
        "model": preset,
        "pool_tokens": DEFAULT_POOL_TOKENS if pool_tokens is None else pool_tokens,
        "seed": seed,
        "cpu_threads": cpu_threads,
        "max_rounds": 10_000 if max_rounds is None else max_rounds,
        "device": device,
    }
    result = _bench_rounds(workload, texts, shape, priced, dev, unit_args, repeats=repeats, **run)
    _report(document(result, "policykit.bench/1"), as_json, out, Console(stderr=True))


def _bench_rounds(
    workload: str,
    texts: list[str] | None,
    shape: ModelPreset,
    priced: ModelPreset,
    dev: torch.device,
    unit_args: dict[str, Any],
    *,
    repeats: int,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    as_json: bool,
) -> dict[str, Any]:
    """A round-based workload (named, or a scenario) through the chosen combos: the result
    before it becomes a document. ``unit_args`` are the settings a remote unit rebuilds it from
    (``pool_tokens``, ``seed``, ``max_rounds`` resolved)."""
    from policykit.harness.runner import resolve_input

    pool_tokens, seed = unit_args["pool_tokens"], unit_args["seed"]
    bench_input = resolve_input(workload, pool_tokens, seed)
    pm, registry = load_registry()
    engine = bench_input.config
    chosen = _combos(registry, texts, engine)
    refusal = bench_input.paged.refusal
    if refusal is not None and any(c.preempts for c in chosen):
        raise PolicykitError(refusal)  # before any combo runs, as for a bad combo
    warned: set[str] = set()
    for combo in chosen:
        warn_if_uncheckable(combo, engine, as_json=as_json, seen=warned)
    if executor != "inline":
        result = _bench_units(
            bench_input,
            shape,
            dev,
            chosen,
            unit_args,
            quiet=as_json,
            executor=executor,
            workers=workers,
            ray_address=ray_address,
        )
    else:
        result = _bench_inline(
            bench_input,
            shape,
            dev,
            chosen,
            pm,
            seed,
            unit_args["max_rounds"],
            repeats,
            priced,
            quiet=as_json,
        )
    source = bench_input.summary.get("source")
    holds = Holds.of_bench_input(bench_input.config.sliding_window, source)
    result["approximations"] = approximation_lines(chosen, holds)
    return result


def _bench_inline(
    bench_input: BenchInput,
    shape: ModelPreset,
    dev: torch.device,
    chosen: list[Combo],
    pm: PolicykitPluginManager,
    seed: int,
    max_rounds: int,
    repeats: int = 1,
    predict_model: ModelPreset | None = None,
    *,
    quiet: bool,
) -> dict[str, Any]:
    """Every combo in this process, on one model (weights and prefix KV built once)."""
    from policykit.harness.model import Decoder
    from policykit.harness.runner import run_bench

    with ProgressBar("bench", len(chosen) * repeats, unit="runs", quiet=quiet) as bar:
        bar.describe(f"building {shape.name} on {dev}, laying out {bench_input.name}")
        model = Decoder(shape, dev, seed=seed)
        current = {"combo": ""}

        def start(combo: Combo) -> None:
            if current["combo"]:
                bar.advance()
            current["combo"] = str(combo)
            bar.describe(current["combo"])

        def on_round(record) -> None:
            bar.describe(f"{current['combo']}, round {record.plan.round}")

        result = run_bench(
            bench_input,
            chosen,
            model,
            pm=pm,
            max_rounds=max_rounds,
            on_combo_start=start,
            on_round=on_round,
            repeats=repeats,
            predict_model=predict_model,
        )
        bar.advance()
    result["executor"] = {"name": "inline", "host": socket.gethostname()}
    return result


def _bench_units(
    bench_input: BenchInput,
    shape: ModelPreset,
    dev: torch.device,
    chosen: list[Combo],
    unit_args: dict[str, Any],
    *,
    quiet: bool,
    **executor_options: Any,
) -> dict[str, Any]:
    """One unit per combo through an executor; rows merged into the same bench document,
    each saying which executor and node produced it."""
    import datetime as dt
    import time

    from policykit.executor import Status, SweepProgress, Unit, open_executor, run_units
    from policykit.harness.model import default_dtype
    from policykit.harness.runner import bench_document

    units = [
        Unit(
            f"bench/{bench_input.name}/{c}",
            "bench",
            "policykit.executor.units:bench_unit",
            {**unit_args, "combo": str(c)},
            gpu=dev.type == "cuda",
        )
        for c in chosen
    ]
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    name = executor_options.pop("executor")
    with (
        open_executor(name, **executor_options) as pool,
        SweepProgress(len(units), label="bench", quiet=quiet) as progress,
    ):
        results = run_units(units, pool, listener=progress)
    rows = []
    for r in results.units:
        if r.status is Status.OK and r.result is not None:
            rows.append({**r.result, "executor": r.executor, "node": r.node})
    doc = bench_document(
        bench_input.summary, shape, dev, default_dtype(dev), rows, created, time.perf_counter() - t0
    )
    doc["executor"] = results.executor
    doc["failed"] = [
        {"id": r.unit.id, "error": r.error} for r in results.units if r.status is Status.FAILED
    ]
    doc["missing"] = results.missing
    return doc


def _report(
    result: dict[str, Any],
    as_json: bool,
    out: Path | None,
    console: Console,
    table: Callable[[dict[str, Any]], Any] = results_table,
) -> None:
    if out is not None:
        write_json(out, result, result["schema"])
        console.print(f"results written to {out}")
    if as_json:
        echo_json(result, result["schema"])
        return
    # a table this wide is hard to read folded to 80 columns when the output is a log file
    default_console(piped_width=200).print(table(result))
    for line in result.get("approximations", ()):
        default_console(piped_width=200).print(Text(line, style="yellow"))
