"""Asking a policy inside vLLM's scheduler: a wrong answer costs one decision, never the engine.

The decisions are :mod:`policykit.kernel`'s, on ints (:class:`~policykit.kernel.Ints`), exactly
as in ``policykit simulate``: a policy that raises, or answers something that is not a
decision, raises :class:`~policykit.errors.PolicyError` there. ``policykit simulate`` fails the
request; inside vLLM an exception escaping ``schedule()`` would stop the engine core and every
request it serves. So each question goes through :meth:`Guard.ask`: on a ``PolicyError`` the
caller makes vLLM's own decision instead, and the failure is logged once per policy, question
and reason (a policy broken for every request would otherwise log on every step).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from policykit.errors import PolicyError

logger = logging.getLogger("policykit.vllm")

#: a consulted policy failed; the caller makes vLLM's decision instead
FALLBACK = object()


class Guard:
    """The failures one scheduler has logged, so that each is logged once."""

    def __init__(self) -> None:
        self.logged: set[tuple[str, str, str]] = set()
        #: per policy kind, the decisions its answers made and those vLLM made instead
        self.answered: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()

    def ask(self, kind: str, question: str, decide: Callable[..., Any], *args: Any) -> Any:
        """``decide(*args)``, or :data:`FALLBACK` (logged) if a policy broke its contract in
        it."""
        try:
            answer = decide(*args)
        except PolicyError as exc:
            cause = exc.__cause__
            reason = "the answer" if cause is None else type(cause).__name__
            self.refuse(kind, question, reason, str(exc))
            return FALLBACK
        self.answered[kind] += 1
        return answer

    def refuse(self, kind: str, question: str, reason: str, message: str) -> None:
        """Count a fallback; log ``message`` with it unless this kind, question and reason
        was logged before."""
        self.fallbacks[kind] += 1
        key = (kind, question, reason)
        if key in self.logged:
            return
        self.logged.add(key)
        logger.error(
            "%s vLLM decides instead (logged once for %s() and this reason).", message, question
        )
