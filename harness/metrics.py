"""What a benchmark run reports per combination, computed from the run's records.

Time in the simulation is the wall time of its rounds laid end to end: round ``r`` starts when
round ``r - 1`` ended. *TTFT* of a request is the time from the start of its arrival round to the
end of the round whose forward produced its first token (its last-position logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from policykit.harness.roofline import GPUS
from policykit.memory.allocator import torch_allocator
from policykit.memory.oom_chain import find_cuda_oom
from policykit.memory.watermark import read_watermark
from policykit.plan import EntryKind
from policykit.scheduler import RunResult

#: the H200's dense bf16 tensor-core peak in TFLOP/s, for MFU (one figure: the roofline's)
H200_BF16_DENSE_TFLOPS = GPUS["H200"].peak_flops / 1e12


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in [0, 100]); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def round_times(
    result: RunResult, seconds: Sequence[float] | None = None
) -> tuple[dict[int, float], dict[int, float]]:
    """Start and end time (seconds since the run began) of every round, from the measured
    round times or from ``seconds`` (one per round: a prediction)."""
    durations = seconds if seconds is not None else [r.round_seconds for r in result.rounds]
    start, end, clock = {}, {}, 0.0
    for record, duration in zip(result.rounds, durations, strict=True):
        start[record.plan.round] = clock
        clock += duration
        end[record.plan.round] = clock
    return start, end


def ttfts(
    result: RunResult,
    arrivals: dict[str, int],
    first: dict[str, int],
    seconds: Sequence[float] | None = None,
) -> list[float]:
    """TTFT of every request that produced its first token (round times as for
    :func:`round_times`)."""
    start, end = round_times(result, seconds)
    out = []
    for rid, done in first.items():
        arrived = max(arrivals[rid], 1)  # a request there from the beginning arrives in round 1
        out.append(end[done] - start[arrived])
    return out


def spread(samples: Sequence[float | None]) -> dict[str, Any] | None:
    """Median and range of repeated measurements; ``None`` when any repeat had no value.

    Two measurements are only called different when their ranges do not overlap
    (:func:`distinct`): on a shared machine a single timing says little.
    """
    if not samples or any(s is None for s in samples):
        return None
    values = [float(s) for s in samples if s is not None]
    return {
        "median": percentile(values, 50),
        "min": min(values),
        "max": max(values),
        "samples": values,
    }


def distinct(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two :func:`spread` results differ beyond noise: their ranges do not overlap."""
    if a is None or b is None:
        return False
    return a["max"] < b["min"] or b["max"] < a["min"]


def deferred_requests(result: RunResult) -> list[str]:
    """Requests whose in-progress chunk was deferred at least once."""
    seen: dict[str, None] = {}
    for record in result.rounds:
        for entry in record.plan.entries:
            if entry.kind is EntryKind.DEFERRED:
                seen[entry.request_id] = None
    return list(seen)


def kv_utilisation(result: RunResult, total: int) -> list[dict[str, float]]:
    """Per round after commit: share of the pool in use (anything not free) and share held by
    requests (in use minus evictable cached prefix, which a new allocation could reclaim)."""
    return [
        {
            "round": r.plan.round,
            "used": (total - r.free_tokens_after) / total,
            "held": (total - r.free_tokens_after - r.evictable_tokens_after) / total,
        }
        for r in result.rounds
    ]


def is_torch_oom(exc: BaseException) -> bool:
    """A torch out-of-memory error anywhere in ``exc``'s chain (engines re-raise allocation
    failures as their own errors: docs/incidents.md#allocator-fragmentation)."""
    return find_cuda_oom(exc) is not None


def watermark(device: torch.device) -> dict[str, int] | None:
    """Caching-allocator watermark in bytes (``alloc``, ``reserved``, ``frag_gap``,
    ``max_alloc``) from one ``memory_stats()`` call; ``None`` off CUDA."""
    if device.type != "cuda":
        return None
    mark = read_watermark(torch_allocator())
    return {
        "alloc": mark.alloc,
        "reserved": mark.reserved,
        "frag_gap": mark.frag_gap,
        "max_alloc": mark.max_alloc,
    }


def summarise_rounds(result: RunResult) -> dict[str, Any]:
    plan = sum(r.plan_seconds for r in result.rounds)
    wall = sum(r.round_seconds for r in result.rounds)
    return {
        "plan_seconds": plan,
        "wall_seconds": wall,
        "planning_share": plan / wall if wall > 0 else None,
    }
