"""A waiting request's admission (SGLang 0.5.23's ``add_one_req``): what the cache offers it,
the admission policy's verdict before and after its prefix is locked, its first chunk, and
the re-selection of a request its own lock refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from policykit.kernel.chunking import chunk, place
from policykit.kernel.domain import Numbers
from policykit.kernel.swa import lower_swa, swa_host_charge
from policykit.kernel.views import admit_view, chunk_view
from policykit.ledger import Ledger


@dataclass(frozen=True)
class Offer:
    """What the cache offers a waiting request in one round: the planner's prefix match, the
    round model's ``Hit``."""

    cached: Any  #: device tokens matched
    host: Any  #: host tokens a load-back copies after them
    lock: Any  #: evictable tokens that locking the match takes out of the baseline
    slots: Any  #: the slots the load-back takes (whole pages)
    #: hybrid SWA: evictable sliding-window tokens the lock's window takes out of the
    #: sliding-window baseline (:mod:`policykit.swa_cache`)
    swa_lock: Any = 0
    #: hybrid SWA with a load-back: the sliding-window tokens the request's lock holds once
    #: the loaded KV is in the tree (its window moves onto it); None: the hit's whole
    #: sliding-window KV is charged (:func:`swa_host_charge`)
    swa_load_lock: Any = None


@dataclass
class Attempt:
    """One admission attempt of a waiting request on an :class:`Offer` (:func:`admission`)."""

    ok: Any  #: the admission policy's answer
    other: Any  #: no first chunk, or a second in-progress request (``Budget.OTHER``)
    bad_range: Any  #: the chunk is out of range (a broken contract)
    whole: Any  #: the chunk is the whole rest of the prompt
    bad_truncation: Any  #: a truncation's alignment or reservation broke the contract
    ledger: Ledger  #: the ledger with the chunk placed
    offer: Offer  #: what the attempt was made on
    start: Any
    end: Any  #: a truncation's aligned end
    chunk: Any

    @staticmethod
    def skipped(ledger: Ledger, offer: Offer) -> Attempt:
        """An attempt ints never made (refused before its chunk was asked about)."""
        return Attempt(False, False, False, False, False, ledger, offer, None, None, None)


def load_back_swa(ledger: Ledger, offer: Offer) -> None:
    """After a load-back under hybrid SWA its sliding-window KV is on the device (0.5.23's
    ``init_load_back`` loads the host node's sliding-window values with its full ones). Where
    the offer knows the tree (``swa_load_lock``), the loaded KV joins it as evictable cache and
    the round's sliding-window baseline loses what the request's lock then holds instead of
    what its prefix's lock held; otherwise it loses the hit's whole sliding-window KV.
    Nothing without hybrid SWA."""
    if ledger.swa_baseline is None:
        return
    if offer.swa_load_lock is None:
        ledger.swa_baseline = ledger.swa_baseline - swa_host_charge(
            offer.host, ledger.sliding_window, ledger.page_size
        )
    else:
        ledger.swa_baseline = ledger.swa_baseline - (offer.swa_load_lock - offer.swa_lock)


def admits(
    domain: Numbers,
    ledger: Ledger,
    prompt: Any,
    offer: Offer,
    swa_pool: Any | None,
    request_id: str,
) -> Any:
    """The admission policy's verdict on a ``prompt``-token request offered ``offer``."""
    view = admit_view(prompt, prompt - offer.cached, offer.host, ledger, swa_pool)
    return domain.admits(view, request_id)


def attempt(
    domain: Numbers,
    ledger: Ledger,
    prompt: Any,
    offer: Offer,
    ok: Any,
    has_chunked: Any,
    swa_pool: Any | None,
    request_id: str,
) -> Attempt:
    """The admission of a request the admission policy answered ``ok`` about, on a copy of
    ``ledger``: the lock and the load-back lower the baseline, the chunking policy gives the
    first chunk, which is placed (:func:`place`) unless it is 0 or would be a second
    in-progress request (``has_chunked``)."""
    loaded = ledger.copy()
    if not domain.known_zero(offer.lock):
        loaded.lower_baseline(offer.lock)
    lower_swa(loaded, offer.swa_lock)
    loaded.lower_baseline(offer.slots)  # the load-back allocates at admission
    compute = prompt - offer.cached - offer.host
    view = chunk_view(compute, loaded, swa_pool, offer.host)
    length, bad_range = chunk(domain, "new_chunk", view, request_id, label="new_chunk")
    other = domain.any(length == 0, domain.all(length < compute, has_chunked))
    whole = length == compute
    start = offer.cached + offer.host
    placed, end, bad = place(
        domain, loaded, start, length, whole, prompt, request_id, placed=lambda: not other
    )
    load_back_swa(placed, offer)  # its sliding-window KV comes back too
    return Attempt(ok, other, bad_range, whole, bad, placed, offer, start, end, length)


