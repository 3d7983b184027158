"""Page arithmetic, one home: KV is allocated and cached in whole pages, so tokens round to
pages in many places (the ledger, the nodes, the checker, the plugins). Each rounding is
named here once, so every caller rounds the same way.

Plain ``+ - * //`` only: the functions run on ints and on the checker's ``Sym`` terms alike
(:mod:`policykit.spec.symbolic` overloads those operators; ``//`` is floor division on both).
"""

from __future__ import annotations

from typing import Any


def pages_for(tokens: Any, page_size: int) -> Any:
    """The number of pages ``tokens`` tokens take: the last, partly filled one counts."""
    return -(-tokens // page_size)


def ceil_paged(tokens: Any, page_size: int) -> Any:
    """Round ``tokens`` up to whole pages: the slots their pages hold. Policies call it
    (``policykit.ceil_paged``), so it is written out rather than through :func:`pages_for`:
    the checker's refusal of a symbolic page size then names this helper, the one the policy
    called."""
    return -(-tokens // page_size) * page_size


def floor_paged(tokens: Any, page_size: int) -> Any:
    """Round ``tokens`` down to whole pages: the tokens of their full pages."""
    return tokens // page_size * page_size


def cached_on_release(tokens: Any, page_size: int) -> Any:
    """The tokens of a released request's KV that the prefix cache keeps: its whole pages (the
    partly filled last page goes back to the free list). The node's release and the
    checker's release cache the same."""
    return floor_paged(tokens, page_size)


def extend_pages(seq_len: Any, prefix_len: Any, page_size: int) -> Any:
    """Pages ``alloc_extend`` takes to grow a sequence from ``prefix_len`` to ``seq_len``.

    The partly filled last page of the prefix is reused, so this is
    ``ceil(seq/page) - ceil(prefix/page)``, never more than ``ceil((seq-prefix)/page)``.
    """
    return pages_for(seq_len, page_size) - pages_for(prefix_len, page_size)


def eviction_demand(extend_tokens: Any, requests: int, page_size: int) -> Any:
    """The free tokens SGLang 0.5.23 evicts for before it allocates a prefill batch.

    ``alloc_paged_token_slots_extend`` sizes it conservatively, as if every request started a
    new page: the batch's extend tokens plus one page per request (``alloc_token_slots``, for
    one-token pages, asks for the extend tokens alone). Eviction takes whole least recently
    used leaves until the shortfall is covered, so it may free more than the exact pages the
    allocation then takes. Plain arithmetic: the checker's round model charges a commit
    with it too.
    """
    return extend_tokens + (requests * page_size if page_size > 1 else 0)
