"""Host tier: KV of prefixes kept in CPU memory, copied back to the device on a hit.

A host hit is the cheapest prefill there is in compute and the most expensive in memory: the
copied-back tokens are not recomputed (no compute budget) but they take device slots *at
admission*, before the batch is allocated. Seed 000's incident is exactly that asymmetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Tokens = Sequence[int]

#: SGLang 0.5.23 (HiCache's ``load_back_threshold``): shorter host hits are recomputed
LOAD_BACK_THRESHOLD = 10


@dataclass
class HostEntry:
    """Host copy of the KV of ``tokens[start:end]`` for sequences that begin with ``head``."""

    head: tuple[int, ...]
    run: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = field(default=None, repr=False)

    @property
    def start(self) -> int:
        return len(self.head)

    @property
    def end(self) -> int:
        return len(self.head) + len(self.run)


class HostTier:
    """Host-resident KV runs, looked up by the token prefix they continue."""

    def __init__(self) -> None:
        self._entries: dict[tuple[int, ...], list[HostEntry]] = {}

    def put(
        self,
        tokens: Tokens,
        start: int,
        kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> HostEntry:
        """Hold ``tokens[start:]``; ``kv`` (per layer, ``[len, heads, dim]``) when data is kept."""
        entry = HostEntry(tuple(tokens[:start]), tuple(tokens[start:]), kv)
        self._entries.setdefault(entry.head, []).append(entry)
        return entry

    def lookup(self, tokens: Tokens, start: int) -> HostEntry | None:
        """The longest host run that continues ``tokens[:start]`` and matches what follows."""
        best: HostEntry | None = None
        for entry in self._entries.get(tuple(tokens[:start]), ()):
            fits = entry.end <= len(tokens) and tuple(tokens[start : entry.end]) == entry.run
            if fits and (best is None or entry.end > best.end):
                best = entry
        return best

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
        return sum(len(v) for v in self._entries.values())
