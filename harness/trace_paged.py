"""Replay a timed trace through a combo that preempts: vLLM's kind of node on the trace clock.

:mod:`.trace_replay` replays a trace on SGLang's node, whose round records its clock prices.
A combo that preempts runs on :class:`~policykit.preempting.PreemptingNode` instead (vLLM
0.33.0's v1 step), which writes the same kind of round record for each step
(:func:`policykit.harness.preempting_bench.round_record`), so the same roofline clock, the same
outcome tally and the same fairness tally (:mod:`.trace_fairness`) apply, and a row compares
with an SGLang combo's row figure for figure. What differs is stated in the row
(``node: preempting``): vLLM has no host tier of its own (a host-side KV cache is a KV
connector), so only ``--host-tier off`` is replayed; the step's token budget is the replay's
chunk size (vLLM's ``max_num_batched_tokens``); there is no cap on running requests; and a
prefix-cache block is keyed as the trace names it (a Mooncake ``hash_id`` stands for its whole
prefix, as vLLM's chained block hash does).
"""

from __future__ import annotations

import time
from typing import Any

from policykit.errors import PolicyError, PolicykitError
from policykit.harness.metrics import percentile
from policykit.harness.preempting_bench import round_record
from policykit.harness.roofline import round_cost
from policykit.harness.trace_fairness import FairnessTally
from policykit.harness.trace_replay import Progress, ReplayConfig, TraceClock, TraceTally
from policykit.harness.traces import Trace, TraceRequest
from policykit.harness.workloads import check_pool
from policykit.plugin_manager import PolicykitPluginManager
from policykit.preempting import PagedRequest, PreemptingConfig, PreemptingNode
from policykit.preempting import PreemptingScheduler as Stepper
from policykit.registry import Combo


def refuse_host_tier(config: ReplayConfig) -> None:
    """A node that preempts has no host tier: a replay with one would compare a different
    memory hierarchy, so it is refused with the way out."""
    if config.host_tier != "off":
        raise PolicykitError(
            "A combo that preempts runs on vLLM's kind of node, which has no host tier of its "
            "own (a host-side KV cache is a KV connector, outside the scheduler), so a trace "
            "replay with --host-tier write-through cannot run it. Replay with --host-tier off "
            "(every combo of the run then has no host tier, so the rows compare)."
        )


