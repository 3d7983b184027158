"""Token ids held as runs of consecutive ids: a prompt's memory is its structure, not its length.

A scenario gives each request ids no other request has, and a trace builds prompts out of shared
512-token blocks; either way a prompt is a handful of runs ``first, first + 1, ...``. Held as a
tuple of Python ints, the Mooncake conversation trace's 145 M prompt tokens would take about
6 GB before a single round runs; held as runs they take a few megabytes. :class:`TokenRuns` is
an immutable ``Sequence[int]`` that compares equal to the tuple of the same ids, so the prefix
cache and the host tier work on it and on plain tuples alike, and a slice of it is again runs
(cheap: no ids are laid out until someone iterates them).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, overload


class TokenRuns(Sequence[int]):
    """Token ids as maximal runs of consecutive ids (canonical: equal sequences, equal runs)."""

    __slots__ = ("_ends", "_firsts")

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        """``runs``: ``(first id, length)`` pairs in order; adjacent runs that continue each
        other are merged and empty ones dropped."""
        firsts: list[int] = []
        ends: list[int] = []
        total = 0
        next_id = None  # the id that would continue the last run
        for first, length in runs:
            if length <= 0:
                continue
            total += length
            if first == next_id:
                ends[-1] = total
            else:
                firsts.append(first)
                ends.append(total)
            next_id = first + length
        self._firsts = tuple(firsts)
        #: offset in the sequence where each run ends (cumulative lengths)
        self._ends = tuple(ends)

    @classmethod
    def span(cls, first: int, length: int) -> TokenRuns:
        """The ids ``first, first + 1, ..., first + length - 1``."""
        return cls(((first, length),))

    @property
    def runs(self) -> tuple[tuple[int, int], ...]:
        """``(first id, length)`` of each run."""
        starts = (0, *self._ends)
        return tuple((f, e - s) for f, s, e in zip(self._firsts, starts, self._ends, strict=False))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _locate(self, index: int) -> int:
        """The run holding position ``index`` (0 <= index < len)."""
        return bisect.bisect_right(self._ends, index)

    def _id(self, run: int, index: int) -> int:
        return self._firsts[run] + index - (self._ends[run - 1] if run else 0)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> TokenRuns: ...

    def __getitem__(self, index: int | slice) -> int | TokenRuns:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return TokenRuns((i, 1) for i in list(self)[index])
            return self._slice(start, stop)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("TokenRuns index out of range")
        return self._id(self._locate(index), index)

    def _slice(self, start: int, stop: int) -> TokenRuns:
        if stop <= start:
            return _EMPTY
        if start == 0 and stop == len(self):
            return self
        out = TokenRuns.__new__(TokenRuns)
        first_run, last_run = self._locate(start), self._locate(stop - 1)
        firsts = list(self._firsts[first_run : last_run + 1])
        firsts[0] = self._id(first_run, start)
        ends = [e - start for e in self._ends[first_run:last_run]]
        ends.append(stop - start)
        out._firsts, out._ends = tuple(firsts), tuple(ends)
        return out

    def __iter__(self) -> Iterator[int]:
        starts = (0, *self._ends)
        return chain.from_iterable(
            range(f, f + e - s) for f, s, e in zip(self._firsts, starts, self._ends, strict=False)
        )

    def __add__(self, other: Sequence[int]) -> TokenRuns:
        if not isinstance(other, TokenRuns):
            other = TokenRuns((i, 1) for i in other)
        return TokenRuns(chain(self.runs, other.runs))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRuns):
            return self._firsts == other._firsts and self._ends == other._ends
        if isinstance(other, tuple | list):
            return len(other) == len(self) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        # The hash of the equal tuple, so that either finds the other in a dict (the prefix
        # cache keys its children by page tuples). Costs a pass over the ids, as a tuple's does.
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"TokenRuns({list(self.runs)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenRuns, (self.runs,))


_EMPTY = TokenRuns()
