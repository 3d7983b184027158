"""Stepping vLLM's real scheduler through a policykit scenario as a prefill-only node.

One policykit round is one ``Scheduler.schedule()`` followed by one ``update_from_output`` with
a hand-made ``ModelRunnerOutput``: a request whose prompt is fully computed after the step
samples one token and, with ``max_tokens=1``, finishes there (what a disaggregated prefill
instance does). Its blocks stay allocated (see :mod:`.connector`) until the driver reports its
transfer done: in the update of round ``max(f, f + kv_release_rounds - 1)`` for a request
finished in round ``f``, so they are free for the next round's ``schedule()`` -- policykit's
"released at the start of round ``f + kv_release_rounds``" (never before ``f + 1``); with
``kv_release_rounds`` null the KV is held for the whole run.

Before round 1 the driver brings vLLM to the scenario's state the way a running engine would
have got there: the earlier requests :func:`policykit.preempting_layout.layout` lists (filler,
then each device prefix's owner alone, freed or kept, then the request in progress), each
through ``schedule()`` and ``update_from_output()`` like any other, so the free queue's LRU
order, the cached hashes and the running list are vLLM's own. Nothing here reads policykit's
node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policykit.conformance.vllm.engine import SchedulerKnobs, build_scheduler
from policykit.conformance.vllm.mapping import pool_blocks, refuse_unmappable
from policykit.conformance.vllm.record import StepRecord, Trace
from policykit.errors import ScenarioError
from policykit.kernel import kv_back
from policykit.preempting_layout import filler_tokens, layout
from policykit.scenario import Scenario

#: the largest token id vLLM 0.34.0 can hold: it keeps a request's token ids in a 32-bit
#: signed array (``vllm.v1.token_buffer.TokenBuffer``), where 0.33.0 kept a Python list
_MAX_TOKEN_ID = (1 << 31) - 1
#: the token every finished prefill "samples"; its value never matters to the scheduler
_SAMPLED = 0


@dataclass
class _Run:
    scheduler: Any
    release_delay: int | None
    hasher: Any
    finished_round: dict[str, int] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)  # finished, blocks not yet released
    usable_blocks: int = 0
    added: int = 0  # requests added so far: the next one's arrival time

    def arrivals(self) -> float:
        self.added += 1
        return float(self.added)


def _prompt(index: int, length: int, stride: int = 1 << 20) -> list[int]:
    """Request ``index``'s token ids, from ``(index + 1) * stride`` on."""
    base = (index + 1) * stride
    return list(range(base, base + length))


def _prompts(scenario: Scenario) -> list[list[int]]:
    """Each request's token ids: request ``i``'s start at ``(i + 1) * stride``, past the
    filler's (which start at 0), so no two requests share a block hash unless a prefix is
    meant to be shared; the stride is the scenario's longest run of ids, so every id fits the
    32-bit token ids vLLM 0.34.0 keeps."""
    lengths = [r.prompt_tokens for r in scenario.requests]
    stride = max([filler_tokens(scenario), *lengths]) + 1
    if (len(lengths) + 1) * stride > _MAX_TOKEN_ID:
        raise ScenarioError(
            f"scenario {scenario.name!r} needs token ids up to {(len(lengths) + 1) * stride} "
            f"to keep its {len(lengths)} prompts apart, more than vLLM's 32-bit token ids "
            f"hold ({_MAX_TOKEN_ID}); split it into smaller scenarios."
        )
    return [_prompt(i, n, stride) for i, n in enumerate(lengths)]


def _block_hasher(block_size: int) -> Any:
    """vLLM's prefix-cache block hasher; what makes identical token ids share cached blocks."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    return get_request_block_hasher(block_size, sha256)


def _make_request(request_id: str, tokens: list[int], hasher: Any, arrival: float) -> Any:
    """A prefill-only request; ``arrival`` orders it in vLLM's priority queue (all priorities
    are equal), as distinct arrival times do in a deployment."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=1, ignore_eos=True),
        pooling_params=None,
        arrival_time=arrival,
        block_hasher=hasher,
    )


