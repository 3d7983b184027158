"""The evictable part of the prefix cache as terms: free list, recency, locks and eviction.

Pinned prefixes need no state (never evicted, never locked by a request). What eviction can
take is modelled per *unit*, one per request plus the scenario's anonymous filler, because the
scenario format gives every request tokens of its own (a prefix is never shared, docs/spec.md
"Unpinned device prefixes"):

* before its request is released, a unit is the request's unpinned prefix node (``top``, 0 once
  evicted or when the request has none);
* after the release, ``top`` is the leaf that holds the rest of the request's whole pages and
  ``bottom`` the prefix node under it (if still cached). ``evict`` takes the leaf and then, at
  once, its parent: the parent was touched one tick before the leaf, by the same insert.

Hybrid SWA (:mod:`policykit.swa_cache`): ``swa`` is the unit's evictable sliding-window KV
(what its request's window lock holds is counted with the request), and before the release
``top`` is the prefix's live leaf (its last window, :func:`policykit.swa_cache.prefix_window`)
and ``bottom`` the tombstone above it; a match is gated on the live leaf, and sliding-window
eviction drops it whole (``drops``). A released unit's sliding-window KV is taken as
tombstones: its full KV stays (an approximation, docs/conformance.md).

``stamp`` is the unit's last access as a term: a concrete tick per place in the round where
the scheduler matches or inserts (:func:`touch_tick`, :func:`release_tick`), so comparing two
stamps is comparing ``last_access`` in :class:`policykit.prefix_cache.PrefixCache`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import z3

from policykit.spec.encoding import Encoder
from policykit.spec.symbolic import Sym, num

#: ticks per round: release ticks lie below ``_PLAN``, match ticks of the planning above it
_ROUND = 1 << 16
_PLAN = 1 << 15
#: release ticks: ``finished_round * _FINISH + position in that round's plan``
_FINISH = 64


def _ite(c: z3.BoolRef, a: Sym | int, b: Sym | int) -> Sym:
    return Sym(z3.If(c, _term(a), _term(b)))


def _term(x: Sym | int) -> z3.ArithRef:
    return x.t if isinstance(x, Sym) else num(x)


@dataclass(frozen=True)
class Unit:
    """One request's evictable KV (or the filler's): see the module docstring."""

    top: Sym
    bottom: Sym
    stamp: Sym
    #: tokens of it its request holds locked (0: unlocked, evictable)
    lock: Sym
    #: hybrid SWA: its evictable sliding-window KV, and whether taking it drops ``top`` whole
    swa: Sym = field(default_factory=lambda: Sym(num(0)))
    drops: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(False))
    #: hybrid SWA: its place in the sliding-window LRU, where that is not ``stamp`` (a match
    #: that goes on into a long host run refreshes the full LRU only)
    swa_stamp: Sym | None = None

    @property
    def swa_order(self) -> Sym:
        """The unit's sliding-window LRU stamp."""
        return self.stamp if self.swa_stamp is None else self.swa_stamp

    def touch(self, touched: z3.BoolRef, tick: int, swa_too: z3.BoolRef) -> Unit:
        """The unit after a match or insert at ``tick`` where ``touched``: its full LRU stamp
        refreshed, and its sliding-window one where ``swa_too``
        (``SWAPrefixCache.refresh``)."""
        return replace(
            self,
            stamp=_ite(touched, tick, self.stamp),
            swa_stamp=_ite(z3.And(touched, swa_too), tick, self.swa_order),
        )

    @property
    def evictable(self) -> Sym:
        """What the unit adds to the cache's evictable total."""
        return _ite(self.lock.t == 0, self.top + self.bottom, 0)


def initial_units(unpinned: list[Sym], filler: Sym, live: list[Sym] | None = None) -> list[Unit]:
    """The scenario's layout: request ``i``'s prefix inserted at tick ``i`` in listing order,
    the filler after all of them (the most recent). ``live``: hybrid SWA, each prefix's live
    sliding-window KV (the rest is a tombstone; the filler has none)."""
    zero = Sym(num(0))
    if live is None:
        units = [Unit(u, zero, Sym(num(i)), zero) for i, u in enumerate(unpinned)]
    else:
        units = [
            Unit(w, u - w, Sym(num(i)), zero, w, z3.BoolVal(True))
            for i, (u, w) in enumerate(zip(unpinned, live, strict=True))
        ]
    return [*units, Unit(filler, zero, Sym(num(len(unpinned))), zero)]


