"""Host tier: KV of prefixes kept in CPU memory, copied back to the device on a hit.

A host hit is the cheapest prefill there is in compute and the most expensive in memory: the
copied-back tokens are not recomputed (no compute budget) but they take device slots *at
admission*, before the batch is allocated. The truncated-tail incident
(docs/incidents.md#truncated-tail) is exactly that asymmetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from policykit.pages import ceil_paged
from policykit.tokens import TokenRuns

Tokens = Sequence[int]

#: SGLang 0.5.23 (HiCache's ``load_back_threshold``): shorter host hits are recomputed
LOAD_BACK_THRESHOLD = 10


@dataclass
class HostEntry:
    """Host copy of the KV of ``tokens[held_from:end]`` for sequences that begin with ``head``:
    the run ``tokens[start:end]`` and, from ``held_from`` on, the head's KV too."""

    head: Tokens
    run: Tokens
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = field(default=None, repr=False)
    #: where the host's KV begins (``start`` unless the head's is held too); ``kv`` from here
    held_from: int | None = None

    def __post_init__(self) -> None:
        if self.held_from is None:
            self.held_from = len(self.head)

    @property
    def kv_from(self) -> int:
        """``held_from`` once set: ``__post_init__`` fills it in where it was not given."""
        assert self.held_from is not None
        return self.held_from

    @property
    def start(self) -> int:
        """Where the run begins: a node boundary of the engine's tree (a load-back that
        crosses it caches the KV as two nodes, as SGLang's host nodes come back)."""
        return len(self.head)

    @property
    def end(self) -> int:
        return len(self.head) + len(self.run)


class HostTier:
    """Host-resident KV runs, looked up by the token prefix they continue.

    Indexed by where a run's KV begins and its first token, so a lookup looks only at the runs
    that could continue this very prompt (normally one) instead of every run on the host: its
    cost does not grow with the number of requests the host tier has seen.
    """

    def __init__(self) -> None:
        #: (start, first token of the run, or None for an empty run) -> entries, in put order
        self._index: dict[tuple[int, int | None], list[HostEntry]] = {}
        self._count = 0

    def put(
        self,
        tokens: Tokens,
        start: int,
        kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        *,
        held_from: int | None = None,
    ) -> HostEntry:
        """Hold ``tokens[start:]``, and the head's KV from ``held_from`` on when that is
        before ``start``; ``kv`` (per layer, ``[len, heads, dim]``, from ``held_from``, or
        ``start``) when data is kept."""
        held = start if held_from is None else held_from
        entry = HostEntry(_frozen(tokens[:start]), _frozen(tokens[start:]), kv, held)
        self._index.setdefault(_slot(tokens, start), []).append(entry)
        if held == 0 < start:
            self._index.setdefault(_slot(tokens, 0), []).append(entry)
        self._count += 1
        return entry

    def lookup(self, tokens: Tokens, start: int) -> HostEntry | None:
        """The longest host run that continues ``tokens[:start]`` and matches what follows
        (the first one held, among equals).

        A run whose head is held from token 0 continues every prefix of itself: SGLang
        0.5.23's HiCache backs a node's ancestors up before the node, so a device match that
        stops short of the run (its head evicted, say) is continued on the host from there."""
        best: HostEntry | None = None
        for key in dict.fromkeys(((start, None), _slot(tokens, start), _slot(tokens, 0))):
            for entry in self._index.get(key, ()):
                if entry.end > len(tokens) or entry.kv_from > start:
                    continue
                if entry.end <= start and entry.start != start:
                    continue
                if best is not None and entry.end <= best.end:
                    continue
                if _frozen(tokens[: entry.start]) == entry.head and (
                    _frozen(tokens[entry.start : entry.end]) == entry.run
                ):
                    best = entry
        return best

    def node_bounds(self, tokens: Tokens, page_size: int, window: int | None) -> tuple[int, ...]:
        """Where SGLang 0.5.23's tree splits ``tokens`` along the host's nodes: where the
        longest run held from token 0 begins and where its whole pages end, and with hybrid
        SWA (a ``window``) also where the run's last window of whole pages begins, when it is
        longer (an insert cuts a new leaf there, and the host keeps the leaf's nodes). A radix
        tree keeps a node's bounds, so KV inserted through a host node (a load-back, or a
        request that computed what the host held) is cached in pieces cut there, and an
        eviction may stop at them. Only what the host tier indexes itself counts (a subclass
        answering lookups its own way has no nodes)."""
        entry = HostTier.lookup(self, tokens, 0)
        if entry is None:
            return ()
        paged = (entry.end - entry.start) // page_size * page_size
        end = entry.start + paged
        if window is not None and paged > ceil_paged(window, page_size):
            return (entry.start, end - ceil_paged(window, page_size), end)
        return (entry.start, end)

    def loadable(self, tokens: Tokens, start: int, page_size: int) -> int:
        """How many tokens after ``tokens[:start]`` a load-back copies to the device.

        As SGLang 0.5.23's HiCache does it: the host tier is matched in whole pages (its radix
        tree is paged like the device one), and a hit shorter than
        :data:`LOAD_BACK_THRESHOLD` tokens is not loaded back but recomputed.
        """
        entry = self.lookup(tokens, start)
        if entry is None:
            return 0
        hit = (entry.end - start) // page_size * page_size
        return hit if hit >= LOAD_BACK_THRESHOLD else 0

    def __len__(self) -> int:
        return self._count


def _slot(tokens: Tokens, start: int) -> tuple[int, int | None]:
    return (start, tokens[start] if start < len(tokens) else None)


def _frozen(tokens: Tokens) -> Tokens:
    """An immutable copy of a slice (a :class:`TokenRuns` slice already is one)."""
    return tokens if isinstance(tokens, TokenRuns | tuple) else tuple(tokens)
