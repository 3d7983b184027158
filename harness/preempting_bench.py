"""A bench run of a combo that preempts: vLLM's kind of node, with the real model forward.

SGLang's combos run on :class:`~policykit.node.PrefillNode`; a combo that preempts runs on
:class:`~policykit.preempting.PreemptingNode`, whose blocks are pages of the same kind of tensor
pool, here holding the model's K/V. Every step's plan goes through the same
:class:`~policykit.harness.engine.ModelForward`: a preempted request's chunks are computed again
for real, on blocks the free queue may have handed to someone else in between, and a prefix hit
reads the K/V its blocks still hold, so the logits show whether the block bookkeeping is right.

The steps are written down as :class:`~policykit.scheduler.RoundRecord` objects, so every metric
of a bench row (TTFT, throughput, KV use, the roofline's prediction, the deterministic outcomes)
is computed as for SGLang's node; the row adds the preemptions and the tokens they made the node
compute again (:func:`recomputed_after_preemption`).
Two things have no counterpart: the KV hand-off copy (the node releases a finished request's
blocks ``kv_release_rounds`` later, as ``simulate`` does, so ``handoff_bytes`` is ``None``) and
the host tier (refused with a reason, as ``simulate`` refuses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from policykit.errors import PolicyError, ScenarioError
from policykit.harness.engine import ForwardStats, ModelForward
from policykit.harness.metrics import is_torch_oom
from policykit.harness.model import Decoder
from policykit.harness.workloads import Workload, WorkloadError
from policykit.plan import Plan
from policykit.plugin_manager import PolicykitPluginManager
from policykit.preempting import (
    Forward,
    PagedRequest,
    PreemptingConfig,
    PreemptingNode,
    PreemptingScheduler,
    Step,
)
from policykit.preempting_scenario import OWNER, prepare, refuse_unmappable, run, warm_up
from policykit.registry import Combo
from policykit.scenario import Scenario
from policykit.scheduler import RoundRecord, RunResult

#: ``make(combo, model, forward)``: a scheduler with the input laid out on a fresh node whose
#: pool holds ``model``'s K/V, resident prefixes computed by ``forward``, requests queued
PagedLayout = Callable[[Combo, Decoder, Forward], PreemptingScheduler]


@dataclass(frozen=True)
class PagedInput:
    """How a bench input lays out on a node that preempts, or why it cannot."""

    make: PagedLayout | None
    refusal: str | None = None


def scenario_layout(scenario: Scenario) -> PagedInput:
    """A scenario as ``simulate`` and ``conformance vllm`` lay it out."""
    try:
        refuse_unmappable(scenario)
    except ScenarioError as err:
        return PagedInput(None, str(err))

    def make(combo: Combo, model: Decoder, forward: Forward) -> PreemptingScheduler:
        sched, _ = prepare(
            scenario, combo, device=model.device, layout=model.layout, forward=forward
        )
        return sched

    return PagedInput(make)


def workload_layout(workload: Workload) -> PagedInput:
    """A workload's requests with content-addressed blocks (a shared prefix group shares
    blocks, as vLLM's block hashes do); its device-resident prefixes are computed before round
    1 by owner requests, pinned ones held for good."""
    hosted = [r.id for r in workload.requests if r.host_prefix_tokens]
    if hosted:
        return PagedInput(
            None,
            f"Workload {workload.name!r}: request(s) {', '.join(map(repr, hosted[:5]))} have a "
            "prefix in the host tier, but vLLM's v1 scheduler has no host tier of its own (a "
            "host-side KV cache is a KV connector, outside the scheduler), so a combo that "
            "preempts cannot run it. Pick a workload without host prefixes (long-prompts, or a "
            "scenario file without host_prefix_tokens) for combos that preempt.",
        )

    def make(combo: Combo, model: Decoder, forward: Forward) -> PreemptingScheduler:
        return _lay_out_workload(workload, combo, model, forward)

    return PagedInput(make)


def _lay_out_workload(
    workload: Workload, combo: Combo, model: Decoder, forward: Forward
) -> PreemptingScheduler:
    page = workload.config.page_size
    config = PreemptingConfig(page, workload.config.chunked_prefill_size)
    blocks = workload.pool_tokens // page
    node = PreemptingNode(config, blocks, device=model.device, layout=model.layout)
    sched = PreemptingScheduler(node, combo, forward=forward)
    tokens = workload.tokens()
    interned: dict[tuple[int, tuple[int, ...]], int] = {}
    owners: dict[tuple[int, ...], PagedRequest] = {}
    requests = []
    for spec in workload.requests:
        toks = tokens[spec.id]
        keys = _block_keys(toks, page, interned)
        release = workload.config.kv_release_rounds
        requests.append(
            PagedRequest(
                spec.id, spec.prompt_tokens, spec.arrival_round, keys, release, tokens=toks
            )
        )
        device = spec.device_prefix_tokens
        prefix = toks[:device]
        if device and (prefix not in owners or spec.device_prefix_pinned):
            hold = None if spec.device_prefix_pinned else 1
            owners[prefix] = PagedRequest(
                OWNER + spec.id, device, 0, keys[: device // page], hold, tokens=prefix
            )
    warm_up(sched, list(owners.values()))
    if node.waiting or node.running:
        raise WorkloadError(
            f"Workload {workload.name!r}: the device-resident prefixes do not fit the "
            f"{blocks * page}-token pool of a node that preempts; raise --pool-tokens."
        )
    for req in requests:
        node.add(req)
    return sched


def _block_keys(
    tokens: Sequence[int], page: int, interned: dict[tuple[int, tuple[int, ...]], int]
) -> tuple[int, ...]:
    """One key per full block: the block's tokens and everything before it (vLLM's chained
    block hash), interned to small ints so that equal prefixes have equal keys exactly."""
    keys: list[int] = []
    parent = -1
    for start in range(0, len(tokens) - page + 1, page):
        parent = interned.setdefault((parent, tuple(tokens[start : start + page])), len(interned))
        keys.append(parent)
    return tuple(keys)


@dataclass
class PagedRun:
    """A combo's run on a node that preempts, in the records a bench row is computed from."""

    result: RunResult
    forward: ModelForward
    requests: dict[str, PagedRequest]
    pool_tokens: int
    page_size: int
    preemptions: int = 0
    #: a torch out-of-memory error in the forward, as ``run_combo`` reports one
    crash: dict[str, Any] | None = None