def touch_tick(round_no: int, position: int) -> int:
    """The tick of the admission match of the request at ``position`` in the queue loop."""
    return round_no * _ROUND + _PLAN + position


def refresh_tick(round_no: int, position: int) -> int:
    """The tick at which the round's refresh of the waiting prefixes touches the request at
    ``position`` in the queue: after the round's releases, before its planning, the head last
    (``Scheduler._refresh_waiting_prefixes``)."""
    return round_no * _ROUND + _PLAN - 1 - position


def commit_tick(round_no: int, position: int) -> int:
    """The tick at which the commit matches and locks the prefix of the request at
    ``position`` (hybrid SWA: it refreshes the sliding-window LRU after every match of the
    planning)."""
    return round_no * _ROUND + _PLAN + 1024 + position


def checkpoint_tick(round_no: int) -> int:
    """The tick of the round-start checkpoint of the in-progress request (hybrid SWA): after
    the round's releases, before the refresh of the waiting prefixes."""
    return round_no * _ROUND + _PLAN - 64


def release_tick(round_no: int, finished: Sym, position: Sym) -> Sym:
    """The tick of a release in ``round_no``: releases run in the order the requests finished
    (round, then place in that round's plan), before the round's planning matches anything."""
    return finished * _FINISH + position + round_no * _ROUND


def evict(enc: Encoder, units: list[Unit], short: Sym) -> tuple[list[Unit], Sym, Sym]:
    """``PrefixCache.evict(short)`` (and ``victims``): unlocked units, least recently used
    first, each leaf then its parent, until ``short`` tokens are freed. Returns the units
    left and the tokens freed. A unit is taken from the front of the order while what was
    freed before it is still short, so with distinct stamps it is taken iff the unlocked units
    older than it hold less than ``short``. Also returns the sliding-window KV freed with
    them (a unit's goes with its ``top``)."""
    cand = [u.lock.t == 0 for u in units]
    out, freed, swa = [], Sym(num(0)), Sym(num(0))
    for k, x in enumerate(units):
        before = Sym(num(0))
        for m, y in enumerate(units):
            if m != k:
                before = before + _ite(z3.And(cand[m], y.stamp.t < x.stamp.t), y.top + y.bottom, 0)
        before = enc.bind("evict_before", before)
        take_top = z3.And(cand[k], before.t < short.t)
        take_bottom = z3.And(cand[k], (before + x.top).t < short.t)
        freed = freed + _ite(take_top, x.top, 0) + _ite(take_bottom, x.bottom, 0)
        # (an in-progress request's unit has no full KV to take, only checkpointed KV that
        # its lock holds: its sliding-window KV stays)
        take_swa = z3.And(take_top, x.top.t > 0)
        swa = swa + _ite(take_swa, x.swa, 0)
        out.append(
            replace(
                x,
                top=enc.bind("unit_top", _ite(take_top, 0, x.top)),
                bottom=enc.bind("unit_bottom", _ite(take_bottom, 0, x.bottom)),
                swa=_ite(take_swa, 0, x.swa),
            )
        )
    return out, enc.bind("evicted", freed), swa


def evict_swa(enc: Encoder, units: list[Unit], quota: Sym) -> tuple[list[Unit], Sym, Sym]:
    """``SWAPrefixCache.evict_swa(quota)``: units' evictable sliding-window KV, least recently
    used first (:attr:`Unit.swa_order`), until ``quota`` slots were freed. A unit is taken
    whole (its nodes one after the other; where the quota ends inside a unit the model frees
    all of it). A unit that
    ``drops`` loses its ``top`` (full KV) with it. Returns the units left, the
    sliding-window slots and the full slots freed."""
    out, swa, full = [], Sym(num(0)), Sym(num(0))
    for k, x in enumerate(units):
        before = Sym(num(0))
        for m, y in enumerate(units):
            if m != k:
                before = before + _ite(y.swa_order.t < x.swa_order.t, y.swa, 0)
        take = z3.And(x.swa.t > 0, enc.bind("swa_before", before).t < quota.t)
        swa = swa + _ite(take, x.swa, 0)
        drop = z3.And(take, x.drops)
        full = full + _ite(drop, x.top, 0)
        out.append(
            replace(
                x,
                top=enc.bind("unit_top", _ite(drop, 0, x.top)),
                swa=enc.bind("unit_swa", _ite(take, 0, x.swa)),
            )
        )
    return out, enc.bind("swa_evicted", swa), enc.bind("swa_evicted_full", full)
