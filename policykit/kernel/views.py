"""The questions a round asks the policies, built from the ledger as it stands: one builder
per view, so the planner and the checker ask with the same facts."""

from __future__ import annotations

from typing import Any

from policykit.kernel.domain import FIRST_TOKENS
from policykit.kernel.swa import swa_loaded
from policykit.ledger import Ledger
from policykit.liveness import swa_facts
from policykit.policy import AdmitView, ChunkView


def view_swa_facts(compute: Any, ledger: Ledger, swa_pool: Any | None) -> dict:
    """The sliding-window fields of a view for a request with ``compute`` tokens to go, with
    a sliding-window pool of ``swa_pool`` tokens in all (none without hybrid SWA)."""
    if swa_pool is None:
        return {}
    return swa_facts(ledger, compute, FIRST_TOKENS, swa_pool)


def chunk_view(remaining: Any, ledger: Ledger, swa_pool: Any | None, host: Any = 0) -> ChunkView:
    """The chunking question for a request with ``remaining`` tokens to compute (a new one:
    after ``host`` tokens it loads back), on the ledger as it stands."""
    swa_led, swa_pool = swa_loaded(ledger, swa_pool, host)
    return ChunkView(
        remaining_tokens=remaining,
        rem_chunk_tokens=ledger.rem_chunk_tokens,
        rem_total_tokens=ledger.rem_total_tokens,
        rem_swa_tokens=swa_led.rem_swa_tokens,
        page_size=ledger.page_size,
        hybrid_swa=ledger.hybrid_swa,
        **view_swa_facts(remaining, swa_led, swa_pool),
    )


def admit_view(
    prompt: Any, remaining: Any, host: Any, ledger: Ledger, swa_pool: Any | None
) -> AdmitView:
    """The admission question for a prompt of which ``remaining`` tokens are not cached on
    the device and ``host`` of those load back from the host tier, on the ledger as it
    stands."""
    swa_led, swa_pool = swa_loaded(ledger, swa_pool, host)
    return AdmitView(
        prompt_tokens=prompt,
        remaining_tokens=remaining,
        host_prefix_tokens=host,
        first_tokens=FIRST_TOKENS,
        page_size=ledger.page_size,
        rem_total_tokens=ledger.rem_total_tokens,
        cur_rem_tokens=ledger.cur_rem_tokens,
        hybrid_swa=ledger.hybrid_swa,
        rem_swa_tokens=swa_led.rem_swa_tokens,
        **view_swa_facts(remaining - host, swa_led, swa_pool),
    )
