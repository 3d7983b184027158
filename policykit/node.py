"""The simulated prefill node: KV pool(s), prefix cache, host tier and the requests on it.

The node *commits* plans (allocates what a plan decided) and *releases* the KV of requests
whose transfer to decode completed. It does not decide anything: deciding is the planner's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import torch

from policykit.config import EngineConfig
from policykit.errors import LoadBackError, PlanError, PrefillOutOfMemory
from policykit.host_tier import HostEntry, HostTier
from policykit.kernel.between import kv_back, kv_due
from policykit.kernel.domain import INT_LOGIC
from policykit.kernel.swa import swa_host_hit
from policykit.pages import cached_on_release, eviction_demand, extend_pages, pages_for
from policykit.plan import Entry, EntryKind, Plan
from policykit.pool import TokenPool
from policykit.prefix_cache import Node, PrefixCache, Tokens
from policykit.request import NO_PAGES, Request, State
from policykit.swa_cache import SWAPrefixCache, kept_from


@dataclass
class _Staged:
    """What a commit took for one entry, held apart from the request until nothing can fail."""

    req: Request
    entry: Entry
    prefix_node: Node | None = None
    prefix_pages: torch.Tensor = NO_PAGES
    load_pages: torch.Tensor = NO_PAGES
    host_entry: HostEntry | None = None
    extend_pages: torch.Tensor = NO_PAGES
    swa_pages: torch.Tensor | None = None
    #: hybrid SWA: the full KV the tree held of the request when it was matched
    full_hit: int = 0


def _concat(head: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """``torch.cat`` that skips the copy when one side is empty (most rounds: one side is)."""
    if not tail.numel():
        return head
    if not head.numel():
        return tail
    return torch.cat([head, tail])


@dataclass
class SWAProgress:
    """Where an admitted request's KV stands under hybrid SWA (see ``PrefillNode``)."""

    protected: int
    swa_from: int
    evicted: int = 0
    #: where the request's admission match stopped short of the full KV the tree had (its
    #: window was gone there): SGLang's ``swa_branching_seqlen``
    branching: int | None = None


def _unadopted(pages: torch.Tensor, dup: int, adopted: list[int]) -> torch.Tensor:
    """The first ``dup`` of ``pages`` less those the tree took over (``adopted``): the
    duplicates an insert leaves to free."""
    keep = set(adopted)
    return pages[[i for i in range(min(dup, int(pages.numel()))) if i not in keep]]


def _first_over(needs: list[tuple[Entry, int]], available: int) -> str | None:
    """The first entry of a batch whose running total of needs exceeds ``available``."""
    total = 0
    for entry, need in needs:
        total += need
        if total > available:
            return entry.request_id
    return None


