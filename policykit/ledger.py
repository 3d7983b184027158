"""The per-round ledger: two independent budgets, opened fresh every round.

*Compute* says how many new tokens this forward may process (``rem_chunk_tokens``,
``rem_input_tokens``). *Memory* says whether the KV pool can pay. Memory is a subtraction::

    rem_total_tokens = baseline - rem_total_token_offset   # what may still be promised
    cur_rem_tokens   = baseline - cur_rem_token_offset     # what this batch leaves behind

``baseline = free + evictable`` is read from the pool and cache; it already reflects everything
allocated (including host load-backs done at admission). The offsets count what this round
promised and has not allocated yet: ``cur_*`` only this batch's chunks (plus a page each),
``rem_total_*`` also what later rounds will allocate (first tokens, and — with the seed 000 fix —
the tail of every truncated request). Every ``cur_*`` term is also a ``rem_total_*`` term, so
``cur_rem_tokens >= rem_total_tokens`` always.

The arithmetic follows SGLang's ``PrefillAdder`` as described in seed 000 (PD prefill node,
``max_new_tokens`` clipped to the single first token).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Budget(enum.Enum):
    """Verdict after each admission: may the planner look at the next request?"""

    NO_TOKEN = "NO_TOKEN"  # memory exhausted: the batch is full
    OTHER = "OTHER"  # compute exhausted
    CONTINUE = "CONTINUE"


def ceil_paged(tokens: int, page_size: int) -> int:
    """Round ``tokens`` up to whole pages (works on ints and symbolic integers alike)."""
    return -(-tokens // page_size) * page_size


@dataclass
class Ledger:
    """Budgets and offsets of one planning round."""

    page_size: int
    baseline: int
    rem_chunk_tokens: int
    rem_input_tokens: int | None = None
    swa_baseline: int | None = None
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
        in the compute budgets.
        """
        paged = ceil_paged(chunk, self.page_size)
        self.rem_total_token_offset += paged + first_tokens + self.page_size
        self.cur_rem_token_offset += paged + self.page_size
        self.rem_chunk_tokens -= paged
        if self.rem_input_tokens is not None:
            self.rem_input_tokens -= paged
        if self.swa_baseline is not None:
            self.rem_swa_token_offset += chunk + self.page_size

    def reserve(self, tokens: int) -> None:
        """Promise ``tokens`` to a later round (a truncated request's tail)."""
        self.rem_total_token_offset += tokens

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
