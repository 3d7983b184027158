"""The prefix cache of a hybrid sliding-window model, kept as SGLang 0.5.23 keeps it.

SGLang's ``UnifiedRadixCache`` with its ``SWA`` component stores a request's sliding-window
KV in the same radix tree as its full KV, and four rules follow from that, each of which
decides what a later round can admit:

* **Tombstones.** A node's sliding-window KV can be gone while its full KV stays (the node is
  a *tombstone* for the window). A request's KV out of its window is freed as a tombstone when
  it is checkpointed, and eviction for sliding-window slots tombstones inner nodes.
* **Gated matches.** A cached prefix matches only up to a node that ends a run of at least one
  window of live sliding-window KV (counted from the last tombstone, or from the root):
  attention over the window needs it. A prefix whose window was taken matches nothing past it.
* **Window locks.** Locking a node locks its full KV up to the root, but its sliding-window KV
  only for the nodes that cover one window back from it (tombstones counted by length). The
  rest of the path stays evictable for sliding-window slots, and the sliding-window budget
  counts it as room.
* **Eviction by the sliding-window LRU.** When the sliding-window pool is short, SGLang walks
  its own LRU list of nodes with live sliding-window KV, least recent first, skipping locked
  ones: a leaf goes whole (its full KV too), an inner node becomes a tombstone.

A node's ``swa`` holds its sliding-window pages, None for a tombstone; ``swa_access`` is its
place in the sliding-window LRU, refreshed for a matched or inserted node and the nodes of
one window (plus a page) above it, as ``reset_node_and_window_ancestors_mru`` does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable
from functools import partial
from typing import Any

import torch

from policykit.ledger import maximum
from policykit.pages import pages_for
from policykit.pool import TokenPool
from policykit.prefix_cache import Node, PrefixCache, Tokens


def window_start(tokens: int, window: int | None, page: int) -> int:
    """Where a cached sequence of ``tokens`` keeps its sliding-window KV from when only its
    last window survives: the last whole pages that cover one window (a prefix matches only
    through a window of it), all of it without hybrid SWA. A scenario's cached prefixes and
    its in-progress request are laid out this way, as a released request's KV is left once
    the sliding-window LRU has taken what is out of its window."""
    if window is None or tokens <= window:
        return 0
    return (tokens - window) // page * page


def kept_from(last: Any, evicted: Any, window: int, page: int) -> Any:
    """Where a request's own sliding-window KV starts once what lies out of the window of
    position ``last`` is freed (``free_swa_out_of_window_slots``): a window rounded up to
    whole pages back from ``last``, floored to a page, never before ``evicted``. Plain
    arithmetic, on ints and the checker's terms alike."""
    keep = pages_for(max(window, page), page) * page
    return maximum(evicted, last - keep) // page * page


