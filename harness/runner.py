"""Run one workload through policy combinations on the real model, and collect the results.

Each combination gets a fresh node (same workload, same pool size, same resident prefixes) and
runs until it is idle, hits ``max_rounds`` or crashes. A crash is what an engine would do: the
pool could not place a planned batch (:class:`PrefillOutOfMemory`) or torch ran out of device
memory; the combination is marked *crashed at round R* and the next one runs. The results
follow one versioned schema (:data:`SCHEMA`, documented in ``docs/harness.md``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.harness.build import PrefixKV, attach_kv, build_workload_node, fill_kv
from policykit.harness.engine import ModelForward
from policykit.harness.handoff import DecodeHandoff
from policykit.harness.lookup import WorkloadKind, find_workload
from policykit.harness.metrics import (
    H200_BF16_DENSE_TFLOPS,
    deferred_requests,
    is_torch_oom,
    kv_utilisation,
    percentile,
    spread,
    summarise_rounds,
    ttfts,
    watermark,
)
from policykit.harness.model import Decoder
from policykit.harness.outcomes import finish_rounds, outcomes
from policykit.harness.preempting_bench import (
    PagedInput,
    recomputed_after_preemption,
    run_paged,
    scenario_layout,
    workload_layout,
)
from policykit.harness.presets import ModelPreset
from policykit.harness.roofline import GPU, GPUS, predicted_round_seconds
from policykit.harness.workloads import Workload, generate, load_trace
from policykit.node import PrefillNode
from policykit.plugin_manager import PolicykitPluginManager
from policykit.registry import Combo
from policykit.scenario import build_node, load_scenario
from policykit.scheduler import RoundRecord, RunResult, Scheduler

SCHEMA = "policykit.bench/1"


@dataclass(frozen=True)
class BenchInput:
    """A workload ready to lay out on a fresh node for each combination."""

    name: str
    summary: dict[str, Any]
    config: EngineConfig
    arrivals: dict[str, int]
    make_node: Callable[[PrefixKV], PrefillNode]
    #: the same input on a node that preempts (a combo that preempts runs there)
    paged: PagedInput


def from_workload(workload: Workload) -> BenchInput:
    return BenchInput(
        workload.name,
        workload.summary(),
        workload.config,
        {r.id: r.arrival_round for r in workload.requests},
        lambda store: build_workload_node(workload, store),
        workload_layout(workload),
    )


def from_scenario(path: Path) -> BenchInput:
    """A core scenario file run on the model: its own pool, cache and host layout, real KV."""
    scenario = load_scenario(path)

    def make(store: PrefixKV) -> PrefillNode:
        node = build_node(scenario, device=store.model.device)
        attach_kv(node.pool, store.model)
        fill_kv(node, store)
        return node

    summary = {
        "name": scenario.name,
        "description": scenario.description,
        "source": str(path),
        "page_size": scenario.config.page_size,
        "chunked_prefill_size": scenario.config.chunked_prefill_size,
        "max_prefill_tokens": scenario.config.max_prefill_tokens,
        "pool_tokens": None,  # filled in from the node: the scenario fixes it
        "kv_release_rounds": scenario.config.kv_release_rounds,
        "requests": len(scenario.requests),
        "prompt_tokens": sum(r.prompt_tokens for r in scenario.requests),
    }
    return BenchInput(
        scenario.name,
        summary,
        scenario.config,
        {r.id: r.arrival_round for r in scenario.requests},
        make,
        scenario_layout(scenario),
    )


def resolve_input(arg: str, pool_tokens: int, seed: int = 0) -> BenchInput:
    """``arg`` is a workload name, a ``.jsonl`` trace, or a scenario file / bundled name
    (:func:`~policykit.harness.lookup.find_workload`; a timed trace is not round-based)."""
    ref = find_workload(arg)
    if ref.kind is WorkloadKind.TRACE:
        raise PolicykitError(f"{arg!r} is a timed production trace, not a round-based workload.")
    if ref.kind is WorkloadKind.TRACE_FILE:
        return from_workload(load_trace(ref.file, pool_tokens))
    if ref.kind is WorkloadKind.SCENARIO:
        return from_scenario(ref.file)
    return from_workload(generate(arg, pool_tokens, seed))


@dataclass
class ComboRun:
    """One combination's outcome: the JSON row, plus the logits when asked to keep them."""

    row: dict[str, Any]
    logits: dict[str, torch.Tensor]
    pool_tokens: int


