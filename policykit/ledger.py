"""The per-round ledger: two independent budgets, opened fresh every round.

*Compute* says how many new tokens this forward may process (``rem_chunk_tokens``,
``rem_input_tokens``). *Memory* says whether the KV pool can pay. Memory is a subtraction::

    rem_total_tokens = baseline - rem_total_token_offset   # what may still be promised
    cur_rem_tokens   = baseline - cur_rem_token_offset     # what this batch leaves behind

``baseline = free + evictable`` is read from the pool and cache; it already reflects everything
allocated (including host load-backs done at admission). The offsets count what this round
promised and has not allocated yet: ``cur_*`` only this batch's chunks (plus a page each),
``rem_total_*`` also what later rounds will allocate (first tokens, and — with the
truncated-tail fix, docs/incidents.md#truncated-tail — the tail of every truncated request).
Every ``cur_*`` term is also a ``rem_total_*`` term, so ``cur_rem_tokens >= rem_total_tokens``
always.

The arithmetic follows SGLang's ``PrefillAdder`` on a PD prefill node (docs/concepts/index.md;
``max_new_tokens`` clipped to the single first token). With hybrid SWA a third budget,
``rem_swa_tokens``, follows SGLang 0.5.23's ``SWAPrefillBudget``: each chunk is charged the
window-capped estimate of :func:`swa_estimate`, not its raw length.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from policykit.pages import ceil_paged


class Budget(enum.Enum):
    """Verdict after each admission: may the planner look at the next request?"""

    NO_TOKEN = "NO_TOKEN"  # memory exhausted: the batch is full
    OTHER = "OTHER"  # compute exhausted
    CONTINUE = "CONTINUE"


def minimum(a: Any, b: Any) -> Any:
    """``min`` without a branch: the checker runs this ledger on symbolic integers outside any
    policy evaluation, where a comparison cannot be branched on (``|a - b|`` is exact)."""
    return (a + b - abs(a - b)) // 2


def maximum(a: Any, b: Any) -> Any:
    """``max`` without a branch (see :func:`minimum`)."""
    return (a + b + abs(a - b)) // 2


def swa_estimate(
    extend: Any, first_tokens: int, window: int | None, page_size: int, chunk_limit: Any
) -> Any:
    """Sliding-window slots SGLang 0.5.23 reserves for a chunk of ``extend`` tokens
    (``estimate_swa_kv_tokens`` without a host hit): what the chunk allocates beyond one window
    (at most ``chunk_limit``), plus the window part, capped at the window, plus a page. Only the
    window stays locked between chunks, so a long prompt is not charged its whole length."""
    if window is None:
        return extend + first_tokens + page_size
    beyond = maximum(minimum(extend, chunk_limit) - window, 0)
    return beyond + minimum(extend + first_tokens, window) + page_size


@dataclass
class Ledger:
    """Budgets and offsets of one planning round."""

    page_size: int
    baseline: int
    rem_chunk_tokens: int
    rem_input_tokens: int | None = None
    swa_baseline: int | None = None
    #: hybrid SWA: tokens of the sliding window (``None``: charge chunks as if unwindowed)
    sliding_window: int | None = None
    rem_total_token_offset: int = 0
    cur_rem_token_offset: int = 0
    rem_swa_token_offset: int = 0

    @property
    def hybrid_swa(self) -> bool:
        return self.swa_baseline is not None

    @property
    def rem_total_tokens(self) -> int:
        return self.baseline - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> int:
        return self.baseline - self.cur_rem_token_offset

    @property
    def rem_swa_tokens(self) -> int:
        """Sliding-window pool headroom; effectively unbounded without hybrid SWA."""
        if self.swa_baseline is None:
            return self.baseline
        return self.swa_baseline - self.rem_swa_token_offset

    def charge_chunk(self, chunk: int, *, first_tokens: int) -> None:
        """Record a chunk placed in this batch (``first_tokens`` when it is a request's last).

        A chunk costs its paged length plus one page of headroom in both memory offsets (the
        page is what ``alloc_extend`` may need beyond the paged length), and its paged length
        in the compute budgets. With hybrid SWA it also costs :meth:`swa_need` sliding-window
        slots, against the compute budget as it was before this chunk (SGLang 0.5.23's
        ``SWAPrefillBudget.reserve``).
        """
        paged = ceil_paged(chunk, self.page_size)
        if self.swa_baseline is not None:
            self.rem_swa_token_offset += self.swa_need(chunk, first_tokens)
        self.rem_total_token_offset += paged + first_tokens + self.page_size
        self.cur_rem_token_offset += paged + self.page_size
        self.rem_chunk_tokens -= paged
        if self.rem_input_tokens is not None:
            self.rem_input_tokens -= paged

    def swa_need(self, tokens: Any, first_tokens: int) -> Any:
        """Sliding-window slots a chunk of ``tokens`` would be charged now (hybrid SWA)."""
        paged = ceil_paged(tokens, self.page_size)
        return swa_estimate(
            paged, first_tokens, self.sliding_window, self.page_size, self.rem_chunk_tokens
        )

    def swa_chunk_cap(self, first_tokens: int) -> Any:
        """The longest chunk, in whole pages, that the sliding-window budget leaves for a
        request that can never fit the pool whole (SGLang 0.5.23's ``_chunk_cap``): what is
        left after the headroom of an empty chunk, and 0 when nothing is."""
        headroom = swa_estimate(
            0, first_tokens, self.sliding_window, self.page_size, self.rem_chunk_tokens
        )
        return maximum((self.rem_swa_tokens - headroom) // self.page_size * self.page_size, 0)

    def reserve(self, tokens: int) -> None:
        """Promise ``tokens`` to a later round (a truncated request's tail)."""
        self.rem_total_token_offset += tokens

    def copy(self) -> Ledger:
        """A copy to decide a step on (the round model keeps both sides of a choice)."""
        return dataclasses.replace(self)

    def become(self, other: Ledger) -> None:
        """Take ``other``'s budgets: a step decided on a copy is taken."""
        self.__dict__.update(other.__dict__)

    def lower_baseline(self, tokens: int) -> None:
        """Memory taken at admission: a host load-back, or a lock making cache unevictable."""
        self.baseline -= tokens

    def budget_state(self) -> Budget:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return Budget.NO_TOKEN
        if self.swa_baseline is not None and self.rem_swa_tokens <= 0:
            return Budget.NO_TOKEN
        if self.rem_chunk_tokens <= 0:
            return Budget.OTHER
        if self.rem_input_tokens is not None and self.rem_input_tokens <= 0:
            return Budget.OTHER
        return Budget.CONTINUE
