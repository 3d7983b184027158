"""Built-in chunking policies.

They differ in what happens to the in-progress chunked request when memory is short. It cannot
be dropped (it holds KV already), so the choice is between forcing a chunk anyway and waiting.
"""

from __future__ import annotations

from policykit.hookspecs import hookimpl
from policykit.policy import ChunkingPolicy, ChunkView


def _truncate_to_pages(v: ChunkView) -> int:
    """A new request's chunk: whole if its paged length fits the compute budget, else as many
    whole pages as the budget allows (0 if not even one)."""
    if -(-v.remaining_tokens // v.page_size) * v.page_size <= v.rem_chunk_tokens:
        return v.remaining_tokens
    return v.rem_chunk_tokens // v.page_size * v.page_size


class SGLangChunking(ChunkingPolicy):
    """SGLang 0.5.23 on a plain KV pool: resume with ``min(rem_chunk, rem_total)``, forced.

    Reproduces ``add_chunked_req`` with ``PrefillBudget``: if ``min(rem_chunk, rem_total)`` is
    ``<= 0``, force ``rem_chunk_tokens`` so the half-computed request is not leaked. With
    hybrid SWA it models the code before ``SWAPrefillBudget`` (seed 001's pre-fix fallback,
    capped at ``rem_swa_tokens``), which 0.5.23 no longer runs.

    The forced chunk bypasses the memory budget: it is where seed 000's OOM finally happens, and
    (capped at ``rem_swa_tokens`` with no page reserved) where seed 001's does.
    """

    name = "sglang"

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

    The alternative seed 000 leaves for later: never allocate past the memory budget; the
    request resumes once transfers to decode release memory.
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
    """The seed 001 fix for hybrid sliding-window models.

    ``alloc_extend`` on the sliding-window pool needs ``extend + page_size`` free, so a chunk is
    capped at ``rem_swa_tokens - page_size``; when that is ``<= 0`` the in-progress request is
    deferred instead of falling back to ``rem_chunk_tokens``. Without hybrid SWA it behaves like
    ``sglang``.
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
        budget = min(v.rem_chunk_tokens, v.rem_total_tokens)
        if v.hybrid_swa:
            budget = min(budget, v.rem_swa_tokens - v.page_size)
            if budget <= 0:
                return 0
        if budget <= 0:
            budget = v.rem_chunk_tokens
        return min(v.remaining_tokens, budget)


@hookimpl
def policykit_register_policies(register):
    register(SGLangChunking)
    register(DeferChunking)
    register(SWAReserveChunking)
