"""Asking a policy inside the engine: a wrong answer costs one decision, never the engine.

In the simulator a policy that raises fails its request (:class:`~policykit.errors.PolicyError`).
Inside SGLang there is no such exit: an exception escaping ``PrefillAdder`` ends the scheduler
loop and with it every request being served. So each question goes through :func:`consult`,
which checks the answer's type and range; on an exception or a nonsense answer it logs one
line naming the policy, its distribution and the request, and returns :data:`FALLBACK`. The
caller then lets upstream's own rule make that decision (see ``hooks``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from policykit.planner import describe
from policykit.policy import Policy

logger = logging.getLogger("policykit.sglang")

#: a consulted policy failed; the hook makes upstream's decision instead
FALLBACK = object()


def consult(
    policy: Policy,
    question: str,
    view: Any,
    request_id: str,
    valid: Callable[[Any], bool],
    expected: str,
) -> Any:
    """``policy.<question>(view)`` if it returns normally and ``valid`` accepts the answer,
    otherwise log one line and return :data:`FALLBACK`."""
    try:
        answer = getattr(policy, question)(view)
    except Exception as exc:  # any policy failure falls back, by design
        logger.error(
            "%s raised %s: %s in %s() for request %r; upstream SGLang decides instead.",
            describe(policy),
            type(exc).__name__,
            exc,
            question,
            request_id,
        )
        return FALLBACK
    if not valid(answer):
        logger.error(
            "%s answered %r to %s() for request %r (%s expected); upstream SGLang decides instead.",
            describe(policy),
            answer,
            question,
            request_id,
            expected,
        )
        return FALLBACK
    return answer


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    """A validator for an int in ``[lo, hi]``."""
    return lambda x: is_int(x) and lo <= x <= hi
