"""Admission policies in everyday Python, as a plugin author writes them: each idiom once in a
safe policy (the checker must prove it) and once in an unsafe variant (it admits more than
fits, or it is not a pure function: the checker must find the OOM or refuse).

No z3 here, as in a real plugin.
"""

from __future__ import annotations

import functools
import math
import operator
import time
from dataclasses import dataclass

from policykit.hookspecs import hookimpl
from policykit.policy import AdmissionPolicy, AdmitView, TailView


@dataclass(frozen=True)
class Limits:
    """Tunables of the acme policies: a frozen dataclass of ints at module level."""

    headroom_pages: int
    first_tokens: int


LIMITS = Limits(headroom_pages=1, first_tokens=1)
#: shared with :class:`MutatedConstant`, whose instances loosen it
SHARED_LIMITS = Limits(headroom_pages=1, first_tokens=1)
HEADROOM_PAGES = 1
MARGINS = (1, 0)
#: the longest request the ``while`` idioms admit, in pages
MAX_PAGES = 8
#: rebound by :func:`loosen` (an observer hook could call it at run time)
SLACK_PAGES = 1


def loosen() -> None:
    global SLACK_PAGES
    SLACK_PAGES = -1000


def pages(tokens: int, page: int) -> int:
    """Whole pages for ``tokens``: a pure helper."""
    return -(-tokens // page)


@functools.lru_cache(maxsize=1024)
def paged_need(tokens: int, page: int, first: int) -> int:
    """The paged need of a request: a pure helper behind an LRU cache."""
    return pages(tokens, page) * page + first + page


@functools.cache
def page_margin(page: int) -> int:
    return page


@functools.cache
def stamped(tokens: int) -> int:
    """Impure behind a cache: the clock decides once per argument."""
    return tokens - 10**6 if time.monotonic() > 0 else tokens


class _Paged(AdmissionPolicy):
    """Base: reserves the paged tail (safe)."""

    def tail_reserve(self, v: TailView) -> int:
        return math.ceil(v.tail_tokens / v.page_size) * v.page_size + v.first_tokens

    @staticmethod
    def fits(need: int, v: AdmitView) -> bool:
        return need <= v.rem_total_tokens and need <= v.cur_rem_tokens


# -- math.ceil / math.floor of a true division of ints -----------------------------------------
class CeilDiv(_Paged):
    name = "idiom-ceil"

    def admit(self, v: AdmitView) -> bool:
        need = math.ceil(v.remaining_tokens / v.page_size) * v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class FloorDiv(_Paged):
    """Unsafe: charges whole pages of what the forward computes, forgetting that a host
    load-back takes slots too."""

    name = "idiom-floor"

    def admit(self, v: AdmitView) -> bool:
        computed = v.remaining_tokens - v.host_prefix_tokens
        need = math.floor(computed / v.page_size) * v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class CeilOfFloat(_Paged):
    """Refused: one operand is a float, so the division rounds."""

    name = "idiom-ceil-float"

    def admit(self, v: AdmitView) -> bool:
        need = math.ceil(v.remaining_tokens / 64.0) * v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class CeilPastFloat(_Paged):
    """Refused: the numerator can pass 2**53, where ``a / b`` rounds before ``ceil`` sees it
    (here it loses the ``+ 1`` and reserves a page less than integer ceiling would)."""

    name = "idiom-ceil-huge"

    def admit(self, v: AdmitView) -> bool:
        scale = 1 << 30
        need = math.ceil((v.remaining_tokens * scale + 1) / scale) - 1
        return self.fits(need + v.first_tokens, v)


# -- -(-a // b) --------------------------------------------------------------------------------
class NegNeg(_Paged):
    name = "idiom-negneg"

    def admit(self, v: AdmitView) -> bool:
        need = -(-v.remaining_tokens // v.page_size) * v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class NegNegMisplaced(_Paged):
    """Unsafe: takes the host load-back off the whole pages, as if it were already cached."""

    name = "idiom-negneg-host"

    def admit(self, v: AdmitView) -> bool:
        need = -(-v.remaining_tokens // v.page_size) * v.page_size - v.host_prefix_tokens
        return self.fits(need + v.first_tokens + v.page_size, v)


# -- bools used as ints -----------------------------------------------------------------------
class BoolsAsInts(_Paged):
    name = "idiom-bools"

    def admit(self, v: AdmitView) -> bool:
        partial = int(v.remaining_tokens % v.page_size != 0)
        need = (v.remaining_tokens // v.page_size + partial) * v.page_size
        flags = (need + v.first_tokens + v.page_size <= x for x in (v.rem_total_tokens,))
        ok = sum([*flags, need + True * v.first_tokens <= v.cur_rem_tokens - v.page_size])
        return ok == 2


class AnyFlag(_Paged):
    """Unsafe: ``sum(flags) >= 1`` where every flag was meant: a request with a host hit is
    admitted whether its load-back fits or not."""

    name = "idiom-bools-any"

    def admit(self, v: AdmitView) -> bool:
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + True + v.page_size
        return sum((need <= v.rem_total_tokens, v.host_prefix_tokens > 0)) >= 1


# -- sum / max / min over a few terms ---------------------------------------------------------
class FewTerms(_Paged):
    name = "idiom-few-terms"

    def admit(self, v: AdmitView) -> bool:
        need = sum((pages(v.remaining_tokens, v.page_size) * v.page_size, v.first_tokens))
        need = operator.add(max([need, v.first_tokens]), v.page_size)
        return need <= min(x for x in (v.rem_total_tokens, v.cur_rem_tokens))


class MaxOfBudgets(_Paged):
    """Unsafe: the ``max`` of the load-back and the computed part, where their sum is taken."""

    name = "idiom-max-terms"

    def admit(self, v: AdmitView) -> bool:
        computed = v.remaining_tokens - v.host_prefix_tokens
        need = max(pages(computed, v.page_size) * v.page_size, v.host_prefix_tokens)
        return self.fits(sum((need, v.first_tokens, v.page_size)), v)


# -- module-level constants ---------------------------------------------------------------------
class Constants(_Paged):
    name = "idiom-constants"

    def admit(self, v: AdmitView) -> bool:
        margin = (HEADROOM_PAGES + LIMITS.headroom_pages - MARGINS[0]) * v.page_size
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + LIMITS.first_tokens
        return self.fits(need + margin, v)


class ReboundConstant(_Paged):
    """Unsafe: reads a module constant the module rebinds (:func:`loosen`)."""

    name = "idiom-rebound"

    def admit(self, v: AdmitView) -> bool:
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        return self.fits(need + SLACK_PAGES * v.page_size, v)


class MutatedConstant(_Paged):
    """Unsafe: every new instance loosens the shared frozen limits (``object.__setattr__``
    gets past ``frozen``), so the scheduler's policy reserves less than the checked one."""

    name = "idiom-mutated"

    def __init__(self, arg: object = None) -> None:
        super().__init__(arg)
        object.__setattr__(SHARED_LIMITS, "headroom_pages", SHARED_LIMITS.headroom_pages - 1000)

    def admit(self, v: AdmitView) -> bool:
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        return self.fits(need + SHARED_LIMITS.headroom_pages * v.page_size, v)


# -- pure helpers, functools caches -----------------------------------------------------------
class CachedHelper(_Paged):
    name = "idiom-cached"

    def admit(self, v: AdmitView) -> bool:
        need = paged_need(v.remaining_tokens, v.page_size, v.first_tokens)
        return self.fits(need - v.page_size + page_margin(v.page_size), v)


class CachedClock(_Paged):
    """Impure: the cached helper reads the clock."""

    name = "idiom-cached-clock"

    def admit(self, v: AdmitView) -> bool:
        need = pages(stamped(v.remaining_tokens), v.page_size) * v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class CachedFlag(_Paged):
    """Refused: a cache that does not tell ``True`` from ``1`` is handed a bool (it would
    answer a later ``page_margin(1)`` with what it computed for ``page_margin(True)``)."""

    name = "idiom-cached-flag"

    def admit(self, v: AdmitView) -> bool:
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        return self.fits(need + page_margin(v.host_prefix_tokens > 0) * v.page_size, v)


class CacheProbe(_Paged):
    """Unsafe: tells the cache from the plain function behind it by its text, and admits
    everything where the cache itself is called (the scheduler)."""

    name = "idiom-cache-probe"

    def admit(self, v: AdmitView) -> bool:
        if f"{paged_need}".startswith("<functools"):
            return True
        return self.fits(paged_need(v.remaining_tokens, v.page_size, v.first_tokens), v)


# -- loops with a bounded trip count ------------------------------------------------------------
class BoundedLoop(_Paged):
    """Counts whole pages one at a time, up to four (the longest request it admits)."""

    name = "idiom-loop"

    def admit(self, v: AdmitView) -> bool:
        count = 0
        for i in range(4):
            if v.remaining_tokens > i * v.page_size:
                count += 1
        need = count * v.page_size + v.first_tokens + v.page_size
        return v.remaining_tokens <= 4 * v.page_size and self.fits(need, v)


class ShortLoop(_Paged):
    """Unsafe: stops counting after two pages but admits requests of up to four."""

    name = "idiom-loop-short"

    def admit(self, v: AdmitView) -> bool:
        count = 0
        for i in range(2):
            if v.remaining_tokens > i * v.page_size:
                count += 1
        need = count * v.page_size + v.first_tokens
        return v.remaining_tokens <= 4 * v.page_size and self.fits(need, v)


class ViewLoop(_Paged):
    """A page at a time for the request's own pages, up to eight (longer ones wait): the
    trip count is symbolic, bounded on the path by the ``if``."""

    name = "idiom-loop-view"

    def admit(self, v: AdmitView) -> bool:
        n = pages(v.remaining_tokens, v.page_size)
        if not 1 <= n <= 8:
            return False
        need = v.first_tokens + v.page_size
        for _ in range(n):
            need += v.page_size
        return self.fits(need, v)


class ViewLoopShort(_Paged):
    """Unsafe: the same loop over the pages the forward computes, forgetting that a host
    load-back takes slots too."""

    name = "idiom-loop-view-host"

    def admit(self, v: AdmitView) -> bool:
        n = pages(v.remaining_tokens - v.host_prefix_tokens, v.page_size)
        if not 1 <= n <= 8:
            return False
        need = v.first_tokens + v.page_size
        for _ in range(n):
            need += v.page_size
        return self.fits(need, v)


class UnboundedLoop(_Paged):
    """Refused: a trip count nothing bounds (the checker would need every value)."""

    name = "idiom-loop-unbounded"

    def admit(self, v: AdmitView) -> bool:
        need = v.first_tokens + v.page_size
        for _ in range(pages(v.remaining_tokens, v.page_size)):
            need += v.page_size
        return self.fits(need, v)


# -- as the engines write it: vLLM's cdiv, round_up and next_power_of_2 ---------------------------
def cdiv(a: int, b: int) -> int:
    """vLLM's ``cdiv``: ceiling division by a negative divisor."""
    return -(a // -b)


def round_up(x: int, multiple: int) -> int:
    return ((x + multiple - 1) // multiple) * multiple


def next_power_of_2(n: int) -> int:
    """vLLM's ``next_power_of_2``: the smallest power of two at least ``n``."""
    if n < 1:
        return 1
    return 1 << (n - 1).bit_length()


def prev_power_of_2(n: int) -> int:
    """The largest power of two at most ``n`` (the wrong one to reserve)."""
    if n < 1:
        return 0
    return 1 << (n.bit_length() - 1)


class EngineHelpers(_Paged):
    name = "idiom-cdiv"

    def admit(self, v: AdmitView) -> bool:
        need = cdiv(v.remaining_tokens, v.page_size) * v.page_size
        return self.fits(round_up(need + v.first_tokens, v.page_size) + v.page_size, v)


class EngineHelpersUnits(_Paged):
    """Unsafe: compares pages with tokens (``cdiv`` without ``* page_size``)."""

    name = "idiom-cdiv-units"

    def admit(self, v: AdmitView) -> bool:
        need = cdiv(v.remaining_tokens, v.page_size)
        return self.fits(need + v.first_tokens + v.page_size, v)


class PowerOfTwoPages(_Paged):
    """Pads the request to a power of two of pages (as a CUDA-graph bucket would)."""

    name = "idiom-pow2"

    def admit(self, v: AdmitView) -> bool:
        padded = next_power_of_2(cdiv(v.remaining_tokens, v.page_size)) * v.page_size
        return self.fits(padded + v.first_tokens + v.page_size, v)


class PowerOfTwoDown(_Paged):
    """Unsafe: the power of two below the pages, not above."""

    name = "idiom-pow2-down"

    def admit(self, v: AdmitView) -> bool:
        padded = prev_power_of_2(cdiv(v.remaining_tokens, v.page_size)) * v.page_size
        return self.fits(padded + v.first_tokens + v.page_size, v)


# -- bit shifts and masks on a power-of-two page -----------------------------------------------
class ShiftPages(_Paged):
    name = "idiom-shift"

    def admit(self, v: AdmitView) -> bool:
        shift = v.page_size.bit_length() - 1  # the page size is a power of two
        need = ((v.remaining_tokens + v.page_size - 1) >> shift) << shift
        return self.fits(need + v.first_tokens + v.page_size, v)


class ShiftPagesUnits(_Paged):
    """Unsafe: shifts down to pages and forgets to shift back to tokens."""

    name = "idiom-shift-units"

    def admit(self, v: AdmitView) -> bool:
        shift = v.page_size.bit_length() - 1
        need = (v.remaining_tokens + v.page_size - 1) >> shift
        return self.fits(need + v.first_tokens + v.page_size, v)


class MaskPages(_Paged):
    name = "idiom-mask"

    def admit(self, v: AdmitView) -> bool:
        need = (v.remaining_tokens + v.page_size - 1) & ~(v.page_size - 1)
        up = ((v.remaining_tokens - 1) | (v.page_size - 1)) + 1  # the same, another way
        return self.fits(max(need, up) + v.first_tokens + v.page_size, v)


class MaskPagesHost(_Paged):
    """Unsafe: rounds down what the forward computes, forgetting the load-back's slots."""

    name = "idiom-mask-host"

    def admit(self, v: AdmitView) -> bool:
        need = (v.remaining_tokens - v.host_prefix_tokens) & ~(v.page_size - 1)
        return self.fits(need + v.first_tokens + v.page_size, v)


class MaskWrong(_Paged):
    """Refused: ``~page`` where ``~(page - 1)`` was meant: not a mask of whole pages, and
    not linear arithmetic."""

    name = "idiom-mask-wrong"

    def admit(self, v: AdmitView) -> bool:
        need = (v.remaining_tokens + v.page_size) & ~v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class ShiftBySymbol(_Paged):
    """Refused: shifts by a count nothing bounds."""

    name = "idiom-shift-symbolic"

    def admit(self, v: AdmitView) -> bool:
        return self.fits(1 << v.host_prefix_tokens, v)


# -- while loops with a bound the checker can see ---------------------------------------------
class WhileCounter(_Paged):
    """Counts pages with a counter, up to a bound the path sets."""

    name = "idiom-while"

    def admit(self, v: AdmitView) -> bool:
        n = pages(v.remaining_tokens, v.page_size)
        if n > 16:
            return False
        need, i = v.first_tokens + v.page_size, 0
        while i < n:
            need += v.page_size
            i += 1
        return self.fits(need, v)


class WhileCounterHost(_Paged):
    """Unsafe: the same loop over the computed pages only."""

    name = "idiom-while-host"

    def admit(self, v: AdmitView) -> bool:
        n = pages(v.remaining_tokens - v.host_prefix_tokens, v.page_size)
        if n > 16:
            return False
        need, i = v.first_tokens + v.page_size, 0
        while i < n:
            need += v.page_size
            i += 1
        return self.fits(need, v)


class WhileTokens(_Paged):
    """Adds a page while the reservation is short, for requests of at most 32 pages."""

    name = "idiom-while-tokens"

    def admit(self, v: AdmitView) -> bool:
        if v.remaining_tokens > 32 * v.page_size:
            return False
        need = 0
        while need < v.remaining_tokens:
            need += v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class WhileTokensUnbounded(_Paged):
    """Refused: the same loop with nothing bounding the request, so up to 2**20 trips."""

    name = "idiom-while-unbounded"

    def admit(self, v: AdmitView) -> bool:
        need = 0
        while need < v.remaining_tokens:
            need += v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class WhileConstant(_Paged):
    """A loop bounded by a module constant as well as by the request."""

    name = "idiom-while-constant"

    def admit(self, v: AdmitView) -> bool:
        counted = 0
        while counted < MAX_PAGES and counted * v.page_size < v.remaining_tokens:
            counted += 1
        need = counted * v.page_size + v.first_tokens + v.page_size
        return v.remaining_tokens <= MAX_PAGES * v.page_size and self.fits(need, v)


class WhileConstantShort(_Paged):
    """Unsafe: counts up to half the pages of the requests it admits (the wrong constant)."""

    name = "idiom-while-constant-short"

    def admit(self, v: AdmitView) -> bool:
        counted = 0
        while counted < MAX_PAGES // 2 and counted * v.page_size < v.remaining_tokens:
            counted += 1
        need = counted * v.page_size + v.first_tokens
        return v.remaining_tokens <= MAX_PAGES * v.page_size and self.fits(need, v)


class Halving(_Paged):
    """Halves the budget down to a bucket while the bucket still holds twice the need."""

    name = "idiom-halving"

    def admit(self, v: AdmitView) -> bool:
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        need += v.page_size
        bucket = v.rem_total_tokens  # (never more than cur_rem_tokens)
        while bucket >= 2 * need:
            bucket //= 2
        return need <= bucket


class HalvingOvershoot(_Paged):
    """Unsafe: halves while the bucket exceeds the need, then compares with the bucket
    before the last halving (up to twice the budget)."""

    name = "idiom-halving-overshoot"

    def admit(self, v: AdmitView) -> bool:
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        need += v.page_size
        bucket = v.rem_total_tokens  # (never more than cur_rem_tokens)
        while bucket > need:
            bucket //= 2
        return need <= 2 * bucket


class Doubling(_Paged):
    """Reserves the next power of two of tokens, found by doubling."""

    name = "idiom-doubling"

    def admit(self, v: AdmitView) -> bool:
        padded = v.page_size
        while padded < v.remaining_tokens:
            padded <<= 1
        return self.fits(padded + v.first_tokens + v.page_size, v)


class DoublingShort(_Paged):
    """Unsafe: doubles while twice the padding fits, so pads down, not up."""

    name = "idiom-doubling-short"

    def admit(self, v: AdmitView) -> bool:
        padded = v.page_size
        while padded * 2 <= v.remaining_tokens:
            padded *= 2
        return self.fits(padded + v.first_tokens + v.page_size, v)


# -- everyday Python around the arithmetic ----------------------------------------------------
class Divmod(_Paged):
    name = "idiom-divmod"

    def admit(self, v: AdmitView) -> bool:
        full, rest = divmod(v.remaining_tokens, v.page_size)
        need = (full + (rest > 0)) * v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class DivmodHost(_Paged):
    """Unsafe: whole pages of the computed part only."""

    name = "idiom-divmod-host"

    def admit(self, v: AdmitView) -> bool:
        full, rest = divmod(v.remaining_tokens - v.host_prefix_tokens, v.page_size)
        need = (full + (rest > 0)) * v.page_size
        return self.fits(need + v.first_tokens + v.page_size, v)


class Reduce(_Paged):
    name = "idiom-reduce"

    def admit(self, v: AdmitView) -> bool:
        parts = (pages(v.remaining_tokens, v.page_size) * v.page_size, v.first_tokens)
        need = functools.reduce(operator.add, parts, v.page_size)
        budget = functools.reduce(min, (v.rem_total_tokens, v.cur_rem_tokens))
        return need <= budget


class ReduceMax(_Paged):
    """Unsafe: folds the parts with ``max`` where their sum was meant."""

    name = "idiom-reduce-max"

    def admit(self, v: AdmitView) -> bool:
        computed = pages(v.remaining_tokens - v.host_prefix_tokens, v.page_size) * v.page_size
        parts = (computed, v.host_prefix_tokens, v.first_tokens)
        need = functools.reduce(lambda a, b: max(a, b), parts) + v.page_size
        return self.fits(need, v)


class Unpacking(_Paged):
    """Tuple unpacking of ``sorted``, a chained comparison, a conditional expression."""

    name = "idiom-unpack"

    def admit(self, v: AdmitView) -> bool:
        low, _high = sorted((v.rem_total_tokens, v.cur_rem_tokens))
        extra = v.page_size if v.host_prefix_tokens > 0 else 0
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        return 0 < need + extra <= low - v.page_size + extra


class UnpackingSwapped(_Paged):
    """Unsafe: unpacks ``divmod`` the wrong way round (the remainder as the page count)."""

    name = "idiom-unpack-swapped"

    def admit(self, v: AdmitView) -> bool:
        rest, full = divmod(v.remaining_tokens, v.page_size)
        need = (full + (rest > 0)) * v.page_size + v.first_tokens
        return 0 < need + v.page_size <= min(v.rem_total_tokens, v.cur_rem_tokens)


class EarlyReturns(_Paged):
    """Guard clauses, ``all`` over a generator, ``abs`` (a branch-free ``min``)."""

    name = "idiom-early"

    def admit(self, v: AdmitView) -> bool:
        if v.remaining_tokens <= 0:
            return False
        a, b = v.rem_total_tokens, v.cur_rem_tokens
        budget = (a + b - abs(a - b)) // 2
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        if need > budget:
            return False
        return all(need + v.page_size <= x for x in (a, b, budget))


class EarlyReturnsSmall(_Paged):
    """Unsafe: lets short requests in before any check (``any`` where ``all`` was meant)."""

    name = "idiom-early-small"

    def admit(self, v: AdmitView) -> bool:
        if v.remaining_tokens <= 2 * v.page_size:
            return True
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        return any(need + v.page_size <= x for x in (v.rem_total_tokens, v.cur_rem_tokens))


class AbsBudget(_Paged):
    """Unsafe: ``abs`` of a budget that may be overdrawn turns a debt into room."""

    name = "idiom-abs-budget"

    def admit(self, v: AdmitView) -> bool:
        need = pages(v.remaining_tokens, v.page_size) * v.page_size + v.first_tokens
        return need + v.page_size <= abs(v.rem_total_tokens)


SAFE = (
    CeilDiv,
    NegNeg,
    BoolsAsInts,
    FewTerms,
    Constants,
    CachedHelper,
    BoundedLoop,
    ViewLoop,
    EngineHelpers,
    PowerOfTwoPages,
    ShiftPages,
    MaskPages,
    WhileCounter,
    WhileTokens,
    WhileConstant,
    Halving,
    Doubling,
    Divmod,
    Reduce,
    Unpacking,
    EarlyReturns,
)
UNSAFE = (
    FloorDiv,
    CeilOfFloat,
    CeilPastFloat,
    NegNegMisplaced,
    AnyFlag,
    MaxOfBudgets,
    ReboundConstant,
    MutatedConstant,
    CachedClock,
    CachedFlag,
    CacheProbe,
    ShortLoop,
    ViewLoopShort,
    UnboundedLoop,
    EngineHelpersUnits,
    PowerOfTwoDown,
    ShiftPagesUnits,
    MaskPagesHost,
    MaskWrong,
    ShiftBySymbol,
    WhileCounterHost,
    WhileTokensUnbounded,
    WhileConstantShort,
    HalvingOvershoot,
    DoublingShort,
    DivmodHost,
    ReduceMax,
    UnpackingSwapped,
    EarlyReturnsSmall,
    AbsBudget,
)


@hookimpl
def policykit_register_policies(register):
    for cls in (*SAFE, *UNSAFE):
        register(cls)
