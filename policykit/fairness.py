"""Bounded overtaking: who was passed over by how many later arrivals, on any node's run.

``no-starvation`` only asks about rounds on a drained node, so a queue that always serves the
shortest prompt first passes it while a long prompt waits forever behind a stream of short
ones (issue 33). *Bounded overtaking* closes that gap: a waiting request that an idle node
would admit (it fits the pool: ``Planner.never_fits`` says None) is overtaken by a request
that arrived strictly later and was admitted (its first chunk placed) while it still waits,
that is, while it is still in the queue after the round. Each overtaker counts once. The
property holds with bound ``K`` when no such request is overtaken by more than ``K``.

Why "still waits after the round": a later arrival placed in the same round as the earlier one
took nothing from it; one placed in a round the earlier one ends still waiting did. Why only
requests that fit an idle node: one that can never fit is ``no-starvation``'s (or is rejected
for good), and nothing a queue does can serve it.

The detector is the one definition: the scheduler feeds it every round (``simulate``, and the
replay of a ``check`` counterexample), and :mod:`policykit.spec.overtaking` encodes the same
count over the model's rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: the property's name in ``policykit check``
OVERTAKING = "bounded-overtaking"
#: the bound ``check`` proves or refutes and exported counterexamples carry, where none is given:
#: one later arrival may pass a waiting request (a queue that fills a round's budget with a
#: short prompt behind a long head is still fair), two may not
DEFAULT_OVERTAKING = 1


@dataclass(frozen=True)
class RoundSeen:
    """What one round did to the waiting queue: who was admitted (a first chunk placed) and
    who still waits after it, in any order."""

    round: int
    placed: Sequence[str]
    waiting: Sequence[str]


@dataclass
class Overtaking:
    """The overtakes of one run so far, fed a round at a time (:meth:`observe`).

    ``arrival`` gives a request's arrival round (round 1 is the first; 0 counts as 1) and
    ``fits`` whether an idle node would admit it; ``fits`` is asked once per request, and only
    about a request some later arrival passed, so a run that overtakes nobody asks nothing."""

    arrival: Callable[[str], int]
    fits: Callable[[str], bool]
    #: victim -> its overtakers in the order they passed it, and the round each did
    by: dict[str, dict[str, int]] = field(default_factory=dict)
    _fits: dict[str, bool] = field(default_factory=dict)

    def observe(self, seen: RoundSeen) -> None:
        """Count the overtakes of one round."""
        if not seen.placed or not seen.waiting:
            return
        late = [(max(self.arrival(j), 1), j) for j in seen.placed]
        for i in seen.waiting:
            mine = max(self.arrival(i), 1)
            passed = [j for a, j in late if a > mine]
            if passed and self._fitting(i):
                mark = self.by.setdefault(i, {})
                for j in passed:
                    mark.setdefault(j, seen.round)

    def _fitting(self, request: str) -> bool:
        if request not in self._fits:
            self._fits[request] = self.fits(request)
        return self._fits[request]

    def counts(self) -> dict[str, int]:
        """Each overtaken request and by how many distinct later arrivals."""
        return {i: len(js) for i, js in self.by.items()}

    def beyond(self, bound: int) -> dict[str, OvertakenBeyond]:
        """The requests overtaken more than ``bound`` times, in the order they first were."""
        out = {}
        for i, js in self.by.items():
            if len(js) > bound:
                rounds = sorted(js.values())
                out[i] = OvertakenBeyond(i, tuple(js), rounds[bound], bound)
        return dict(sorted(out.items(), key=lambda kv: (kv[1].round, kv[0])))


@dataclass(frozen=True)
class OvertakenBeyond:
    """A request overtaken by more than ``bound`` later arrivals: ``by`` in the order they
    passed it, ``round`` the round the ``bound + 1``-th did (the failure's round)."""

    request: str
    by: tuple[str, ...]
    round: int
    bound: int

    @property
    def message(self) -> str:
        return (
            f"an idle node would admit it, but {len(self.by)} requests that arrived after it "
            f"({', '.join(self.by)}) were admitted while it waited, more than the bound of "
            f"{self.bound} (passed beyond it in round {self.round})."
        )

    def to_dict(self) -> dict[str, object]:
        return {"id": self.request, "by": list(self.by), "round": self.round}


def overtaken(
    rounds: Iterable[RoundSeen], arrivals: Mapping[str, int], fits: Mapping[str, bool]
) -> dict[str, int]:
    """Who was overtaken by how many later arrivals over a whole run (:class:`Overtaking`)."""
    tally = Overtaking(lambda r: arrivals[r], lambda r: fits[r])
    for seen in rounds:
        tally.observe(seen)
    return tally.counts()
