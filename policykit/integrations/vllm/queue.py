"""vLLM's waiting queue in the order the combo's queue policy gives it.

vLLM 0.33.0 walks its waiting queue with ``peek_request`` and ``pop_request`` and puts requests
back with ``prepend_request`` (a preempted request) and ``prepend_requests`` (those skipped in
a step). :class:`PolicyQueue` is such a queue. It keeps a *base order*, vLLM's own order
without priorities:

* under ``--scheduling-policy fcfs``, ``FCFSRequestQueue``'s: arrivals at the back, preempted
  requests at the front (the order ``policykit simulate`` keeps too);
* under ``priority``, arrival order as ``PriorityRequestQueue``'s heap breaks ties:
  ``arrival_time``, then ``request_id``; a preempted or skipped request goes back to its place
  there, since the heap has no front.

For a queue policy that sorts (``priority``, ``lpm``) it sorts the queue once per step, the
first time the step looks at it: by :meth:`~policykit.policy.QueuePolicy.priority`, lower
first, the base order among equals, as ``policykit simulate`` does. So ``priority`` under a
priority engine is the heap's order, ``Request.__lt__``'s, ties included.

Outside ``schedule()`` it reads as vLLM's queue does: ``len``, truthiness, ``in``,
iteration (the base order under fcfs, as the deque iterates; heap-pop order under priority, as
``PriorityRequestQueue.__iter__``), indexing in that order and ``remove``.

It also lets a step stop at a refused request. vLLM stops its waiting loop where
``allocate_slots`` fails; where the combo's admission or chunking policy refuses, the plugin
skips the request (vLLM's own way to pass over one) and :meth:`close`\\ s the queue, which then
reads as empty until the step puts the skipped request back, in its place.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue

#: the step's order of the waiting requests, or None where the base order stands
Ranker = Callable[[list[Any]], list[Any] | None]


class PolicyQueue(RequestQueue):
    """Waiting requests in vLLM's base order, looked at in the queue policy's order each step."""

    def __init__(self, rank: Ranker | None, by_arrival: bool = False) -> None:
        #: None: the queue policy keeps the base order, and it is the step's order
        self._rank = rank
        #: the base order is arrival (priority engine), not fcfs with preempted at the front
        self._by_arrival = by_arrival
        #: the base order: ascending keys (fcfs: arrivals count up, preempted requests count
        #: down; by arrival: (arrival_time, request_id, a count))
        self._items: list[Any] = []
        self._keys: list[Any] = []
        self._key_of: dict[Any, Any] = {}
        self._back = itertools.count()
        self._front = itertools.count(-1, -1)
        #: this step's order, worked out when the step first looks (None: not yet)
        self._order: list[Any] | None = None
        self._closed = False
        #: requests taken off this step, and their keys (a skipped one goes back in its place)
        self._popped: dict[Any, Any] = {}
        #: the request the step last looked at
        self.peeked: Any = None

    # -- the plugin's side -------------------------------------------------------------------
    def new_step(self) -> None:
        self._order = None
        self._closed = False

    def end_step(self) -> None:
        """Forget the step's requests while the scheduler still holds them: a finished one's
        last reference then goes with vLLM's own, outside the next ``schedule()``."""
        self._popped.clear()
        self.peeked = None

    def close(self) -> None:
        """Read as empty until the step puts its skipped requests back."""
        self._closed = True

    def _ordered(self) -> list[Any]:
        """This step's order, the head last (so that it pops in O(1))."""
        if self._order is None:
            ranked = None
            if self._rank is not None and len(self._items) > 1:
                ranked = self._rank(self._items)
            self._order = list(self._items) if ranked is None else ranked
            self._order.reverse()
        return self._order

    def _arrival_key(self, request: Any) -> tuple[Any, ...]:
        return (request.arrival_time, request.request_id, next(self._back))

    def _insert(self, request: Any, key: Any) -> None:
        place = bisect.bisect_left(self._keys, key)
        self._keys.insert(place, key)
        self._items.insert(place, request)
        self._key_of[request] = key
        self._order = None

    def _drop(self, request: Any) -> Any:
        key = self._key_of.pop(request)
        place = bisect.bisect_left(self._keys, key)
        del self._keys[place]
        del self._items[place]
        return key

    def _listed(self) -> list[Any]:
        """The queue as vLLM's iterates: the base order, or heap-pop order by priority."""
        return sorted(self._items) if self._by_arrival else list(self._items)

    # -- vLLM's RequestQueue -----------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        if self._by_arrival:
            self._insert(request, self._arrival_key(request))
            return
        key = next(self._back)
        self._keys.append(key)
        self._items.append(request)
        self._key_of[request] = key
        self._order = None

    def peek_request(self) -> Any:
        if not self._items:
            raise IndexError("peek from an empty queue")
        self.peeked = self._items[0] if self._rank is None else self._ordered()[-1]
        return self.peeked

    def pop_request(self) -> Any:
        if not self._items:
            raise IndexError("pop from an empty queue")
        request = self._items[0] if self._rank is None else self._ordered().pop()
        self._popped[request] = self._drop(request)
        return request

    def prepend_request(self, request: Any) -> None:
        key = self._arrival_key(request) if self._by_arrival else next(self._front)
        self._insert(request, key)

    def prepend_requests(self, requests: Iterable[Any]) -> None:
        """Requests skipped this step go back where they were (vLLM's skipped ones were at the
        front); the queue opens again."""
        for request in requests:
            key = self._popped.pop(request, None)
            if key is None:
                key = self._arrival_key(request) if self._by_arrival else next(self._front)
            self._insert(request, key)
        self._closed = False

    def remove_request(self, request: Any) -> None:
        self._drop(request)
        self._order = None

    def remove_requests(self, requests: Iterable[Any]) -> None:
        for request in set(requests):
            if request in self._key_of:
                self._drop(request)
        self._order = None

    def remove(self, request: Any) -> None:
        """``deque.remove``: ValueError when the request is not waiting."""
        if request not in self._key_of:
            raise ValueError(f"{request!r} is not in the waiting queue")
        self.remove_request(request)

    def __bool__(self) -> bool:
        return bool(self._items) and not self._closed

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request: object) -> bool:
        return request in self._key_of

    def __iter__(self) -> Iterator[Any]:
        return iter(self._listed())

    def __getitem__(self, index: int) -> Any:
        return self._items[index] if not self._by_arrival else self._listed()[index]
