"""The overtaking detector (:mod:`policykit.fairness`): who was passed over by how many."""

from __future__ import annotations

from policykit.fairness import Overtaking, RoundSeen, overtaken

ARRIVALS = {"A": 1, "B": 2, "C": 2, "D": 0, "E": 3}
FITS = {"A": True, "B": True, "C": True, "D": True, "E": True}


def test_later_arrivals_admitted_while_a_request_waits_count_once_each() -> None:
    rounds = [
        RoundSeen(1, placed=["D"], waiting=["A"]),  # D arrived with A (round 0 is round 1)
        RoundSeen(2, placed=["B"], waiting=["A", "C"]),  # B passes A, not C (same round)
        RoundSeen(3, placed=["C", "E"], waiting=["A"]),  # C and E pass A
        RoundSeen(4, placed=["A"], waiting=[]),
    ]
    assert overtaken(rounds, ARRIVALS, FITS) == {"A": 3}


def test_admitted_in_the_same_round_is_not_overtaken() -> None:
    assert overtaken([RoundSeen(2, placed=["B", "A"], waiting=[])], ARRIVALS, FITS) == {}


def test_a_request_no_idle_node_would_admit_is_not_counted_and_fits_is_asked_lazily() -> None:
    asked: list[str] = []

    def fits(rid: str) -> bool:
        asked.append(rid)
        return False

    tally = Overtaking(ARRIVALS.__getitem__, fits)
    tally.observe(RoundSeen(1, placed=["A"], waiting=["D"]))  # nobody later: nothing asked
    tally.observe(RoundSeen(2, placed=["B"], waiting=["A"]))
    tally.observe(RoundSeen(3, placed=["C"], waiting=["A"]))
    assert tally.counts() == {} and asked == ["A"]


def test_beyond_the_bound_names_the_round_the_bound_was_passed() -> None:
    tally = Overtaking(ARRIVALS.__getitem__, FITS.__getitem__)
    tally.observe(RoundSeen(2, placed=["B"], waiting=["A"]))
    tally.observe(RoundSeen(3, placed=["C", "E"], waiting=["A"]))
    assert tally.beyond(3) == {}
    (one,) = tally.beyond(1).values()
    assert (one.request, one.by, one.round, one.bound) == ("A", ("B", "C", "E"), 3, 1)
    assert tally.beyond(0)["A"].round == 2
    assert one.to_dict() == {"id": "A", "by": ["B", "C", "E"], "round": 3}
