"""Liveness facts, defined once for the scheduler, the planner and the z3 model.

Two questions decide whether a request can ever finish on a prefill node, and the checker
only means something if it asks them exactly as the scheduler does:

* *never fits*: would the round's policies take a waiting request even on an **idle** node?
  An idle node offers its whole pool minus the pinned prefixes (memory held for requests
  outside the node, which never comes back), and the whole compute budget. The planner skips
  a request for which the answer is no, instead of blocking the queue behind it forever.
* *never completes*: an admitted request still owes ``alloc_extend`` pages to finish. If that
  is more than the node can ever have free again (free + evictable now, plus the KV of held
  requests whose release is still to come), it can never complete, whatever happens next.

The functions take plain ints or the checker's symbolic ints alike (only ``+ - * //`` and
comparisons are used), so the model builds the very same views.
"""

from __future__ import annotations

from typing import Any

from policykit.ledger import Ledger
from policykit.pages import extend_pages, pages_for
from policykit.policy import AdmitView, ChunkView


def idle_capacity(pool_total: Any, pinned: Any) -> Any:
    """What an idle node could ever have free: every slot but the pinned prefixes."""
    return pool_total - pinned


def swa_facts(ledger: Ledger, compute: Any, first_tokens: int, pool_tokens: Any) -> dict:
    """The sliding-window fields of a view (hybrid SWA) for a request with ``compute`` tokens
    to go, as ``ledger`` stands and with a sliding-window pool of ``pool_tokens`` in all."""
    return {
        "swa_need": ledger.swa_need(compute, first_tokens),
        "swa_pool_tokens": pool_tokens,
        "swa_chunk_cap": ledger.swa_chunk_cap(first_tokens),
    }


def idle_swa_facts(
    compute: Any,
    first_tokens: int,
    page: int,
    chunked_prefill_size: int,
    swa_total: Any,
    window: int,
) -> dict:
    """:func:`swa_facts` on an idle node: the whole sliding-window pool and compute budget."""
    ledger = Ledger(
        page_size=page,
        baseline=swa_total,
        rem_chunk_tokens=chunked_prefill_size,
        swa_baseline=swa_total,
        sliding_window=window,
    )
    return swa_facts(ledger, compute, first_tokens, swa_total)


def idle_admit_view(
    prompt: Any,
    remaining: Any,
    host: Any,
    first_tokens: int,
    page: int,
    capacity: Any,
    swa: dict | None = None,
) -> AdmitView:
    """The admission question on an idle node of ``capacity`` tokens (``swa``: its
    :func:`idle_swa_facts` with hybrid SWA)."""
    hybrid = {} if swa is None else {"hybrid_swa": True, "rem_swa_tokens": swa["swa_pool_tokens"]}
    return AdmitView(
        prompt_tokens=prompt,
        remaining_tokens=remaining,
        host_prefix_tokens=host,
        first_tokens=first_tokens,
        page_size=page,
        rem_total_tokens=capacity,
        cur_rem_tokens=capacity,
        **hybrid,
        **(swa or {}),
    )


def idle_chunk_view(
    compute: Any,
    host: Any,
    page: int,
    chunked_prefill_size: int,
    capacity: Any,
    swa_total: Any | None,
    swa: dict | None = None,
) -> ChunkView:
    """The first-chunk question on an idle node: the whole compute budget, the pool after the
    host load-back, the whole sliding-window pool (hybrid SWA, where ``swa_total`` and its
    :func:`idle_swa_facts` are given)."""
    after_load = capacity - pages_for(host, page) * page
    return ChunkView(
        remaining_tokens=compute,
        rem_chunk_tokens=chunked_prefill_size,
        rem_total_tokens=after_load,
        rem_swa_tokens=after_load if swa_total is None else swa_total,
        page_size=page,
        hybrid_swa=swa_total is not None,
        **(swa or {}),
    )


def owed_tokens(prompt: Any, seq: Any, page: int) -> Any:
    """Slots an admitted request still needs to finish: its remaining ``alloc_extend``."""
    return extend_pages(prompt, seq, page) * page


def never_completes(owed: Any, reclaimable: Any) -> Any:
    """An admitted request owing ``owed`` slots can never finish on a node that can never
    again have more than ``reclaimable`` free (free + evictable + held KV still due back)."""
    return owed > reclaimable
