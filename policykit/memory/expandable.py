"""Switching torch's allocator to expandable segments at run time, and windows that switch back.

The allocator setting is process-global and only affects segments created after it changes
(docs/incidents.md#allocator-fragmentation). Two consequences shape this class:

* before switching on, ``empty_cache()`` returns the fully free segments left over from
  initialisation, so expandable segments can reuse that memory;
* a late static buffer (RDMA registration, ``MemPool``) must be allocated with the setting
  *off*, in a :meth:`ExpandableSwitch.non_expandable` window. Windows may nest and may run in
  several threads at once; one lock and a depth counter make the setting go off when the first
  window opens and come back only when the last one closes, so one window can never switch it
  on under another. Allocations of other threads inside a window merely miss expandable
  segments once, which is harmless.

When switching is unsafe or impossible the switch is skipped, the reason is logged once and the
process keeps the default allocator: the backend is not torch's native allocator, expandable
segments are already on (by environment), a component allocates in a ``MemPool``, or the set
call itself raises (an old torch or driver).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from policykit.memory.allocator import AllocatorFacade
from policykit.memory.allocator_settings import expandable_enabled, with_expandable
from policykit.memory.watermark import GIB, read_watermark

log = logging.getLogger("policykit.memory.allocator")


class ExpandableSwitch:
    """Owns the expandable-segments setting of one process on behalf of a policy."""

    def __init__(self, facade: AllocatorFacade, logger: logging.Logger = log) -> None:
        self.facade = facade
        self.log = logger
        self._lock = threading.Lock()
        self._depth = 0  #: open non-expandable windows
        self._decided = False  #: enable() ran (it decides once per process)
        self._wanted = False  #: expandable was enabled; windows switch it off temporarily
        self._switched = False  #: the setting has been switched on at least once
        self._user_settings: str | None = None
        self._logged: set[str] = set()

    # -- queries ---------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Expandable segments are on for serving (possibly off inside an open window)."""
        return self._wanted

    def user_settings(self) -> str:
        """The setting string the process started with, captured before any change."""
        if self._user_settings is None:
            self._user_settings = self.facade.settings()
        return self._user_settings

    def skip_reason(self) -> str | None:
        """Why switching must not happen here, or ``None`` when it may."""
        f = self.facade
        if not f.is_available():
            return "no CUDA device is available"
        backend = f.backend()
        if backend != "native":
            return f"the allocator backend is {backend!r}, not torch's native caching allocator"
        if expandable_enabled(self.user_settings()):
            return "expandable_segments is already on (set by the environment)"
        users = f.mempool_users()
        if users:
            return (
                "torch.cuda.MemPool is in use (by "
                + ", ".join(users)
                + "), and MemPool does not support expandable_segments"
            )
        return None

    # -- transitions -----------------------------------------------------------------------
    def enable(self) -> bool:
        """Switch expandable segments on for the rest of the process (decides only once).

        Returns whether they are (or will be, once open windows close) on.
        """
        with self._lock:
            if self._decided:
                return self._wanted
            self._decided = True
            reason = self.skip_reason()
            if reason is not None:
                self._note(
                    logging.WARNING,
                    f"Not enabling expandable_segments: {reason}; keeping the default allocator.",
                )
                return False
            self._wanted = True
            if self._depth > 0:
                # a window is open: the last one to close switches on
                return True
            return self._switch_on()

    @contextmanager
    def non_expandable(self) -> Iterator[None]:
        """Allocations inside land on ordinary segments (for RDMA / MemPool / IPC buffers).

        If switching off raises, so does the window: a static buffer must not silently land on
        expandable segments. If switching back on raises, the process keeps the default
        allocator from then on (logged once).
        """
        with self._lock:
            self._depth += 1
            if self._depth == 1 and self._wanted:
                try:
                    self.facade.set_settings(with_expandable(self.user_settings(), False))
                except Exception:
                    self._depth -= 1
                    raise
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._wanted:
                    self._switch_on()

    # -- internals (called with the lock held) ---------------------------------------------
    def _switch_on(self) -> bool:
        """Set expandable on; the first time, after ``empty_cache()`` and with a log line."""
        first = not self._switched
        if first:
            before = read_watermark(self.facade).reserved
            self.facade.empty_cache()
        try:
            self.facade.set_settings(with_expandable(self.user_settings(), True))
        except Exception as exc:
            self._wanted = False
            self._note(
                logging.WARNING,
                f"Failed to enable expandable_segments ({type(exc).__name__}: {exc}); "
                "keeping the default allocator.",
            )
            return False
        self._switched = True
        if first:
            after = read_watermark(self.facade)
            self._note(
                logging.INFO,
                "Enabled PyTorch CUDA expandable_segments for runtime dynamic allocations "
                f"(empty_cache reserved {before / GIB:.2f} GiB -> {after.reserved / GIB:.2f} "
                f"GiB; {after.format()})",
            )
        return True

    def _note(self, level: int, message: str) -> None:
        """Log ``message`` once per process: skips and failures must not flood the log."""
        if message not in self._logged:
            self._logged.add(message)
            self.log.log(level, message)