def run_combo(
    bench: BenchInput,
    combo: Combo,
    store: PrefixKV,
    *,
    pm: PolicykitPluginManager | None = None,
    keep_logits: bool = False,
    max_rounds: int = 10_000,
    on_round: Callable[[RoundRecord], None] | None = None,
    predict_model: ModelPreset | None = None,
) -> ComboRun:
    """One fresh node through ``combo``. ``predict_model`` is the shape the roofline prices
    the schedule for (default: the model that ran)."""
    model = store.model
    device = model.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if combo.preempts:
        return _run_paged_combo(bench, combo, model, pm, keep_logits, max_rounds, on_round)
    combo.allocator_phase.on_init()  # before the pool's buffers are allocated
    node = bench.make_node(store)
    handoff = DecodeHandoff(node)
    forward = ModelForward(model, handoff, keep_logits=keep_logits)
    scheduler = Scheduler(node, combo, pm=pm, forward=forward)
    crash: dict[str, Any] | None = None
    try:
        result = scheduler.run(max_rounds=max_rounds, on_round=on_round)
    except Exception as exc:
        if not is_torch_oom(exc):
            raise
        result = scheduler.result
        result.stopped_by = "oom"
        crash = {
            "round": scheduler.round_no,
            "kind": "torch",
            "request": None,
            "message": " ".join(str(exc).split())[:400],
        }
    if result.oom is not None:
        crash = {
            "round": result.oom.round,
            "kind": f"{result.oom.pool}-pool",
            "request": result.oom.request,
            "message": result.oom.message,
        }
    ran = _Ran(node.requests, node.pool.total_tokens, node.config.page_size, result, forward)
    row = _finished_row(bench, combo, ran, crash, predict_model or model.preset, device)
    row["handoff_bytes"] = handoff.bytes_sent
    return ComboRun(row, forward.logits, ran.pool_tokens)


def _run_paged_combo(
    bench: BenchInput,
    combo: Combo,
    model: Decoder,
    pm: PolicykitPluginManager | None,
    keep_logits: bool,
    max_rounds: int,
    on_round: Callable[[RoundRecord], None] | None,
) -> ComboRun:
    """A combo that preempts, on a node that preempts (:mod:`.preempting_bench`): the same
    row, plus ``node``, ``preemptions`` and ``recomputed_after_preemption``; no hand-off copy
    (``handoff_bytes`` is None)."""
    if bench.paged.make is None:
        raise PolicykitError(bench.paged.refusal or f"{bench.name}: no node that preempts")
    paged = run_paged(
        bench.paged.make,
        combo,
        model,
        pm=pm,
        keep_logits=keep_logits,
        max_rounds=max_rounds,
        on_round=on_round,
    )
    ran = _Ran(paged.requests, paged.pool_tokens, paged.page_size, paged.result, paged.forward)
    row = _finished_row(bench, combo, ran, paged.crash, model.preset, model.device)
    row["node"] = "preempting"
    row["preemptions"] = paged.preemptions
    row["recomputed_after_preemption"] = recomputed_after_preemption(paged.result)
    return ComboRun(row, paged.forward.logits, paged.pool_tokens)


@dataclass(frozen=True)
class _Ran:
    """What a finished run leaves for its row, whichever node ran it."""

    requests: Mapping[str, Any]
    pool_tokens: int
    page_size: int
    result: RunResult
    forward: ModelForward


