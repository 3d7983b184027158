"""The round planner: open a ledger, ask the policies, produce a :class:`~policykit.plan.Plan`.

The order is the engine's (SGLang ``_get_new_batch_prefill_raw``):

1. open a fresh ledger from ``free + evictable``;
2. resume the in-progress chunked request first (chunking policy, then alignment);
3. admit waiting requests in order while the budget says ``CONTINUE``: admission check, lock
   of the device prefix (and the check again), host load-back (lowers the baseline at once,
   and evicts unlocked cached prefixes at once if the free pool is short, so a later request
   no longer hits them: :class:`LoadBacks`), chunk length, alignment, charges, tail
   reservation;
   The queue policy orders the waiting requests; it also says whether a request that can
   never fit is rejected for good (the planner goes on) or, as upstream, stops the queue;
4. stop at the first request that is refused: nothing behind it is looked at.

Nothing is allocated here. Locks and load-backs are *accounted* on the ledger exactly as the
engine's real ones would lower its baseline; :meth:`PrefillNode.commit` performs them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from policykit import kernel
from policykit.kernel import Ints, Offer, describe
from policykit.ledger import Budget, Ledger
from policykit.liveness import idle_capacity
from policykit.node import PrefillNode
from policykit.pages import pages_for
from policykit.plan import NEVER, Entry, EntryKind, LedgerMark, Plan, Rejection
from policykit.policy import QueueView
from policykit.prefix_cache import Node
from policykit.registry import Combo
from policykit.request import Request
from policykit.swa_cache import SWAPrefixCache

#: ``_admit_with``'s verdict when the request fitted until its cached prefix was locked
_LOCK_REFUSED = object()


@dataclass
class LoadBacks:
    """What the round's host load-backs have taken so far.

    SGLang loads a host prefix back while it admits the request, evicting cached prefixes
    that nothing has locked yet when the free pool is short, before it even matches the next
    request; so a later request of the round can lose the prefix it would have hit (and the
    node's commit does the same, request by request).
    """

    #: ids of the cached nodes those evictions take
    gone: set[int] = field(default_factory=set)
    loaded: int = 0  #: slots the load-backs take from the free pool
    freed: int = 0  #: slots their evictions give back to it


class Observer:
    """Receives planning events; the scheduler forwards them to the plugins' observer hooks."""

    def admit(self, request_id: str, entry: Entry, ledger: Ledger) -> None: ...

    def reject(self, request_id: str, verdict: str, ledger: Ledger) -> None: ...


class Planner:
    """Plans rounds on one node with one combo."""

    def __init__(
        self,
        node: PrefillNode,
        combo: Combo,
        observer: Observer | None = None,
    ) -> None:
        self.node = node
        self.combo = combo
        self.observer = observer or Observer()
        #: each request's place in the last queue this planner gave, when that was not arrival
        #: order (what a queue over its policy's ``sort_limit`` keeps)
        self._last_order: dict[str, int] | None = None

    @property
    def combo(self) -> Combo:
        return self.domain.combo

    @combo.setter
    def combo(self, combo: Combo) -> None:
        """Switching policies between rounds (``Scheduler.use``) must reach the int domain,
        which is what asks them."""
        self.domain = Ints(combo)

    def open_ledger(self) -> Ledger:
        node, cfg = self.node, self.node.config
        return Ledger(
            page_size=cfg.page_size,
            baseline=node.baseline,
            rem_chunk_tokens=cfg.chunked_prefill_size,
            rem_input_tokens=cfg.max_prefill_tokens,
            swa_baseline=None if node.swa_pool is None else node.swa_baseline,
            sliding_window=cfg.sliding_window,
        )

    def plan(self, round_no: int, ledger: Ledger | None = None) -> Plan:
        ledger = ledger or self.open_ledger()
        baseline = ledger.baseline
        entries: list[Entry] = []
        marks: list[LedgerMark] = []
        rejected: list[Rejection] = []
        stop: str | None = None

        if self.node.chunked is not None:
            entry = self._resume(self.node.chunked, ledger)
            entries.append(entry)
            if entry.kind is not EntryKind.DEFERRED:
                marks.append(self._mark(entry.request_id, ledger))
                self.observer.admit(entry.request_id, entry, ledger)

        locked: set[int] = set()
        #: hybrid SWA: nodes whose sliding-window KV the round's admissions have window-locked
        self._window_locked: set[int] = set()
        loads = LoadBacks()
        skips = self.combo.queue.skips_never_fitting
        for req in self.queue():
            state = ledger.budget_state()
            if state is not Budget.CONTINUE:
                stop = state.value
                break
            verdict = self._admit(req, ledger, locked, entries, loads)
            if isinstance(verdict, Budget) and skips and (reason := self.never_fits(req)):
                # Refused for good: skip it rather than block the queue behind it forever.
                rejected.append(Rejection(req.id, NEVER, reason))
                self.observer.reject(req.id, NEVER, ledger)
                continue
            if isinstance(verdict, Budget):
                rejected.append(Rejection(req.id, verdict.value))
                self.observer.reject(req.id, verdict.value, ledger)
                stop = verdict.value
                break
            entries.append(verdict)
            marks.append(self._mark(req.id, ledger))
            self.observer.admit(req.id, verdict, ledger)
        return Plan(
            round=round_no,
            entries=tuple(entries),
            rejected=tuple(rejected),
            marks=tuple(marks),
            stop=stop,
            baseline=baseline,
        )

    # -- the waiting queue -----------------------------------------------------------------
    def queue(self) -> list[Request]:
        """The waiting requests in the order this round looks at them
        (:func:`policykit.kernel.queue_order`: by the queue policy's priority, stably; a queue
        over the policy's ``sort_limit`` in the order this planner last gave it)."""
        order, self._last_order = kernel.queue_order(
            self.domain, self.combo.queue, list(self.node.waiting), self._priority, self._last_order
        )
        return order

    def _priority(self, req: Request) -> int:
        node, page = self.node, self.node.config.page_size
        cached = node.cache.match(req.tokens)[0]
        view = QueueView(
            prompt_tokens=req.prompt_tokens,
            prefix_tokens=cached,
            host_prefix_tokens=node.host.loadable(req.tokens, cached, page),
            page_size=page,
        )
        return kernel.queue_rank(self.combo.queue, view, req.id)

    # -- the in-progress request -----------------------------------------------------------
    def _resume(self, req: Request, ledger: Ledger) -> Entry:
        start = req.seq_len
        r = kernel.resume(self.domain, ledger, req.prompt_tokens, start, self._swa_pool, req.id)
        if r.deferred:
            return Entry(req.id, start, start, EntryKind.DEFERRED)
        ledger.become(r.ledger)
        if r.final:
            return Entry(req.id, start, start + r.chunk, EntryKind.FINAL)
        return Entry(req.id, start, r.end, EntryKind.RESUMED)

    # -- a waiting request -----------------------------------------------------------------
    def _admit(
        self,
        req: Request,
        ledger: Ledger,
        locked: set[int],
        entries: list[Entry],
        loads: LoadBacks,
    ) -> Entry | Budget:
        """``req``'s turn: its admission on what the cache offers it now, or afresh where its
        own lock refused it (:func:`policykit.kernel.afresh`); placed, its load-back's
        evictions are foreseen."""
        first = self._admit_with(req, ledger, locked, entries, loads, reuse=True)
        verdict = kernel.afresh(
            self.domain,
            first is _LOCK_REFUSED,
            first,
            lambda: self._admit_with(req, ledger, locked, entries, loads, reuse=False),
        )
        if isinstance(verdict, Entry) and verdict.load_back:
            self._load_back(verdict.load_back, locked, loads)
        return verdict

    def _load_back(self, tokens: int, locked: set[int], loads: LoadBacks) -> None:
        """Foresee what a load-back of ``tokens`` evicts at admission (``LoadBacks``)."""
        node, page = self.node, self.node.config.page_size
        slots = pages_for(tokens, page) * page
        short = slots - (node.pool.free_tokens + loads.freed - loads.loaded)
        if short > 0:
            taken = node.cache.victims(short, keep=locked, gone=loads.gone)
            loads.gone.update(n.id for n in taken)
            loads.freed += sum(len(n) for n in taken)
        loads.loaded += slots

    def _admit_with(
        self,
        req: Request,
        ledger: Ledger,
        locked: set[int],
        entries: list[Entry],
        loads: LoadBacks,
        *,
        reuse: bool,
    ) -> Entry | Budget | object:
        """``req``'s admission (:func:`policykit.kernel.admission`) on its cached prefix, as
        a load-back of the round may have left it (``reuse``), or on nothing cached. Placed,
        the ledger takes it and its prefix stays locked for the rest of the round; refused by
        its own lock, nothing changes and the answer is ``_LOCK_REFUSED``."""
        node = self.node
        if reuse:
            cached, last, _ = node.cache.match(req.tokens, loads.gone)
        else:
            cached, last = 0, node.cache.root
        newly = [n for n in node.cache.unlocked_on_path(last) if n.id not in locked]
        window = self._window_newly(last)
        # afresh, nothing is offered: no device hit, and no host hit either (the host's copy
        # of the prefix is no reason to load back what the device still holds)
        offer = (
            self._offer(req, cached, sum(len(n) for n in newly), sum(len(n) for n in window))
            if reuse
            else Offer(0, 0, 0, 0)
        )
        if offer.host and isinstance(node.cache, SWAPrefixCache):
            held, window = self._window_after_load(last, offer.host)
            offer = dataclasses.replace(offer, swa_load_lock=held)
        a, refused = kernel.admission(
            self.domain,
            ledger,
            req.prompt_tokens,
            offer,
            self._has_chunked(entries),
            self._swa_pool,
            req.id,
        )
        # No ``max_prefill_tokens`` gate here: SGLang 0.5.23 refuses a request whose input
        # reaches ``rem_input_tokens`` only with chunked prefill disabled, and a policykit node
        # always chunks; the budget still ends admission once spent (``Budget.OTHER``).
        if refused:
            return _LOCK_REFUSED
        if not a.ok:
            return Budget.NO_TOKEN
        if a.other:  # no room to start it, or it would be a second in-progress request
            return Budget.OTHER
        locked.update(n.id for n in newly)
        self._window_locked.update(n.id for n in window)
        ledger.become(a.ledger)
        if a.whole:
            return Entry(req.id, a.start, a.start + a.chunk, EntryKind.WHOLE, cached, offer.host)
        return Entry(req.id, a.start, a.end, EntryKind.TRUNCATED, cached, offer.host)

    def _window_newly(self, last: Node) -> list[Node]:
        """Hybrid SWA: the nodes whose evictable sliding-window KV a lock on ``last`` takes
        (its window, :meth:`SWAPrefixCache.swa_unlocked_on_path`) that no admission of the
        round has locked yet."""
        cache = self.node.cache
        if not isinstance(cache, SWAPrefixCache):
            return []
        return [n for n in cache.swa_unlocked_on_path(last) if n.id not in self._window_locked]

    def _window_after_load(self, last: Node, host: int) -> tuple[int, list[Node]]:
        """Hybrid SWA: what the lock of a request whose ``host`` tokens load back after
        ``last`` holds of sliding-window KV once they are in the tree, and the cached nodes
        of it. The loaded KV is one new leaf, capped at one window of whole pages
        (:meth:`SWAPrefixCache.insert_swa`); the window goes on into ``last``'s path when the
        leaf is shorter than a window."""
        cache = self.node.cache
        assert isinstance(cache, SWAPrefixCache)
        page = self.node.config.page_size
        covered = min(host, pages_for(cache.window, page) * page)
        held, nodes = covered, []
        for n in last.path():
            if covered >= cache.window:
                break
            covered += len(n)
            if n.swa is not None and n.swa_lock == 0 and n.id not in self._window_locked:
                held += len(n)
                nodes.append(n)
        return held, nodes

    def _offer(self, req: Request, cached: int, lock: int, swa_lock: int = 0) -> Offer:
        """What the cache offers ``req`` with ``cached`` tokens of it matched, whose lock
        takes ``lock`` evictable tokens (``swa_lock`` sliding-window ones): the host prefix
        after them loads back."""
        page = self.node.config.page_size
        host = self.node.host.loadable(req.tokens, cached, page)
        return Offer(cached, host, lock, pages_for(host, page) * page, swa_lock)

    # -- liveness --------------------------------------------------------------------------
    def never_fits(self, req: Request) -> str | None:
        """Why ``req`` can never run here, or None if an idle node would take it.

        Asks this round's policies about the best case the node can ever offer: nothing else
        admitted or held, every unpinned cached prefix evicted, the whole compute budget free.
        Pinned prefixes (locked for holders outside the node) never come back, so they are not
        counted as memory, but a request whose prompt starts with one gets it for free. Assumes
        that policies admit no less when more is free.
        """
        node, cfg, page = self.node, self.node.config, self.node.config.page_size
        capacity = idle_capacity(node.pool.total_tokens, node.cache.pinned_tokens)
        pinned = node.cache.pinned_prefix(req.tokens)
        idle = kernel.idle_answers(
            self.domain,
            req.prompt_tokens,
            pinned,
            node.host.loadable(req.tokens, pinned, page),
            capacity,
            self._swa_pool,
            page=page,
            chunk_size=cfg.chunked_prefill_size,
            window=cfg.sliding_window,
            request_id=req.id,
        )
        where = f"even on an idle node ({capacity} tokens could ever be free"
        where += f", {pinned} of its prompt cached and pinned)" if pinned else ")"
        if not idle.ok:
            adm = describe(self.combo.admission)
            return f"{adm} refuses its {req.prompt_tokens}-token prompt {where}."
        if idle.chunk == 0:
            return f"{describe(self.combo.chunking)} never gives it a first chunk {where}."
        return None

    # -- shared ----------------------------------------------------------------------------
    @property
    def _swa_pool(self) -> int | None:
        """The sliding-window pool's size (hybrid SWA), which the views' SWA fields need."""
        swa = self.node.swa_pool
        return None if swa is None else swa.total_tokens

    @staticmethod
    def _has_chunked(entries: list[Entry]) -> bool:
        """Whether this round already has an in-progress request (there is at most one)."""
        stays = (EntryKind.TRUNCATED, EntryKind.RESUMED, EntryKind.DEFERRED)
        return any(e.kind in stays for e in entries)

    @staticmethod
    def _mark(request_id: str, ledger: Ledger) -> LedgerMark:
        return LedgerMark(
            request_id, ledger.rem_total_tokens, ledger.cur_rem_tokens, ledger.rem_chunk_tokens
        )
