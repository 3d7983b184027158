"""Replay a timed trace through one combo: arrivals become rounds through a roofline clock.

The scheduler counts rounds; a trace counts seconds. The clock joins them: round ``r`` starts
when round ``r - 1`` ended, and a round lasts its *predicted* time, the roofline of the chosen
model preset on the chosen GPU for that round's batch (:mod:`policykit.harness.roofline`). A
request arrives in the first round that starts at or after its (scaled) timestamp. A round that
computes nothing while no held KV is due back lasts until the next arrival (nothing can change
before it); one that waits for held KV lasts nothing (release is counted in rounds). Nothing
here reads a wall clock, so a replay gives the same outcomes and predicted times on every
machine, and the arrivals differ between combos only where their schedules do.

Outcomes are accumulated round by round and the scheduler keeps no round history, so memory
is bounded by the live state, not by the length of the trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policykit.config import EngineConfig
from policykit.harness.metrics import percentile
from policykit.harness.presets import ModelPreset
from policykit.harness.roofline import GPU, round_cost
from policykit.harness.trace_fairness import FairnessTally
from policykit.harness.trace_host import BlockHostStore
from policykit.harness.trace_shadow import Shadows
from policykit.harness.traces import Trace, TraceRequest
from policykit.harness.workloads import check_pool
from policykit.node import PrefillNode
from policykit.plan import NEVER, Entry, EntryKind
from policykit.plugin_manager import PolicykitPluginManager
from policykit.pool import TokenPool
from policykit.registry import Combo
from policykit.request import Request
from policykit.scheduler import Forward, RoundRecord, RunResult, Scheduler

#: enough for any trace the package carries at any load (a replay ends when the trace drains)
DEFAULT_MAX_ROUNDS = 10_000_000


@dataclass(frozen=True)
class ReplayConfig:
    """How a trace is replayed: the node, the load and what the clock prices rounds with."""

    pool_tokens: int
    #: the node's page, chunk and release settings (the same record scenarios and ``check`` use)
    engine: EngineConfig
    preset: ModelPreset
    gpu: GPU
    #: arrivals happen at ``timestamp * time_scale``: 0.5 doubles the load, 2 halves it
    time_scale: float = 1.0
    max_rounds: int = DEFAULT_MAX_ROUNDS
    starvation_rounds: int = 1000
    #: ``write-through``: every computed block is kept on the host (:mod:`.trace_host`);
    #: ``off``: no host tier, reuse only through the device radix cache
    host_tier: str = "write-through"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool_tokens": self.pool_tokens,
            "chunked_prefill_size": self.engine.chunked_prefill_size,
            "page_size": self.engine.page_size,
            "kv_release_rounds": self.engine.kv_release_rounds,
            "time_scale": self.time_scale,
            "host_tier": self.host_tier,
            "clock": {"model": self.preset.name, "gpu": self.gpu.name, "dtype": "bfloat16"},
            "max_rounds": self.max_rounds,
        }


class TraceClock:
    """Predicted time, and which trace requests are due at the start of the next round."""

    def __init__(self, trace: Trace, time_scale: float) -> None:
        first = trace.requests[0].arrival_s if trace.requests else 0.0
        self._due = [(r.arrival_s - first) * time_scale for r in trace.requests]
        self._requests = trace.requests
        self._next = 0
        self.now = 0.0

    @property
    def remaining(self) -> int:
        return len(self._requests) - self._next

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wait_for_next(self) -> None:
        """Idle until the next arrival (if any is left)."""
        if self._next < len(self._due):
            self.now = max(self.now, self._due[self._next])

    def due(self) -> list[TraceRequest]:
        """Requests whose arrival time has come, in trace order."""
        start = self._next
        while self._next < len(self._due) and self._due[self._next] <= self.now:
            self._next += 1
        return list(self._requests[start : self._next])


@dataclass
class TraceTally:
    """Outcomes counted round by round (no round history kept)."""

    page_size: int
    block_tokens: int
    pool_tokens: int
    rounds: int = 0
    computed: int = 0
    load_back: int = 0
    cached: int = 0
    admitted_prompt: int = 0
    recomputed: int = 0
    peak_use: float = 0.0
    use_sum: float = 0.0
    arrival_round: dict[str, int] = field(default_factory=dict)
    arrival_s: dict[str, float] = field(default_factory=dict)
    ttft_rounds: list[int] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    finish_round: dict[str, int] = field(default_factory=dict)
    _seen_pages: set[int] = field(default_factory=set)

    def arrived(self, request: TraceRequest, round_no: int, now: float) -> None:
        self.arrival_round[request.id] = round_no
        self.arrival_s[request.id] = now

    def count(self, record: RoundRecord, blocks: dict[str, tuple[int, ...]], end_s: float) -> None:
        self.rounds += 1
        use = (self.pool_tokens - record.free_tokens_after) / self.pool_tokens
        self.peak_use = max(self.peak_use, use)
        self.use_sum += use
        r = record.plan.round
        for entry in record.plan.batch:
            self.computed += entry.tokens
            self.load_back += entry.load_back
            if entry.kind.is_new:
                self.cached += entry.cached
                self.admitted_prompt += entry.cached + entry.load_back
            self.admitted_prompt += entry.tokens
            self.recomputed += self._recomputed(entry, blocks[entry.request_id])
            if entry.kind.finishes:
                rid = entry.request_id
                self.finish_round[rid] = r
                self.ttft_rounds.append(r - self.arrival_round[rid] + 1)
                self.ttft_s.append(end_s - self.arrival_s[rid])

    def _recomputed(self, entry: Entry, blocks: tuple[int, ...]) -> int:
        """Tokens of whole pages computed before in this run. A page is named by its block
        (a block id stands for its whole prefix) and its place in the block."""
        per_block = self.block_tokens // self.page_size
        out = 0
        for page in range(-(-entry.start // self.page_size), entry.end // self.page_size):
            block, offset = divmod(page, per_block)
            key = blocks[block] * per_block + offset
            if key in self._seen_pages:
                out += self.page_size
            self._seen_pages.add(key)
        return out

    def _share(self, tokens: int) -> float:
        return tokens / self.admitted_prompt if self.admitted_prompt else 0.0

    def crashed(self) -> None:
        """The round that ran out of memory: counted as a full pool."""
        self.peak_use = 1.0

    def outcomes(self, total: int, crash_round: int | None, counts: dict[str, int]) -> dict:
        return {
            "rounds": self.rounds,
            "crash_round": crash_round,
            "requests": {"total": total, **counts},
            "completion_round": {
                "p50": percentile(list(self.finish_round.values()), 50),
                "max": max(self.finish_round.values(), default=None),
            },
            "ttft_rounds": {
                "p50": percentile(self.ttft_rounds, 50),
                "p99": percentile(self.ttft_rounds, 99),
            },
            "computed_tokens": self.computed,
            "recomputed_tokens": self.recomputed,
            "load_back_tokens": self.load_back,
            "cached_tokens": self.cached,
            # prompt tokens not computed: device radix-cache hits, then host-tier load-backs
            "prefix_hit_rate": self._share(self.cached + self.load_back),
            "device_hit_rate": self._share(self.cached),
            "pool_use": {
                "peak": self.peak_use,
                "mean": self.use_sum / self.rounds if self.rounds else 0.0,
            },
        }


#: what a replay reports while it runs: (requests done, requests in the trace, rounds, clock s)
Progress = Callable[[int, int, int, float], None]


def _node(trace: Trace, config: ReplayConfig, device: Any, layout: Any) -> PrefillNode:
    host = BlockHostStore(trace.block_tokens) if config.host_tier == "write-through" else None
    pool = TokenPool(
        check_pool(config.pool_tokens, config.engine.page_size),
        config.engine.page_size,
        device=device,
        layout=layout,
    )
    return PrefillNode(config.engine, pool, host=host)


def replay(
    trace: Trace,
    combo: Combo,
    config: ReplayConfig,
    *,
    pm: PolicykitPluginManager | None = None,
    forward: Callable[[PrefillNode], Forward] | None = None,
    device: Any = "cpu",
    layout: Any = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """One combo through the whole of ``trace``: a results row (deterministic outcomes,
    predicted seconds on ``config.gpu``, and the scheduler's own wall time).

    ``forward`` makes the model forward for a node (the CPU slice runs the real model);
    ``device``/``layout`` give the pool real KV buffers for it.
    """
    row, _ = replay_shadowed(
        trace,
        combo,
        config,
        [],
        pm=pm,
        forward=forward,
        device=device,
        layout=layout,
        progress=progress,
    )
    return row


def replay_shadowed(
    trace: Trace,
    combo: Combo,
    config: ReplayConfig,
    shadows: list[Combo],
    *,
    pm: PolicykitPluginManager | None = None,
    forward: Callable[[PrefillNode], Forward] | None = None,
    device: Any = "cpu",
    layout: Any = None,
    progress: Progress | None = None,
) -> tuple[dict[str, Any], list[Combo]]:
    """:func:`replay` of ``combo``, with ``shadows`` (combos of its queue policy) planned
    beside it every round (:mod:`.trace_shadow`): its row, and the shadows whose replay it
    provably was."""
    t0 = time.perf_counter()
    node = _node(trace, config, device, layout)
    scheduler = Scheduler(
        node,
        combo,
        pm=pm,
        forward=None if forward is None else forward(node),
        history=False,
        starvation_rounds=config.starvation_rounds,
    )
    beside = Shadows(node, combo, shadows)
    beside.follow(scheduler, pm)
    clock = TraceClock(trace, config.time_scale)
    tally = TraceTally(config.engine.page_size, trace.block_tokens, node.pool.total_tokens)
    fairness = FairnessTally()
    blocks: dict[str, tuple[int, ...]] = {}
    deferred: set[str] = set()
    never_fit_skips = [0]  # requests the queue rejected for good (``trace_groups.skip_twins``)

    def admit(round_no: int) -> None:
        for req in clock.due():
            blocks[req.id] = req.blocks
            tally.arrived(req, round_no, clock.now)
            fairness.arrived(req.id, req.prompt_tokens, round_no, clock.now)
            node.add(Request(req.id, trace.tokens(req), arrival_round=round_no))

    def on_round(record: RoundRecord) -> None:
        beside.after_round(record)
        start = clock.now
        clock.advance(round_cost(record.plan.batch, config.preset).seconds(config.gpu))
        tally.count(record, blocks, clock.now)
        fairness.count(record, start, clock.now)
        if isinstance(node.host, BlockHostStore):
            for entry in record.plan.batch:
                node.host.computed(blocks[entry.request_id], entry.end)
        deferred.update(e.request_id for e in record.plan.entries if e.kind is EntryKind.DEFERRED)
        never_fit_skips[0] += sum(r.verdict == NEVER for r in record.plan.rejected)
        if not record.plan.batch and not node.pending_releases():
            clock.wait_for_next()
        admit(record.plan.round + 1)
        if progress is not None:
            progress(len(tally.finish_round), len(trace.requests), tally.rounds, clock.now)

    admit(1)
    result = scheduler.run(max_rounds=config.max_rounds, on_round=on_round)
    if result.oom is not None:
        tally.crashed()
    row = _row(combo, result, tally, len(trace.requests), clock, len(deferred))
    row["predicted"] = {
        "model": config.preset.name,
        "gpu": config.gpu.name,
        "dtype": "bfloat16",
        "seconds": clock.now,
        "ttft_s": {"p50": percentile(tally.ttft_s, 50), "p99": percentile(tally.ttft_s, 99)},
    }
    row["fairness"] = fairness.summary(tally.rounds, clock.now)
    row["never_fit_skips"] = never_fit_skips[0]
    row["scheduler_seconds"] = time.perf_counter() - t0
    return row, beside.after_run(row, scheduler)


def _row(
    combo: Combo,
    result: RunResult,
    tally: TraceTally,
    total: int,
    clock: TraceClock,
    deferred: int,
) -> dict[str, Any]:
    """How the replay ended and its deterministic outcomes."""
    crash = _crash(result)
    counts = {
        "completed": len(result.completed),
        "rejected": len(result.rejected),
        "failed": len(result.failed),
        "starved": len(result.starved),
        "deferred": deferred,
        "pending": len(result.pending),
        "not_arrived": clock.remaining,
    }
    if crash is not None:
        status = "crashed"
    elif result.pending or clock.remaining or result.stopped_by == "max_rounds":
        status = "incomplete"
    else:
        status = "completed"
    never = result.never_completes
    return {
        "combo": str(combo),
        "policies": combo.as_dict(),
        "status": status,
        "crash": crash,
        "never_completes": None if never is None else dict(never.__dict__),
        "starvation": None if result.starvation is None else dict(result.starvation.__dict__),
        #: requests that waited more than ``starvation_rounds`` rounds (``simulate`` fails on one)
        "starved": [{"id": k, "waited_rounds": v} for k, v in result.starved.items()],
        #: request id ("*": the run) -> the fault that failed it: a broken plugin is visible
        "policy_faults": dict(result.policy_faults),
        "outcomes": tally.outcomes(total, None if crash is None else crash["round"], counts),
    }


def _crash(result: RunResult) -> dict[str, Any] | None:
    if result.oom is None:
        return None
    return {
        "round": result.oom.round,
        "kind": f"{result.oom.pool}-pool",
        "request": result.oom.request,
        "message": result.oom.message,
    }
