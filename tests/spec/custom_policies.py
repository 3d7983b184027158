"""Third-party policies as a plugin author would write them: plain Python, no solver."""

from __future__ import annotations

from policykit.hookspecs import hookimpl
from policykit.pages import ceil_paged
from policykit.plugins.chunking import SGLangChunking
from policykit.policy import (
    AdmissionPolicy,
    AdmitView,
    ChunkView,
    QueuePolicy,
    QueueView,
    TailView,
)


class ComputeOnly(AdmissionPolicy):
    """Charges only what the forward computes: forgets that a host load-back takes slots too."""

    name = "compute-only"

    def admit(self, v: AdmitView) -> bool:
        return v.remaining_tokens - v.host_prefix_tokens + v.page_size < v.rem_total_tokens

    def tail_reserve(self, v: TailView) -> int:
        return v.tail_tokens


class PagedReserve(AdmissionPolicy):
    """Admits only what fits in whole pages with headroom, and reserves the paged tail."""

    name = "paged-reserve"

    def admit(self, v: AdmitView) -> bool:
        need = ceil_paged(v.remaining_tokens, v.page_size) + v.first_tokens + v.page_size
        return need <= v.rem_total_tokens and need <= v.cur_rem_tokens

    def tail_reserve(self, v: TailView) -> int:
        return ceil_paged(v.tail_tokens, v.page_size) + v.first_tokens


class FloatRatio(AdmissionPolicy):
    """Uses a float ratio: cannot be checked symbolically (and says where)."""

    name = "float-ratio"

    def admit(self, v: AdmitView) -> bool:
        return v.remaining_tokens / v.page_size < v.rem_total_tokens

    def tail_reserve(self, v: TailView) -> int:
        return 0


class HalfBudget(SGLangChunking):
    """Upstream SGLang's chunking, except that a new request is truncated to half the compute
    budget's pages (say, to leave room for short requests behind it)."""

    name = "half-budget"

    def new_chunk(self, v: ChunkView) -> int:
        if ceil_paged(v.remaining_tokens, v.page_size) <= v.rem_chunk_tokens:
            return v.remaining_tokens
        return v.rem_chunk_tokens // (2 * v.page_size) * v.page_size


class PastComputeBudget(SGLangChunking):
    """SGLang 0.5.23's chunking, except that a new request whose sliding-window estimate fits
    is placed whole, even past the compute budget. The estimate counts at most
    ``rem_chunk_tokens`` beyond the window, so the ledger is charged less than the chunk will
    take from the sliding-window pool."""

    name = "past-compute-budget"

    def new_chunk(self, v: ChunkView) -> int:
        if v.hybrid_swa and v.swa_need < v.rem_swa_tokens:
            return v.remaining_tokens
        return super().new_chunk(v)


class ShortestFirst(QueuePolicy):
    """Shortest prompt first, with the never-fits skip: what one writes to cut the median
    TTFT. No request waits behind one that can never fit (``no-starvation`` is proved), but a
    long prompt is passed over by every shorter one that arrives after it."""

    name = "shortest-first"
    skips_never_fitting = True
    arrival_order = False

    def priority(self, v: QueueView) -> int:
        return v.prompt_tokens


class SameRank(QueuePolicy):
    """Sorts, but ranks every request alike: the queue stays in arrival order, which the
    checker must find out from the priority itself."""

    name = "same-rank"
    skips_never_fitting = True

    def priority(self, v: QueueView) -> int:
        return 0


@hookimpl
def policykit_register_policies(register):
    register(ComputeOnly)
    register(HalfBudget)
    register(PagedReserve)
    register(FloatRatio)
    register(PastComputeBudget)
    register(ShortestFirst)
    register(SameRank)