def page_keys(request: TraceRequest, block_tokens: int, page_size: int) -> tuple[int, ...]:
    """One prefix-cache key per full page of the prompt: the trace's block id and the page's
    place in it (the key :class:`~.trace_replay.TraceTally` counts recomputed pages by)."""
    per_block = block_tokens // page_size
    pages = request.prompt_tokens // page_size
    return tuple(request.blocks[p // per_block] * per_block + p % per_block for p in range(pages))


def replay_paged(
    trace: Trace,
    combo: Combo,
    config: ReplayConfig,
    *,
    pm: PolicykitPluginManager | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``combo`` (one that preempts) through the whole of ``trace``: a row shaped as
    :func:`~.trace_replay.replay`'s, with ``node: preempting``."""
    refuse_host_tier(config)
    t0 = time.perf_counter()
    run = _PagedReplay(trace, combo, config, pm)
    run.admit(1)
    fault = run.run(progress)
    return run.row(fault, time.perf_counter() - t0)


class _PagedReplay:
    """The node, its stepper, the trace clock and the two tallies of one replay."""

    def __init__(
        self,
        trace: Trace,
        combo: Combo,
        config: ReplayConfig,
        pm: PolicykitPluginManager | None,
    ) -> None:
        page = config.engine.page_size
        blocks = check_pool(config.pool_tokens, page) // page
        budget = config.engine.chunked_prefill_size
        self.node = PreemptingNode(PreemptingConfig(page, budget), blocks)
        self.sched = Stepper(self.node, combo, pm=pm)
        self.trace, self.combo, self.config = trace, combo, config
        self.clock = TraceClock(trace, config.time_scale)
        self.tally = TraceTally(page, trace.block_tokens, blocks * page)
        self.fairness = FairnessTally()
        self.blocks: dict[str, tuple[int, ...]] = {}
        self.arrivals: dict[int, list[str]] = {}

    def admit(self, round_no: int) -> None:
        """The trace requests due by now arrive in round ``round_no``."""
        page, release = self.config.engine.page_size, self.config.engine.kv_release_rounds
        for req in self.clock.due():
            self.blocks[req.id] = req.blocks
            self.tally.arrived(req, round_no, self.clock.now)
            self.fairness.arrived(req.id, req.prompt_tokens, round_no, self.clock.now)
            keys = page_keys(req, self.trace.block_tokens, page)
            self.node.add(PagedRequest(req.id, req.prompt_tokens, round_no, keys, release))
            self.arrivals.setdefault(round_no, []).append(req.id)

    def run(self, progress: Progress | None) -> str | None:
        """Step until the trace drained and every request finished and released its KV,
        nothing can change any more, or ``max_rounds``; the policy fault that stopped it."""
        node, clock, total = self.node, self.clock, len(self.trace.requests)
        for _ in range(self.config.max_rounds):
            try:
                step = self.sched.step()
            except PolicyError as err:
                return " ".join(str(err).split())
            arrived = self.arrivals.pop(step.round, [])
            record = round_record(self.sched.last_plan, node, step.released, arrived)
            start, cost = clock.now, round_cost(record.plan.batch, self.config.preset)
            clock.advance(cost.seconds(self.config.gpu))
            self.tally.count(record, self.blocks, clock.now)
            self.fairness.count(record, start, clock.now)
            self.fairness.preempt(step.preempted)
            if not clock.remaining and len(node.finished) == total and not node.pending_releases():
                return None
            if not record.plan.batch and not node.pending_releases():
                if not clock.remaining and self.sched.idle(step):
                    return None
                clock.wait_for_next()
            self.admit(step.round + 1)
            if progress is not None:
                progress(len(self.tally.finish_round), total, self.tally.rounds, clock.now)
        return None

    def row(self, fault: str | None, seconds: float) -> dict[str, Any]:
        """The replay's row: how it ended, its outcomes, predicted seconds and fairness."""
        done = {r.id for r in self.node.finished}
        arrived = self.trace.requests[: len(self.trace.requests) - self.clock.remaining]
        pending = [r.id for r in arrived if r.id not in done]
        fair = self.fairness.summary(self.tally.rounds, self.clock.now)
        starved = self.fairness.starved(self.config.starvation_rounds)
        counts = {
            "completed": len(done),
            "rejected": 0,
            "failed": 0,
            "starved": len(starved),
            "deferred": 0,
            "pending": len(pending),
            "not_arrived": self.clock.remaining,
        }
        drained = not pending and not self.clock.remaining and fault is None
        config = self.config
        return {
            "combo": str(self.combo),
            "policies": self.combo.as_dict(),
            "node": "preempting",
            "status": "completed" if drained else "incomplete",
            "crash": None,  # a node that preempts never runs out of memory: it preempts
            "never_completes": None,
            "starvation": None,
            "starved": [{"id": k, "waited_rounds": v} for k, v in starved.items()],
            "policy_faults": {} if fault is None else {"*": fault},
            "outcomes": self.tally.outcomes(len(self.trace.requests), None, counts),
            "predicted": {
                "model": config.preset.name,
                "gpu": config.gpu.name,
                "dtype": "bfloat16",
                "seconds": self.clock.now,
                "ttft_s": {
                    "p50": percentile(self.tally.ttft_s, 50),
                    "p99": percentile(self.tally.ttft_s, 99),
                },
            },
            "fairness": fair,
            "unfinished": pending[:20],
            "never_fit_skips": 0,
            "scheduler_seconds": seconds,
        }