def _finished_row(
    bench: BenchInput,
    combo: Combo,
    ran: _Ran,
    crash: dict[str, Any] | None,
    preset: ModelPreset,
    device: torch.device,
) -> dict[str, Any]:
    row = _row(bench, combo, ran, crash, device)
    row["outcomes"] = outcomes(
        ran.result,
        ran.requests,
        bench.arrivals,
        pool_tokens=ran.pool_tokens,
        page_size=ran.page_size,
        crash_round=None if crash is None else crash["round"],
    )
    row["predicted"] = predicted(bench, ran.requests, ran.result, preset)
    if device.type == "cuda":
        row["watermark"] = watermark(device)
        torch.cuda.empty_cache()
    return row


def _row(bench, combo, ran: _Ran, crash, device) -> dict[str, Any]:
    result, stats = ran.result, ran.forward.stats
    total = ran.pool_tokens
    completed = set(result.completed)
    first = {rid: r for rid, r in stats.first_token_round.items() if rid in completed}
    times = ttfts(result, bench.arrivals, first)
    rounds = summarise_rounds(result)
    wall = rounds["wall_seconds"]
    prompt = sum(ran.requests[rid].prompt_tokens for rid in completed)
    util = kv_utilisation(result, total)
    cuda = device.type == "cuda"
    tflops = stats.flops / stats.seconds / 1e12 if stats.seconds > 0 else None
    if crash is not None:
        status = "crashed"
    elif result.pending or result.stopped_by == "max_rounds":
        status = "incomplete"
    else:
        status = "completed"
    return {
        "combo": str(combo),
        "policies": combo.as_dict(),
        "status": status,
        "crash": crash,
        "requests": {
            "total": len(ran.requests),
            "completed": len(result.completed),
            "rejected": len(result.rejected),
            "failed": len(result.failed),
            "starved": len(result.starved),
            "deferred": len(deferred_requests(result)),
            "pending": len(result.pending),
        },
        "rounds": len(result.rounds),
        "prompt_tokens_completed": prompt,
        "prompt_tokens_per_s": prompt / wall if wall > 0 else None,
        "computed_tokens": stats.tokens,
        "computed_tokens_per_s": stats.tokens / wall if wall > 0 else None,
        "ttft_s": {"p50": percentile(times, 50), "p99": percentile(times, 99)},
        "peak_kv_utilisation": max((u["used"] for u in util), default=0.0),
        "peak_kv_held": max((u["held"] for u in util), default=0.0),
        "kv_utilisation": util,
        **rounds,
        "forward_seconds": stats.seconds,
        "flops": stats.flops,
        "tflops": tflops,
        "mfu": tflops / H200_BF16_DENSE_TFLOPS if cuda and tflops is not None else None,
        "handoff_bytes": None,
        "watermark": None,
    }


def predicted(
    bench: BenchInput,
    requests: Mapping[str, Any],
    result: RunResult,
    preset: ModelPreset,
    gpus: dict[str, GPU] = GPUS,
) -> dict[str, Any]:
    """Roofline-predicted seconds of this schedule for ``preset`` on each GPU (bf16);
    ``requests`` by id, each with its ``prompt_tokens``."""
    completed = set(result.completed)
    first = {rid: r for rid, r in finish_rounds(result).items() if rid in completed}
    prompt = sum(requests[rid].prompt_tokens for rid in completed)
    out: dict[str, Any] = {"model": preset.name, "dtype": "bfloat16", "gpus": {}}
    for name, gpu in gpus.items():
        seconds = predicted_round_seconds(result, preset, gpu)
        times = ttfts(result, bench.arrivals, first, seconds)
        total = sum(seconds)
        out["gpus"][name] = {
            "seconds": total,
            "prompt_tokens_per_s": prompt / total if total > 0 else None,
            "ttft_s": {"p50": percentile(times, 50), "p99": percentile(times, 99)},
        }
    return out