def run_paged(
    make: PagedLayout,
    combo: Combo,
    model: Decoder,
    *,
    pm: PolicykitPluginManager | None = None,
    keep_logits: bool = False,
    max_rounds: int = 10_000,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> PagedRun:
    """Lay the input out (``make``), then step it until it is done, idle or ``max_rounds``:
    every step's batch through the model, every step a :class:`RoundRecord`."""
    forward = ModelForward(model, None, keep_logits=keep_logits)
    marks: dict[str, float] = {}

    def model_forward(plan: Plan, node: PreemptingNode) -> None:
        marks["planned"] = time.perf_counter()
        by_id = {r.id: r for r in node.running}
        placed = [by_id[e.request_id] for e in plan.batch]
        pages = [(_tokens(r), torch.tensor(r.blocks, dtype=torch.int64)) for r in placed]
        forward.run(plan, node.pool.kv, pages)

    sched = make(combo, model, model_forward)
    forward.stats, forward.logits = ForwardStats(), {}  # the prefixes' warm-up is not the run
    sched.pm = pm
    node = sched.node
    requests = {r.id: r for r in node.future}
    arrivals: dict[int, list[str]] = {}
    for r in requests.values():
        arrivals.setdefault(max(r.arrival_round, 1), []).append(r.id)
    page = node.config.page_size
    out = PagedRun(RunResult(combo), forward, requests, node.pool.num_blocks * page, page)
    marks["end"] = time.perf_counter()

    def record(step: Step | None) -> None:
        """Round ``step`` (None: the one a torch OOM stopped, as ``Scheduler`` records it)."""
        now = time.perf_counter()
        times = (marks.pop("planned", now) - marks["end"], now - marks["end"])
        plan = sched.last_plan
        released = [] if step is None else step.released
        arrived = arrivals.get(plan.round, [])
        out.result.rounds.append(round_record(plan, node, released, arrived, times))
        marks["end"] = now
        out.preemptions += 0 if step is None else len(step.preempted)
        if on_round is not None and step is not None:
            on_round(out.result.rounds[-1])

    try:
        run(sched, len(requests), max_rounds, on_step=record)
    except PolicyError as err:
        out.result.policy_faults["*"] = " ".join(str(err).split())
        out.result.stopped_by = "policy-fault"
    except Exception as exc:
        if not is_torch_oom(exc):
            raise
        record(None)
        out.result.stopped_by = "oom"
        message = " ".join(str(exc).split())[:400]
        out.crash = {"round": sched.round_no, "kind": "torch", "request": None, "message": message}
    _summarise(out, node, max_rounds)
    return out


def round_record(
    plan: Plan,
    node: PreemptingNode,
    released: list[str],
    arrived: list[str],
    times: tuple[float, float] = (0.0, 0.0),
) -> RoundRecord:
    """A step as the ledger node's round record (what the outcome tallies and the roofline
    clock read, for either node); ``times``: planning and wall seconds (none for a replay
    without a forward, whose clock is predicted)."""
    page = node.config.page_size
    return RoundRecord(
        plan=plan,
        free_tokens_after=node.pool.free_blocks * page,
        evictable_tokens_after=node.pool.evictable_free_blocks * page,
        swa_free_tokens_after=None,
        released=released,
        arrived=arrived,
        plan_seconds=times[0],
        round_seconds=times[1],
    )


def recomputed_after_preemption(result: RunResult) -> int:
    """Tokens requests computed again at positions they had computed before: what their
    preemptions cost, less what their surviving cached blocks saved. Exact to the token, unlike
    the outcomes' ``recomputed_tokens`` (whole pages, across requests, for either node)."""
    reached: dict[str, int] = {}
    again = 0
    for record in result.rounds:
        for entry in record.plan.batch:
            before = reached.get(entry.request_id, 0)
            again += max(0, min(entry.end, before) - entry.start)
            reached[entry.request_id] = max(before, entry.end)
    return again


def _summarise(out: PagedRun, node: PreemptingNode, max_rounds: int) -> None:
    result = out.result
    done = {r.id for r in node.finished}
    result.completed = [rid for rid in out.requests if rid in done]
    result.pending = [rid for rid in out.requests if rid not in done]
    if result.stopped_by != "policy-fault" and result.pending and len(result.rounds) >= max_rounds:
        result.stopped_by = "max_rounds"


def _tokens(req: PagedRequest) -> Sequence[int]:
    """The prompt's token ids: a bench lays every request out with them (``make``)."""
    assert req.tokens is not None, f"request {req.id!r} was laid out without its tokens"
    return req.tokens
