"""The scheduler core as z3 formulas: one planning step at a time, over symbolic state.

The round's decisions are not restated here: :mod:`policykit.kernel` holds them once (resume,
admission with its lock and re-selection, the idle node's answers) and :class:`Terms` runs
them on z3 terms, as :class:`~policykit.kernel.Ints` runs them on ints for
:class:`policykit.planner.Planner`. Nor does this module copy any policy or the ledger: the
real :class:`~policykit.ledger.Ledger` runs on :class:`~policykit.spec.symbolic.Sym` values,
and the registered policies are evaluated symbolically (``symbolic.evaluate``). What it adds
is the guarding: ``step(guard)`` leaves the state unchanged where the guard is false, so a
whole round is one straight-line formula (no path explosion across requests or rounds).

Device prefixes are pinned (no lock, never evicted) or unpinned: a :class:`Hit` says what the
cache offers a waiting request in a round (eviction, which decides whether the prefix is
still there, is :mod:`policykit.spec.cache`'s). The node's commit and release are
:mod:`policykit.spec.bmc`'s. ``tests/spec/test_conformance.py`` checks the encoding against
the concrete planner and node on random states.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import z3

from policykit import kernel
from policykit.config import EngineConfig
from policykit.host_tier import LOAD_BACK_THRESHOLD
from policykit.kernel import Attempt, Offer
from policykit.ledger import Budget, Ledger
from policykit.liveness import owed_tokens
from policykit.pages import eviction_demand, extend_pages, pages_for
from policykit.plan import NEVER
from policykit.policy import QueueView
from policykit.registry import Combo
from policykit.spec.encoding import Encoder, Terms, is_zero, ite, ledger_fields, t
from policykit.spec.symbolic import (
    Choice,
    Sym,
    as_int,
    as_sym,
    decide_all,
    num,
)

#: entry kinds as small ints in traces (the names are :class:`policykit.plan.EntryKind`'s)
NONE, WHOLE, TRUNCATED, RESUMED, FINAL, DEFERRED, REJ_NO_TOKEN, REJ_OTHER, REJ_NEVER = range(9)
KIND_NAMES = {
    WHOLE: "whole",
    TRUNCATED: "truncated",
    RESUMED: "resumed",
    FINAL: "final",
    DEFERRED: "deferred",
    REJ_NO_TOKEN: "rejected NO_TOKEN",
    REJ_OTHER: "rejected OTHER",
    REJ_NEVER: f"rejected {NEVER}",
}
#: the kinds of an entry that computes this round (the batch): consecutive codes, so that
#: :func:`placed_kind` is one range test
PLACED = (WHOLE, TRUNCATED, RESUMED, FINAL)


def loadable_host(host: Sym, page: int) -> Sym:
    """``HostTier.loadable`` (SGLang 0.5.23's HiCache): the host hit in whole pages, and none
    when that is under ``LOAD_BACK_THRESHOLD`` tokens (it is recomputed instead)."""
    paged = host // page * page
    return ite(paged.t >= LOAD_BACK_THRESHOLD, paged, Sym(num(0)))


def make_request(
    enc: Encoder,
    name: str,
    inputs: tuple[Sym, ...],
    page: int,
    host_paged: bool,
    unpinned: Sym | None = None,
) -> Req:
    """A request (``inputs``: prompt, device and host prefix hits, arrival) whose load-back,
    ``loadable_host(host)``, is worked out once. Where the host hit is known to be whole
    pages (``host_paged``) and a page reaches the threshold, that is the hit itself; leaving
    the rounding and the threshold out of the formula then saves a case split at every
    admission of every round. ``unpinned``: the request's unpinned device prefix (none by
    default)."""
    prompt, device, host, arrival = inputs
    unpinned = Sym(num(0)) if unpinned is None else unpinned
    if host_paged and page >= LOAD_BACK_THRESHOLD:
        loadable = host
    else:
        loadable = enc.bind("loadable", loadable_host(host, page))
    lost = Sym(num(0))
    if not is_zero(unpinned):
        lost = enc.bind("lost_loadable", loadable_after_eviction(unpinned, host, page))
    return Req(name, prompt, device, host, arrival, loadable, unpinned, lost)


def unconstrained_request(enc: Encoder, name: str, inputs: tuple[Sym, ...], page: int) -> Req:
    """A request whose ``inputs`` (prompt, device and host hits, arrival) are any a scenario
    can give: a prompt of a token or more, a device prefix in whole pages, the two prefixes
    short of the prompt (their facts go on ``enc``). The one-step questions about *every*
    request (the induction, the queue's order) ask about it."""
    q = make_request(enc, name, inputs, page, host_paged=False)
    enc.facts += [
        q.prompt.t >= 1,
        q.device.t >= 0,
        (q.device % page).t == 0,
        q.host.t >= 0,
        q.device.t + q.host.t < q.prompt.t,
    ]
    return q


def loadable_after_eviction(unpinned: Sym, host: Sym, page: int) -> Sym:
    """What a load-back copies once the unpinned device prefix is evicted: the host holds it
    too (SGLang 0.5.23's HiCache backs a node's ancestors up before the node, and a host run
    under a page is no node at all), so the hit runs from token 0 (``HostTier.lookup``)."""
    held = ite(host.t >= page, unpinned + host, Sym(num(0)))
    return loadable_host(held, page)


@dataclass
class Req:
    """A request's symbolic facts (inputs) and state (per round)."""

    name: str
    prompt: Sym
    device: Sym  #: pinned device prefix hit, page-aligned
    host: Sym  #: host-tier prefix hit
    arrival: Sym
    loadable: Sym  #: what a load-back copies of the host hit (``loadable_host``)
    #: unpinned device prefix, page-aligned (a request has a pinned one or an unpinned one)
    unpinned: Sym = field(default_factory=lambda: Sym(num(0)))
    #: the load-back once the unpinned prefix is evicted (:func:`loadable_after_eviction`)
    lost_loadable: Sym = field(default_factory=lambda: Sym(num(0)))

    @property
    def idle_host(self) -> Sym:
        """The host hit ``Planner.never_fits`` sees: an idle node has evicted the unpinned
        prefix, which the host holds with the host prefix after it."""
        if is_zero(self.unpinned):
            return self.loadable
        return ite(self.unpinned.t > 0, self.lost_loadable, self.loadable)


@dataclass(frozen=True)
class Hit(Offer):
    """What the cache offers a waiting request in one round: the device prefix matched
    (pinned, or the unpinned one while cached), whose lock takes the unpinned prefix, and the
    host prefix after it. The load-back's slots are kept a term of the inputs where the host
    hit is: a floor division of a per-round term is a fresh quotient for the solver."""

    @staticmethod
    def pinned(req: Req, page: int) -> Hit:
        """A request whose device prefix, if any, is pinned."""
        return Hit(req.device, req.loadable, Sym(num(0)), _slots(req.loadable, page))

    @staticmethod
    def of(req: Req, cached_unpinned: Sym, page: int) -> Hit:
        """``req`` while ``cached_unpinned`` tokens of its unpinned prefix are cached (all of
        it, or 0 once evicted: a node is evicted whole). Once evicted, the host holds it with
        the host prefix, and the hit runs from token 0 (``lost_loadable``)."""
        lost = z3.And(req.unpinned.t > 0, cached_unpinned.t == 0)
        return Hit(
            req.device + cached_unpinned,
            ite(lost, req.lost_loadable, req.loadable),
            cached_unpinned,
            ite(lost, _slots(req.lost_loadable, page), _slots(req.loadable, page)),
        )

    @staticmethod
    def none() -> Hit:
        """Nothing cached: the request computed from token 0."""
        zero = Sym(num(0))
        return Hit(zero, zero, zero, zero)


def _slots(host: Sym, page: int) -> Sym:
    return pages_for(host, page) * page


@dataclass
class EntryTerms:
    """What one request does in one round (all terms; kind is an int code)."""

    kind: Sym
    start: Sym
    end: Sym
    load_back: Sym  #: host tokens copied back (what the plan records)
    rem_total: Sym
    cur_rem: Sym
    load_back_slots: Sym  #: the slots that load-back takes (whole pages)
    lock: Sym  #: evictable tokens the entry's prefix lock took out of the baseline

    @property
    def tokens(self) -> Sym:
        return self.end - self.start


def _admitted(
    kind: Sym, placed: z3.BoolRef, whole: z3.BoolRef, a: Attempt, rem_total: Sym, cur_rem: Sym
) -> EntryTerms:
    """The entry of a waiting request's turn: the attempt's chunk and what it took, where
    it was placed (zeros elsewhere)."""
    zero = Sym(num(0))
    end = ite(placed, ite(whole, a.start + a.chunk, a.end), zero)
    got = a.offer
    return EntryTerms(
        kind,
        ite(placed, a.start, zero),
        end,
        ite(placed, got.host, zero),
        rem_total,
        cur_rem,
        ite(placed, got.slots, zero),
        ite(placed, got.lock, zero),
    )


def placed_kind(kind: Sym) -> z3.BoolRef:
    """The entry of kind ``kind`` is in the round's batch (one of :data:`PLACED`)."""
    return z3.And(kind.t >= PLACED[0], kind.t <= PLACED[-1])


def quiet_entry() -> EntryTerms:
    return EntryTerms(*(Sym(num(0)) for _ in range(8)))


@dataclass
class RoundState:
    """The planner's state while it walks the queue."""

    ledger: Ledger
    has_chunked: z3.BoolRef  #: a truncated / resumed / deferred entry exists
    deferred: z3.BoolRef  #: the in-progress request was deferred this round
    active: z3.BoolRef  #: the planner is still looking at the queue
    bad_contract: z3.BoolRef  #: a policy returned something the planner refuses
    bad_ledger: z3.BoolRef  #: cur_rem_tokens < rem_total_tokens at some mark


class RoundModel:
    """Steps of one planning round, with the combo's policies evaluated symbolically."""

    def __init__(
        self, combo: Combo, config: EngineConfig, enc: Encoder, sources: dict[str, str]
    ) -> None:
        self.combo, self.config, self.enc, self.sources = combo, config, enc, sources
        self.terms = Terms(enc, combo, sources)
        #: per request (by name): the idle node's answers, the same in every round
        self._idle: dict[str, kernel.IdleAnswers] = {}

    # -- ledger ----------------------------------------------------------------------------
    def open_ledger(self, baseline: Sym, swa_free: Sym | None) -> Ledger:
        cfg = self.config
        return Ledger(
            page_size=cfg.page_size,
            baseline=as_int(baseline),
            rem_chunk_tokens=as_int(Sym(num(cfg.chunked_prefill_size))),
            rem_input_tokens=None
            if cfg.max_prefill_tokens is None
            else as_int(Sym(num(cfg.max_prefill_tokens))),
            swa_baseline=as_int(swa_free) if cfg.hybrid_swa and swa_free is not None else None,
            sliding_window=cfg.sliding_window,
            rem_total_token_offset=as_int(Sym(num(0))),
            cur_rem_token_offset=as_int(Sym(num(0))),
            rem_swa_token_offset=as_int(Sym(num(0))),
        )

    def merge_ledger(self, guard: Any, new: Ledger, old: Ledger) -> Ledger:
        """``new`` where ``guard`` holds, else ``old``; every field bound to a fresh name."""
        out = dataclasses.replace(old)
        for name in ledger_fields(old):
            setattr(
                out, name, self.enc.bind(name, ite(guard, getattr(new, name), getattr(old, name)))
            )
        return out

    def budget(self, ledger: Ledger) -> Choice:
        return decide_all(ledger.budget_state)

    def _mark(self, state: RoundState, ledger: Ledger, placed: z3.BoolRef) -> tuple[Sym, Sym]:
        rem_total, cur_rem = as_sym(ledger.rem_total_tokens), as_sym(ledger.cur_rem_tokens)
        state.bad_ledger = z3.Or(state.bad_ledger, z3.And(placed, cur_rem.t < rem_total.t))
        return rem_total, cur_rem

    # -- the in-progress request -----------------------------------------------------------
    def resume(self, state: RoundState, guard: z3.BoolRef, prompt: Sym, seq: Sym) -> EntryTerms:
        """``Planner._resume`` for the in-progress request, where ``guard`` holds."""
        led = state.ledger
        # (the model's resume view has no sliding-window fields: no built-in resume_chunk
        # reads them, and their terms would cost every round a quotient)
        r = kernel.resume(self.terms, led, prompt, seq, None, "")
        chunk, bad_range, end_t, bad_t = r.chunk, r.bad_range, r.end, r.bad_truncation
        deferred, final = t(r.deferred), t(r.final)
        placed = z3.And(guard, z3.Not(bad_range), z3.Not(deferred))
        new_led = self.merge_ledger(placed, r.ledger, led)
        state.ledger = new_led
        state.bad_contract = z3.Or(
            state.bad_contract,
            z3.And(guard, z3.Or(bad_range, z3.And(z3.Not(deferred), z3.Not(final), bad_t))),
        )
        keeps = z3.And(guard, z3.Not(final))
        state.has_chunked = z3.Or(state.has_chunked, keeps)
        state.deferred = z3.Or(state.deferred, z3.And(guard, deferred))
        rem_total, cur_rem = self._mark(state, new_led, placed)
        end = ite(deferred, seq, ite(final, seq + chunk, end_t))
        kind = ite(guard, ite(deferred, DEFERRED, ite(final, FINAL, RESUMED)), NONE)
        zero = Sym(num(0))
        return EntryTerms(
            kind, ite(guard, seq, zero), ite(guard, end, zero), zero, rem_total, cur_rem, zero, zero
        )

    # -- a waiting request -----------------------------------------------------------------
    def admit(
        self,
        state: RoundState,
        consider: z3.BoolRef,
        req: Req,
        idle: IdleNode | None = None,
        hit: Hit | None = None,
        reselect: bool = True,
    ) -> tuple[EntryTerms, z3.BoolRef, z3.BoolRef]:
        """One turn of the planner's queue loop for ``req`` where ``consider`` holds: the
        budget check, then the admission (:func:`policykit.kernel.admission`) on what the
        cache offers (``hit``; by default the request's pinned prefix), then (for a refused
        request, given the ``idle`` node's capacity) ``Planner.never_fits``. Returns the
        entry, whether it was placed and whether it was rejected for good (the queue then
        moves on past it).

        ``reselect=False`` leaves out the turns where the lock refuses the request (a fact
        says there are none): such a turn is the turn of the same prompt with nothing cached,
        so a claim about *every* request's turn need not encode it twice (the induction)."""
        led = state.ledger
        budget = self.budget(led)
        go = z3.And(consider, state.active, budget.is_(Budget.CONTINUE))
        stop_budget = z3.And(consider, state.active, z3.Not(budget.is_(Budget.CONTINUE)))
        hit = hit or Hit.pinned(req, self.config.page_size)
        # the sliding-window pool's size: the idle node's, or (induction step) any size
        swa_pool = None
        if self.config.hybrid_swa:
            swa_pool = idle.swa_total if idle is not None else self.enc.var("swa_pool")
        a, refused = kernel.admission(
            self.terms, led, req.prompt, hit, state.has_chunked, swa_pool, req.name
        )
        if reselect:
            windowed = hit.swa_load_lock is not None
            a = kernel.afresh(
                self.terms, refused, a, lambda: self._afresh(state, req, swa_pool, windowed)
            )
        elif refused is not False:
            self.enc.facts.append(z3.Not(refused))
        ok, other, whole = a.ok, a.other, t(a.whole)
        placed = z3.And(go, ok, z3.Not(a.bad_range), z3.Not(other))
        new_led = self.merge_ledger(placed, a.ledger, led)
        state.ledger = new_led
        state.bad_contract = z3.Or(
            state.bad_contract,
            z3.And(
                go, ok, z3.Or(a.bad_range, z3.And(z3.Not(other), z3.Not(whole), a.bad_truncation))
            ),
        )
        refused = z3.And(go, z3.Or(z3.Not(ok), other))
        never = z3.BoolVal(False)
        if idle is not None and self.combo.queue.skips_never_fitting:
            never = z3.And(refused, self._never_fits(state, req, idle))
        state.active = z3.And(
            state.active, z3.Not(stop_budget), z3.Not(z3.And(refused, z3.Not(never)))
        )
        state.has_chunked = z3.Or(state.has_chunked, z3.And(placed, z3.Not(whole)))
        rem_total, cur_rem = self._mark(state, new_led, placed)
        kind = ite(
            placed,
            ite(whole, WHOLE, TRUNCATED),
            ite(never, REJ_NEVER, ite(refused, ite(ok, REJ_OTHER, REJ_NO_TOKEN), NONE)),
        )
        return _admitted(kind, placed, whole, a, rem_total, cur_rem), placed, never

    def _afresh(
        self, state: RoundState, req: Req, swa_pool: Sym | None, windowed: bool = False
    ) -> Attempt:
        """The admission of ``req`` with nothing cached, so no host prefix either (the host
        prefix continues the device prefix it lost). ``windowed``: the offer it replaces
        knows what a load-back's window lock holds (none here, nothing loads back)."""
        offer = Hit.none()
        if windowed:
            offer = dataclasses.replace(offer, swa_load_lock=Sym(num(0)))
        a, _ = kernel.admission(
            self.terms, state.ledger, req.prompt, offer, state.has_chunked, swa_pool, req.name
        )
        return a

    def _never_fits(self, state: RoundState, req: Req, idle: IdleNode) -> Any:
        """``Planner.never_fits``, asked by the planner about a refused request: a policy that
        breaks its contract there breaks it in the round."""
        answers = self.idle_answers(req, idle)
        ok, chunk = answers.ok, answers.chunk
        state.bad_contract = z3.Or(state.bad_contract, z3.And(ok, answers.bad))
        return z3.Or(z3.Not(ok), chunk.t == 0)

    def fits_idle(self, req: Req, idle: IdleNode) -> z3.BoolRef:
        """An idle node would admit ``req`` and give it a first chunk (not ``never_fits``)."""
        answers = self.idle_answers(req, idle)
        return z3.And(answers.ok, answers.chunk.t > 0)

    def idle_answers(self, req: Req, idle: IdleNode) -> kernel.IdleAnswers:
        """:func:`policykit.kernel.idle_answers` about ``req`` on the best case an idle node
        can ever offer. That node is made of the request's inputs alone, so the answers are
        worked out once per request and reused in every round."""
        if req.name not in self._idle:
            cfg = self.config
            self._idle[req.name] = kernel.idle_answers(
                self.terms,
                req.prompt,
                req.device,
                req.idle_host,
                idle.capacity,
                idle.swa_total if cfg.hybrid_swa else None,
                page=cfg.page_size,
                chunk_size=cfg.chunked_prefill_size,
                window=cfg.sliding_window,
                request_id=req.name,
            )
        return self._idle[req.name]

    # -- the waiting queue -----------------------------------------------------------------
    def priority(self, req: Req) -> Sym | None:
        """``Planner.queue``'s sort key for ``req``, or None where the queue keeps arrival
        order (the queue policy's ``arrival_order``)."""
        if self.combo.queue.arrival_order:
            return None
        view = QueueView(
            as_int(req.prompt), as_int(req.device), as_int(req.loadable), self.config.page_size
        )
        return self.enc.bind("priority", self.terms.ask("queue", "priority", view))


@dataclass(frozen=True)
class IdleNode:
    """What an idle node could ever offer: the pool minus pinned prefixes
    (:func:`policykit.liveness.idle_capacity`), the SWA pool."""

    capacity: Sym
    swa_total: Sym


def full_need(entry: EntryTerms, page: int) -> Sym:
    """Slots ``commit`` takes for an entry: its load-back pages and ``alloc_extend`` pages."""
    computes = entry.end.t > entry.start.t
    ext = extend_pages(entry.end, entry.start, page) * page
    return entry.load_back_slots + ite(computes, ext, 0)


def swa_need(entry: EntryTerms, page: int) -> Sym:
    """Sliding-window slots the commit's ``alloc_paged_token_slots_extend`` takes for an
    entry: its extend's whole new pages, as in the full pool (SGLang 0.5.23 pairs every full
    page with a sliding-window one; ``PrefillNode._alloc_extend_swa``)."""
    ext = extend_pages(entry.end, entry.start, page) * page
    return ite(entry.end.t > entry.start.t, ext, 0)


def eviction_share(entry: EntryTerms, page: int) -> Sym:
    """An entry's share of what the commit evicts for (``eviction_demand`` of one
    request), when it computes."""
    return ite(entry.end.t > entry.start.t, eviction_demand(entry.tokens, 1, page), 0)


def owed(prompt: Sym, seq: Sym, page: int) -> Sym:
    """Slots an in-progress request still needs to finish (its remaining ``alloc_extend``)."""
    return owed_tokens(prompt, seq, page)
