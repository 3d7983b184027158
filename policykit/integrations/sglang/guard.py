"""Asking a policy inside the engine: a wrong answer costs one decision, never the engine.

In the simulator a policy that raises fails its request (:class:`~policykit.errors.PolicyError`).
Inside SGLang there is no such exit: an exception escaping ``PrefillAdder`` ends the scheduler
loop and with it every request being served. So each question goes through :func:`ask_verdict`
or :func:`ask_count`, which check the answer's type and range; on an exception or a nonsense
answer they log one line naming the policy, its distribution and the request, and return
:data:`FALLBACK`. The caller then lets upstream's own rule make that decision (see ``hooks``).

They run on every decision of every planning round, so the check is inline and the
``expected`` wording is only built when an answer is refused.
"""

from __future__ import annotations

import logging
from typing import Any

from policykit.planner import describe
from policykit.policy import Policy

logger = logging.getLogger("policykit.sglang")

#: a consulted policy failed; the hook makes upstream's decision instead
FALLBACK = object()


def ask_verdict(policy: Policy, question: str, view: Any, request_id: str) -> Any:
    """``policy.<question>(view)`` if it returns ``True`` or ``False``, else :data:`FALLBACK`."""
    try:
        answer = getattr(policy, question)(view)
    except Exception as exc:  # any policy failure falls back, by design
        return _raised(policy, question, request_id, exc)
    if answer is True or answer is False:
        return answer
    return _refused(policy, question, request_id, answer, "True or False")


def ask_count(
    policy: Policy, question: str, view: Any, request_id: str, lo: int, hi: int | None
) -> Any:
    """``policy.<question>(view)`` if it returns an int in ``[lo, hi]`` (``hi`` None: no upper
    bound), else :data:`FALLBACK`. A ``bool`` is not a count, as in the planner."""
    try:
        answer = getattr(policy, question)(view)
    except Exception as exc:  # any policy failure falls back, by design
        return _raised(policy, question, request_id, exc)
    if (
        isinstance(answer, int)
        and not isinstance(answer, bool)
        and lo <= answer
        and (hi is None or answer <= hi)
    ):
        return answer
    expected = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
    return _refused(policy, question, request_id, answer, expected)


def _raised(policy: Policy, question: str, request_id: str, exc: Exception) -> Any:
    logger.error(
        "%s raised %s: %s in %s() for request %r; upstream SGLang decides instead.",
        describe(policy),
        type(exc).__name__,
        exc,
        question,
        request_id,
    )
    return FALLBACK


def _refused(policy: Policy, question: str, request_id: str, answer: Any, expected: str) -> Any:
    logger.error(
        "%s answered %r to %s() for request %r (%s expected); upstream SGLang decides instead.",
        describe(policy),
        answer,
        question,
        request_id,
        expected,
    )
    return FALLBACK
