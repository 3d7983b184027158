"""The paged KV token pool: the memory the prefill scheduler is trying not to run out of.

A slot holds the KV of one token; slots are handed out a *page* at a time, so a request owns
``ceil(seq_len / page_size)`` pages and its last page may be partly filled. The free list is a
torch tensor of page ids on the pool's device, as in the engines, so the pool's bookkeeping
lives where its memory does. When a model is attached (the harness does this) the pool also
owns the K and V buffers, indexed by the same slots: the pool *is* the KV cache.

Memory: the bookkeeping is the free list, 8 bytes per page, whatever the pool's size (a 1 Mi-token
pool of 64-token pages: 128 KiB), so a pool sized for a real GPU from a trace costs nothing on
the CPU. K and V exist only when a model's :class:`KVLayout` is given, and then they are real:
zero-filled tensors of exactly ``tokens x kv_heads x head_dim`` per layer, 2 per layer, on the
pool's device. Whoever attaches a model (the harness) sizes that pool for the model it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from policykit.errors import PrefillOutOfMemory


@dataclass(frozen=True)
class KVLayout:
    """Shape of the KV the pool stores per token slot (one entry per attention layer)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype


class TokenPool:
    """Page-granular slot allocator over a fixed number of token slots.

    ``alloc`` either returns every page asked for or raises :class:`PrefillOutOfMemory` and
    changes nothing: a failed allocation never leaks half a batch.
    """

    def __init__(
        self,
        total_tokens: int,
        page_size: int,
        *,
        device: str | torch.device = "cpu",
        name: str = "full",
        layout: KVLayout | None = None,
    ) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        if total_tokens < page_size or total_tokens % page_size:
            raise ValueError(
                f"a {name} pool of {total_tokens} tokens is not a whole, non-zero number of "
                f"{page_size}-token pages"
            )
        self.page_size = page_size
        self.name = name
        self.device = torch.device(device)
        self.num_pages = total_tokens // page_size
        # Page 0 is a real page here (no padding page): ids run 0..num_pages-1.
        self._free = torch.arange(self.num_pages, dtype=torch.int64, device=self.device)
        self._num_free = self.num_pages
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        if layout is not None:
            shape = (total_tokens, layout.kv_heads, layout.head_dim)
            self.k = [
                torch.zeros(shape, dtype=layout.dtype, device=self.device)
                for _ in range(layout.layers)
            ]
            self.v = [
                torch.zeros(shape, dtype=layout.dtype, device=self.device)
                for _ in range(layout.layers)
            ]

    @property
    def total_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def free_pages(self) -> int:
        return self._num_free

    @property
    def free_tokens(self) -> int:
        return self._num_free * self.page_size

    @property
    def used_tokens(self) -> int:
        return self.total_tokens - self.free_tokens

    def alloc(
        self, num_pages: int, *, tokens: int | None = None, evictable: int = 0
    ) -> torch.Tensor:
        """Take ``num_pages`` pages off the free list.

        ``tokens`` and ``evictable`` only shape the error message: the engine reports the
        tokens it tried to place, not the pages, and what the prefix cache could still give.
        """
        if num_pages < 0:
            raise ValueError(f"cannot allocate {num_pages} pages")
        if num_pages > self._num_free:
            raise PrefillOutOfMemory(
                tokens=num_pages * self.page_size if tokens is None else tokens,
                available=self.free_tokens,
                evictable=evictable,
                pool=self.name,
            )
        pages = self._free[self._num_free - num_pages : self._num_free].clone()
        self._num_free -= num_pages
        return pages

    def free(self, pages: torch.Tensor) -> None:
        """Return pages to the free list."""
        n = int(pages.numel())
        if n == 0:
            return
        if self._num_free + n > self.num_pages:
            raise RuntimeError(f"{self.name} pool: freeing {n} pages would exceed its size")
        self._free[self._num_free : self._num_free + n] = pages.to(self.device)
        self._num_free += n

    def free_last(self, pages: torch.Tensor) -> None:
        """Return pages to the *bottom* of the free list: the last to be handed out again, in
        the order given (the last one given goes out last). With :meth:`free` pushing onto the
        top and :meth:`take` removing from anywhere, the free list is an ordered queue, which is
        how a node that preempts (vLLM's free-block queue, :mod:`policykit.block_pool`) keeps
        its eviction order on this same pool."""
        n = int(pages.numel())
        if n == 0:
            return
        if self._num_free + n > self.num_pages:
            raise RuntimeError(f"{self.name} pool: freeing {n} pages would exceed its size")
        kept = self._free[: self._num_free].clone()
        self._free[:n] = pages.to(self.device).flip(0)
        self._free[n : n + self._num_free] = kept
        self._num_free += n

    def take(self, pages: torch.Tensor) -> None:
        """Take these particular free pages off the free list, wherever they are, keeping the
        others' order (a prefix hit on cached pages that nobody holds)."""
        n = int(pages.numel())
        if n == 0:
            return
        free = self._free[: self._num_free]
        mask = torch.isin(free, pages.to(self.device))
        if int(mask.sum()) != n:
            raise RuntimeError(f"{self.name} pool: taking pages that are not all free")
        kept = free[~mask]
        self._num_free -= n
        self._free[: self._num_free] = kept

    def reclaim(self, pages: torch.Tensor) -> None:
        """Take back ``pages`` that the last :meth:`free` returned (a commit's rollback).

        Frees push onto the top of the free stack, so undoing them in reverse order finds each
        run exactly on top: the free list ends bit-for-bit as it was before the round.
        """
        n = int(pages.numel())
        if n == 0:
            return
        top = self._free[self._num_free - n : self._num_free]
        if n > self._num_free or not torch.equal(top, pages.to(self.device)):
            raise RuntimeError(f"{self.name} pool: reclaim of pages that are not the last freed")
        self._num_free -= n

    def free_page_ids(self) -> torch.Tensor:
        """A copy of the free list (for invariant checks)."""
        return self._free[: self._num_free].clone()

    def slots(self, pages: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Slot indices of token positions ``[start, end)`` of a sequence laid on ``pages``."""
        pos = torch.arange(start, end, device=self.device)
        return pages.to(self.device)[pos // self.page_size] * self.page_size + pos % self.page_size