class PrefillNode:
    """State of one prefill node between rounds."""

    def __init__(
        self,
        config: EngineConfig,
        pool: TokenPool,
        *,
        swa_pool: TokenPool | None = None,
        cache: PrefixCache | None = None,
        host: HostTier | None = None,
    ) -> None:
        if (swa_pool is None) != (config.sliding_window is None):
            raise ValueError("a sliding-window pool goes with a sliding_window size, and only then")
        if swa_pool is not None and swa_pool.page_size != config.page_size:
            raise ValueError(
                "the sliding-window pool is paged like the full one: SGLang 0.5.23 pairs every "
                f"page of one with a page of the other ({swa_pool.page_size} != "
                f"{config.page_size})"
            )
        self.config = config
        self.pool = pool
        self.swa_pool = swa_pool
        if cache is None:
            window = config.sliding_window
            swa = swa_pool
            cache = PrefixCache(pool) if swa is None else SWAPrefixCache(pool, swa, window)  # type: ignore[arg-type]  # a sliding-window pool comes with its window
        self.cache = cache
        self.host = host or HostTier()
        if isinstance(cache, SWAPrefixCache):
            cache.host_hit = self._host_hit
        self.requests: dict[str, Request] = {}
        self.future: deque[Request] = deque()
        self.waiting: deque[Request] = deque()
        self.chunked: Request | None = None
        self.held: deque[Request] = deque()
        #: where each admitted request's chunks began (page floor): its tree nodes once cached
        self._checkpoints: dict[str, list[int]] = {}
        #: hybrid SWA (:mod:`policykit.swa_cache`), per admitted request: ``protected``, how
        #: much of its KV the tree holds (its matched prefix, load-back and checkpoints), and
        #: ``swa_from``, where its own sliding-window pages start (the KV out of its window
        #: before that is freed), ``evicted``, SGLang's ``evicted_seqlen``
        self._swa_state: dict[str, SWAProgress] = {}
        #: whether a held request's KV has reached the decode node; the harness replaces this
        #: with a check of its real copy, so slots are never freed under an in-flight transfer
        self.transfer_done: Callable[[Request], bool] = lambda req: True

    # -- requests --------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request; it joins the waiting queue in its arrival round (requests of the
        same round in the order they were added)."""
        if request.id in self.requests:
            raise ValueError(f"duplicate request id {request.id!r}")
        self.requests[request.id] = request
        request.state = State.FUTURE
        # Keep the future queue in arrival order (stable): ``arrive`` only looks at its head,
        # so a later arrival added first must not hold back an earlier one.
        at = len(self.future)
        while at and self.future[at - 1].arrival_round > request.arrival_round:
            at -= 1
        self.future.insert(at, request)

    def arrive(self, round_no: int) -> list[Request]:
        """Move requests whose arrival round has come into the waiting queue."""
        arrived = []
        while self.future and self.future[0].arrival_round <= round_no:
            req = self.future.popleft()
            if pages_for(req.prompt_tokens, self.config.page_size) > self.pool.num_pages:
                req.state = State.REJECTED
                req.reason = (
                    f"its {req.prompt_tokens}-token prompt can never fit the "
                    f"{self.pool.total_tokens}-token KV pool"
                )
            else:
                req.state = State.WAITING
                self.waiting.append(req)
            arrived.append(req)
        return arrived

    @property
    def baseline(self) -> int:
        """``free + evictable``: what the pool could pay right now."""
        return self.pool.free_tokens + self.cache.evictable_tokens

    @property
    def swa_baseline(self) -> int | None:
        """Hybrid SWA: free plus evictable sliding-window tokens (SGLang's
        ``remaining_swa`` before any charge); None without hybrid SWA."""
        if self.swa_pool is None:
            return None
        return self.swa_pool.free_tokens + self._swa_cache.swa_evictable_tokens

    # -- commit ----------------------------------------------------------------------------
    def commit(self, plan: Plan) -> None:
        """Allocate what ``plan`` decided, in the engine's order, all or nothing.

        New requests in plan order, each as SGLang admits it: lock its cached prefix, then
        load back its host prefix (which may evict cached prefixes no request of the round
        has locked yet, as the planner foresaw); then one ``alloc_extend`` over the batch.
        Every step that can fail only touches the cache and the pools, and logs its inverse;
        the requests are updated once nothing can fail any more. So when anything raises
        part-way (:class:`PrefillOutOfMemory`, a :class:`~policykit.errors.LoadBackError`, a
        fault in the allocator) the pools, the cache and the requests are left exactly as
        before the round and the error propagates.
        """
        self.check_plan(plan)
        undo: list[Callable[[], None]] = []
        try:
            staged = self._stage(plan.batch, undo)
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        for s in staged:
            self._apply(s, plan.round)

    def check_plan(self, plan: Plan) -> None:
        """Raise :class:`PlanError` unless every entry is the named request's next step."""
        seen: set[str] = set()
        stays = 0
        for e in plan.entries:
            req = self.requests.get(e.request_id)
            where = f"The plan of round {plan.round} gives {e.request_id!r} [{e.start}, {e.end})"
            if req is None:
                raise PlanError(f"{where}, but no such request is on this node.")
            if e.request_id in seen:
                raise PlanError(f"{where} twice.")
            seen.add(e.request_id)
            if e.kind.is_new:
                ok = (
                    req.state is State.WAITING
                    and e.cached >= 0
                    and e.load_back >= 0
                    and e.start == e.cached + e.load_back
                )
            else:
                ok = req is self.chunked and e.start == req.seq_len
            if not ok:
                raise PlanError(
                    f"{where} as a {e.kind.value} chunk, but it is {req.state.value} with "
                    f"{req.seq_len} tokens on the device."
                )
            last = e.end == req.prompt_tokens
            if e.kind is EntryKind.DEFERRED:
                ok = e.end == e.start
            else:
                ok = e.start < e.end <= req.prompt_tokens and last == e.kind.finishes
            if not ok:
                raise PlanError(
                    f"{where} as a {e.kind.value} chunk of its {req.prompt_tokens}-token prompt."
                )
            stays += not e.kind.finishes
        if self.chunked is not None and self.chunked.id not in seen:
            raise PlanError(
                f"The plan of round {plan.round} leaves out the in-progress request "
                f"{self.chunked.id!r}."
            )
        if stays > 1:
            raise PlanError(
                f"The plan of round {plan.round} leaves {stays} requests in progress; a prefill "
                "node has at most one."
            )

    def _stage(self, batch: Iterable[Entry], undo: list[Callable[[], None]]) -> list[_Staged]:
        staged = [_Staged(self.requests[e.request_id], e) for e in batch]
        new = [s for s in staged if s.entry.kind.is_new]
        for s in new:
            if self.swa_pool is not None:
                s.full_hit = self._swa_cache.full_hit(s.req.tokens)
            self._lock_prefix(s, undo)
            if s.entry.load_back and self.swa_pool is not None:
                self._load_back_swa(s, undo)
            elif s.entry.load_back:
                self._load_back(s, undo)
        if self.swa_pool is not None:
            self._alloc_extend_swa(staged, undo)
        else:
            self._alloc_extend(staged, undo)
        return staged

    def _lock_prefix(self, s: _Staged, undo: list[Callable[[], None]]) -> None:
        if not s.entry.cached:
            return  # computed afresh, even if the cache has some of it
        matched, last, pages = self.cache.match(s.req.tokens)
        if matched != s.entry.cached:
            raise PlanError(
                f"The plan gives {s.req.id!r} a {s.entry.cached}-token cached prefix; the cache "
                f"now has {matched}."
            )
        self.cache.lock(last)
        undo.append(lambda: self.cache.unlock(last))
        s.prefix_node, s.prefix_pages = last, pages

    def _alloc(
        self,
        pool: TokenPool,
        num_pages: int,
        undo: list[Callable[[], None]],
        *,
        tokens: int,
        request: str | None,
    ) -> torch.Tensor:
        """Take pages (evicting cached prefix first if the full pool is short), logging both."""
        evictable = 0
        if pool is self.pool:
            short = num_pages - pool.free_pages
            if short > 0:
                self._evict(short * pool.page_size, undo)
            evictable = self.cache.evictable_tokens
        try:
            pages = pool.alloc(num_pages, tokens=tokens, evictable=evictable)
        except PrefillOutOfMemory as err:
            err.request = err.request or request
            raise
        undo.append(lambda: pool.free(pages))
        return pages

    def _evict(self, tokens: int, undo: list[Callable[[], None]]) -> None:
        evicted: list[Node] = []
        try:
            self.cache.evict(tokens, evicted)
        finally:
            undo.extend(partial(self.cache.unevict, leaf) for leaf in evicted)

    def _load_back(self, s: _Staged, undo: list[Callable[[], None]]) -> None:
        req, n = s.req, s.entry.load_back
        start = s.entry.cached
        host = self.host.lookup(req.tokens, start)
        if host is None or host.end - start < n:
            raise PlanError(f"The plan loads back {n} tokens for {req.id!r}; the host has fewer.")
        s.load_pages = self._alloc(
            self.pool, pages_for(n, self.pool.page_size), undo, tokens=n, request=req.id
        )
        s.host_entry = host
        self._copy_back(s, host, n)

    def _copy_back(self, s: _Staged, host: HostEntry, n: int) -> None:
        """Copy a load-back's KV from the host tier, when both sides hold real KV."""
        req, start = s.req, s.entry.cached
        if host.kv is not None and self.pool.k:
            try:
                self.copy_from_host(host, torch.cat([s.prefix_pages, s.load_pages]), start, n)
            except Exception as exc:
                raise LoadBackError(
                    f"Copying the {n}-token host-tier prefix of {req.id!r} to the device failed: "
                    f"{type(exc).__name__}: {exc}",
                    request_id=req.id,
                ) from exc

    def copy_from_host(self, host: HostEntry, pages: torch.Tensor, start: int, n: int) -> None:
        """Copy KV positions ``[start, start + n)`` of ``host`` into the slots of ``pages``."""
        slots = self.pool.slots(pages, start, start + n)
        offset = start - host.kv_from
        assert host.kv is not None
        for layer, (k, v) in enumerate(host.kv):
            self.pool.k[layer][slots] = k[offset : offset + n].to(slots.device)
            self.pool.v[layer][slots] = v[offset : offset + n].to(slots.device)

    def _alloc_extend(self, staged: list[_Staged], undo: list[Callable[[], None]]) -> None:
        page = self.config.page_size
        needs = [(s.entry, extend_pages(s.entry.end, s.entry.start, page)) for s in staged]
        total_pages = sum(n for _, n in needs)
        extend_tokens = sum(e.tokens for e, _ in needs)
        short = eviction_demand(extend_tokens, len(staged), page) - self.pool.free_tokens
        if short > 0:
            self._evict(short, undo)
        if total_pages > self.pool.free_pages:
            raise PrefillOutOfMemory(
                tokens=extend_tokens,
                available=self.pool.free_tokens,
                evictable=self.cache.evictable_tokens,
                request=_first_over(needs, self.pool.free_pages),
            )
        for s, (entry, n) in zip(staged, needs, strict=True):
            rid = entry.request_id
            s.extend_pages = self._alloc(self.pool, n, undo, tokens=entry.tokens, request=rid)

    def _apply(self, s: _Staged, round_no: int) -> None:
        """Record a staged entry on its request (nothing here can fail)."""
        req, entry = s.req, s.entry
        cut = entry.start // self.config.page_size * self.config.page_size
        if cut:
            self._checkpoints.setdefault(req.id, []).append(cut)
        if entry.kind.is_new:
            self.waiting.remove(req)
            req.prefix_node, req.prefix_pages = s.prefix_node, s.prefix_pages
            req.cached_len = entry.cached
            req.own_pages = s.load_pages
            req.host_entry = s.host_entry
            if self.swa_pool is not None:
                branch = s.full_hit if s.full_hit > entry.start else None
                self._swa_state[req.id] = SWAProgress(entry.start, entry.start, 0, branch)
        req.own_pages = _concat(req.own_pages, s.extend_pages)
        if s.swa_pages is not None:
            req.swa_pages = _concat(req.swa_pages, s.swa_pages)
        self._advance(req, entry, round_no)

    def _advance(self, req: Request, entry: Entry, round_no: int) -> None:
        req.seq_len = entry.end
        if req.first_scheduled_round is None:
            req.first_scheduled_round = round_no
        if entry.kind.finishes:
            req.state = State.HELD
            req.finished_round = round_no
            self.held.append(req)
            if self.chunked is req:
                self.chunked = None
        else:
            req.state = State.CHUNKED
            self.chunked = req

    # -- hybrid SWA (SGLang 0.5.23's SWA radix tree, :mod:`policykit.swa_cache`) ------------
    def _host_bounds(self, req: Request) -> tuple[int, ...]:
        """Where the host's nodes cut ``req``'s prompt (``HostTier.node_bounds``)."""
        return self.host.node_bounds(req.tokens, self.config.page_size, self.config.sliding_window)

    def _host_hit(self, tokens: Tokens, matched: int) -> int:
        """The host tier's run right after a device match of ``matched`` tokens, in whole
        pages (what SGLang's match walks on through host-only nodes)."""
        entry = self.host.lookup(tokens, matched)
        page = self.config.page_size
        return 0 if entry is None else (entry.end - matched) // page * page

    @property
    def _swa_cache(self) -> SWAPrefixCache:
        assert isinstance(self.cache, SWAPrefixCache)
        return self.cache

    def _evict_for(
        self, tokens: int, undo: list[Callable[[], None]], swa_tokens: int | None = None
    ) -> None:
        """SGLang's ``evict_to_free_tokens`` on both pools: the full pool with fewer than
        ``tokens`` free is short by the difference, the sliding-window pool likewise for
        ``swa_tokens`` (``tokens`` unless given: an extend's conservative demand asks both
        pools for the same). The full pool's shortfall is evicted first (whole leaves, their
        sliding-window KV too), then what the sliding-window pool still lacks
        (:meth:`SWAPrefixCache.evict_swa`)."""
        cache, swa = self._swa_cache, self.swa_pool
        assert swa is not None
        full_short = max(0, tokens - self.pool.free_tokens)
        swa_short = max(0, (tokens if swa_tokens is None else swa_tokens) - swa.free_tokens)
        swa_target = swa.free_tokens + swa_short
        freed = 0
        if full_short:
            evicted: list[Node] = []
            try:
                cache.evict(full_short, evicted)
            finally:
                undo.extend(partial(cache.unevict, leaf) for leaf in evicted)
            freed = sum(len(n) for n in evicted if n.swa is not None)
        if swa_short:
            cache.evict_swa(swa_short, swa_target, freed, undo)

    def _alloc_extend_swa(self, staged: list[_Staged], undo: list[Callable[[], None]]) -> None:
        """``alloc_paged_token_slots_extend`` (``alloc_token_slots`` for one-token pages)
        under hybrid SWA: evict for the conservative demand in both pools, then take each
        entry's new pages in both (SGLang pairs every full page with a sliding-window one)."""
        page, swa = self.config.page_size, self.swa_pool
        assert swa is not None
        needs = [(s.entry, extend_pages(s.entry.end, s.entry.start, page)) for s in staged]
        total = sum(n for _, n in needs)
        extend_tokens = sum(e.tokens for e, _ in needs)
        self._evict_for(eviction_demand(extend_tokens, len(staged), page), undo)
        for pool in (self.pool, swa):
            if total > pool.free_pages:
                raise PrefillOutOfMemory(
                    tokens=extend_tokens,
                    available=pool.free_tokens,
                    evictable=self.cache.evictable_tokens,
                    pool=pool.name,
                    request=_first_over(needs, min(self.pool.free_pages, swa.free_pages)),
                )
        for s, (entry, n) in zip(staged, needs, strict=True):
            rid = entry.request_id
            s.extend_pages = self._alloc(self.pool, n, undo, tokens=entry.tokens, request=rid)
            s.swa_pages = self._alloc(swa, n, undo, tokens=entry.tokens, request=rid)

    def _load_back_swa(self, s: _Staged, undo: list[Callable[[], None]]) -> None:
        """A load-back under hybrid SWA, as 0.5.23's ``init_load_back``: evict for it in both
        pools, take its full pages and the pages of the sliding-window KV the host holds of it
        (its last window, :func:`~policykit.kernel.swa.swa_host_hit`), and put it into the tree
        (that window live, the part above a tombstone); the request's lock moves to the node
        that ends it."""
        req, n, start = s.req, s.entry.load_back, s.entry.cached
        cache, page, swa = self._swa_cache, self.config.page_size, self.swa_pool
        assert swa is not None
        host = self.host.lookup(req.tokens, start)
        if host is None or host.end - start < n:
            raise PlanError(f"The plan loads back {n} tokens for {req.id!r}; the host has fewer.")
        # the host holds the hit's last window of sliding-window KV; the rest is a tombstone
        windowed = swa_host_hit(n, self.config.sliding_window, page)
        self._evict_for(n, undo, swa_tokens=pages_for(windowed, page) * page)
        pages = self._alloc(self.pool, pages_for(n, page), undo, tokens=n, request=req.id)
        swa_pages = self._alloc(swa, pages_for(windowed, page), undo, tokens=n, request=req.id)
        s.load_pages, s.host_entry = pages, host
        self._copy_back(s, host, n)
        table = _concat(s.prefix_pages, pages)
        end = start + n
        swa_from = end - windowed
        matched, leaf, adopted = cache.insert_swa(
            req.tokens[:end], table, swa_pages, swa_from, start
        )
        undo.append(partial(cache.uninsert, leaf, end - matched, list(cache.recovered)))
        cache.cut(req.tokens[:end], self._host_bounds(req))
        if matched > start:  # the tree had them (past a gated match): ours are duplicates
            self._free_logged(self.pool, pages[: (matched - start) // page], undo)
            dup = max(0, matched - swa_from) // page
            self._free_logged(swa, _unadopted(swa_pages, dup, adopted), undo)
        _, node, _ = cache.match(req.tokens[:end])  # the gated node it locks
        cache.lock(node)
        undo.append(partial(cache.unlock, node))
        if s.prefix_node is not None:
            cache.unlock(s.prefix_node)
            undo.append(partial(cache.lock, s.prefix_node))
        # its table is the path to the loaded leaf; its lock is where the gated match ends
        s.prefix_node, s.prefix_pages, s.load_pages = node, cache.path_pages(leaf), NO_PAGES

    def start_progress(self, req: Request, protected: int, swa_from: int, evicted: int) -> None:
        """Hybrid SWA: ``req`` is in progress since before the first round (a scenario's),
        with ``protected`` tokens in the tree and its sliding-window pages from ``swa_from``."""
        self._swa_state[req.id] = SWAProgress(protected, swa_from, evicted)

    @staticmethod
    def _free_logged(pool: TokenPool, pages: torch.Tensor, undo: list[Callable[[], None]]) -> None:
        pool.free(pages)
        undo.append(partial(pool.reclaim, pages))

    def checkpoint(self) -> None:
        """Hybrid SWA: put the in-progress request's KV so far into the tree, as SGLang 0.5.23
        does before every round (``checkpoint_kv_cache``): its KV out of the window is freed
        (``free_swa_out_of_window_slots``), the rest is inserted, the part freed a tombstone,
        and its lock moves to the node that ends it. Nothing without hybrid SWA (there the
        tree learns a request's chunks when it is released)."""
        req = self.chunked
        if req is not None and self.swa_pool is not None:
            self._insert_progress(req, self._swa_state[req.id], finished=False)

    def _free_out_of_window(self, req: Request, state: SWAProgress, last: int) -> None:
        """Free ``req``'s own sliding-window KV that lies a window (whole pages) before
        position ``last``, as ``free_swa_out_of_window_slots`` does."""
        window, page, swa = self.config.sliding_window, self.config.page_size, self.swa_pool
        assert window is not None and swa is not None
        if last - window < state.evicted + 1:
            return
        state.evicted = max(state.evicted, state.protected)
        upto = kept_from(last, state.evicted, window, page)
        if upto > state.evicted:
            cut = (upto - state.swa_from) // page
            swa.free(req.swa_pages[:cut])
            req.swa_pages = req.swa_pages[cut:]
            state.swa_from = state.evicted = upto

    def _insert_progress(self, req: Request, state: SWAProgress, *, finished: bool) -> None:
        """Insert ``req``'s whole pages the tree does not hold yet (its sliding-window KV from
        ``state.swa_from`` on) and move its lock to the node that ends them, as
        ``checkpoint_into_tree`` does. A request whose match stopped short of the full KV the
        tree had (``state.branching``) is inserted only up to there, once it has got that
        far; an unfinished one frees its KV out of the window first."""
        cache, page, swa = self._swa_cache, self.config.page_size, self.swa_pool
        assert swa is not None
        end = req.seq_len
        branch = state.branching
        if branch is not None and state.protected < branch <= end:
            end = branch
        if not finished:
            self._free_out_of_window(req, state, end - 1)
        aligned = end // page * page
        table = req.pages
        matched, node, adopted = cache.insert_swa(
            req.tokens[:aligned], table, req.swa_pages, state.swa_from, state.protected
        )
        cache.cut(req.tokens[:aligned], self._host_bounds(req))
        if matched > state.protected:  # cached meanwhile (or a tombstone): ours are duplicates
            self.pool.free(table[state.protected // page : matched // page])
            dup = max(0, matched - state.swa_from) // page
            swa.free(_unadopted(req.swa_pages, dup, adopted))
            table = _concat(cache.path_pages(node)[: matched // page], table[matched // page :])
        if req.prefix_node is not None:
            cache.unlock(req.prefix_node)
        cache.lock(node)
        req.prefix_node = node
        req.prefix_pages, req.own_pages = table[: aligned // page], table[aligned // page :]
        taken = max(0, aligned - state.swa_from) // page
        req.swa_pages = req.swa_pages[taken:]
        state.protected, state.swa_from = aligned, max(state.swa_from, aligned)
        if branch is not None and aligned >= branch:
            state.branching = None
            if not finished:
                self._free_out_of_window(req, state, req.seq_len - 1)

    # -- release ---------------------------------------------------------------------------
    def release_due(self, round_no: int) -> list[Request]:
        """Release the KV of held requests whose transfer to decode has completed."""
        delay = self.config.kv_release_rounds
        if delay is None:
            return []
        released = []
        while (
            self.held
            and kv_back(self.held[0].finished_round, delay, round_no)
            and self.transfer_done(self.held[0])
        ):
            req = self.held.popleft()
            self._release(req)
            released.append(req)
        return released

    def release(self, req: Request) -> None:
        """Release a held request's KV now (its transfer to decode completed early)."""
        if req.state is not State.HELD:
            raise ValueError(f"{req.id!r} is {req.state.value}, not holding finished KV")
        self.held.remove(req)
        self._release(req)

    def _release(self, req: Request) -> None:
        """Hand a finished request's KV to the prefix cache and drop its lock.

        Whole pages become cached (evictable) prefix, unless the cache already has those tokens;
        duplicates and the partly filled last page go back to the free list.
        """
        if self.swa_pool is not None:
            self._insert_progress(req, self._swa_state.pop(req.id), finished=True)
            self.pool.free(req.own_pages)  # the partly filled last page
            self._drop_kv(req)
            req.state = State.DONE
            return
        page = self.config.page_size
        aligned = cached_on_release(req.seq_len, page)
        table = req.pages
        already = self._insert_by_checkpoint(req, aligned, table) if aligned else 0
        own_start = req.cached_len // page
        dup_end = max(already // page, own_start)
        self.pool.free(_concat(table[own_start:dup_end], table[aligned // page :]))
        self._drop_kv(req)
        req.state = State.DONE

    def _insert_by_checkpoint(self, req: Request, aligned: int, table: torch.Tensor) -> int:
        """Cache ``req``'s first ``aligned`` tokens as SGLang 0.5.23's tree holds them: one node
        per chunk, cut where each chunk began (page floor). The engine checkpoints a chunked
        request into its tree before every round (``checkpoint_kv_cache``), so eviction later
        takes the last chunk first and may stop part-way through the request's KV. It also
        cuts where the host's nodes along the prompt end (``HostTier.node_bounds``): SGLang's
        tree keeps a host node's bounds when KV is inserted through it.

        Returns how many leading tokens were cached already (by someone else): the caller
        frees its duplicate pages.
        """
        page = self.config.page_size
        bounds = (
            *self._checkpoints.get(req.id, ()),
            *self.host.node_bounds(req.tokens, page, None),
        )
        cuts = {b for b in bounds if 0 < b < aligned}
        already = prev = 0
        for end in (*sorted(cuts), aligned):
            got = self.cache.insert(req.tokens[:end], table)
            if got > prev:
                already = got
            prev = end
        return already

    def _drop_kv(self, req: Request) -> None:
        """Unlock the request's prefix and forget its pages (already returned or cached)."""
        self._checkpoints.pop(req.id, None)
        if req.prefix_node is not None:
            self.cache.unlock(req.prefix_node)
        if self.swa_pool is not None:
            self.swa_pool.free(req.swa_pages)
        req.own_pages = req.prefix_pages = req.swa_pages = NO_PAGES
        req.prefix_node = None
        req.host_entry = None

    # -- ending a request early ------------------------------------------------------------
    def reject(self, req: Request, reason: str) -> None:
        """Refuse a waiting request for good (it can never fit), with ``reason``."""
        if req.state is not State.WAITING:
            raise ValueError(f"only a waiting request can be rejected; {req.id!r} is {req.state}")
        self.waiting.remove(req)
        req.state, req.reason = State.REJECTED, reason

    def fail(self, req: Request, reason: str) -> None:
        """Fail a waiting or in-progress request cleanly: its KV goes back to the free list
        (a half-computed prompt is not worth caching), its prefix lock is dropped."""
        if req.state is State.WAITING:
            self.waiting.remove(req)
        elif req.state is State.CHUNKED:
            self.pool.free(req.own_pages)
            self._swa_state.pop(req.id, None)
            self._drop_kv(req)
            self.chunked = None
        else:
            raise ValueError(
                f"only a waiting or in-progress request can fail; {req.id!r} is {req.state.value}"
            )
        req.state, req.reason = State.FAILED, reason

    # -- introspection ---------------------------------------------------------------------
    def pending_releases(self) -> bool:
        """Whether held KV will still come back (:func:`policykit.kernel.kv_due`)."""
        # every held request finished and shares the node's release setting: the oldest answers
        # for all of them, in one step however many are held
        never = self.config.kv_release_rounds is None
        return bool(self.held) and kv_due(INT_LOGIC, self.held[0].finished_round, [], never)

    def owned_pages(self) -> dict[str, torch.Tensor]:
        """Every page of the full pool by owner (free list, cache, each request)."""
        owners = {"free": self.pool.free_page_ids(), "cache": self.cache.cached_pages()}
        for req in self.requests.values():
            if req.own_pages.numel():
                owners[req.id] = req.own_pages
        return owners
