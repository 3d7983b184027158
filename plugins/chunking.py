"""Built-in chunking policies.

They differ in what happens to the in-progress chunked request when memory is short. It cannot
be dropped (it holds KV already), so the choice is between forcing a chunk anyway and waiting.
"""

from __future__ import annotations

from policykit.config import EngineConfig
from policykit.hookspecs import hookimpl
from policykit.policy import ChunkingPolicy, ChunkView


def _truncate_to_pages(v: ChunkView) -> int:
    """A new request's chunk: whole if its paged length fits the compute budget, else as many
    whole pages as the budget allows (0 if not even one)."""
    if -(-v.remaining_tokens // v.page_size) * v.page_size <= v.rem_chunk_tokens:
        return v.remaining_tokens
    return v.rem_chunk_tokens // v.page_size * v.page_size


def _resume_within_budgets(v: ChunkView) -> int:
    """SGLang 0.5.23's resume (``add_chunked_req``): the compute and pool budgets, under hybrid
    SWA also the window room less a page, deferred when that is gone; on a plain pool a spent
    budget falls back to the compute budget (the pool check comes later, at allocation)."""
    budget = min(v.rem_chunk_tokens, v.rem_total_tokens)
    if v.hybrid_swa:
        budget = min(budget, v.rem_swa_tokens - v.page_size)
        if budget <= 0:
            return 0
    if budget <= 0:
        budget = v.rem_chunk_tokens
    return min(v.remaining_tokens, budget)


def _swa_limit(v: ChunkView) -> int | None:
    """The compute limit SGLang 0.5.23's ``SWAPrefillBudget`` puts on a new request's chunk:
    unchanged when the rest fits the sliding-window budget now, capped at ``swa_chunk_cap``
    when it can never fit the pool whole, ``None`` (wait) on a shortage that will pass."""
    if not v.hybrid_swa or v.swa_need < v.rem_swa_tokens:
        return v.rem_chunk_tokens
    if v.swa_need < v.swa_pool_tokens or v.swa_chunk_cap <= 0:
        return None
    return min(v.rem_chunk_tokens, v.swa_chunk_cap)


class SGLangChunking(ChunkingPolicy):
    """SGLang 0.5.23: resume with ``min(rem_chunk, rem_total)``, forced on a plain pool.

    Reproduces ``add_chunked_req`` and the truncation of ``_select_prefill_admission``, with
    ``PrefillBudget`` on a plain KV pool and ``SWAPrefillBudget`` under hybrid SWA, checked
    against SGLang 0.5.23's real ``PrefillAdder`` by ``policykit conformance sglang``. On a
    plain pool, if ``min(rem_chunk, rem_total)`` is ``<= 0`` the resume is forced to
    ``rem_chunk_tokens`` so the half-computed request is not leaked: the forced chunk bypasses
    the memory budget, and that is where the truncated-tail OOM finally happens
    (docs/incidents.md#truncated-tail). Under hybrid SWA the resume is capped at
    ``rem_swa_tokens - page_size`` and deferred when that is ``<= 0`` (the fix of
    docs/incidents.md#swa-resume), and a new request's chunk is capped at ``swa_chunk_cap`` only
    when it can never fit the sliding-window pool whole. ``sglang-pre-swa-fix`` keeps the code
    before that fix.
    """

    name = "sglang"

    def new_chunk(self, v: ChunkView) -> int:
        limit = _swa_limit(v)
        if limit is None:
            return 0
        if -(-v.remaining_tokens // v.page_size) * v.page_size <= limit:
            return v.remaining_tokens
        return limit // v.page_size * v.page_size

    def resume_chunk(self, v: ChunkView) -> int:
        return _resume_within_budgets(v)


class SGLangPreSWAFixChunking(ChunkingPolicy):
    """SGLang before the hybrid-SWA resume fix: an SWA resume takes all of
    ``rem_swa_tokens``, or falls back to ``rem_chunk_tokens`` (docs/incidents.md#swa-resume).

    Reproduces ``add_chunked_req`` before that fix (the code before ``SWAPrefillBudget``, which
    SGLang 0.5.23 no longer runs): resume with ``min(rem_chunk, rem_total, rem_swa)``, and when
    that is ``<= 0`` force ``rem_chunk_tokens``. The fallback ignores the sliding-window budget:
    on SGLang 0.5.23's paged sliding-window pool that is the OOM (a resume handed the whole
    budget, with no page left over, still fits there). A new request's chunk ignores the
    sliding-window budget too. Kept so that the incident replays, and only under hybrid SWA (on
    a plain KV pool it would be ``sglang``). The ledger it runs on is 0.5.23's (the
    window-capped sliding-window charge), which the pre-fix code did not have.
    """

    name = "sglang-pre-swa-fix"

    def validate(self, config: EngineConfig) -> None:
        if not config.hybrid_swa:
            raise ValueError(
                "sglang-pre-swa-fix differs from chunking=sglang only with hybrid SWA (a "
                "sliding window); without one, use chunking=sglang"
            )

    def new_chunk(self, v: ChunkView) -> int:
        return _truncate_to_pages(v)

    def resume_chunk(self, v: ChunkView) -> int:
        budget = min(v.rem_chunk_tokens, v.rem_total_tokens)
        if v.hybrid_swa:
            budget = min(budget, v.rem_swa_tokens)
        if budget <= 0:
            budget = v.rem_chunk_tokens
        return min(v.remaining_tokens, budget)


class DeferChunking(ChunkingPolicy):
    """Resume with ``min(rem_chunk, rem_total)``; when that is ``<= 0``, wait for a later round.

    The alternative the truncated-tail fix left for later (docs/incidents.md#truncated-tail):
    never allocate past the memory budget; the request resumes once transfers to decode
    release memory.
    """

    name = "defer"

    def new_chunk(self, v: ChunkView) -> int:
        return _truncate_to_pages(v)

    def resume_chunk(self, v: ChunkView) -> int:
        budget = min(v.rem_chunk_tokens, v.rem_total_tokens)
        if v.hybrid_swa:
            budget = min(budget, v.rem_swa_tokens - v.page_size)
        if budget <= 0:
            return 0
        return min(v.remaining_tokens, budget)


class SWAReserveChunking(ChunkingPolicy):
    """The hybrid-SWA resume fix (docs/incidents.md#swa-resume).

    A chunk is capped at ``rem_swa_tokens - page_size``, keeping the page that the fix reserves
    for ``alloc_extend`` (whose eviction SGLang 0.5.23 sizes by ``extend + page_size``; the
    allocation then takes the chunk's pages); when that is ``<= 0`` the in-progress request is
    deferred instead of falling back to ``rem_chunk_tokens``, which would bypass the
    sliding-window budget. Without hybrid SWA it behaves like ``sglang``.
    """

    name = "swa-reserve"

    def new_chunk(self, v: ChunkView) -> int:
        chunk = _truncate_to_pages(v)
        if v.hybrid_swa:
            room = v.rem_swa_tokens - v.page_size
            if room <= 0:
                return 0
            if chunk > room:
                chunk = room // v.page_size * v.page_size
        return chunk

    def resume_chunk(self, v: ChunkView) -> int:
        return _resume_within_budgets(v)


@hookimpl
def policykit_register_policies(register):
    register(SGLangChunking)
    register(SGLangPreSWAFixChunking)
    register(DeferChunking)
    register(SWAReserveChunking)
