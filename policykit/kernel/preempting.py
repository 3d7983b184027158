"""The decisions of a node that preempts (vLLM 0.33.0's v1 scheduler): its chunking and
admission questions, where a non-final chunk ends, and which running request to preempt.
The node and the vLLM plugin ask them on ints, the checker on terms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policykit.kernel.chunking import aligned_end, chunk
from policykit.kernel.domain import FIRST_TOKENS, Numbers
from policykit.policy import AdmitView, ChunkView, PreemptView


def blocks_to_allocate(tokens: Any, held_blocks: Any, page_size: int) -> Any:
    """Blocks a request holding ``held_blocks`` must still get to hold ``tokens`` tokens
    (vLLM's ``get_num_blocks_to_allocate`` for one full-attention group)."""
    return -(-tokens // page_size) - held_blocks


def preempting_chunk_view(
    remaining: Any, budget: Any, free_tokens: Any, eligible: Any, page_size: int
) -> ChunkView:
    """The chunking question on a node that preempts: ``budget`` tokens left in the step,
    ``free_tokens`` of free blocks (what a chunk may take without a preemption) and
    ``eligible`` requests running or waiting."""
    return ChunkView(
        remaining_tokens=remaining,
        rem_chunk_tokens=budget,
        rem_total_tokens=free_tokens,
        rem_swa_tokens=free_tokens,
        page_size=page_size,
        hybrid_swa=False,
        eligible_requests=eligible,
    )


def preempting_admit_view(
    prompt: Any, remaining: Any, free_tokens: Any, page_size: int
) -> AdmitView:
    """The admission question on a node that preempts: ``remaining`` of the ``prompt`` not
    hit in the prefix cache, ``free_tokens`` of free blocks once the hit is taken. Nothing is
    promised to later steps there, so what may be promised and what the batch leaves are one."""
    return AdmitView(
        prompt_tokens=prompt,
        remaining_tokens=remaining,
        host_prefix_tokens=0,
        first_tokens=FIRST_TOKENS,
        page_size=page_size,
        rem_total_tokens=free_tokens,
        cur_rem_tokens=free_tokens,
    )


def preempting_chunk(
    domain: Numbers,
    method: str,
    start: Any,
    prompt: Any,
    budget: Any,
    free_tokens: Any,
    eligible: Any,
    page_size: int,
    request_id: str,
) -> tuple[Any, Any]:
    """A node that preempts asks the chunking policy (``new_chunk`` or ``resume_chunk``) for
    the chunk of a ``prompt``-token request from ``start``, and the alignment policy where a
    non-final one ends; 0 leaves it for this step. Returns the chunk and whether a policy
    broke its contract. The node, the vLLM plugin (:mod:`policykit.integrations.vllm`) and the
    checker's model of the node (``policykit.spec.preempting_bmc``) all take their chunk here."""
    remaining = prompt - start
    view = preempting_chunk_view(remaining, budget, free_tokens, eligible, page_size)
    length, bad = chunk(domain, method, view, request_id, label=method)
    cut = domain.all(length > 0, length < remaining)
    aligned = domain.when(
        lambda: cut, lambda: aligned_end(domain, start, start + length, page_size, request_id)
    )
    if aligned is None:  # ints, and the chunk is final or empty
        return length, bad
    end, bad_end = aligned
    length = domain.name("chunk", domain.choose(cut, end - start, length))
    return length, domain.any(bad, domain.all(cut, bad_end))


def preempting_admits(
    domain: Numbers, prompt: Any, start: Any, free_tokens: Any, page_size: int, request_id: str
) -> Any:
    """The admission policy's verdict on a waiting request of a node that preempts, ``start``
    tokens of its ``prompt`` hit in the prefix cache, ``free_tokens`` free once the hit is
    taken."""
    view = preempting_admit_view(prompt, prompt - start, free_tokens, page_size)
    return domain.admits(view, request_id)


@dataclass
class Turn:
    """A waiting request's turn on a node that preempts (vLLM's ``_schedule_waiting`` body):
    its first chunk (aligned), the admission policy's verdict (on ints None where the chunk is
    0: the node stops there without asking) and the blocks it takes, its hit's included."""

    chunk: Any
    ok: Any
    takes: Any
    bad: Any  #: the chunking or alignment policy broke its contract


def waiting_turn(
    domain: Numbers,
    prompt: Any,
    hit: Any,
    evictable: Any,
    budget: Any,
    free: Any,
    eligible: Any,
    page_size: int,
    request_id: str,
) -> Turn:
    """The turn of a waiting ``prompt``-token request whose prefix hits ``hit`` cached blocks,
    ``evictable`` of them only cached (a hit on those takes free blocks), on ``free`` free
    blocks with ``budget`` tokens left in the step. It gets in where its chunk is not 0, the
    admission policy admits it and it ``takes`` no more than ``free`` blocks. The node asks it
    about each request in its queue, the checker's model about each place of the queue."""
    start = hit * page_size
    tokens = (free - evictable) * page_size
    args = (start, prompt, budget, tokens, eligible, page_size, request_id)
    length, bad = preempting_chunk(domain, "new_chunk", *args)
    ok = domain.when(
        lambda: length > 0,
        lambda: preempting_admits(domain, prompt, start, tokens, page_size, request_id),
    )
    need = blocks_to_allocate(start + length, hit, page_size)
    return Turn(length, ok, domain.name("takes", need + evictable), bad)


def running_turn(
    domain: Numbers,
    prompt: Any,
    computed: Any,
    held: Any,
    budget: Any,
    free: Any,
    eligible: Any,
    page_size: int,
    request_id: str,
) -> tuple[Any, Any, Any]:
    """The turn of a running request, ``computed`` of its ``prompt`` done and ``held`` blocks
    held, on ``free`` free blocks with ``budget`` tokens left in the step: its
    ``resume_chunk`` (aligned; 0 defers it), the blocks that chunk needs beyond the held ones
    (where they are more than ``free``, the node preempts until they fit) and whether a policy
    broke its contract."""
    length, bad = preempting_chunk(
        domain,
        "resume_chunk",
        computed,
        prompt,
        budget,
        free * page_size,
        eligible,
        page_size,
        request_id,
    )
    need = domain.name("need", blocks_to_allocate(computed + length, held, page_size))
    return length, need, bad


def preempting_victim(
    domain: Numbers,
    running: list[tuple[int, int, int]],
    requester: int,
    page_size: int,
    request_ids: list[str],
    orders: list[tuple[int, int]] | None = None,
) -> int:
    """The place in the running list of the request to preempt so the chunk of the one at
    ``requester`` fits: each running request as ``(prompt, computed, held blocks)``, ranked by
    the preemption policy (:func:`victim`). ``orders``, where the engine has them: each one's
    ``(priority, arrival stamp)`` (``PreemptView``). On ints only: the node branches on it."""
    facts = [(0, 0)] * len(running) if orders is None else orders
    count = 0 if orders is None else len(running)
    views = [
        PreemptView(
            position=place,
            prompt_tokens=prompt,
            computed_tokens=computed,
            held_blocks=held,
            is_requester=place == requester,
            page_size=page_size,
            priority=priority,
            arrival=arrival,
            running_requests=count,
        )
        for place, ((prompt, computed, held), (priority, arrival)) in enumerate(
            zip(running, facts, strict=True)
        )
    ]
    place, _ = victim(domain, views, request_ids)
    return place


def victim(
    domain: Numbers,
    views: list[PreemptView],
    request_ids: list[str],
    present: list[Any] | None = None,
) -> tuple[Any, Any]:
    """Which running request to preempt, by its place in ``views`` (the running list): the
    preemption policy's highest rank, a tie going to the later one. Returns that place and
    whether a rank broke the contract (ranks are ints; any int is a rank).

    ``present`` (the checker's): per view, whether that request is still in the list; a view
    that is not never wins and its rank is not held against the policy. The checker's running
    list has a place for every request, filled or not, where the scheduler's has only the
    running ones (None: every view is present)."""
    here_all = [True] * len(views) if present is None else present
    best: Any = 0
    best_rank: Any = 0
    found: Any = False
    broken: Any = False
    for place, (view, rid, here) in enumerate(zip(views, request_ids, here_all, strict=True)):
        rank, bad = domain.decide(
            "preemption",
            "victim_rank",
            view,
            rid,
            label=f"victim_rank_{place}",
            bad=lambda r: False,
            complaint=_rank_complaint(rid),
        )
        broken = domain.any(broken, domain.all(here, bad))
        take = domain.all(here, domain.any(domain.not_(found), rank >= best_rank))
        best = domain.choose(take, place, best)
        best_rank = domain.choose(take, rank, best_rank)
        found = domain.any(found, here)
    return best, broken


def _rank_complaint(request_id: str) -> Callable[[Any], str]:
    """What is wrong with the victim rank ``r`` of running request ``request_id``."""
    return lambda r: f"ranked running request {request_id!r} {r!r}; a victim rank is an int."