def _runner_output(sched: Any, ids: list[str], finished: list[str], release: list[str]) -> Any:
    """What a model runner would return: one sampled token for each finished prefill."""
    import dataclasses

    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    # vLLM 0.34.0 dropped ``req_id_to_index`` (the scheduler indexes ``req_ids`` itself);
    # 0.32.0 and 0.33.0 require it
    index: dict[str, Any] = {}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        index["req_id_to_index"] = {rid: i for i, rid in enumerate(ids)}
    return ModelRunnerOutput(
        req_ids=ids,
        **index,
        sampled_token_ids=[[_SAMPLED] if rid in finished else [] for rid in ids],
        # vLLM frees finished transfers in the order it iterates them: a worker's set, whose
        # order varies from process to process. Handed over in finish order (a set's view that
        # keeps it), the frees, and so which cached blocks are evicted first, are reproducible.
        kv_connector_output=KVConnectorOutput(
            finished_sending=dict.fromkeys(release).keys()  # type: ignore[arg-type]  # an ordered set view on purpose (above); vLLM only iterates it
        ),
    )


def _prefills_done(sched: Any, ids: list[str]) -> list[str]:
    """Scheduled requests whose whole prompt is computed once this step runs."""
    return [
        rid
        for rid in ids
        if sched.requests[rid].num_computed_tokens >= sched.requests[rid].num_prompt_tokens
    ]


def _step(run: _Run, round_no: int) -> StepRecord:
    """One round: ``schedule()``, then ``update_from_output()`` with the hand-made output."""
    sched = run.scheduler
    out = sched.schedule()
    free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    ids = list(out.num_scheduled_tokens)
    done = _prefills_done(sched, ids)
    delay = run.release_delay
    release: list[str] = []
    if delay is not None:
        # the transfers policykit's nodes complete by the next round (:func:`kv_back`): the
        # release timing is the scenario's, handed to vLLM as a KV connector would
        nxt = round_no + 1
        release = [rid for rid in run.held if kv_back(run.finished_round[rid], delay, nxt)]
        release += [rid for rid in done if kv_back(round_no, delay, nxt)]
    sched.update_from_output(out, _runner_output(sched, ids, done, release))
    completed = [
        rid for rid in done if rid not in sched.requests or sched.requests[rid].is_finished()
    ]
    for rid in completed:
        run.finished_round[rid] = round_no
    run.held = [rid for rid in [*run.held, *completed] if rid not in release]
    return StepRecord(
        round=round_no,
        scheduled=dict(out.num_scheduled_tokens),
        preempted=sorted(out.preempted_req_ids or ()),
        completed=completed,
        released=release,
        blocks_used=run.usable_blocks - free,
        blocks_free=free,
    )


def _idle(run: _Run, step: StepRecord, pending: list) -> bool:
    """Nothing can change any more: nothing ran, was preempted or freed this round, nothing
    arrives later and no held KV is due back (a request that can never be admitted waits
    forever in vLLM)."""
    due = run.release_delay is not None and bool(run.held)
    moved = step.scheduled or step.preempted or step.released
    return not moved and not pending and not due


def _layout_step(sched: Any) -> Any:
    """One ``schedule()`` of vLLM's own ``Scheduler``, whatever subclass ``sched`` is: a
    subclass's decisions (the policykit plugin's combo) do not lay the scenario out, as the
    combo under test does not on policykit's side."""
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler.schedule(sched)


def _alone(run: _Run, request: Any, *, keep: bool) -> int:
    """Run ``request`` alone until its prefill is done, its blocks then freed (unless ``keep``);
    return the steps it took."""
    sched, rid, steps = run.scheduler, request.request_id, 0
    sched.add_request(request)
    while rid in sched.requests and not sched.requests[rid].is_finished():
        steps += 1
        out = _layout_step(sched)
        ids = list(out.num_scheduled_tokens)
        if rid not in ids:
            raise ScenarioError(f"vLLM did not schedule the layout's request {rid!r} alone")
        done = _prefills_done(sched, ids)
        sched.update_from_output(out, _runner_output(sched, ids, done, [] if keep else done))
    return steps


def _start_in_progress(run: _Run, request: Any, chunks: list[int]) -> int:
    """Admit ``request`` alone and compute ``chunks`` of it, one step each (the step budget set
    to the chunk, full-sequence reservation off for the admission: the scenario says it is
    running), leaving it in the running list; return the steps it took."""
    sched = run.scheduler
    budget, reserve = sched.max_num_scheduled_tokens, sched.scheduler_reserve_full_isl
    sched.add_request(request)
    sched.scheduler_reserve_full_isl = False
    try:
        for chunk in chunks:
            sched.max_num_scheduled_tokens = chunk
            out = _layout_step(sched)
            ids = list(out.num_scheduled_tokens)
            if out.num_scheduled_tokens.get(request.request_id) != chunk:
                raise ScenarioError(
                    f"vLLM did not compute {chunk} tokens of the in-progress request "
                    f"{request.request_id!r} alone while laying the scenario out"
                )
            sched.update_from_output(out, _runner_output(sched, ids, [], []))
    finally:
        sched.max_num_scheduled_tokens, sched.scheduler_reserve_full_isl = budget, reserve
    return len(chunks)


