"""A chunk's length, its truncation and its placing on the ledger: the chunking policy gives
the length, the alignment policy moves a non-final chunk's end and the admission policy
reserves its tail; the in-progress request resumes first (:func:`resume`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policykit.kernel.domain import FIRST_TOKENS, Numbers
from policykit.kernel.views import chunk_view
from policykit.ledger import Ledger
from policykit.policy import AlignView, ChunkView, TailView


def chunk(
    domain: Numbers, method: str, view: ChunkView, request_id: str, *, label: str
) -> tuple[Any, Any]:
    """The chunking policy's chunk length (``new_chunk`` or ``resume_chunk``), which must be
    in ``[0, remaining]``; and whether it is not."""
    remaining = view.remaining_tokens
    return domain.decide(
        "chunking",
        method,
        view,
        request_id,
        label=label,
        bad=lambda c: domain.any(c < 0, c > remaining),
        complaint=lambda c: (
            f"returned the chunk length {c!r} for request {request_id!r} with {remaining} "
            f"tokens left; a chunk length is an int in [0, {remaining}]."
        ),
    )


def aligned_end(
    domain: Numbers, start: Any, end: Any, page_size: int, request_id: str
) -> tuple[Any, Any]:
    """The alignment policy's end for the non-final chunk ``[start, end)``, which must be in
    ``(start, end]``; and whether it is not. Both nodes, both models and the SGLang plugin ask
    it here."""
    return domain.decide(
        "alignment",
        "align_end",
        AlignView(start=start, end=end, page_size=page_size),
        request_id,
        label="aligned",
        bad=lambda a: domain.not_(domain.all(start < a, a <= end)),
        complaint=lambda a: (
            f"moved the end of the chunk [{start}, {end}) of request {request_id!r} to "
            f"{a!r}; an aligned end must be an int in ({start}, {end}]."
        ),
    )


def tail_reserve(
    domain: Numbers, tail: Any, first_tokens: Any, page_size: int, request_id: str
) -> tuple[Any, Any]:
    """The admission policy's reservation for the ``tail`` tokens a truncated request still
    has to come (and its ``first_tokens``), which must not be negative; and whether it is."""
    return domain.decide(
        "admission",
        "tail_reserve",
        TailView(tail_tokens=tail, first_tokens=first_tokens, page_size=page_size),
        request_id,
        label="reserve",
        bad=lambda r: r < 0,
        complaint=lambda r: (
            f"reserved {r!r} tokens for the {tail}-token tail of request {request_id!r}; a "
            "reservation is a non-negative int."
        ),
    )


def truncate(
    domain: Numbers, ledger: Ledger, start: Any, end: Any, prompt: Any, request_id: str
) -> tuple[Any, Any]:
    """Place the non-final chunk ``[start, end)`` of a ``prompt``-token request on
    ``ledger``: the alignment policy moves its end, the chunk is charged, and the admission
    policy reserves the tail still to come. Returns the aligned end and whether a policy
    broke the contract."""
    page = ledger.page_size
    aligned, bad_align = aligned_end(domain, start, end, page, request_id)
    ledger.charge_chunk(aligned - start, first_tokens=0)
    reserve, bad_reserve = tail_reserve(domain, prompt - aligned, FIRST_TOKENS, page, request_id)
    ledger.reserve(reserve)
    return aligned, domain.any(bad_align, bad_reserve)


def place(
    domain: Numbers,
    ledger: Ledger,
    start: Any,
    length: Any,
    whole: Any,
    prompt: Any,
    request_id: str,
    *,
    placed: Callable[[], bool],
) -> tuple[Ledger, Any, Any]:
    """The chunk ``[start, start + length)`` of a ``prompt``-token request placed on a copy of
    ``ledger``: charged with the first tokens where it is the ``whole`` rest of the prompt,
    else truncated (:func:`truncate`). Returns that ledger, the truncated end and whether the
    truncation broke the contract. ``placed`` says (to ints) whether the chunk is placed at
    all: a chunk of 0 has no truncation to ask about."""

    def charged() -> Ledger:
        out = ledger.copy()
        out.charge_chunk(length, first_tokens=FIRST_TOKENS)
        return out

    def cut() -> tuple[Ledger, Any, Any]:
        out = ledger.copy()
        end, bad = truncate(domain, out, start, start + length, prompt, request_id)
        return out, end, bad

    full = domain.when(lambda: placed() and whole, charged)
    kept = domain.when(lambda: placed() and not whole, cut)
    cut_ledger, end, bad = (ledger, start + length, False) if kept is None else kept
    return domain.choose(whole, ledger if full is None else full, cut_ledger), end, bad


@dataclass
class Resumed:
    """The in-progress request's turn (:func:`resume`)."""

    chunk: Any
    bad_range: Any  #: the chunk is out of range (a broken contract)
    deferred: Any  #: no chunk this round
    final: Any  #: the chunk is the rest of the prompt
    ledger: Ledger  #: the ledger with the chunk placed (where it is)
    end: Any  #: a truncation's aligned end
    bad_truncation: Any  #: the truncation broke the contract


def resume(
    domain: Numbers, ledger: Ledger, prompt: Any, seq: Any, swa_pool: Any | None, request_id: str
) -> Resumed:
    """The in-progress request, ``seq`` of its ``prompt`` tokens computed, resumes first
    (SGLang's chunked request): the chunking policy's ``resume_chunk``, 0 to defer it; the
    last chunk is charged with the first tokens, any other is truncated."""
    remaining = prompt - seq
    view = chunk_view(remaining, ledger, swa_pool)
    length, bad_range = chunk(domain, "resume_chunk", view, request_id, label="resume_chunk")
    deferred = length == 0
    final = length == remaining
    placed, end, bad = place(
        domain, ledger, seq, length, final, prompt, request_id, placed=lambda: not deferred
    )
    return Resumed(length, bad_range, deferred, final, placed, end, bad)
