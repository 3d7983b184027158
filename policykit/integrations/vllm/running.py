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

Under ``--scheduling-policy priority`` vLLM picks the victim inline, ``max(self.running,
key=(priority, arrival_time))``, and then asks for its place with ``self.running.index(victim)``
(nothing else in ``schedule()`` does): there the list hands the running requests and vLLM's
victim to a *witness*, which asks the preemption policy for its choice and records whether the
two agree; vLLM's victim is taken either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, SupportsIndex

#: given the running list, the request to preempt
Chooser = Callable[[list[Any]], Any]
#: given the running list and vLLM's own victim in it, compares the policy's choice
Witness = Callable[[list[Any], Any], None]


class RunningList(list):
    """A list; during a step, ``[-1]`` and ``pop()`` are the preemption policy's victim (fcfs),
    or ``index()`` shows vLLM's victim to a witness (priority)."""

    __slots__ = ("_choose", "_victim", "_witness")

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self._choose: Chooser | None = None
        self._victim: Any = None
        self._witness: Witness | None = None

    def arm(self, choose: Chooser | None = None, witness: Witness | None = None) -> None:
        self._choose = choose
        self._witness = witness

    def disarm(self) -> None:
        self._choose = None
        self._victim = None
        self._witness = None

    def index(self, value: Any, *args: Any) -> int:
        if self._witness is not None and not args:
            self._witness(self, value)
        return super().index(value, *args)

    def __getitem__(self, index: Any) -> Any:
        if index == -1 and self._choose is not None:
            self._victim = self._choose(self)
            return self._victim
        return super().__getitem__(index)

    def pop(self, index: SupportsIndex = -1) -> Any:
        victim = self._victim
        if victim is None or index != -1:
            return super().pop(index)
        self._victim = None
        for place, request in enumerate(self):
            if request is victim:
                return super().pop(place)
        return super().pop()