class SWAPrefixCache(PrefixCache):
    """A :class:`PrefixCache` whose nodes also hold sliding-window KV (see the module
    docstring). ``swa_evictable_tokens`` is what SGLang's ``swa_evictable_size`` reports."""

    def __init__(self, pool: TokenPool, swa_pool: TokenPool, window: int) -> None:
        super().__init__(pool)
        self.swa_pool = swa_pool
        self.window = window
        self.swa_evictable_tokens = 0
        self._swa_clock = itertools.count(1)
        #: the tombstones the last :meth:`insert_swa` gave sliding-window KV (to undo it)
        self.recovered: list[Node] = []
        #: how many tokens the host tier holds right after a device match of ``tokens`` that
        #: ends at ``matched`` (whole pages); the node with a host tier sets it
        self.host_hit: Callable[[Tokens, int], int] = lambda tokens, matched: 0

    # -- lookup ----------------------------------------------------------------------------
    def match(self, tokens: Tokens, gone: Collection[int] = ()) -> tuple[int, Node, torch.Tensor]:
        """The longest cached prefix of ``tokens`` that ends a window of live sliding-window
        KV (``SWAComponent.create_match_validator``). The walk goes as far as the full KV
        does, splitting where it ends inside a node, but only the gated part is touched."""
        path = []
        for child, common in self._descend(tokens):
            if child.id in gone:
                break
            path.append(child if common == len(child) else self._split(child, common))
        path = path[: self._gated(path)]
        now = next(self._clock)
        for n in path:
            n.last_access = now
        best = path[-1] if path else self.root
        matched = sum(len(n) for n in path)
        self.refresh(best, self.host_hit(tokens, matched))
        pages = torch.cat([n.pages for n in path]) if path else self.root.pages
        return matched, best, pages

    def full_hit(self, tokens: Tokens) -> int:
        """How much of ``tokens`` the tree holds full KV of, ungated (whole pages), without
        touching or splitting anything: SGLang's ``full_kv_hit_length``."""
        return sum(common for _, common in self._descend(tokens))

    def peek_window(self, tokens: Tokens) -> tuple[int, int]:
        """The gated match of ``tokens`` (whole nodes) and the evictable sliding-window KV a
        lock on it would take, touching and splitting nothing."""
        path = [child for child, common in self._descend(tokens) if common == len(child)]
        path = path[: self._gated(path)]
        if not path:
            return 0, 0
        held = sum(len(n) for n in self.swa_unlocked_on_path(path[-1]))
        return sum(len(n) for n in path), held

    def _gated(self, path: list[Node]) -> int:
        """How many nodes of ``path`` a match may take: up to the last one that ends a window
        of live sliding-window KV since the last tombstone (the root counts as live)."""
        run: float = float("inf")
        best = 0
        for i, n in enumerate(path):
            if n.swa is None:
                run = 0
                continue
            run += len(n)
            if run >= self.window:
                best = i + 1
        return best

    def refresh(self, node: Node, beyond: int = 0) -> None:
        """Make ``node`` the most recent in the sliding-window LRU, and the live nodes of one
        window and a page above it just older, nearest first. A match that goes on into the
        host tier for ``beyond`` tokens refreshes from the end of those (SGLang's match ends
        at the last host node, whose sliding-window KV is not on the device), so they count
        against the window and a page."""
        span, live = beyond, []
        while node is not self.root and span < self.window + self.page_size:
            if node.swa is not None:
                live.append(node)
            span += len(node)
            assert node.parent is not None
            node = node.parent
        for n in reversed(live):
            n.swa_access = next(self._swa_clock)

    def _split(self, child: Node, at: int) -> Node:
        upper = super()._split(child, at)
        upper.swa_lock = child.swa_lock
        upper.swa_access = child.swa_access
        if child.swa is not None:
            cut = at // self.page_size
            upper.swa, child.swa = child.swa[:cut], child.swa[cut:]
        return upper

    # -- locks -----------------------------------------------------------------------------
    def window_nodes(self, node: Node) -> list[Node]:
        """The nodes a lock on ``node`` holds sliding-window KV of: ``node`` and its ancestors
        until they cover one window (tombstones counted by length, as
        ``SWAComponent.acquire_component_lock`` counts them)."""
        out, covered = [], 0
        for n in node.path():
            if covered >= self.window:
                break
            out.append(n)
            covered += len(n)
        return out

    def swa_unlocked_on_path(self, node: Node) -> list[Node]:
        """The nodes whose live sliding-window KV a lock on ``node`` takes out of the
        evictable total."""
        return [n for n in self.window_nodes(node) if n.swa_lock == 0 and n.swa is not None]

    def lock(self, node: Node) -> None:
        super().lock(node)
        for n in self.window_nodes(node):
            if n.swa_lock == 0 and n.swa is not None:
                self.swa_evictable_tokens -= len(n)
            n.swa_lock += 1

    def unlock(self, node: Node) -> None:
        for n in self.window_nodes(node):
            if n.swa_lock <= 0:
                raise RuntimeError("prefix cache: window unlock of a node that is not locked")
            n.swa_lock -= 1
            if n.swa_lock == 0 and n.swa is not None:
                self.swa_evictable_tokens += len(n)
        super().unlock(node)

    # -- insert / evict --------------------------------------------------------------------
    def insert_swa(
        self,
        tokens: Tokens,
        pages: torch.Tensor,
        swa_pages: torch.Tensor,
        swa_from: int,
        protected: int = 0,
    ) -> tuple[int, Node, list[int]]:
        """Cache the page-aligned ``tokens`` whose full KV sits on ``pages`` and whose
        sliding-window KV, from position ``swa_from`` on, on ``swa_pages`` (one per page from
        there). What lies before ``swa_from`` is a tombstone. Returns how many leading tokens
        were cached already, the node that ends ``tokens``, and the indices into ``swa_pages``
        of the pages the tree took over for nodes it had already.

        As SGLang's insert does, a new leaf is cut where its live sliding-window KV starts,
        and its live part is capped at one window (whole pages): locking the leaf then holds
        one window of sliding-window KV, not a whole chunk's. A cached node past
        ``protected`` (what the inserting request had locked) that is a tombstone takes the
        incoming sliding-window KV (``update_component_on_insert_overlap``); its full KV stays
        and the caller frees the incoming duplicate, as SGLang does for a locked node."""
        page = self.page_size
        length = len(tokens) // page * page
        matched, node, path = self._walk(tokens[:length])
        self.recovered = []
        adopted = self._recover(path, swa_pages, swa_from, protected)
        if matched < length:
            node = self._leaf(tokens, matched, length, pages, node)
            live = max(swa_from, matched)
            if live < length:
                self._publish(node, matched, live, length, swa_pages, swa_from)
        self.refresh(node)
        return matched, node, adopted

    def _walk(self, tokens: Tokens) -> tuple[int, Node, list[Node]]:
        """Walk the cached prefix of ``tokens`` as an insert does (no gate): touch it, split
        where it ends inside a node."""
        now = next(self._clock)
        path = []
        for child, common in self._descend(tokens):
            if common < len(child):
                child = self._split(child, common)
            child.last_access = now
            path.append(child)
        return sum(len(n) for n in path), path[-1] if path else self.root, path

    def _recover(
        self, path: list[Node], swa_pages: torch.Tensor, swa_from: int, protected: int
    ) -> list[int]:
        """Give the tombstones of ``path`` past ``protected`` the incoming sliding-window KV
        from ``swa_from`` on (cut where it starts); returns the indices into ``swa_pages`` of
        the pages they took."""
        page, start = self.page_size, 0
        taken: list[int] = []
        for n in path:
            end = start + len(n)
            live = max(start, swa_from)
            if n.swa is None and end > protected and live < end:
                if live > start:
                    self._split(n, live - start)  # the upper half stays a tombstone
                first = (live - swa_from) // page
                n.swa = swa_pages[first : first + (end - live) // page].clone()
                self.recovered.append(n)
                taken += range(first, first + (end - live) // page)
                if n.swa_lock == 0:
                    self.swa_evictable_tokens += len(n)
                n.swa_access = next(self._swa_clock)
            start = end
        return taken

    def _leaf(
        self, tokens: Tokens, start: int, end: int, pages: torch.Tensor, parent: Node
    ) -> Node:
        page = self.page_size
        leaf = Node(tuple(tokens[start:end]), pages[start // page : end // page].clone(), parent)
        leaf.last_access = next(self._clock)
        self._attach(leaf)
        self.evictable_tokens += len(leaf)
        return leaf

    def _publish(
        self,
        leaf: Node,
        start: int,
        live: int,
        end: int,
        swa_pages: torch.Tensor,
        swa_from: int,
    ) -> None:
        """Give ``leaf`` (tokens ``[start, end)``) its sliding-window KV from ``live`` on,
        cutting it there and capping the live part at one window."""
        page = self.page_size
        node = leaf
        if live > start:
            self._split(leaf, live - start)  # the upper half stays a tombstone
        tail = -(-self.window // page) * page
        parts = [node]
        if end - live > tail:
            parts.insert(0, self._split(node, end - live - tail))
        at = live
        for n in parts:  # older first: the tail ends most recent
            first = (at - swa_from) // page
            n.swa = swa_pages[first : first + len(n) // page].clone()
            self.swa_evictable_tokens += len(n)
            n.swa_access = next(self._swa_clock)
            at += len(n)

    def cut(self, tokens: Tokens, bounds: Iterable[int]) -> None:
        """Split the cached nodes along ``tokens`` at each of ``bounds`` (page-aligned): where
        SGLang's tree has node bounds this one would not, a host node's, which its tree keeps
        when KV is inserted through it. A node in a window lock is left whole (the lock was
        counted over its nodes; a node is cut when it is made, before any lock)."""
        for bound in sorted(set(bounds)):
            for child, common in self._descend(tokens[:bound]):
                if common < len(child) and child.swa_lock == 0:
                    self._split(child, common)

    def path_pages(self, node: Node) -> torch.Tensor:
        """The full pages of every node from the root to ``node``."""
        pieces = [n.pages for n in node.path()]
        return torch.cat(pieces[::-1]) if pieces else self.root.pages

    def uninsert(self, node: Node, tokens: int, recovered: list[Node]) -> None:
        """Undo an insert that made the last ``tokens`` of the path to the leaf ``node`` and
        gave the ``recovered`` tombstones sliding-window KV (a failed commit's rollback: the
        pages go back with their allocation)."""
        for n in recovered:
            if n.swa_lock == 0:
                self.swa_evictable_tokens -= len(n)
            n.swa = None
        while tokens > 0:
            parent = node.parent
            assert parent is not None
            tokens -= len(node)
            self._detach(node)
            self.evictable_tokens -= len(node)
            if node.swa is not None:
                self.swa_evictable_tokens -= len(node)
            node = parent

    def cached_swa_pages(self) -> torch.Tensor:
        """Every sliding-window page the cache owns (for the pool's ownership invariant)."""
        pieces = [n.swa for n in self._nodes() if n.swa is not None]
        return torch.cat(pieces) if pieces else self.root.pages

    def evict(self, tokens: int, journal: list[Node] | None = None) -> int:
        """Free least recently used unlocked leaves, full and sliding-window KV both, until
        ``tokens`` full slots were released (``journal``: see :meth:`PrefixCache.evict`)."""
        freed = 0
        for leaf in self.victims(tokens):
            self._drop(leaf)
            freed += len(leaf)
            if journal is not None:
                journal.append(leaf)
        return freed

    def _drop(self, leaf: Node) -> None:
        """Take a leaf out whole: its full KV and, if live, its sliding-window KV."""
        self._detach(leaf)
        self.pool.free(leaf.pages)
        self.evictable_tokens -= len(leaf)
        if leaf.swa is not None:
            self.swa_pool.free(leaf.swa)
            self.swa_evictable_tokens -= len(leaf)

    def unevict(self, leaf: Node) -> None:
        if leaf.swa is not None:
            self.swa_pool.reclaim(leaf.swa)
            self.swa_evictable_tokens += len(leaf)
        super().unevict(leaf)

    def evict_swa(self, quota: int, target: int, freed: int, undo: list[Callable[[], None]]) -> int:
        """SGLang's sliding-window eviction walk: least recent live, unlocked sliding-window
        KV first; a leaf goes whole (full KV too), an inner node becomes a tombstone. Stops
        once ``quota`` sliding-window slots were freed (``freed`` already were, by the leaves a
        full eviction took) or the pool has ``target`` free. Each step logs its inverse in
        ``undo``. Returns the sliding-window slots freed in all."""
        order = sorted(
            (n for n in self._nodes() if n.swa is not None and n.swa_lock == 0),
            key=lambda n: n.swa_access,
        )
        for n in order:
            if freed >= quota or self.swa_pool.free_tokens >= target:
                break
            freed += len(n)
            if not n.children and n.lock_ref == 0:
                self._drop(n)
                undo.append(partial(self.unevict, n))
            else:
                swa = n.swa
                assert swa is not None  # ``order`` holds only nodes with sliding-window KV
                undo.append(partial(self._revive, n, swa))
                self.swa_pool.free(swa)
                self.swa_evictable_tokens -= len(n)
                n.swa = None
        return freed

    def _revive(self, node: Node, swa: torch.Tensor) -> None:
        """Undo a tombstone (a failed commit's rollback)."""
        self.swa_pool.reclaim(swa)
        node.swa = swa
        self.swa_evictable_tokens += len(node)
