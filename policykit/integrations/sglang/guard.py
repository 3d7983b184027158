"""Asking a policy inside the engine: a wrong answer costs one decision, never the engine.

The questions and their contracts are :mod:`policykit.kernel`'s, on ints
(:class:`~policykit.kernel.Ints`), exactly as in ``policykit simulate`` and in the vLLM
plugin: a policy that raises, or answers something that is not a decision, raises
:class:`~policykit.errors.PolicyError` there, which names the policy, its distribution, the
method's file and line and the request. ``policykit simulate`` fails the request; inside SGLang
an exception escaping ``PrefillAdder`` would end the scheduler loop and with it every request
being served. So each question goes through one of the functions here: on a ``PolicyError``
it logs the error and returns :data:`FALLBACK`, and the caller lets upstream's own rule make
that decision (see ``hooks``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from policykit import kernel
from policykit.errors import PolicyError
from policykit.policy import AdmitView, ChunkView, Policy, QueueView

logger = logging.getLogger("policykit.sglang")

#: a consulted policy failed; the hook makes upstream's decision instead
FALLBACK = object()


def admits(domain: kernel.Ints, view: AdmitView, request: Any) -> Any:
    """The admission policy's verdict (``True`` or ``False``), else :data:`FALLBACK`."""
    return _ask(domain.admits, view, request_id(request))


def chunk(domain: kernel.Ints, method: str, view: ChunkView, request: Any) -> Any:
    """The chunking policy's ``method`` (``new_chunk`` or ``resume_chunk``): a length in
    ``[0, remaining]``, else :data:`FALLBACK`."""
    answer = _ask(kernel.chunk, domain, method, view, request_id(request), label=method)
    return answer if answer is FALLBACK else answer[0]


def aligned_end(domain: kernel.Ints, start: int, end: int, page: int, request: Any) -> Any:
    """The alignment policy's end for the chunk ``[start, end)``, in ``(start, end]``, else
    :data:`FALLBACK`."""
    answer = _ask(kernel.aligned_end, domain, start, end, page, request_id(request))
    return answer if answer is FALLBACK else answer[0]


def tail_reserve(domain: kernel.Ints, tail: int, first: int, page: int, request: Any) -> Any:
    """The admission policy's reservation for a ``tail``-token tail (``first`` generated
    tokens), not negative, else :data:`FALLBACK`."""
    answer = _ask(kernel.tail_reserve, domain, tail, first, page, request_id(request))
    return answer if answer is FALLBACK else answer[0]


def rank(policy: Policy, view: QueueView, request: Any) -> Any:
    """The queue policy's priority (any int), else :data:`FALLBACK`."""
    return _ask(kernel.queue_rank, policy, view, request_id(request))


def request_id(request: Any) -> str:
    """The id a log line names: SGLang's ``Req.rid``."""
    return str(getattr(request, "rid", "?"))


def _ask(question: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``question(*args, **kwargs)``, or :data:`FALLBACK` (logged) where a policy broke its
    contract in it."""
    try:
        return question(*args, **kwargs)
    except PolicyError as exc:
        logger.error("%s Upstream SGLang decides instead.", exc)
        return FALLBACK
