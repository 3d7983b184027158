"""vLLM 0.33.0's admission and chunking, as policies of a node that preempts.

vLLM's v1 scheduler (``vllm/v1/core/sched/scheduler.py``) decides a prefill step in two
places a policy can own: whether a waiting request may enter (``allocate_slots`` with
``full_sequence_must_fit=scheduler_reserve_full_isl``) and how many tokens a request computes
this step (the token budget, capped by ``long_prefill_token_threshold``). Both decide on vLLM's
block pool and on its count of running and waiting requests, which only the preempting node
fills in (:mod:`policykit.preempting`), so they are ``preempting_only``. ``policykit
conformance vllm`` checks them against the real scheduler round by round.
"""

from __future__ import annotations

from policykit.config import EngineConfig
from policykit.hookspecs import hookimpl
from policykit.pages import ceil_paged
from policykit.policy import (
    AdmissionPolicy,
    AdmitView,
    ChunkingPolicy,
    ChunkView,
    Parameter,
    TailView,
)


class VllmAdmission(AdmissionPolicy):
    """vLLM 0.33.0's default: a request enters only if its whole prompt fits now.

    With ``scheduler_reserve_full_isl=True``, ``allocate_slots`` first asks whether the blocks of
    the full sequence (its prompt, less its prefix-cache hit, plus the hit blocks that are only
    evictable) fit the free blocks, then whether this step's chunk does. Nothing is promised
    beyond this step: running requests that later outgrow the pool together are preempted, not
    refused. (The chunk check is the node's, not the policy's.)
    """

    name = "vllm"
    preempting_only = True

    def admit(self, v: AdmitView) -> bool:
        return ceil_paged(v.remaining_tokens, v.page_size) <= v.rem_total_tokens

    def tail_reserve(self, v: TailView) -> int:
        return 0


class VllmNoReserveAdmission(VllmAdmission):
    """vLLM 0.33.0, ``scheduler_reserve_full_isl=False``: only the first chunk must fit.

    A long prompt enters as soon as its first chunk's blocks are free, so more requests run at
    once and preemption does the rest (the behaviour before vLLM added the full-sequence
    check).
    """

    name = "vllm-no-reserve"

    def admit(self, v: AdmitView) -> bool:
        return True


def _budgeted(v: ChunkView, threshold: int) -> int:
    """vLLM's chunk: the rest of the prompt, capped by the long-prefill threshold when more than
    one request is eligible, then by the step's token budget."""
    tokens = v.remaining_tokens
    if v.eligible_requests > 1 and 0 < threshold < tokens:
        tokens = threshold
    return min(tokens, v.rem_chunk_tokens)


class VllmChunking(ChunkingPolicy):
    """vLLM 0.33.0's chunked prefill: what the step's token budget leaves.

    ``max_num_batched_tokens`` is the budget (the scenario's ``chunked_prefill_size``); running
    requests are served first, then waiting ones, each taking what is left. Chunks end
    anywhere (use the ``none`` alignment to stay vLLM's).
    """

    name = "vllm"
    preempting_only = True

    def new_chunk(self, v: ChunkView) -> int:
        return _budgeted(v, 0)

    def resume_chunk(self, v: ChunkView) -> int:
        return _budgeted(v, 0)


class VllmThresholdChunking(ChunkingPolicy):
    """vLLM 0.33.0's ``long_prefill_token_threshold``: at most N tokens a step, unless alone.

    No request computes more than the threshold in one step, unless it is the only request
    running or waiting: the threshold keeps one long prompt from taking the whole budget while
    others wait, and with a single eligible request there is nobody to starve.
    """

    name = "vllm-threshold"
    preempting_only = True
    parameter = Parameter("n", "a positive int: vLLM's long_prefill_token_threshold")
    #: the threshold an enumeration of every combo tries
    samples = ("256",)

    def __init__(self, arg: int | None = None) -> None:
        if arg is None or arg < 1:
            raise ValueError(f"the threshold must be a positive int, got {arg!r}")
        super().__init__(arg)

    def new_chunk(self, v: ChunkView) -> int:
        return _budgeted(v, self.arg)

    def resume_chunk(self, v: ChunkView) -> int:
        return _budgeted(v, self.arg)


