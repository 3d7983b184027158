"""The allocator watermark: how much the caching allocator holds but nobody uses.

``frag_gap = reserved - alloc`` is the memory torch keeps cached. Under the default allocator
it creeps up over days when long-lived small tensors pin large segments
(docs/incidents.md#allocator-fragmentation); with expandable segments it falls back whenever
the allocator releases pages. Logging it next to the round statistics makes fragmentation
visible *before* the OOM that it eventually causes.

All four figures come from one ``memory_stats()`` call, which reads host-side counters only (no
device synchronisation), so the line is cheap enough for the scheduling hot path. Before CUDA is
initialised the stats are an empty mapping: every figure then reads 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policykit.memory.allocator import AllocatorFacade

GIB = 1 << 30


@dataclass(frozen=True)
class Watermark:
    """Bytes: live tensors, what the allocator holds, and the live peak since start-up."""

    alloc: int  #: ``allocated_bytes.all.current``
    reserved: int  #: ``reserved_bytes.all.current``
    max_alloc: int  #: ``allocated_bytes.all.peak``

    @property
    def frag_gap(self) -> int:
        return self.reserved - self.alloc

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> Watermark:
        return cls(
            alloc=int(stats.get("allocated_bytes.all.current", 0)),
            reserved=int(stats.get("reserved_bytes.all.current", 0)),
            max_alloc=int(stats.get("allocated_bytes.all.peak", 0)),
        )

    def format(self) -> str:
        """``torch mem (GiB) alloc: 52.31, reserved: 55.80, frag_gap: 3.49, max_alloc: 58.02``"""
        return (
            f"torch mem (GiB) alloc: {self.alloc / GIB:.2f}, reserved: {self.reserved / GIB:.2f}, "
            f"frag_gap: {self.frag_gap / GIB:.2f}, max_alloc: {self.max_alloc / GIB:.2f}"
        )

    def to_dict(self) -> dict[str, float]:
        """The four figures in GiB, for JSON output."""
        return {
            "alloc_gib": self.alloc / GIB,
            "reserved_gib": self.reserved / GIB,
            "frag_gap_gib": self.frag_gap / GIB,
            "max_alloc_gib": self.max_alloc / GIB,
        }


def read_watermark(facade: AllocatorFacade) -> Watermark:
    """One ``memory_stats()`` call, missing counters read as 0."""
    return Watermark.from_stats(facade.memory_stats())
