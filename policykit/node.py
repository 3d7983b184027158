"""The simulated prefill node: KV pool(s), prefix cache, host tier and the requests on it.

The node *commits* plans (allocates what a plan decided) and *releases* the KV of requests
whose transfer to decode completed. It does not decide anything: deciding is the planner's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from policykit.errors import PrefillOutOfMemory
from policykit.host_tier import HostTier
from policykit.plan import Entry, Plan
from policykit.policy import EngineConfig
from policykit.pool import TokenPool, extend_pages, pages_for
from policykit.prefix_cache import PrefixCache
from policykit.request import Request, State

#: KV a prefill node keeps per request for generated tokens: the first token only
FIRST_TOKENS = 1


@dataclass(frozen=True)
class NodeConfig:
    """Fixed facts about the node (what a server is started with)."""

    page_size: int
    chunked_prefill_size: int
    max_prefill_tokens: int | None = None
    #: rounds a finished request holds its KV (transfer to decode); None: the whole run
    kv_release_rounds: int | None = None
    #: hybrid SWA: tokens of the sliding window; None: no sliding-window layers
    sliding_window: int | None = None

    @property
    def engine(self) -> EngineConfig:
        return EngineConfig(
            page_size=self.page_size,
            chunked_prefill_size=self.chunked_prefill_size,
            hybrid_swa=self.sliding_window is not None,
        )


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
        config: NodeConfig,
        pool: TokenPool,
        *,
        swa_pool: TokenPool | None = None,
        cache: PrefixCache | None = None,
        host: HostTier | None = None,
    ) -> None:
        if (swa_pool is None) != (config.sliding_window is None):
            raise ValueError("a sliding-window pool goes with a sliding_window size, and only then")
        self.config = config
        self.pool = pool
        self.swa_pool = swa_pool
        self.cache = cache or PrefixCache(pool)
        self.host = host or HostTier()
        self.requests: dict[str, Request] = {}
        self.future: deque[Request] = deque()
        self.waiting: deque[Request] = deque()
        self.chunked: Request | None = None
        self.held: deque[Request] = deque()
        #: whether a held request's KV has reached the decode node; the harness replaces this
        #: with a check of its real copy, so slots are never freed under an in-flight transfer
        self.transfer_done: Callable[[Request], bool] = lambda req: True

    # -- requests --------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request; it joins the waiting queue in its arrival round."""
        if request.id in self.requests:
            raise ValueError(f"duplicate request id {request.id!r}")
        self.requests[request.id] = request
        request.state = State.FUTURE
        self.future.append(request)

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

    # -- commit ----------------------------------------------------------------------------
    def commit(self, plan: Plan) -> None:
        """Allocate what ``plan`` decided, in the engine's order.

        Locks first (so a load-back's eviction cannot take a prefix the plan counted on), then
        host load-backs, then one ``alloc_extend`` over the whole batch. Raises
        :class:`PrefillOutOfMemory` when the pool cannot pay; allocation is all-or-nothing, so
        the pool stays consistent for inspection.
        """
        batch = plan.batch
        new = [e for e in batch if e.kind.is_new]
        for entry in new:
            self._lock_prefix(self.requests[entry.request_id], entry)
        for entry in new:
            if entry.load_back:
                self._load_back(self.requests[entry.request_id], entry)
        self._alloc_extend(batch)
        for entry in batch:
            self._advance(self.requests[entry.request_id], entry, plan.round)

    def _lock_prefix(self, req: Request, entry: Entry) -> None:
        matched, last, pages = self.cache.match(req.tokens)
        if matched != entry.cached:
            raise RuntimeError(
                f"plan/commit mismatch: {req.id} planned a {entry.cached}-token cached prefix, "
                f"the cache now has {matched}"
            )
        self.cache.lock(last)
        req.prefix_node, req.prefix_pages, req.cached_len = last, pages, matched
        req.seq_len = matched
        if self.waiting and self.waiting[0] is req:
            self.waiting.popleft()
        else:
            self.waiting.remove(req)

    def _take_pages(self, num_pages: int, tokens: int, request: str) -> torch.Tensor:
        short = num_pages - self.pool.free_pages
        if short > 0:
            self.cache.evict(short * self.pool.page_size)
        try:
            return self.pool.alloc(num_pages, tokens=tokens, evictable=self.cache.evictable_tokens)
        except PrefillOutOfMemory as err:
            err.request = request
            raise

    def _load_back(self, req: Request, entry: Entry) -> None:
        host = self.host.lookup(req.tokens, req.seq_len)
        if host is None or host.end - req.seq_len < entry.load_back:
            raise RuntimeError(f"plan/commit mismatch: {req.id}'s host prefix is gone")
        pages = self._take_pages(
            pages_for(entry.load_back, self.pool.page_size), entry.load_back, req.id
        )
        req.own_pages = pages
        start = req.seq_len
        req.seq_len += entry.load_back
        req.host_entry = host
        if host.kv is not None and self.pool.k:
            slots = self.pool.slots(req.pages, start, req.seq_len)
            offset = start - host.start
            for layer, (k, v) in enumerate(host.kv):
                self.pool.k[layer][slots] = k[offset : offset + entry.load_back].to(slots.device)
                self.pool.v[layer][slots] = v[offset : offset + entry.load_back].to(slots.device)

    def _alloc_extend(self, batch: Iterable[Entry]) -> None:
        page = self.config.page_size
        needs = [(e, extend_pages(e.end, e.start, page)) for e in batch]
        total_pages = sum(n for _, n in needs)
        extend_tokens = sum(e.tokens for e, _ in needs)
        if self.swa_pool is not None:
            swa_need = [(e, e.tokens + page) for e, _ in needs]
            if sum(n for _, n in swa_need) > self.swa_pool.free_tokens:
                raise PrefillOutOfMemory(
                    tokens=extend_tokens,
                    available=self.swa_pool.free_tokens,
                    evictable=0,
                    pool="swa",
                    request=_first_over(swa_need, self.swa_pool.free_tokens),
                )
        short = total_pages - self.pool.free_pages
        if short > 0:
            self.cache.evict(short * page)
        if total_pages > self.pool.free_pages:
            raise PrefillOutOfMemory(
                tokens=extend_tokens,
                available=self.pool.free_tokens,
                evictable=self.cache.evictable_tokens,
                request=_first_over(needs, self.pool.free_pages),
            )
        for entry, n in needs:
            req = self.requests[entry.request_id]
            req.own_pages = torch.cat([req.own_pages, self.pool.alloc(n)])
            if self.swa_pool is not None:
                req.swa_pages = torch.cat([req.swa_pages, self.swa_pool.alloc(entry.tokens)])

    def _advance(self, req: Request, entry: Entry, round_no: int) -> None:
        req.seq_len = entry.end
        if req.first_scheduled_round is None:
            req.first_scheduled_round = round_no
        if self.swa_pool is not None and self.config.sliding_window is not None:
            keep = min(self.config.sliding_window, req.swa_pages.numel())
            self.swa_pool.free(req.swa_pages[: req.swa_pages.numel() - keep])
            req.swa_pages = req.swa_pages[req.swa_pages.numel() - keep :]
        if entry.kind.finishes:
            req.state = State.HELD
            req.finished_round = round_no
            self.held.append(req)
            if self.chunked is req:
                self.chunked = None
        else:
            req.state = State.CHUNKED
            self.chunked = req

    # -- release ---------------------------------------------------------------------------
    def release_due(self, round_no: int) -> list[Request]:
        """Release the KV of held requests whose transfer to decode has completed."""
        delay = self.config.kv_release_rounds
        if delay is None:
            return []
        released = []
        while (
            self.held
            and self.held[0].finished_round + delay <= round_no
            and self.transfer_done(self.held[0])
        ):
            req = self.held.popleft()
            self.release(req)
            released.append(req)
        return released

    def release(self, req: Request) -> None:
        """Hand a finished request's KV to the prefix cache and drop its lock.

        Whole pages become cached (evictable) prefix, unless the cache already has those tokens;
        duplicates and the partly filled last page go back to the free list.
        """
        page = self.config.page_size
        aligned = req.seq_len // page * page
        table = req.pages
        already = self.cache.insert(req.tokens[:aligned], table) if aligned else 0
        own_start = req.cached_len // page
        dup_end = max(already // page, own_start)
        to_free = [table[own_start:dup_end], table[aligned // page :]]
        self.pool.free(torch.cat(to_free))
        if req.prefix_node is not None:
            self.cache.unlock(req.prefix_node)
        if self.swa_pool is not None:
            self.swa_pool.free(req.swa_pages)
        req.own_pages = req.own_pages[:0]
        req.prefix_pages = req.prefix_pages[:0]
        req.swa_pages = req.swa_pages[:0]
        req.prefix_node = None
        req.state = State.DONE

    # -- introspection ---------------------------------------------------------------------
    def pending_releases(self) -> bool:
        return bool(self.held) and self.config.kv_release_rounds is not None

    def owned_pages(self) -> dict[str, torch.Tensor]:
        """Every page of the full pool by owner (free list, cache, each request)."""
        owners = {"free": self.pool.free_page_ids(), "cache": self.cache.cached_pages()}
        for req in self.requests.values():
            if req.own_pages.numel():
                owners[req.id] = req.own_pages
        return owners