def admission(
    domain: Numbers,
    ledger: Ledger,
    prompt: Any,
    offer: Offer,
    has_chunked: Any,
    swa_pool: Any | None,
    request_id: str,
) -> tuple[Attempt, Any]:
    """A waiting request's admission on ``offer`` (SGLang 0.5.23's ``add_one_req``): asked,
    its cached prefix locked, asked again, then its first chunk (:func:`attempt`). Returns
    the attempt and whether it fitted until its own lock took the prefix out of the evictable
    pool (``False`` where there is no lock to take); that attempt does not stand
    (:func:`afresh`), and ints do not make it."""

    def tried(cond: Callable[[], Any]) -> Attempt:
        """:func:`attempt` where ``cond()`` holds (ints), else one not made."""
        made = domain.when(
            cond,
            lambda: attempt(domain, ledger, prompt, offer, ok, has_chunked, swa_pool, request_id),
        )
        return Attempt.skipped(ledger, offer) if made is None else made

    ok = admits(domain, ledger, prompt, offer, swa_pool, request_id)
    window = not domain.known_zero(offer.swa_lock)  # a window lock (ints only: see Offer)
    if domain.known_zero(offer.lock) and not window:
        return tried(lambda: ok), False
    locked = ledger.copy()
    locked.lower_baseline(offer.lock)
    lower_swa(locked, offer.swa_lock)

    def takes() -> Any:
        """Whether the lock takes anything (terms have no window lock to ask about)."""
        return (offer.lock > 0 or offer.swa_lock > 0) if window else offer.lock > 0

    @cache
    def ok_locked() -> Any:
        # asked once: first by ints, which have no chunk to ask about where the lock refuses;
        # terms ask it after the first chunk, the order the formula's names are made in
        return domain.when(
            lambda: ok and takes(),
            lambda: admits(domain, locked, prompt, offer, swa_pool, request_id),
        )

    if window:
        asked = (ledger, prompt, offer, swa_pool, request_id)
        return _window_admission(domain, asked, ok, locked, has_chunked)
    first = tried(lambda: ok and not (takes() and not ok_locked()))
    refused = domain.name("lock_refused", domain.all(ok, offer.lock > 0, domain.not_(ok_locked())))
    return first, refused


def _window_admission(
    domain: Numbers,
    asked: tuple[Ledger, Any, Offer, Any | None, str],
    ok: Any,
    locked: Ledger,
    has_chunked: Any,
) -> tuple[Attempt, Any]:
    """:func:`admission` where the lock also takes sliding-window KV (hybrid SWA): asked
    again with both locks, and re-selected only where the full lock alone refuses; where the
    window lock alone refuses, SGLang 0.5.23 answers NO_TOKEN and selects nothing else. Ints
    and terms alike (terms ask every question; the attempt stands where ``passes`` holds).
    ``asked``: the ledger, prompt, offer, sliding-window pool and request id."""
    ledger, prompt, offer, swa_pool, request_id = asked
    takes = domain.any(offer.lock > 0, offer.swa_lock > 0)
    fits = domain.when(
        lambda: ok and takes, lambda: admits(domain, locked, prompt, offer, swa_pool, request_id)
    )
    passes = ok if fits is None else domain.all(ok, domain.any(domain.not_(takes), fits))
    if fits is not None:
        passes = domain.name("lock_passes", passes)
    made = domain.when(
        lambda: passes,
        lambda: attempt(domain, ledger, prompt, offer, passes, has_chunked, swa_pool, request_id),
    )
    first = Attempt.skipped(ledger, offer) if made is None else made
    full = ledger.copy()
    full.lower_baseline(offer.lock)
    alone = domain.when(
        lambda: ok and offer.lock > 0,
        lambda: admits(domain, full, prompt, offer, swa_pool, request_id),
    )
    if alone is None:
        return first, False
    return first, domain.name("lock_refused", domain.all(ok, offer.lock > 0, domain.not_(alone)))


def afresh(domain: Numbers, refused: Any, first: Any, retry: Callable[[], Any]) -> Any:
    """Re-selection: a request that fitted until its own lock took its cached prefix out of
    the evictable pool (``refused``: a policy that gives no credit for the prefix pays for it
    twice) is asked about afresh, nothing cached, the prompt computed from token 0
    (``retry()``); otherwise it would wait forever, since an idle node never evicts that
    prefix. ``first`` stands elsewhere."""
    if refused is False:
        return first
    again = domain.when(lambda: refused, retry)
    return first if again is None else domain.choose(refused, again, first)
