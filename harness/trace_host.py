"""The host tier of a trace replay: a write-through KV store of every block computed so far.

Mooncake serves Kimi with a disaggregated KV store (CPU DRAM and SSD) that keeps the KV of
every prefix block a prefill node computed; SGLang's HiCache in write-through mode does the
same on one node. A replay models that store: once a chunk has computed all of a block's
tokens, the block is on the host, and a later request whose prompt continues its device-cached
prefix with stored blocks loads them back instead of computing them (the node decides, through
the same :class:`~policykit.host_tier.HostTier` interface the scheduler always asks). The store
is unbounded and never drops a block: its capacity is not what a prefill policy decides.

Blocks are named by their trace ids, so a lookup costs one set probe per block, not a scan of
token tuples. The runs it hands out carry no KV data: the replay is bookkeeping, and the model
forward slice does not use this store.
"""

from __future__ import annotations

from collections.abc import Sequence

from policykit.harness.traces import BlockTokens
from policykit.host_tier import HostTier


class BlockRun:
    """A host hit: KV positions ``[start, end)`` are on the host (no data kept)."""

    __slots__ = ("end", "kv", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end, self.kv = start, end, None


class BlockHostStore(HostTier):
    """Host tier keyed by block id; :meth:`computed` records what a round wrote through."""

    def __init__(self, block_tokens: int) -> None:
        super().__init__()
        self.block_tokens = block_tokens
        self.blocks: set[int] = set()

    def computed(self, blocks: Sequence[int], end: int) -> None:
        """A request's prompt is computed (or loaded) up to ``end``: its whole blocks are
        written through to the host."""
        self.blocks.update(blocks[: end // self.block_tokens])

    def lookup(self, tokens: Sequence[int], start: int) -> BlockRun | None:  # type: ignore[override]  # a HostEntry's start, end and kv
        """The stored blocks that continue ``tokens[:start]``, as one run."""
        if not isinstance(tokens, BlockTokens):
            return None
        blocks = tokens.blocks
        first = start // self.block_tokens
        last = first
        while last < len(blocks) and blocks[last] in self.blocks:
            last += 1
        end = min(last * self.block_tokens, len(tokens))
        return BlockRun(start, end) if end > start else None

    def __len__(self) -> int:
        return len(self.blocks)

    def __bool__(self) -> bool:
        # an empty store is still the node's host tier (``host or HostTier()`` must keep it)
        return True
