"""Asking a policy inside the engine: a wrong answer costs one decision, never the engine.

In the simulator a policy that raises fails its request (:class:`~policykit.errors.PolicyError`).
Inside SGLang there is no such exit: an exception escaping ``PrefillAdder`` ends the scheduler
loop and with it every request being served. So each question goes through :func:`ask_verdict`,
:func:`ask_count` or :func:`ask_rank`, which check the answer's type and range; on an exception
or a nonsense answer they log one line naming the policy, its distribution and the request, and
return :data:`FALLBACK`. The caller then lets upstream's own rule make that decision (see
``hooks``).

They run on every decision of every planning round, so the check is inline, and the request's
id and the ``expected`` wording are only worked out when a line is logged.
"""

from __future__ import annotations

import logging
from typing import Any

from policykit.planner import describe
from policykit.policy import Policy, QueuePolicy

logger = logging.getLogger("policykit.sglang")

#: a consulted policy failed; the hook makes upstream's decision instead
FALLBACK = object()


def ask_verdict(policy: Policy, question: str, view: Any, request: Any) -> Any:
    """``policy.<question>(view)`` if it returns ``True`` or ``False``, else :data:`FALLBACK`."""
    try:
        answer = getattr(policy, question)(view)
    except Exception as exc:  # any policy failure falls back, by design
        return _raised(policy, question, request, exc)
    if answer is True or answer is False:
        return answer
    return _refused(policy, question, request, answer, "True or False")


def ask_count(
    policy: Policy, question: str, view: Any, request: Any, lo: int, hi: int | None
) -> Any:
    """``policy.<question>(view)`` if it returns an int in ``[lo, hi]`` (``hi`` None: no upper
    bound), else :data:`FALLBACK`. A ``bool`` is not a count, as in the planner."""
    try:
        answer = getattr(policy, question)(view)
    except Exception as exc:  # any policy failure falls back, by design
        return _raised(policy, question, request, exc)
    if (
        isinstance(answer, int)
        and not isinstance(answer, bool)
        and lo <= answer
        and (hi is None or answer <= hi)
    ):
        return answer
    expected = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
    return _refused(policy, question, request, answer, expected)


def ask_rank(policy: QueuePolicy, view: Any, request: Any) -> Any:
    """``policy.priority(view)`` if it returns an int (any value), else :data:`FALLBACK`."""
    try:
        answer = policy.priority(view)
    except Exception as exc:  # any policy failure falls back, by design
        return _raised(policy, "priority", request, exc)
    if isinstance(answer, int) and not isinstance(answer, bool):
        return answer
    return _refused(policy, "priority", request, answer, "an int")


def request_id(request: Any) -> str:
    """The id a log line names: SGLang's ``Req.rid``."""
    return str(getattr(request, "rid", "?"))


def _raised(policy: Policy, question: str, request: Any, exc: Exception) -> Any:
    logger.error(
        "%s raised %s: %s in %s() for request %r; upstream SGLang decides instead.",
        describe(policy),
        type(exc).__name__,
        exc,
        question,
        request_id(request),
    )
    return FALLBACK


def _refused(policy: Policy, question: str, request: Any, answer: Any, expected: str) -> Any:
    logger.error(
        "%s answered %r to %s() for request %r (%s expected); upstream SGLang decides instead.",
        describe(policy),
        answer,
        question,
        request_id(request),
        expected,
    )
    return FALLBACK
