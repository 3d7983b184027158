"""Radix prefix cache: KV of token prefixes kept on the device after their requests finished.

Cached KV is free memory in disguise: a node nobody holds (``lock_ref == 0``) can be evicted to
pay for a new allocation, so the scheduler's memory *baseline* is ``free + evictable``. A request
that reuses a cached prefix locks the path from the root to its match; locked nodes are
*protected* and no longer count as evictable. That is why a lock can lower the baseline in the
middle of admission, and why the admission check is repeated after it.

Keys are matched a whole page at a time, as in the engines: a partly filled page is never shared.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterator, Sequence

import torch

from policykit.pool import TokenPool

Tokens = Sequence[int]


class Node:
    """One edge of the radix tree: a run of page-aligned tokens and the pages holding their KV."""

    __slots__ = (
        "children",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "pages",
        "parent",
        "pins",
        "swa",
        "swa_access",
        "swa_lock",
    )
    _ids = itertools.count()

    def __init__(self, key: tuple[int, ...], pages: torch.Tensor, parent: Node | None) -> None:
        self.id = next(Node._ids)
        self.key = key
        self.pages = pages
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.lock_ref = 0
        #: locks held by nobody on this node (requests outside the simulation): never released
        self.pins = 0
        self.last_access = 0
        #: hybrid SWA (:mod:`policykit.swa_cache`): sliding-window pages (None: a tombstone),
        #: window locks, place in the sliding-window LRU
        self.swa: torch.Tensor | None = None
        self.swa_lock = 0
        self.swa_access = 0

    def __len__(self) -> int:
        return len(self.key)

    def path(self) -> Iterator[Node]:
        """This node and its ancestors, excluding the root."""
        node: Node | None = self
        while node is not None and node.parent is not None:
            yield node
            node = node.parent


class PrefixCache:
    """Page-granular radix tree with lock references and evictable accounting."""

    def __init__(self, pool: TokenPool) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.root = Node((), torch.empty(0, dtype=torch.int64), None)
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_tokens = 0
        self.protected_tokens = 0
        #: tokens locked for good by :meth:`pin`: the pool can never pay with them
        self.pinned_tokens = 0
        self._clock = itertools.count(1)
        #: every node in the tree by id (what ``gone`` names), and the childless ones: eviction
        #: starts from leaves, so it need not walk a tree that grows with the pool
        self._by_id: dict[int, Node] = {}
        self._leaves: dict[int, Node] = {}

    # -- lookup ----------------------------------------------------------------------------
    def match(self, tokens: Tokens, gone: Collection[int] = ()) -> tuple[int, Node, torch.Tensor]:
        """Longest cached page-aligned prefix of ``tokens``: (length, last node, its pages).

        A match ending inside a node splits it, so that the returned node covers the match
        exactly and can be locked on its own. Nodes whose ids are in ``gone`` count as evicted
        already (a planned eviction the engine performs before this request is matched).
        """
        node, matched, pieces = self.root, 0, []
        now = next(self._clock)
        for child, common in self._descend(tokens):
            if child.id in gone:
                break
            if common < len(child):
                child = self._split(child, common)
            child.last_access = now
            pieces.append(child.pages)
            matched += len(child)
            node = child
        pages = torch.cat(pieces) if pieces else self.root.pages
        return matched, node, pages

    def _descend(self, tokens: Tokens) -> Iterator[tuple[Node, int]]:
        """The nodes the page-aligned prefix of ``tokens`` runs through, from the root, each
        with how many of its tokens match (fewer than its length only for the last one, where
        the match ends inside it). Touches and splits nothing: each lookup decides that."""
        page = self.page_size
        limit = len(tokens) // page * page
        node, matched = self.root, 0
        while matched < limit:
            child = node.children.get(tuple(tokens[matched : matched + page]))
            if child is None:
                return
            common = self._common_pages(child.key, tokens, matched, limit)
            inside = common < len(child)  # before the caller splits it
            yield child, common
            if inside:
                return
            matched += common
            node = child

    def _common_pages(self, key: tuple[int, ...], tokens: Tokens, offset: int, limit: int) -> int:
        page, n = self.page_size, 0
        while (
            n < len(key)
            and offset + n < limit
            and key[n : n + page] == tuple(tokens[offset + n : offset + n + page])
        ):
            n += page
        return n

    def _split(self, child: Node, at: int) -> Node:
        """Cut ``child`` after ``at`` tokens; return the new upper half."""
        parent = child.parent
        assert parent is not None
        upper = Node(child.key[:at], child.pages[: at // self.page_size], parent)
        upper.lock_ref = child.lock_ref
        upper.pins = child.pins
        upper.last_access = child.last_access
        self._by_id[upper.id] = upper
        parent.children[child.key[: self.page_size]] = upper
        child.key = child.key[at:]
        child.pages = child.pages[at // self.page_size :]
        child.parent = upper
        upper.children[child.key[: self.page_size]] = child
        return upper

    # -- locks -----------------------------------------------------------------------------
    def unlocked_on_path(self, node: Node) -> list[Node]:
        """Nodes on the path to ``node`` that a lock would take out of the evictable total."""
        return [n for n in node.path() if n.lock_ref == 0]

    def lock(self, node: Node) -> None:
        for n in node.path():
            if n.lock_ref == 0:
                self.evictable_tokens -= len(n)
                self.protected_tokens += len(n)
            n.lock_ref += 1

    def pin(self, node: Node) -> None:
        """Lock the path to ``node`` on behalf of holders outside the node, for good.

        Kept apart from request locks so that liveness checks know which memory will never
        come back (a prompt that only fits with it can never run).
        """
        self.lock(node)
        for n in node.path():
            if n.pins == 0:
                self.pinned_tokens += len(n)
            n.pins += 1

    def pinned_prefix(self, tokens: Tokens) -> int:
        """Length of the pinned part of ``tokens``' cached prefix (a lock makes a whole path,
        so pinned nodes form the head of it). Does not touch access times or split nodes."""
        matched = 0
        for child, common in self._descend(tokens):
            if child.pins == 0:
                break
            matched += common
        return matched

    def unlock(self, node: Node) -> None:
        for n in node.path():
            if n.lock_ref <= 0:
                raise RuntimeError("prefix cache: unlock of a node that is not locked")
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self.evictable_tokens += len(n)
                self.protected_tokens -= len(n)

    # -- insert / evict --------------------------------------------------------------------
    def insert(self, tokens: Tokens, pages: torch.Tensor) -> int:
        """Cache the page-aligned ``tokens`` whose KV sits on ``pages``.

        Returns how many leading tokens were already cached: the caller still owns the pages
        covering them and must free them (their KV is a duplicate).
        """
        page = self.page_size
        length = len(tokens) // page * page
        matched, node, _ = self.match(tokens[:length])
        if matched < length:
            key = tuple(tokens[matched:length])
            leaf = Node(key, pages[matched // page : length // page].clone(), node)
            leaf.last_access = next(self._clock)
            self._attach(leaf)
            self.evictable_tokens += len(leaf)
        return matched

    def evict(self, tokens: int, journal: list[Node] | None = None) -> int:
        """Free least-recently-used unlocked leaves until ``tokens`` slots were released.

        Each evicted leaf is appended to ``journal`` (if given) so that a failed commit can put
        it back with :meth:`unevict`.
        """
        freed = 0
        for leaf in self.victims(tokens):
            self._detach(leaf)
            self.pool.free(leaf.pages)
            self.evictable_tokens -= len(leaf)
            freed += len(leaf)
            if journal is not None:
                journal.append(leaf)
        return freed

    def victims(
        self, tokens: int, keep: Collection[int] = (), gone: Collection[int] = ()
    ) -> list[Node]:
        """The nodes :meth:`evict` would take for ``tokens`` slots, in its order, changing
        nothing: least recently used unlocked leaves first, a parent once its children are
        gone. Nodes whose ids are in ``keep`` count as locked, those in ``gone`` as evicted
        already, so a planner can foresee an eviction the engine performs part-way through a
        round."""
        taken: set[int] = set(gone)

        def free_leaf(n: Node) -> bool:
            return (
                n.lock_ref == 0
                and n.id not in keep
                and n.id not in taken
                and all(c.id in taken for c in n.children.values())
            )

        # Candidates: childless nodes, and nodes whose children are all ``gone`` (parents of
        # gone nodes). Ordered by (last access, the order found): equal access times only ever
        # lie on one root path, of which at most one node is a candidate at a time.
        found = itertools.count()
        starts: dict[int, Node] = dict(self._leaves)
        for i in taken:
            parent = self._by_id[i].parent if i in self._by_id else None
            if parent is not None and parent is not self.root:
                starts[parent.id] = parent
        heap = [(n.last_access, next(found), n) for n in starts.values() if free_leaf(n)]
        heapq.heapify(heap)
        out: list[Node] = []
        freed = 0
        while freed < tokens and heap:
            leaf = heapq.heappop(heap)[2]
            taken.add(leaf.id)
            out.append(leaf)
            freed += len(leaf)
            parent = leaf.parent
            assert parent is not None
            if parent is not self.root and free_leaf(parent):
                heapq.heappush(heap, (parent.last_access, next(found), parent))
        return out

    def unevict(self, leaf: Node) -> None:
        """Undo the eviction of ``leaf`` (the most recent one not yet undone)."""
        self.pool.reclaim(leaf.pages)
        self._attach(leaf)
        self.evictable_tokens += len(leaf)

    def _attach(self, leaf: Node) -> None:
        """Hang a childless node under its parent, keeping the indexes."""
        parent = leaf.parent
        assert parent is not None
        parent.children[leaf.key[: self.page_size]] = leaf
        self._leaves.pop(parent.id, None)
        self._by_id[leaf.id] = self._leaves[leaf.id] = leaf

    def _detach(self, leaf: Node) -> None:
        """Take a childless node out of the tree, keeping the indexes."""
        parent = leaf.parent
        assert parent is not None
        del parent.children[leaf.key[: self.page_size]]
        del self._by_id[leaf.id], self._leaves[leaf.id]
        if not parent.children and parent is not self.root:
            self._leaves[parent.id] = parent

    def _nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def cached_pages(self) -> torch.Tensor:
        """Every page the cache owns (for the pool's ownership invariant)."""
        pieces = [n.pages for n in self._nodes()]
        return torch.cat(pieces) if pieces else self.root.pages

    @property
    def total_tokens(self) -> int:
        return self.evictable_tokens + self.protected_tokens
