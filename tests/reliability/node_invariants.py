"""The bookkeeping invariants of a prefill node, checked after every step of every test here.

Each one is something an engine gets wrong in production: a page owned twice (silent KV
corruption), a page owned by nobody (a leaked slot), a lock nobody will release (memory that
never comes back), a request in two queues (computed twice) or in none (lost).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from policykit.node import PrefillNode
from policykit.pages import pages_for
from policykit.plan import Plan
from policykit.request import State
from policykit.swa_cache import SWAPrefixCache


def check_node(node: PrefillNode) -> None:
    """Assert every invariant of ``node``; the message says which one broke."""
    _check_pages(node)
    _check_cache(node)
    _check_states(node)
    _check_swa(node)


def check_plan(plan: Plan) -> None:
    """Ledger sanity: what this batch leaves can never be less than what may be promised."""
    for mark in plan.marks:
        assert mark.cur_rem_tokens >= mark.rem_total_tokens, f"ledger broken after {mark}"


def _check_pages(node: PrefillNode) -> None:
    pool = node.pool
    assert 0 <= pool.free_pages <= pool.num_pages
    assert pool.free_tokens + pool.used_tokens == pool.total_tokens
    owners = node.owned_pages()
    pages = torch.cat(list(owners.values()))
    counts = torch.bincount(pages, minlength=pool.num_pages)
    assert counts.numel() == pool.num_pages, "a page id outside the pool"
    twice = torch.nonzero(counts > 1).flatten().tolist()
    lost = torch.nonzero(counts == 0).flatten().tolist()
    assert not twice, f"pages {twice[:8]} have two owners: {_who(owners, twice[:8])}"
    assert not lost, f"pages {lost[:8]} are owned by nobody (leaked)"


def _who(owners: dict[str, torch.Tensor], pages: list[int]) -> dict[int, list[str]]:
    return {p: [o for o, t in owners.items() if bool((t == p).any())] for p in pages}


def _check_cache(node: PrefillNode) -> None:
    cache = node.cache
    nodes = list(cache._nodes())
    holders: Counter[int] = Counter()
    for req in node.requests.values():
        if req.prefix_node is not None:
            holders.update(n.id for n in req.prefix_node.path())
    evictable = protected = pinned = 0
    for n in nodes:
        assert n.lock_ref >= 0, f"negative lock_ref on cache node {n.id}"
        assert n.lock_ref == holders[n.id] + n.pins, (
            f"cache node {n.id}: lock_ref {n.lock_ref} but {holders[n.id]} request(s) and "
            f"{n.pins} pin(s) hold it"
        )
        assert n.pages.numel() * cache.page_size == len(n), f"cache node {n.id} pages/key"
        if n.lock_ref:
            protected += len(n)
        else:
            evictable += len(n)
        if n.pins:
            pinned += len(n)
        if n.lock_ref and n.parent is not cache.root:
            assert n.parent.lock_ref > 0, "a locked node under an unlocked parent"
    assert cache.evictable_tokens == evictable, (cache.evictable_tokens, evictable)
    assert cache.protected_tokens == protected, (cache.protected_tokens, protected)
    assert cache.pinned_tokens == pinned, (cache.pinned_tokens, pinned)


def _check_states(node: PrefillNode) -> None:
    page = node.config.page_size
    containers = {
        State.FUTURE: [q.id for q in node.future],
        State.WAITING: [q.id for q in node.waiting],
        State.CHUNKED: [] if node.chunked is None else [node.chunked.id],
        State.HELD: [q.id for q in node.held],
    }
    for state, ids in containers.items():
        assert len(ids) == len(set(ids)), f"a request is twice in the {state.value} queue"
        expected = sorted(q.id for q in node.requests.values() if q.state is state)
        assert sorted(ids) == expected, f"{state.value}: queue {ids} vs states {expected}"
    for req in node.requests.values():
        if req.state in (State.CHUNKED, State.HELD):
            # under hybrid SWA the tree also holds its checkpointed chunks (policykit.swa_cache)
            locked = req.prefix_pages.numel() * page
            assert locked == req.cached_len or (node.swa_pool is not None and locked >= 0)
            own = pages_for(req.seq_len, page) - locked // page
            assert req.own_pages.numel() == own, f"{req.id}: {req.own_pages.numel()} != {own}"
            if req.prefix_node is not None:
                path = [n.pages for n in reversed(list(req.prefix_node.path()))]
                expected = torch.cat(path) if path else req.prefix_pages[:0]
                assert torch.equal(req.prefix_pages, expected), f"{req.id}: stale prefix"
            if req.state is State.HELD:
                assert req.seq_len == req.prompt_tokens
            else:
                assert 0 < req.seq_len < req.prompt_tokens
        else:
            assert req.own_pages.numel() == 0 and req.prefix_pages.numel() == 0
            assert req.swa_pages.numel() == 0 and req.prefix_node is None
        if req.state in (State.REJECTED, State.FAILED):
            assert req.reason, f"{req.id} is {req.state.value} without a reason"


def _check_swa(node: PrefillNode) -> None:
    swa = node.swa_pool
    if swa is None:
        return
    held = [q.swa_pages for q in node.requests.values() if q.swa_pages.numel()]
    cache = node.cache
    cached = cache.cached_swa_pages() if isinstance(cache, SWAPrefixCache) else []
    pages = torch.cat([swa.free_page_ids(), *held, *([cached] if len(cached) else [])])
    assert torch.equal(torch.sort(pages).values, torch.arange(swa.num_pages)), "swa pages"


@dataclass(frozen=True)
class Fingerprint:
    """Everything a rolled-back commit must leave exactly as it was (cache splits aside: a
    split changes the tree's shape, not what is cached, locked or owned)."""

    free: tuple[int, ...]
    swa_free: tuple[int, ...] | None
    evictable: int
    protected: int
    cached: tuple[tuple[int, int], ...]  # (page, lock_ref) for every cached page
    requests: tuple[tuple, ...]


def fingerprint(node: PrefillNode) -> Fingerprint:
    cached = []
    for n in node.cache._nodes():
        cached.extend((int(p), n.lock_ref) for p in n.pages)
    reqs = tuple(
        (
            q.id,
            q.state,
            q.seq_len,
            q.cached_len,
            tuple(q.own_pages.tolist()),
            tuple(q.prefix_pages.tolist()),
            tuple(q.swa_pages.tolist()),
        )
        for q in node.requests.values()
    )
    return Fingerprint(
        tuple(node.pool.free_page_ids().tolist()),
        None if node.swa_pool is None else tuple(node.swa_pool.free_page_ids().tolist()),
        node.cache.evictable_tokens,
        node.cache.protected_tokens,
        tuple(sorted(cached)),
        reqs,
    )
