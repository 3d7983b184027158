"""Progress lines for logs: long work says it is alive when nobody watches a bar.

A progress bar redraws one terminal line; written to a CI log it is either nothing until the end
or thousands of control sequences. When stderr is not a terminal, :class:`Heartbeat` prints one
plain line at a fixed interval (10 s unless told otherwise) from a background thread, so that a
single slow unit (one combo's proof, one long benchmark) still shows the run is alive.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Self, TextIO

#: seconds between two lines; the promise is "at least every 10 s"
INTERVAL_S = 10.0


class Heartbeat:
    """``label: 3/80 done, 41 s — sglang/sglang/page`` every ``interval`` seconds.

    Silent when ``stream`` is a terminal (a bar is drawn there instead) or ``enabled`` is false.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        interval: float = INTERVAL_S,
        enabled: bool = True,
    ) -> None:
        self.label, self.total, self.interval = label, total, interval
        self.stream = stream or sys.stderr
        self.done = 0
        self.current = ""
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        isatty = getattr(self.stream, "isatty", None)
        self.active = enabled and not (isatty is not None and isatty())

    def advance(self, n: int = 1) -> None:
        self.done += n

    def describe(self, current: str) -> None:
        """What is being worked on now (shown after the count)."""
        self.current = current

    def line(self) -> str:
        elapsed = time.monotonic() - self._t0
        now = f" — {self.current}" if self.current else ""
        return f"{self.label}: {self.done}/{self.total} done, {elapsed:.0f} s{now}"

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            print(self.line(), file=self.stream, flush=True)

    def __enter__(self) -> Self:
        if self.active:
            self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if exc_type is None:
                self.current = ""
                print(self.line(), file=self.stream, flush=True)