def _threshold_and_budget(text: str) -> str:
    """``N@B`` with two positive ints, as written (it is the policy's spec); ValueError else."""
    threshold, sep, budget = text.partition("@")
    if not sep or int(threshold) < 1 or int(budget) < 1:
        raise ValueError(text)
    return f"{int(threshold)}@{int(budget)}"


class VllmAdaptiveChunking(ChunkingPolicy):
    """vLLM 0.33.0's adaptive long-prefill threshold: N, or a fair share if larger.

    With the flag on, vLLM raises the step's threshold ``N`` to ``max_num_batched_tokens //
    (running + waiting requests)`` when that is larger, so a threshold set low for a busy
    engine does not cut a request below its share of a quiet one's budget. The share depends on
    the step's whole budget ``B``, which no view carries, so it is the parameter's second part
    (``N@B``) and ``validate`` insists it is the engine's: another budget would be another rule.
    """

    name = "vllm-adaptive"
    #: its fair share divides by the count of requests, which the checker refuses; an
    #: enumerated verdict would only ever be that refusal
    enumerated = False
    preempting_only = True
    parameter = Parameter(
        "n@b",
        "N@B, two positive ints: vLLM's long_prefill_token_threshold and its "
        "max_num_batched_tokens",
        parse=_threshold_and_budget,
    )
    #: the parameter the policies page shows as an example
    samples = ("256@1024",)

    def __init__(self, arg: str | None = None) -> None:
        if arg is None:
            raise ValueError("the parameter must be N@B, got nothing")
        super().__init__(_threshold_and_budget(arg))
        threshold, _, budget = self.arg.partition("@")
        self.threshold = int(threshold)
        self.budget = int(budget)

    def validate(self, config: EngineConfig) -> None:
        if config.chunked_prefill_size != self.budget:
            raise ValueError(
                f"its fair share is of a {self.budget}-token step budget, and this engine's "
                f"is {config.chunked_prefill_size} (write {self.name}:"
                f"{self.threshold}@{config.chunked_prefill_size})"
            )

    def _threshold(self, v: ChunkView) -> int:
        return max(self.threshold, self.budget // v.eligible_requests)

    def new_chunk(self, v: ChunkView) -> int:
        return _budgeted(v, self._threshold(v))

    def resume_chunk(self, v: ChunkView) -> int:
        return _budgeted(v, self._threshold(v))


class VllmNoChunking(ChunkingPolicy):
    """vLLM 0.33.0 with ``enable_chunked_prefill=False``: a waiting request enters whole or not.

    vLLM's waiting loop stops at the first request whose rest does not fit the step's budget
    (``if not enable_chunked_prefill and num_new_tokens > token_budget: break``), so that
    request waits for an emptier step instead of starting with a chunk; ``0`` says the same
    here (not this round, and the queue stops). vLLM's running loop has no such check, so a
    running request's chunk is the budget's, as with chunking on. With a
    ``long_prefill_token_threshold`` too vLLM caps the request first and then checks the capped
    chunk: not this policy (the vLLM integration refuses that configuration at start-up).
    """

    name = "vllm-no-chunk"
    preempting_only = True

    def new_chunk(self, v: ChunkView) -> int:
        return v.remaining_tokens if v.remaining_tokens <= v.rem_chunk_tokens else 0

    def resume_chunk(self, v: ChunkView) -> int:
        return _budgeted(v, 0)


@hookimpl
def policykit_register_policies(register):
    register(VllmAdmission)
    register(VllmNoReserveAdmission)
    register(VllmChunking)
    register(VllmThresholdChunking)
    register(VllmAdaptiveChunking)
    register(VllmNoChunking)
