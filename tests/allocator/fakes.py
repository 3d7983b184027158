"""A fake allocator facade that records every call, for CPU tests of the policies."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from policykit.memory.allocator_settings import expandable_enabled

GIB = 1 << 30


class FakeAllocator:
    """Behaves like :class:`policykit.memory.allocator.TorchAllocator` on a GPU node, in memory."""

    def __init__(
        self,
        settings: str = "",
        *,
        available: bool = True,
        backend: str = "native",
        mempool_users: tuple[str, ...] = (),
        fail_set: bool = False,
        stats: Mapping[str, Any] | None = None,
    ) -> None:
        self._settings = settings
        self.available = available
        self._backend = backend
        self._mempool_users = mempool_users
        self.fail_set = fail_set
        self.stats = dict(stats or {})
        self.calls: list[str] = []  #: "set:<text>" / "empty_cache", in order
        self._lock = threading.Lock()

    def is_available(self) -> bool:
        return self.available

    def backend(self) -> str:
        return self._backend

    def settings(self) -> str:
        return self._settings

    def set_settings(self, text: str) -> None:
        if self.fail_set:
            raise RuntimeError("this torch build cannot change allocator settings at run time")
        time.sleep(0)  # give other threads the chance to interleave, as a driver call would
        with self._lock:
            self._settings = text
            self.calls.append(f"set:{text}")

    def memory_stats(self) -> Mapping[str, Any]:
        return dict(self.stats)

    def mem_get_info(self) -> tuple[int, int]:
        return 70 * GIB, 80 * GIB

    def empty_cache(self) -> None:
        with self._lock:
            self.calls.append("empty_cache")
            self.stats["reserved_bytes.all.current"] = self.stats.get(
                "allocated_bytes.all.current", 0
            )

    def reset_peak_stats(self) -> None:
        self.stats["allocated_bytes.all.peak"] = self.stats.get("allocated_bytes.all.current", 0)

    def mempool_users(self) -> tuple[str, ...]:
        return self._mempool_users

    # -- test helpers ----------------------------------------------------------------------
    @property
    def expandable(self) -> bool:
        return expandable_enabled(self._settings)

    def sets(self) -> list[bool]:
        """The expandable value of every set call, in order."""
        return [expandable_enabled(c[4:]) for c in self.calls if c.startswith("set:")]
