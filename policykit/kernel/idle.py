"""Whether a request could ever run: the policies asked about the best case an idle node can
offer. The planner rejects for good what fails it; the checker asks it of every request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policykit.kernel.chunking import chunk
from policykit.kernel.domain import FIRST_TOKENS, Numbers
from policykit.kernel.swa import swa_host_charge
from policykit.liveness import idle_admit_view, idle_chunk_view, idle_swa_facts


@dataclass
class IdleAnswers:
    """The policies' answers about a request on the best case an idle node can ever offer
    (:func:`idle_answers`)."""

    ok: Any  #: the admission policy admits it
    chunk: Any  #: its first chunk (on ints: None where it is not admitted)
    bad: Any  #: that chunk is out of range (a broken contract)


def idle_answers(
    domain: Numbers,
    prompt: Any,
    cached: Any,
    host: Any,
    capacity: Any,
    swa_total: Any | None,
    *,
    page: int,
    chunk_size: int,
    window: int | None,
    request_id: str,
) -> IdleAnswers:
    """Whether a ``prompt``-token request could ever run here, asked of the policies on an
    idle node: nothing else admitted or held, ``capacity`` tokens free (every unpinned cached
    prefix evicted), the whole compute budget and the whole sliding-window pool
    (``swa_total``, None without hybrid SWA) free; ``cached`` tokens of its prompt stay cached
    (pinned) and ``host`` load back. The planner rejects for good a request that fails it
    (a queue that skips what never fits); the checker asks it of every request."""
    remaining = prompt - cached
    swa = None
    if swa_total is not None:
        # the sliding-window pool once the hit's sliding-window KV is loaded
        swa_total = swa_total - swa_host_charge(host, window, page)
    if swa_total is not None and window is not None:
        swa = idle_swa_facts(remaining - host, FIRST_TOKENS, page, chunk_size, swa_total, window)
    admit = idle_admit_view(prompt, remaining, host, FIRST_TOKENS, page, capacity, swa)
    first = idle_chunk_view(remaining - host, host, page, chunk_size, capacity, swa_total, swa)
    ok = domain.admits(admit, request_id, label="idle_admit")
    asked = domain.when(
        lambda: ok, lambda: chunk(domain, "new_chunk", first, request_id, label="idle_chunk")
    )
    length, bad = (None, False) if asked is None else asked
    return IdleAnswers(ok, length, bad)
