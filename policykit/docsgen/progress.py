"""Progress lines for ``policykit docs``: a CI log must never go quiet for long.

Building the docs runs the checker, the harness and mkdocs: minutes on a small CPU. A terminal
user sees it moving; a CI log that prints nothing for three minutes looks hung. So every phase
prints a line when it starts and when it ends, and while it runs a background thread prints
another at least every :data:`INTERVAL_S` seconds, saying what it is doing now (to stderr:
stdout may carry ``--json``). A thread, not calls from the work itself, because one step of
the work (a solver query, a model forward) can outlast the interval.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

#: the longest silence allowed while work is running
INTERVAL_S = 10.0


class Heartbeat:
    """``policykit docs [  12 s]: ...`` lines for each phase, and beats while one runs."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = INTERVAL_S) -> None:
        self.stream = stream
        self.interval_s = interval_s
        self.started = time.monotonic()
        #: what the running phase is doing now; the work updates it, the beats print it
        self.detail = ""
        self._lock = threading.Lock()

    def say(self, message: str) -> None:
        out = self.stream or sys.stderr
        with self._lock:
            elapsed = time.monotonic() - self.started
            print(f"policykit docs [{elapsed:4.0f} s]: {message}", file=out, flush=True)

    @contextmanager
    def phase(self, name: str) -> Iterator[Heartbeat]:
        """Announce ``name``, beat every interval until it ends, then say how long it took."""
        self.say(f"{name} ...")
        self.detail = ""
        t0 = time.monotonic()
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.interval_s):
                now = f" ({self.detail})" if self.detail else ""
                self.say(f"still {name}, {time.monotonic() - t0:.0f} s{now}")

        thread = threading.Thread(target=beat, name="policykit-docs-heartbeat", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            done.set()
            thread.join()
        self.say(f"{name}: done in {time.monotonic() - t0:.0f} s")
