"""The executor seam: what the sweep driver needs from anything that runs units.

An executor is a set of slots. The driver hands it units while it has room (:meth:`has_room`),
and collects attempts as they end (:meth:`collect`), whether the unit returned, raised, took its
worker down with it, or ran past the timeout. Retries, merging and progress live in the driver,
so a new executor implements only placement and the failures only it can see.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Self

from policykit.errors import PolicykitError
from policykit.executor.work import Attempt, Unit


class ExecutorUnavailable(PolicykitError):
    """The chosen executor cannot run here (its extra is not installed, no cluster answers)."""


class Executor(ABC):
    """Runs units in parallel; see the module docstring for the protocol."""

    #: recorded on every unit result and in the results envelope
    name: str

    def __init__(self, *, timeout: float | None = None) -> None:
        self.timeout = timeout

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the results envelope records about this executor (name, workers, nodes)."""

    @abstractmethod
    def has_room(self, unit: Unit) -> bool:
        """Whether :meth:`submit` would start ``unit`` now rather than queue it."""

    @abstractmethod
    def submit(self, unit: Unit) -> None:
        """Start one attempt of ``unit``."""

    @abstractmethod
    def busy(self) -> bool:
        """Whether any attempt is still running."""

    @abstractmethod
    def collect(self, wait_seconds: float) -> list[Attempt]:
        """Attempts that ended, waiting up to ``wait_seconds`` for the first one.

        Attempts past the timeout are stopped here and reported failed.
        """

    @abstractmethod
    def cancel(self) -> None:
        """Stop every running attempt now; their units get no attempt back."""

    @abstractmethod
    def close(self) -> None:
        """Release workers or the cluster connection; the executor is not used afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