def merge_repeats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated runs of a combo: outcomes from the first (they must not differ),
    measured times as medians with their range under ``wall``."""
    row = dict(rows[0])
    row["outcomes_repeatable"] = all(r["outcomes"] == rows[0]["outcomes"] for r in rows)
    wall: dict[str, Any] = {
        "repeats": len(rows),
        "wall_seconds": spread([r["wall_seconds"] for r in rows]),
        "prompt_tokens_per_s": spread([r["prompt_tokens_per_s"] for r in rows]),
        "ttft_p50_s": spread([r["ttft_s"]["p50"] for r in rows]),
        "ttft_p99_s": spread([r["ttft_s"]["p99"] for r in rows]),
    }
    row["wall"] = wall
    if wall["prompt_tokens_per_s"] is not None:
        row["prompt_tokens_per_s"] = wall["prompt_tokens_per_s"]["median"]
    if wall["ttft_p50_s"] is not None and wall["ttft_p99_s"] is not None:
        row["ttft_s"] = {"p50": wall["ttft_p50_s"]["median"], "p99": wall["ttft_p99_s"]["median"]}
    return row


def run_bench(
    bench: BenchInput,
    combos: Iterable[Combo],
    model: Decoder,
    *,
    pm: PolicykitPluginManager | None = None,
    max_rounds: int = 10_000,
    on_combo_start: Callable[[Combo], None] | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
    repeats: int = 1,
    predict_model: ModelPreset | None = None,
) -> dict[str, Any]:
    """Every combination, ``repeats`` times; the whole result as one :data:`SCHEMA` document.

    Repeats are interleaved (every combination once, then every combination again), so a
    machine getting busier or quieter during the run widens each combination's range instead
    of making the later ones look slower. Outcomes are the same on every repeat; only measured
    times vary, and are reported as median and range. ``on_combo_start`` is called before
    every run."""
    t0 = time.perf_counter()
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    store = PrefixKV(model)
    chosen = list(combos)
    runs: list[list[ComboRun]] = [[] for _ in chosen]
    for _ in range(repeats):
        for combo, done in zip(chosen, runs, strict=True):
            if on_combo_start is not None:
                on_combo_start(combo)
            done.append(
                run_combo(
                    bench,
                    combo,
                    store,
                    pm=pm,
                    max_rounds=max_rounds,
                    on_round=on_round,
                    predict_model=predict_model,
                )
            )
    summary = dict(bench.summary)
    if chosen:
        summary["pool_tokens"] = runs[0][0].pool_tokens
    rows = [merge_repeats([r.row for r in done]) for done in runs]
    return bench_document(
        summary, model.preset, model.device, model.dtype, rows, created, time.perf_counter() - t0
    )


def bench_document(
    workload: dict[str, Any],
    preset: ModelPreset,
    device: torch.device,
    dtype: torch.dtype,
    rows: list[dict[str, Any]],
    created: str,
    wall_seconds: float,
) -> dict[str, Any]:
    """The :data:`SCHEMA` document around per-combo rows, however they were produced."""
    return {
        "schema": SCHEMA,
        "created": created,
        "wall_seconds": wall_seconds,
        "workload": workload,
        "model": {
            "preset": preset.name,
            "dtype": str(dtype).removeprefix("torch."),
            "matmul_params": preset.matmul_params,
            "kv_bytes_per_token": preset.kv_bytes_per_token(torch.finfo(dtype).bits // 8),
        },
        "device": {
            "type": device.type,
            "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        },
        "peak_tflops": H200_BF16_DENSE_TFLOPS if device.type == "cuda" else None,
        "predicted_gpus": {
            name: {
                "peak_flops": gpu.peak_flops,
                "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
                "source": gpu.source,
            }
            for name, gpu in GPUS.items()
        },
        "combos": rows,
    }
