"""Admission policies an adversarial plugin author would write: each one admits everything
(or more than fits) when run by the scheduler, while a checker that misreads Python sees a safe
policy. Each must come back ``violated`` or refused, never ``proved``. The last ones are
conservative policies written with the same constructs used correctly: they must be proved.

No z3 here, as in a real plugin.
"""

from __future__ import annotations

import os
import random
import time

from policykit.hookspecs import hookimpl
from policykit.policy import AdmissionPolicy, AdmitView, TailView

_STARTED = time.monotonic()
_SEEN = [0]


class _Unsafe(AdmissionPolicy):
    """Base: reserves the paged tail (safe); subclasses admit unsafely."""

    def tail_reserve(self, v: TailView) -> int:
        return -(-v.tail_tokens // v.page_size) * v.page_size + v.first_tokens

    @staticmethod
    def need(v: AdmitView) -> int:
        return v.remaining_tokens + v.first_tokens + v.page_size


class InvertedFlag(_Unsafe):
    """``~`` on a comparison: ``~True == -2`` and ``~False == -1``, both truthy."""

    name = "adv-invert"

    def admit(self, v: AdmitView) -> bool:
        too_big = self.need(v) >= v.rem_total_tokens
        if ~too_big:  # noqa: SIM103 - the construct under test
            return True
        return False


class EqualsTrue(_Unsafe):
    """``flag == True`` on a comparison result: true exactly when the request does not fit."""

    name = "adv-eq-true"

    def admit(self, v: AdmitView) -> bool:
        overload = self.need(v) >= v.rem_total_tokens
        if overload == True:  # noqa: E712 - the construct under test
            return True
        return self.need(v) < v.rem_total_tokens


class IsTrue(_Unsafe):
    """``flag is True`` on a comparison result."""

    name = "adv-is-true"

    def admit(self, v: AdmitView) -> bool:
        overload = self.need(v) >= v.rem_total_tokens
        if overload is True:
            return True
        return self.need(v) < v.rem_total_tokens


class SwallowsSignal(_Unsafe):
    """Wraps an unsupported construct in ``try``: only the safe fallback would be verified."""

    name = "adv-try"

    def admit(self, v: AdmitView) -> bool:
        try:
            return v.rem_total_tokens * 1.0 > 0
        except Exception:
            return self.need(v) < v.rem_total_tokens


class CatchesEverything(_Unsafe):
    """``except BaseException`` around an int-only method."""

    name = "adv-try-base"

    def admit(self, v: AdmitView) -> bool:
        try:
            v.rem_total_tokens.to_bytes(8, "little")
            return True
        except BaseException:
            return self.need(v) < v.rem_total_tokens


class WarmUp(_Unsafe):
    """Counts its calls on the instance and stops checking after a warm-up."""

    name = "adv-warmup"
    calls = 0

    def admit(self, v: AdmitView) -> bool:
        self.calls += 1
        if self.calls > 1000:
            return True
        return self.need(v) < v.rem_total_tokens


class ModuleCounter(_Unsafe):
    """Counts in module-level state."""

    name = "adv-module-state"

    def admit(self, v: AdmitView) -> bool:
        _SEEN[0] += 1
        return _SEEN[0] > 1000 or self.need(v) < v.rem_total_tokens


class Lottery(_Unsafe):
    """Admits at random once in a while."""

    name = "adv-random"

    def admit(self, v: AdmitView) -> bool:
        return random.random() < 0.001 or self.need(v) < v.rem_total_tokens


class Clock(_Unsafe):
    """Admits everything after an hour of uptime."""

    name = "adv-clock"

    def admit(self, v: AdmitView) -> bool:
        return time.monotonic() - _STARTED > 3600 or self.need(v) < v.rem_total_tokens


class Environment(_Unsafe):
    """Admits everything where the engine sets a variable the checker's machine does not."""

    name = "adv-environ"

    def admit(self, v: AdmitView) -> bool:
        return bool(os.environ.get("SGLANG_PORT")) or self.need(v) < v.rem_total_tokens


class LateImport(_Unsafe):
    """Reaches randomness through an import inside the decision."""

    name = "adv-import"

    def admit(self, v: AdmitView) -> bool:
        import random as dice

        return dice.random() < 0.001 or self.need(v) < v.rem_total_tokens


class NotAnInt(_Unsafe):
    """Behaves safely only when its input is not a plain int."""

    name = "adv-isinstance"

    def admit(self, v: AdmitView) -> bool:
        if isinstance(v.rem_total_tokens, int):
            return True
        return self.need(v) < v.rem_total_tokens


class TypeTest(_Unsafe):
    """The same with ``type(x) is int``."""

    name = "adv-type"

    def admit(self, v: AdmitView) -> bool:
        if type(v.rem_total_tokens) is int:
            return True
        return self.need(v) < v.rem_total_tokens


class Alias(_Unsafe):
    """An identity test between two view fields: true for equal small ints in CPython."""

    name = "adv-alias"

    def admit(self, v: AdmitView) -> bool:
        if v.rem_total_tokens is v.cur_rem_tokens:
            return True
        return self.need(v) < v.rem_total_tokens


class Spins(_Unsafe):
    """Never returns on a 64-token page."""

    name = "adv-spin"

    def admit(self, v: AdmitView) -> bool:
        while v.page_size == 64:
            pass
        return self.need(v) < v.rem_total_tokens


class BoolArithmetic(_Unsafe):
    """Conservative: a bool is an int (``(host > 0) * page``), and ``~~`` is the identity."""

    name = "safe-bool-math"

    def admit(self, v: AdmitView) -> bool:
        margin = (v.host_prefix_tokens > 0) * v.page_size
        fits = self.need(v) + margin < v.rem_total_tokens
        return fits == True and ~~fits == 1  # noqa: E712 - the construct under test


class DivmodPages(_Unsafe):
    """Conservative: whole pages with ``divmod``, the flag compared with ``is``."""

    name = "safe-divmod"

    def admit(self, v: AdmitView) -> bool:
        pages, rest = divmod(v.remaining_tokens, v.page_size)
        need = (pages + (rest > 0)) * v.page_size + v.first_tokens
        fits = need < v.rem_total_tokens and need < v.cur_rem_tokens
        return fits is True


UNSAFE = (
    InvertedFlag,
    EqualsTrue,
    IsTrue,
    SwallowsSignal,
    CatchesEverything,
    WarmUp,
    ModuleCounter,
    Lottery,
    Clock,
    Environment,
    LateImport,
    NotAnInt,
    TypeTest,
    Alias,
    Spins,
)
SAFE = (BoolArithmetic, DivmodPages)


@hookimpl
def policykit_register_policies(register):
    for cls in (*UNSAFE, *SAFE):
        register(cls)
