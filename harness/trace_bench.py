"""A whole trace through policy combinations: scheduler-level replay, model forward on a slice.

What covers which requests is stated in the document itself (``provenance``): the outcomes and
predicted seconds of every combo cover every request of the trace (the scheduler decides every
round; the clock prices it with the roofline of a named model on a named GPU). The real model
forward runs only on a declared slice (the first ``forward_requests`` requests), on the device
the command ran on; its outcomes are compared with the scheduler-only replay of the same slice,
which must match: the forward computes KV, it never changes a decision.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

from policykit.config import EngineConfig
from policykit.harness.presets import ModelPreset
from policykit.harness.roofline import GPU
from policykit.harness.trace_groups import behaviour_key, group_identical, replay_grouped
from policykit.harness.trace_replay import (
    DEFAULT_MAX_ROUNDS,
    Progress,
    ReplayConfig,
    replay,
    replay_shadowed,
)
from policykit.harness.traces import Trace
from policykit.memory.model_shapes import PRESETS as SHAPES
from policykit.memory.plan import default_chunked_prefill_size, plan_kv
from policykit.plugin_manager import PolicykitPluginManager
from policykit.registry import Combo

SCHEMA = "policykit.trace-bench/1"
PAGE_SIZE = 64
#: a finished request's KV goes to the decode node two rounds later (docs/traces.md)
KV_RELEASE_ROUNDS = 2


def planned_pool(preset: ModelPreset, gpu: GPU, page_size: int = PAGE_SIZE) -> dict[str, Any]:
    """The KV pool ``policykit plan-memory`` gives ``preset`` on one ``gpu`` (its datasheet
    capacity, SGLang's default reserve and chunk size), with where each number came from."""
    gib = gpu.memory_gib
    chunk = default_chunked_prefill_size(gib)
    plan = plan_kv(SHAPES[preset.name], gib, chunked_prefill_size=chunk, page_size=page_size)
    return {
        "pool_tokens": plan.kv_tokens // page_size * page_size,
        "chunked_prefill_size": chunk,
        "source": f"plan-memory: {preset.name} on one {gpu.name} ({gpu.memory_gb:g} GB)",
    }


def replay_config(
    preset: ModelPreset,
    gpu: GPU,
    *,
    pool_tokens: int | None = None,
    chunked_prefill_size: int | None = None,
    time_scale: float = 1.0,
    max_rounds: int | None = None,
    host_tier: str = "write-through",
) -> tuple[ReplayConfig, str]:
    """The replay settings and a sentence saying where the pool size came from."""
    plan = planned_pool(preset, gpu)
    source = plan["source"] if pool_tokens is None else "given (--pool-tokens)"
    return (
        ReplayConfig(
            pool_tokens=plan["pool_tokens"] if pool_tokens is None else pool_tokens,
            engine=EngineConfig(
                page_size=PAGE_SIZE,
                chunked_prefill_size=chunked_prefill_size or plan["chunked_prefill_size"],
                kv_release_rounds=KV_RELEASE_ROUNDS,
            ),
            preset=preset,
            gpu=gpu,
            time_scale=time_scale,
            max_rounds=max_rounds or DEFAULT_MAX_ROUNDS,
            host_tier=host_tier,
        ),
        source,
    )


def replay_either(
    trace: Trace,
    combo: Combo,
    config: ReplayConfig,
    shadows: list[Combo],
    *,
    pm: PolicykitPluginManager | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[Combo]]:
    """``combo``'s row on the node it runs on: SGLang's, with the ``shadows`` that do not
    preempt planned beside it (:func:`replay_shadowed`), or vLLM's node that preempts, which
    carries no shadows (:func:`~.trace_paged.replay_paged`)."""
    if combo.preempts:
        from policykit.harness.trace_paged import replay_paged

        return replay_paged(trace, combo, config, pm=pm, progress=progress), []
    plain = [c for c in shadows if not c.preempts]
    return replay_shadowed(trace, combo, config, plain, pm=pm, progress=progress)


def forward_slice(
    trace: Trace,
    combo: Combo,
    config: ReplayConfig,
    model: Any,
    *,
    pm: PolicykitPluginManager | None = None,
) -> dict[str, Any]:
    """The first requests of ``trace`` with the real model forward; checked against the
    scheduler-only replay of the same slice."""
    from policykit.harness.engine import ModelForward
    from policykit.harness.handoff import DecodeHandoff

    forwards: list[ModelForward] = []

    def make(node):
        forwards.append(ModelForward(model, DecodeHandoff(node)))
        return forwards[-1]

    # the write-through store keeps no KV data, so the forward slice runs without a host tier
    config = dataclasses.replace(config, host_tier="off")
    t0 = time.perf_counter()
    row = replay(
        trace, combo, config, pm=pm, forward=make, device=model.device, layout=model.layout
    )
    wall = time.perf_counter() - t0
    plain = replay(trace, combo, config, pm=pm)
    stats = forwards[0].stats
    return {
        "requests": len(trace.requests),
        "model": model.preset.name,
        "device": str(model.device),
        "wall_seconds": wall,
        "forward_seconds": stats.seconds,
        "computed_tokens": stats.tokens,
        "flops": stats.flops,
        "host_tier": "off",
        "matches_scheduler_replay": behaviour_key(row) == behaviour_key(plain),
    }


def run_trace_bench(
    trace: Trace,
    combos: Sequence[Combo],
    config: ReplayConfig,
    *,
    pm: PolicykitPluginManager | None = None,
    pool_source: str = "given",
    model: Any = None,
    forward_requests: int = 0,
    on_combo: Callable[[Combo, int], Progress | None] | None = None,
) -> dict[str, Any]:
    """Every combo through the whole trace; the :data:`SCHEMA` document. A combo that
    provably decides as another (:func:`~policykit.harness.trace_groups.replay_grouped`) gets
    that replay's row, marked ``same_replay_as``, instead of a replay of its own.
    ``on_combo(combo, rows done)`` is called before each replay."""
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    head = trace.head(forward_requests) if forward_requests else None

    def one(combo: Combo, shadows: list[Combo], done: int) -> tuple[dict, list[Combo]]:
        progress = on_combo(combo, done) if on_combo is not None else None
        gc.collect()  # the last replay's node (its cache, its KV pool) in reference cycles
        return replay_either(trace, combo, config, shadows, pm=pm, progress=progress)

    rows = replay_grouped(combos, one)
    if head is not None and model is not None:
        for combo, row in zip(combos, rows, strict=True):
            if combo.preempts:
                continue  # the forward slice runs on SGLang's node (bench a workload instead)
            gc.collect()
            row["forward"] = forward_slice(head, combo, config, model, pm=pm)
    return trace_document(
        trace, config, rows, pool_source, created, time.perf_counter() - t0, forward_requests
    )


def trace_document(
    trace: Trace,
    config: ReplayConfig,
    rows: list[dict[str, Any]],
    pool_source: str,
    created: str,
    wall_seconds: float,
    forward_requests: int = 0,
) -> dict[str, Any]:
    """The :data:`SCHEMA` document around per-combo rows, however they were produced."""
    groups = group_identical(rows)
    return {
        "schema": SCHEMA,
        "created": created,
        "wall_seconds": wall_seconds,
        "trace": trace.summary(),
        "replay": {**config.to_dict(), "pool_source": pool_source},
        "provenance": {
            "outcomes": f"scheduler-level replay of all {len(trace.requests)} requests "
            "(deterministic: rounds and tokens)",
            "predicted": f"roofline of {config.preset.name} on {config.gpu.name} (bf16) for every "
            "round of that replay; not measured",
            "forward": f"real model forward on the first {forward_requests} requests (combos "
            "that do not preempt)"
            if forward_requests
            else "no model forward",
            "fairness": "per request, on the predicted clock of that replay: TTFT by prompt "
            "size (<1k: under 1,024 tokens, 1k-8k: 1,024 to 8,192, >8k: above), the longest "
            "stretch a request waited without a chunk, preemptions and the tokens they made "
            "the node compute again",
            "scheduler_seconds": "wall clock of this machine (noise; never a winner)",
            "same_replay": f"{sum('same_replay_as' in r for r in rows)} combos decide as "
            "another by construction and carry its replay (their same_replay_as says which "
            "and why)",
        },
        "combos": rows,
        "groups": [
            {"combos": g["combos"], "size": len(g["combos"]), "representative": g["row"]["combo"]}
            for g in groups
        ],
    }


def replay_unit(args: dict[str, Any]) -> dict[str, Any]:
    """Executor unit: one group of :func:`~policykit.harness.trace_groups.unit_groups` (a
    combo and those that provably decide as it) through one trace at one load.

    ``args``: ``trace`` (a bundled name or a path the worker can read), ``combos`` (printed
    combos, the group's leader first), ``model`` (roofline preset), ``gpu``, and optionally
    ``pool_tokens``, ``time_scale``, ``requests`` (first N), ``chunked_prefill_size``,
    ``max_rounds``. Returns the trace, the replay settings and a row per combo (``rows``).
    """
    from policykit.harness.presets import get_preset
    from policykit.harness.roofline import get_gpu
    from policykit.plugin_manager import make_plugin_manager
    from policykit.registry import PolicyRegistry

    trace = _trace(args["trace"])
    if args.get("requests"):
        trace = trace.head(int(args["requests"]))
    config, source = replay_config(
        get_preset(args.get("model", "llama3-8b")),
        get_gpu(args.get("gpu", "H200")),
        pool_tokens=args.get("pool_tokens"),
        chunked_prefill_size=args.get("chunked_prefill_size"),
        time_scale=float(args.get("time_scale", 1.0)),
        max_rounds=args.get("max_rounds"),
        host_tier=args.get("host_tier", "write-through"),
    )
    pm = make_plugin_manager()
    registry = PolicyRegistry.from_plugins(pm)
    engine = config.engine
    combos = [registry.resolve(c, config=engine) for c in args["combos"]]

    def _replay(combo: Combo, shadows: list[Combo]) -> tuple[dict, list[Combo]]:
        gc.collect()  # the last replay's node, in reference cycles
        return replay_either(trace, combo, config, shadows, pm=pm)

    return {
        "trace": trace.name,
        "trace_summary": trace.summary(),
        "replay": {**config.to_dict(), "pool_source": source},
        "rows": replay_grouped(combos, lambda combo, shadows, _: _replay(combo, shadows)),
    }


@functools.lru_cache(maxsize=4)
def _trace(arg: str) -> Trace:
    """A worker runs many units of one trace: parse it once per process."""
    from policykit.harness.trace_formats import resolve_trace

    return resolve_trace(arg)
