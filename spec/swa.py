"""Hybrid sliding-window (SWA) storage as terms: what the node's SWA radix tree keeps.

The node keeps sliding-window KV as SGLang 0.5.23 does (:mod:`policykit.swa_cache`): a paged
pool, a request's KV checkpointed into the tree every round with what lies out of its window
freed, a window lock that holds only the last window of it, and a finished request's KV left
in the tree as evictable cache. The round model (:mod:`policykit.spec.bmc`) keeps, per
request, the sliding-window KV it holds (``hold``: its window-locked part ``wl`` and its own
pages from ``start`` on) and where its KV out of the window was freed up to (``evicted``);
what the tree holds evictable is each unit's ``swa`` (:mod:`policykit.spec.cache`).

Exact where the scenario format makes it so (each request's tokens are its own, its KV one
path); approximated, and said so where it is done: a window lock that does not reach a
window in its last node is taken to hold the previous lock's window too, and a unit's
sliding-window KV is evicted whole (the node may stop inside it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import z3

from policykit.pages import ceil_paged, pages_for
from policykit.spec.cache import Unit
from policykit.spec.encoding import Encoder, ite
from policykit.spec.symbolic import Sym, num
from policykit.swa_cache import kept_from


@dataclass
class Window:
    """Per request: sliding-window KV held (``hold``), of it window-locked in the tree
    (``wl``, of which ``last`` in the node the lock is on), where its own pages start
    (``start``, SGLang's ``protected`` too) and where its KV out of the window was freed up
    to (``evicted``), and where its match stopped at a tombstone it will insert up to first
    (``branch``, 0: none)."""

    hold: list[Sym]
    wl: list[Sym]
    last: list[Sym]
    start: list[Sym]
    evicted: list[Sym]
    branch: list[Sym]

    @staticmethod
    def empty(n: int) -> Window:
        zero = Sym(num(0))
        return Window(*([zero] * n for _ in range(6)))

    def copy(self) -> Window:
        lists = (self.hold, self.wl, self.last, self.start, self.evicted, self.branch)
        return Window(*(list(x) for x in lists))


def paged_window(window: int, page: int) -> int:
    """A window in whole pages: what a new leaf's live part and a window lock are cut to."""
    return pages_for(window, page) * page


def _frees(last: Sym, evicted: Sym, window: int) -> z3.BoolRef:
    """Whether ``free_swa_out_of_window_slots`` frees anything for position ``last`` (its
    guard, asked of ``evicted``); where it cuts is :func:`policykit.swa_cache.kept_from`."""
    return last.t - window >= evicted.t + 1


@dataclass(frozen=True)
class Checkpointed:
    """What a checkpoint changed besides the request's :class:`Window`: its unit (what left
    the window lock is evictable sliding-window KV), the sliding-window slots freed, and the
    tombstone it recovered (a branching request's: its lock takes it, its own copy is freed)."""

    unit: Unit
    swa_freed: Sym
    recovered: Sym


def checkpoint(
    enc: Encoder,
    win: Window,
    i: int,
    going: z3.BoolRef,
    seq: Sym,
    unit: Unit,
    tick: int,
    window: int,
    page: int,
) -> Checkpointed:
    """``PrefillNode.checkpoint`` of request ``i`` where ``going`` (it is in progress) holds:
    its KV out of the window is freed (``free_swa_out_of_window_slots``), its whole pages go
    into the tree, and its window lock moves to the node that ends them, holding that node's
    live KV where it covers a window (capped at a window of whole pages), else that and the
    node the lock was on where the two cover a window, else that and all the lock held before
    (an approximation where the lock held more than two nodes; none where a tombstone lies
    between). A branching request (:func:`admitted`) is inserted up to its branch first, once
    it got that far (:func:`_branch`). Updates ``win``."""
    start, wl, ev, prev = win.start[i], win.wl[i], win.evicted[i], win.last[i]
    guard = z3.And(going, _frees(seq - 1, ev, window))
    live = enc.bind("swa_live_from", ite(guard, kept_from(seq - 1, start, window, page), start))
    aligned = enc.bind("swa_aligned", seq // page * page)
    new = z3.And(going, aligned.t > start.t)
    span = aligned - live
    cap = paged_window(window, page)
    branch = win.branch[i]
    fires = z3.And(going, branch.t > 0, seq.t >= branch.t)
    # short of its branch, it gives the tombstone it covers its KV: one node, uncut
    over_tomb = z3.And(going, branch.t > seq.t, unit.top.t == 0, unit.bottom.t > 0)
    covers = ite(z3.And(span.t >= cap, z3.Not(over_tomb)), cap, span)
    above = ite((span + prev).t >= window, prev, wl)
    locked = ite(span.t >= window, covers, span + ite(live.t == start.t, above, 0))
    b = _branch(win, i, seq, unit, window, page)
    wl_new = enc.bind("swa_wl", ite(fires, b.wl, ite(new, locked, wl)))
    win.last[i] = enc.bind("swa_last", ite(fires, b.wl, ite(new, covers, prev)))
    start_new = enc.bind("swa_start", ite(fires, b.start, ite(new, aligned, start)))
    win.evicted[i] = enc.bind("swa_evicted", ite(fires, b.evicted, ite(guard, live, ev)))
    win.wl[i], win.start[i] = wl_new, start_new
    win.branch[i] = ite(fires, 0, branch)
    win.hold[i] = enc.bind(
        "swa_hold", ite(going, wl_new + ceil_paged(seq, page) - start_new, win.hold[i])
    )
    moved = ite(fires, b.joins, ite(new, wl + span - wl_new, 0))
    recovered = ite(fires, b.recovered, ite(z3.And(new, over_tomb), aligned - start, 0))
    recovered = enc.bind("recovered", recovered)
    out = replace(
        unit,
        swa=enc.bind("unit_swa", unit.swa + moved),
        stamp=ite(new, tick, unit.stamp),
        lock=unit.lock + recovered,
    )
    freed = ite(fires, b.freed, ite(going, live - start, 0))
    return Checkpointed(out, enc.bind("swa_freed", freed), recovered)


@dataclass(frozen=True)
class _Branched:
    wl: Sym
    start: Sym
    evicted: Sym
    freed: Sym
    joins: Sym  #: sliding-window KV it leaves evictable in the tree
    recovered: Sym  #: the cached full KV its lock takes (its own copy is freed)


def _branch(win: Window, i: int, seq: Sym, unit: Unit, window: int, page: int) -> _Branched:
    """The checkpoint of a request whose match stopped short of the full KV the tree held of
    it (``branch`` tokens: its prefix, whose live leaf was evicted or whose lock was refused;
    SGLang's ``swa_branching_seqlen``), once it has computed that far. What is out of the
    window of the branch is freed and the rest inserted up to the branch, then what is out
    of the window of its whole KV is freed (``PrefillNode._insert_progress``). The insert
    finds the prefix as ``unit`` holds it now: a live leaf over a tombstone (the tombstone
    takes the request's sliding-window KV, the leaf's copy is freed, the lock holds the
    leaf), a tombstone alone (it takes the request's KV and the lock holds all of it: one
    node), or nothing (a new leaf, its live part cut to a window). It computed from token 0;
    where a checkpoint short of the branch gave part of the tombstone its KV already,
    ``start`` is where that ended (not modelled for a live leaf: there it is 0)."""
    start, ev, branch = win.start[i], win.evicted[i], win.branch[i]
    first = _frees(branch - 1, ev, window)
    live = ite(first, kept_from(branch - 1, start, window, page), start)
    evicted = ite(first, live, ev)
    then = _frees(seq - 1, evicted, window)  # (it cuts from the branch on)
    kept = ite(then, kept_from(seq - 1, branch, window, page), branch)
    span = branch - live
    cap = paged_window(window, page)
    fresh = ite(span.t >= window, ite(span.t >= cap, cap, span), span)
    leaf, tomb = unit.top.t > 0, z3.And(unit.top.t == 0, unit.bottom.t > 0)
    recovered = branch - unit.top - live  # the tombstone's part it gives live KV to
    dup = ite(leaf, branch - ite(live.t >= (branch - unit.top).t, live, branch - unit.top), 0)
    return _Branched(
        wl=ite(leaf, unit.top, ite(tomb, span, fresh)),
        start=kept,
        evicted=ite(then, kept, evicted),
        freed=(live - start) + dup + (kept - branch),
        joins=ite(leaf, ite(recovered.t > 0, recovered, 0), ite(tomb, 0, span - fresh)),
        recovered=ite(leaf, branch, ite(tomb, branch - start, 0)),
    )


def admitted(
    enc: Encoder,
    win: Window,
    i: int,
    placed: z3.BoolRef,
    start: Sym,
    held: tuple[Sym, Sym],
    branch: Sym,
) -> None:
    """A request placed this round: its own sliding-window KV starts at its chunk's start,
    and its window lock holds ``held``: all of it and what of it is in the node the lock is
    on (its prefix's live leaf, or the load-back's last window). ``branch``: the tombstone
    its match stopped at, longer than what it matched (SGLang's ``swa_branching_seqlen``;
    0: none)."""
    zero = Sym(num(0))
    lock, last = held
    win.branch[i] = ite(placed, branch, win.branch[i])
    win.last[i] = enc.bind("swa_last", ite(placed, last, win.last[i]))
    win.wl[i] = enc.bind("swa_wl", ite(placed, lock, win.wl[i]))
    win.start[i] = enc.bind("swa_start", ite(placed, start, win.start[i]))
    win.evicted[i] = ite(placed, zero, win.evicted[i])
    win.hold[i] = enc.bind("swa_hold", ite(placed, lock, win.hold[i]))
