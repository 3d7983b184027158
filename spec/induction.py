"""Unbounded proofs: induction over rounds *and* over the requests of a round.

A bounded unrolling says nothing about round K+1 or request N+1. Here each property gets a
candidate invariant at two levels and three obligations, each one z3 validity query over
*arbitrary* states (not reachable ones — an over-approximation, so a proof is sound):

* ``Inv(S)`` between rounds. For the full pool: the in-progress request's remaining
  ``alloc_extend`` fits in ``free + evictable`` (that *is* admitted => completes).
* ``J`` inside a round, over the ledger, the real allocations ``A`` planned so far and what
  the in-progress request still ``owes``: ``A + owed <= baseline`` and ``A + owed <=
  rem_total_token_offset`` (the ledger has promised at least what is really owed), unless the
  round froze admission on the sliding-window budget after deferring the in-progress request.

1. *base*: ``Inv(S)`` and the resume step give ``J``;
2. *step*: ``J`` and one admission turn for an arbitrary request from an arbitrary ledger
   state give ``J`` again, and no bad event in the turn — so any number of requests;
3. *exit*: ``J`` gives the property at commit and ``Inv`` of the next round; releases only add
   memory, so ``Inv`` survives them whatever their timing — so any number of rounds.

``Inv`` implies the memory half of admitted-completes (what is owed fits in free + evictable,
so certainly in what can ever be freed). Its other half — the scheduler never fails an admitted
request for waiting forever — needs one more obligation (:meth:`Obligations._never_stuck`):
from a round start where ``Inv`` holds, the in-progress request is not deferred.

When ``J`` is not inductive, ``no-oom`` and admitted => completes get a second candidate:
``J``, *or* ``A + owed <= baseline`` with the compute budget spent (nothing else can join the
round), with the budget kept in whole pages. That is upstream SGLang's implicit protection
(:meth:`Obligations._j_spent`).

For ``no-oom`` alone there is a third, weaker candidate when both fail: no invariant
between rounds at all (any round start, however much the in-progress request still owes) and
``J`` without ``owed``. It goes through for a chunking policy that defers the in-progress
request instead of forcing a chunk the pool cannot pay for: such a combo never OOMs even
where admitted => completes is violated (the request waits for releases instead).

What this covers is the model of ``policykit.spec.model`` (pinned device prefixes, host
load-backs, unpinned prefixes with their locks, re-selection and eviction, held KV and
releases at any time, hybrid SWA, any ``max_prefill_tokens``: a spent input budget only stops
the queue), with the combo's real policies
evaluated symbolically, and policies
assumed to honour their contract (that is the separate ``contract`` property). A failed
obligation is *not* a violation: the candidate invariant is just not inductive for that combo,
and the verdict falls back to bounded model checking.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import z3

from policykit.config import EngineConfig
from policykit.ledger import Ledger
from policykit.registry import Combo
from policykit.spec.encoding import Encoder, ite
from policykit.spec.model import (
    FINAL,
    TRUNCATED,
    EntryTerms,
    Hit,
    IdleNode,
    Req,
    RoundModel,
    RoundState,
    full_need,
    make_request,
    owed,
    swa_need,
    unconstrained_request,
)
from policykit.spec.solver import WALL_CLOCK, solve
from policykit.spec.symbolic import Sym, as_int, num, term_of


@dataclass
class Mid:
    """An arbitrary mid-round state: ledger, planned extends ``A``, what is ``owed``."""

    state: RoundState
    extend: Sym
    owed: Sym
    #: hybrid SWA: the sliding-window slots the commit will require for what is planned so far
    #: (each extend's whole new pages, ``model.swa_need``), not the ledger's estimate
    swa: Sym = field(default_factory=lambda: Sym(num(0)))


class Obligations:
    """Builds and discharges the obligations of one combo and configuration."""

    def __init__(
        self,
        combo: Combo,
        config: EngineConfig,
        sources: dict[str, str],
        rlimit: int,
        granule: int = 1,
        deadline: float | None = None,
    ) -> None:
        self.combo, self.config, self.sources = combo, config, sources
        #: z3 resource units per obligation, and the wall-clock safety net (a ``time.time()``)
        self.rlimit, self.deadline = rlimit, deadline
        #: an obligation was cut short by the safety net, not answered within its budget
        self.cut_by_wall_clock = False
        #: prompt and host-prefix lengths are multiples of this (the checked bounds)
        self.granule = granule
        self._full: str | None = None  # no-oom and admitted-completes share one induction
        #: the two states every obligation starts from, built once per combo (the policies'
        #: symbolic runs are most of an obligation's cost): see :meth:`_resumed`, :meth:`_stepped`
        self._resume: tuple[Encoder, Mid, dict] | None = None
        self._step_from: tuple[Encoder, Mid, Mid, EntryTerms, Req] | None = None

    # -- states ----------------------------------------------------------------------------
    def _round_start(self, enc: Encoder) -> tuple[Sym, Sym, z3.BoolRef, Sym, Sym]:
        page = self.config.page_size
        b, swa = enc.var("B"), enc.var("swa")
        has = enc.bool("in_progress")
        p, seq = enc.var("p"), enc.var("seq")
        enc.facts += [
            b.t >= 0,
            (b % page).t == 0,
            swa.t >= 0,
            z3.Implies(has, z3.And(p.t >= 1, seq.t >= 0, seq.t < p.t)),
        ]
        return b, swa, has, p, seq

    def _after_resume(self, enc: Encoder, model: RoundModel) -> tuple[Mid, dict]:
        b, swa, has, p, seq = self._round_start(enc)
        ledger = model.open_ledger(b, swa)
        f = z3.BoolVal(False)
        state = RoundState(ledger, f, f, z3.BoolVal(True), f, f)
        e = model.resume(state, has, p, seq)
        computes = e.end.t > e.start.t
        end = ite(computes, e.end, seq)
        keeps = z3.And(has, e.kind.t != FINAL)
        mid = Mid(
            state,
            enc.bind("A", full_need(e, self.config.page_size)),
            enc.bind("owed", ite(keeps, owed(p, end, self.config.page_size), 0)),
            enc.bind("S", swa_need(e, self.config.page_size)),
        )
        info = {"B": b, "swa": swa, "has": has, "p": p, "seq": seq, "entry": e}
        return mid, info

    def _arbitrary_mid(self, enc: Encoder, model: RoundModel) -> Mid:
        cfg = self.config
        led = Ledger(
            page_size=cfg.page_size,
            baseline=as_int(enc.var("L_baseline")),
            rem_chunk_tokens=as_int(enc.var("L_rem_chunk")),
            # no input budget: a spent one only stops the queue, which keeps every invariant
            rem_input_tokens=None,
            swa_baseline=as_int(enc.var("L_swa_baseline")) if cfg.hybrid_swa else None,
            sliding_window=cfg.sliding_window,
            rem_total_token_offset=as_int(enc.var("L_total_offset")),
            cur_rem_token_offset=as_int(enc.var("L_cur_offset")),
            rem_swa_token_offset=as_int(enc.var("L_swa_offset")),
        )
        has, deferred = enc.bool("has_chunked"), enc.bool("deferred")
        state = RoundState(
            led, has, deferred, z3.BoolVal(True), z3.BoolVal(False), z3.BoolVal(False)
        )
        mid = Mid(state, enc.var("A"), enc.var("owed"), enc.var("S"))
        enc.facts += [
            term_of(led.baseline) % cfg.page_size == 0,
            term_of(led.rem_chunk_tokens) <= cfg.chunked_prefill_size,
            term_of(led.rem_total_token_offset) >= 0,
            term_of(led.cur_rem_token_offset) >= 0,
            term_of(led.rem_swa_token_offset) >= 0,
            mid.extend.t >= 0,
            mid.owed.t >= 0,
            mid.swa.t >= 0,
            z3.Implies(deferred, has),
        ]
        if cfg.hybrid_swa:
            enc.facts.append(term_of(led.swa_baseline) >= 0)
        return mid

    def _request(self, enc: Encoder, name: str = "X") -> tuple[Req, Hit]:
        """An arbitrary request, and what the cache offers it: a pinned or an unpinned device
        prefix, the unpinned one cached or evicted (``present``), its lock taking all of it
        (a scenario's prefixes are never shared, docs/spec.md "Unpinned device prefixes")."""
        page = self.config.page_size
        inputs = (enc.var("p"), enc.var("d"), enc.var("h"), Sym(num(1)))
        q = make_request(
            enc,
            name,
            inputs,
            page,
            host_paged=False,
            unpinned=enc.var("u"),
        )
        enc.facts += [
            q.prompt.t >= 1,
            q.device.t >= 0,
            (q.device % page).t == 0,
            q.unpinned.t >= 0,
            (q.unpinned % page).t == 0,
            z3.Or(q.device.t == 0, q.unpinned.t == 0),
            q.host.t >= 0,
            q.device.t + q.unpinned.t + q.host.t < q.prompt.t,
        ]
        present = enc.bool(f"{name}_cached")
        return q, Hit.of(q, ite(present, q.unpinned, 0), page)

    def _offered(self, enc: Encoder) -> tuple[Req, Hit]:
        """An arbitrary request as the queue loop meets it, with the same reach as
        :meth:`_request` in fewer terms: ``d`` device tokens cached, the host hit after them,
        and a lock that takes all ``d`` tokens or none (``locks``). A pinned prefix is ``d``
        without a lock, a cached unpinned one ``d`` with it, and an evicted one is a request
        with nothing cached and, where the host holds the prefix with a host run after it,
        the host hit from token 0 (``d = 0``, ``h`` the two together;
        ``loadable_after_eviction``). The never-fits question, which
        tells an unpinned prefix from a pinned one, is not asked in a step."""
        page = self.config.page_size
        inputs = (enc.var("p"), enc.var("d"), enc.var("h"), Sym(num(1)))
        q = unconstrained_request(enc, "X", inputs, page)
        locks = self._last_locks = enc.bool("locks")
        hit = Hit.pinned(q, page)
        return q, dataclasses.replace(hit, lock=ite(locks, q.device, 0))

    def _admit_step(self, enc: Encoder, model: RoundModel, mid: Mid) -> tuple[Mid, EntryTerms]:
        q, hit = self._offered(enc)
        self._last_request = q
        e, placed, _ = model.admit(mid.state, z3.BoolVal(True), q, hit=hit, reselect=False)
        page = self.config.page_size
        extend = mid.extend + full_need(e, page) - e.load_back_slots
        truncated = z3.And(placed, e.kind.t == TRUNCATED)
        new_owed = mid.owed + ite(truncated, owed(q.prompt, e.end, self.config.page_size), 0)
        swa = enc.bind("S", mid.swa + swa_need(e, page))
        return Mid(mid.state, enc.bind("A", extend), enc.bind("owed", new_owed), swa), e

    # -- invariants ------------------------------------------------------------------------
    def _j_full(self, m: Mid) -> z3.BoolRef:
        led = m.state.ledger
        total = m.extend.t + m.owed.t
        frozen = z3.And(m.state.deferred, term_of(led.rem_swa_tokens) <= self.config.page_size)
        return z3.And(
            total <= term_of(led.baseline),
            z3.Or(total <= term_of(led.rem_total_token_offset), frozen),
            z3.Or(m.owed.t == 0, m.state.has_chunked),
        )

    def _j_spent(self, m: Mid) -> z3.BoolRef:
        """``J``, *or* what is owed fits and the compute budget is spent, so nothing else can
        join the round. That is upstream SGLang's implicit protection: a truncation aligned to
        the page spends the whole budget (``rem_chunk_tokens`` starts at a page multiple and
        every chunk is charged in whole pages, which is kept as part of the invariant), so no
        later request of the round can take the truncated request's tail."""
        led, page = m.state.ledger, self.config.page_size
        total = m.extend.t + m.owed.t
        spent = z3.And(
            total <= term_of(led.baseline),
            term_of(led.rem_chunk_tokens) <= 0,
            z3.Or(m.owed.t == 0, m.state.has_chunked),
        )
        j = z3.Or(self._j_full(m), spent)
        if self.config.chunked_prefill_size % page:
            return j
        return z3.And(j, term_of(led.rem_chunk_tokens % page) == 0)

    def _j_planned(self, m: Mid) -> z3.BoolRef:
        """``J`` without what the in-progress request owes: only what is planned this round
        must fit. Weaker than ``_j_full``, so it can hold where admitted => completes does not
        (a chunking policy that defers instead of forcing the tail)."""
        return self._j_full(Mid(m.state, m.extend, Sym(num(0))))

    def _j_swa(self, m: Mid) -> z3.BoolRef:
        """What the commit will require of the sliding-window pool for the chunks planned so
        far fits it, and the ledger has charged at least that much. The ledger's charge (SGLang
        0.5.23's window-capped estimate) may exceed the real need, so its headroom may go below
        zero where the pool does not run out (a resume capped at ``rem_swa_tokens - page_size``
        of a chunk charged its first token too); the budget then stops the round, and the
        second half carries the real need over to what is placed before that."""
        led = m.state.ledger
        return z3.And(
            m.swa.t <= term_of(led.swa_baseline),
            m.swa.t <= term_of(led.rem_swa_token_offset),
        )

    def _swa_fits(self, m: Mid) -> z3.BoolRef:
        """No sliding-window OOM at commit: what the batch requires fits the pool."""
        return m.swa.t <= term_of(m.state.ledger.swa_baseline)

    def _j_ledger(self, m: Mid) -> z3.BoolRef:
        led = m.state.ledger
        return term_of(led.cur_rem_token_offset) <= term_of(led.rem_total_token_offset)

    # -- obligations -----------------------------------------------------------------------
    def _valid(self, enc: Encoder, claim: z3.BoolRef) -> str:
        """'valid', 'invalid' or 'unknown' for ``facts => claim``."""
        r, _, reason = solve([*enc.facts, z3.Not(claim)], self.rlimit, deadline=self.deadline)
        self.cut_by_wall_clock |= reason == WALL_CLOCK
        if r == z3.unsat:
            return "valid"
        return "invalid" if r == z3.sat else "unknown"

    def _two_level(
        self,
        j: Callable[[Mid], z3.BoolRef],
        inv: Callable[[dict], z3.BoolRef],
        post: Callable[[Mid], z3.BoolRef],
    ) -> str:
        """Run base, step and exit for invariant ``j`` (and ``inv`` between rounds)."""
        results = [self._base(j, inv, post), self._step(j, post)]
        if "unknown" in results:
            return "unknown"
        return "valid" if all(r == "valid" for r in results) else "invalid"

    def _resumed(self) -> tuple[Encoder, Mid, dict]:
        """An arbitrary round start and its resume step (:meth:`_after_resume`), built once;
        each caller gets its own copy of the facts to add to (the states are only read)."""
        if self._resume is None:
            with Encoder() as enc:
                model = RoundModel(self.combo, self.config, enc, self.sources)
                mid, info = self._after_resume(enc, model)
            self._resume = (enc, mid, info)
        enc, mid, info = self._resume
        return enc.fork(), mid, info

    def _stepped(self) -> tuple[Encoder, Mid, Mid, EntryTerms, Req]:
        """An arbitrary mid-round state, and the state after one admission turn of an
        arbitrary request: (facts, before, after, the turn's entry, the request), built once.
        The turn updates its round state in place, so ``before`` is a copy taken first."""
        if self._step_from is None:
            with Encoder() as enc:
                model = RoundModel(self.combo, self.config, enc, self.sources)
                mid = self._arbitrary_mid(enc, model)
                before = dataclasses.replace(mid, state=dataclasses.replace(mid.state))
                nxt, e = self._admit_step(enc, model, mid)
            self._step_from = (enc, before, nxt, e, self._last_request)
        enc, before, nxt, e, req = self._step_from
        return enc.fork(), before, nxt, e, req

    def _base(self, j, inv, post) -> str:
        enc, mid, info = self._resumed()
        with enc:
            enc.facts.append(inv(info))
            enc.facts.append(z3.Not(mid.state.bad_contract))
            claim = z3.And(j(mid), post(mid))
        return self._valid(enc, claim)

    def _step(self, j, post) -> str:
        enc, mid, nxt, _, _ = self._stepped()
        with enc:
            enc.facts.append(j(mid))
            enc.facts.append(z3.Not(nxt.state.bad_contract))
            claim = z3.And(j(nxt), post(nxt))
        return self._valid(enc, claim)

    @property
    def owed_always_fits(self) -> bool:
        """The memory half of admitted-completes is proved unbounded: after every round, what
        the in-progress request owes fits in free + evictable (``Inv``, :meth:`prove` of
        ``no-oom`` or ``admitted-completes`` has run). A bounded search then only needs to
        look for its other half, a request failed as stuck."""
        return self._full == "valid"

    def prove(self, prop: str) -> str:
        """'proved', 'not-inductive' or 'unknown' for one property."""
        cfg = self.config
        page = cfg.page_size
        if prop in ("no-oom", "admitted-completes"):

            def inv(i: dict) -> z3.BoolRef:
                return z3.Implies(i["has"], owed(i["p"], i["seq"], page).t <= i["B"].t)

            # post is implied by J (A <= baseline, owed <= baseline - A), checked anyway
            def post(m: Mid) -> z3.BoolRef:
                return m.extend.t + m.owed.t <= term_of(m.state.ledger.baseline)

            if self._full is None:
                self._full = self._two_level(self._j_full, inv, post)
                if self._full == "invalid":
                    self._full = self._two_level(self._j_spent, inv, post)
            out = self._full
            if prop == "admitted-completes" and out == "valid":
                out = self._never_stuck()
            if prop == "no-oom" and out == "invalid":
                # no invariant between rounds at all: any round start, however much the
                # in-progress request still owes, plans only what fits
                out = self._two_level(
                    self._j_planned,
                    lambda i: z3.BoolVal(True),
                    lambda m: m.extend.t <= term_of(m.state.ledger.baseline),
                )
        elif prop == "swa-no-oom":
            if not cfg.hybrid_swa:
                return "proved"
            out = self._two_level(self._j_swa, lambda i: z3.BoolVal(True), self._swa_fits)
        elif prop == "ledger":
            out = self._two_level(
                self._j_ledger, lambda i: z3.BoolVal(True), lambda m: z3.Not(m.state.bad_ledger)
            )
        elif prop == "no-starvation":
            out = self._no_starvation()
        elif prop == "contract":
            out = self._contract()
        elif prop == "progress":
            out = self._progress()
        else:  # pragma: no cover - guarded by the caller
            raise ValueError(prop)
        return {"valid": "proved", "invalid": "not-inductive"}.get(out, "unknown")

    def _contract(self) -> str:
        """Policies honour the planner's contract from every well-formed state."""
        enc, mid, _ = self._resumed()
        first = self._valid(enc, z3.Not(mid.state.bad_contract))
        enc, _, nxt, _, _ = self._stepped()
        second = self._valid(enc, z3.Not(nxt.state.bad_contract))
        if "unknown" in (first, second):
            return "unknown"
        return "valid" if first == second == "valid" else "invalid"

    def _no_starvation(self) -> str:
        """On a drained node, the queue reaches a placement. A round there opens a fresh ledger
        on everything an idle node has, so each request it looks at is either placed or
        skipped with that ledger untouched and the queue going on (first obligation, given
        that some request would fit an idle node); and a request that would fit an idle node
        is placed when the fresh ledger reaches it (second). By induction over the queue,
        whatever stands in front of such a request, something is placed."""
        with Encoder() as enc:
            model, state, idle = self._drained(enc)
            enc.facts.append(model.fits_idle(self._request(enc, "X")[0], idle))
            h, hit = self._request(enc, "H")
            _, placed, _ = model.admit(state, z3.BoolVal(True), h, idle, hit, reselect=False)
            enc.facts.append(z3.Not(state.bad_contract))
            first = self._valid(enc, z3.Or(placed, state.active))
        with Encoder() as enc:
            model, state, idle = self._drained(enc)
            x, hit = self._request(enc, "X")
            enc.facts.append(model.fits_idle(x, idle))
            _, placed, _ = model.admit(state, z3.BoolVal(True), x, idle, hit, reselect=False)
            enc.facts.append(z3.Not(state.bad_contract))
            second = self._valid(enc, placed)
        if "unknown" in (first, second):
            return "unknown"
        return "valid" if first == second == "valid" else "invalid"

    def _drained(self, enc: Encoder) -> tuple[RoundModel, RoundState, IdleNode]:
        """A round opening on a drained node: the ledger holds all an idle node could have."""
        cfg, page = self.config, self.config.page_size
        capacity, swa = enc.var("C"), enc.var("S")
        enc.facts += [capacity.t >= 0, (capacity % page).t == 0]
        enc.facts.append(swa.t >= page if cfg.hybrid_swa else swa.t == 0)
        model = RoundModel(self.combo, cfg, enc, self.sources)
        f = z3.BoolVal(False)
        state = RoundState(model.open_ledger(capacity, swa), f, f, z3.BoolVal(True), f, f)
        return model, state, IdleNode(capacity, swa)

    def _never_stuck(self) -> str:
        """The stuck-request valve never fails an admitted request: from any round start where
        what the in-progress request owes fits (``Inv``), its resume is not a deferral. (The
        valve only fires on a deferral; this asks more — any deferral, not only one on an
        idle node — so where it fails the verdict falls back to bounded model checking.)"""
        out = self._resumes_when_owed_fits(aligned=False)
        whole_pages = self.granule % self.config.page_size == 0
        if out == "invalid" and whole_pages and self._ends_stay_aligned() == "valid":
            out = self._resumes_when_owed_fits(aligned=True)
        return out

    def _resumes_when_owed_fits(self, *, aligned: bool) -> str:
        """The obligation of :meth:`_never_stuck`; ``aligned``: the in-progress request's
        prompt and computed length are whole pages."""
        page = self.config.page_size
        enc, mid, i = self._resumed()
        with enc:
            enc.facts += [
                i["has"],
                owed(i["p"], i["seq"], page).t <= i["B"].t,
                z3.Not(mid.state.bad_contract),
            ]
            if aligned:
                enc.facts += [(i["p"] % page).t == 0, (i["seq"] % page).t == 0]
        return self._valid(enc, i["entry"].end.t > i["entry"].start.t)

    def _ends_stay_aligned(self) -> str:
        """Where prompts and host prefixes are whole pages, every chunk ends on a page: the
        resume from a round start at a page boundary, and any admission from any ledger. Then
        an in-progress request always owes at least a page (without it, a request whose rest
        fits in its last partly filled page owes nothing, and a policy may defer it on a full
        pool forever)."""
        page = self.config.page_size
        enc, mid, i = self._resumed()
        e = i["entry"]
        with enc:
            enc.facts += [
                (i["p"] % page).t == 0,
                (i["seq"] % page).t == 0,
                z3.Not(mid.state.bad_contract),
            ]
            claim = z3.Implies(e.end.t > e.start.t, (e.end % page).t == 0)
        first = self._valid(enc, claim)
        enc, _, nxt, e, req = self._stepped()
        with enc:
            enc.facts.append(z3.Not(nxt.state.bad_contract))
            # the request of the step: its prompt and host prefix are whole pages
            enc.facts += [(v % page).t == 0 for v in (req.prompt, req.host)]
            claim = z3.Implies(e.end.t > e.start.t, (e.end % page).t == 0)
        second = self._valid(enc, claim)
        if "unknown" in (first, second):
            return "unknown"
        return "valid" if first == second == "valid" else "invalid"

    def _progress(self) -> str:
        """From any round start with memory to finish it, the in-progress request runs."""
        cfg, page = self.config, self.config.page_size
        enc, mid, i = self._resumed()
        with enc:
            swa_room = i["swa"].t >= (i["p"] - i["seq"]).t + 2 * page
            room = z3.And(
                i["has"],
                i["B"].t >= owed(i["p"], i["seq"], page).t + page,
                swa_room if cfg.hybrid_swa else z3.BoolVal(True),
            )
            enc.facts.append(z3.Not(mid.state.bad_contract))
        return self._valid(enc, z3.Implies(room, i["entry"].end.t > i["entry"].start.t))