def _lay_out(run: _Run, scenario: Scenario, prompts: list[list[int]]) -> int:
    """Bring vLLM to the scenario's round-1 state the way :mod:`policykit.preempting_layout`
    writes it down (filler, then each device prefix alone, then the request in progress), with
    vLLM's own scheduler and block pool; return the steps it took (not recorded)."""
    plan = layout(scenario)
    steps = 0
    for warm in plan.warm:
        if warm.request is None:
            tokens = list(range(warm.first, warm.first + warm.tokens))
        else:
            tokens = prompts[warm.request][: warm.tokens]
        request = _make_request(warm.id, tokens, run.hasher, run.arrivals())
        steps += _alone(run, request, keep=warm.keep)
    going = plan.in_progress
    if going is not None:
        spec = scenario.requests[going.request]
        request = _make_request(spec.id, prompts[going.request], run.hasher, run.arrivals())
        steps += _start_in_progress(
            run, request, going.chunks(scenario.config.chunked_prefill_size)
        )
    return steps


def max_num_seqs(scenario: Scenario, knobs: SchedulerKnobs) -> int:
    """vLLM's ``max_num_seqs`` for ``scenario``: the knob, or one more than its requests (so it
    never binds), never above the token budget (vLLM refuses that)."""
    seqs = knobs.max_num_seqs or max(len(scenario.requests), 1) + 1
    return min(seqs, scenario.config.chunked_prefill_size)


def drive(
    scenario: Scenario,
    knobs: SchedulerKnobs | None = None,
    *,
    max_rounds: int = 10_000,
    scheduler_cls: type | None = None,
) -> Trace:
    """Run ``scenario`` through vLLM's scheduler (or ``scheduler_cls``, a subclass such as the
    policykit plugin's); one :class:`StepRecord` per round."""
    refuse_unmappable(scenario)
    knobs = knobs or SchedulerKnobs()
    page = scenario.config.page_size
    prompts = _prompts(scenario)
    longest = max((r.prompt_tokens for r in scenario.requests), default=1)
    budget = scenario.config.chunked_prefill_size
    scheduler = build_scheduler(
        block_size=page,
        num_blocks=pool_blocks(scenario) + 1,
        budget=budget,
        # room for the longest prompt and for a filler request of one whole block; vLLM
        # refuses a long-prefill threshold above it (one that long never cuts a chunk here)
        max_model_len=max(longest + 1, page + 1, knobs.long_prefill_token_threshold),
        max_num_seqs=max_num_seqs(scenario, knobs),
        knobs=knobs,
        scheduler_cls=scheduler_cls,
    )
    usable = scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1  # less the null block
    run = _Run(
        scheduler, scenario.config.kv_release_rounds, _block_hasher(page), usable_blocks=usable
    )
    warmup = _lay_out(run, scenario, prompts)
    pending = sorted(
        (
            (spec, tokens)
            for spec, tokens in zip(scenario.requests, prompts, strict=True)
            if not spec.chunked
        ),
        key=lambda p: p[0].arrival_round,
    )
    steps: list[StepRecord] = []
    for round_no in range(1, max_rounds + 1):
        while pending and pending[0][0].arrival_round <= round_no:
            spec, tokens = pending.pop(0)
            scheduler.add_request(_make_request(spec.id, tokens, run.hasher, run.arrivals()))
        step = _step(run, round_no)
        steps.append(step)
        finished = len(run.finished_round) == len(scenario.requests)
        if finished and (run.release_delay is None or not run.held):
            break
        if _idle(run, step, pending):
            break
    return Trace(
        scenario=scenario.name,
        block_size=page,
        num_blocks=usable,
        budget=budget,
        knobs=knobs,
        kv_release_rounds=scenario.config.kv_release_rounds,
        warmup_steps=warmup,
        steps=steps,
        finished_round=dict(run.finished_round),
        unfinished=[r.id for r in scenario.requests if r.id not in run.finished_round],
    )
