"""vLLM's running list, whose "last" request is the preemption policy's victim.

When a running request's chunk cannot be allocated, vLLM 0.33.0 (``--scheduling-policy
fcfs``) reads the victim as ``self.running[-1]``, checks its blocks can be freed, and takes it
with ``self.running.pop()``. Nothing else in ``schedule()`` reads ``running[-1]``. So while a
step is scheduled, :class:`RunningList` answers ``[-1]`` with the request the preemption
policy chose and ``pop()`` takes that one out, wherever it stands; outside a step, and for any
other index, it is a plain list.

vLLM's fcfs path gives back nothing scheduled earlier in the step and serves no running request
after the requester preempted itself, since its own victim, the last, never needs either. The
chooser keeps to what that path can carry out (see
:meth:`policykit.integrations.vllm.scheduler.PolicyDecisions._victim`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

#: given the running list, the request to preempt
Chooser = Callable[[list[Any]], Any]


class RunningList(list):
    """A list; during a step, ``[-1]`` and ``pop()`` are the preemption policy's victim."""

    __slots__ = ("_choose", "_victim")

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self._choose: Chooser | None = None
        self._victim: Any = None

    def arm(self, choose: Chooser) -> None:
        self._choose = choose

    def disarm(self) -> None:
        self._choose = None
        self._victim = None

    def __getitem__(self, index: Any) -> Any:
        if index == -1 and self._choose is not None:
            self._victim = self._choose(self)
            return self._victim
        return super().__getitem__(index)

    def pop(self, index: int = -1) -> Any:
        victim = self._victim
        if victim is None or index != -1:
            return super().pop(index)
        self._victim = None
        for place, request in enumerate(self):
            if request is victim:
                return super().pop(place)
        return super().pop()
