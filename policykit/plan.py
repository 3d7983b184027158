"""A round's plan: pure data saying who computes which tokens, decided before anything is
allocated.

Keeping the decision apart from the allocation means a plan can be printed, checked, compared
across policies, or replayed on another pipeline stage exactly as rank 0 decided it.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


class EntryKind(enum.Enum):
    WHOLE = "whole"  # a new request computed in one chunk
    TRUNCATED = "truncated"  # a new request's first chunk; it becomes the in-progress request
    RESUMED = "resumed"  # the in-progress request, truncated again
    FINAL = "final"  # the in-progress request's last chunk
    DEFERRED = "deferred"  # the in-progress request waits this round

    @property
    def finishes(self) -> bool:
        return self in (EntryKind.WHOLE, EntryKind.FINAL)

    @property
    def is_new(self) -> bool:
        return self in (EntryKind.WHOLE, EntryKind.TRUNCATED)


@dataclass(frozen=True)
class Entry:
    """Request ``request_id`` computes tokens ``[start, end)`` this round.

    ``cached`` tokens of device prefix are locked and ``load_back`` tokens are copied from the
    host tier at admission, before the chunk (new requests only).
    """

    request_id: str
    start: int
    end: int
    kind: EntryKind
    cached: int = 0
    load_back: int = 0

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class LedgerMark:
    """The memory ledger right after a request was placed (what SGLang's prefill log lines
    show, as in docs/incidents.md#truncated-tail)."""

    request_id: str
    rem_total_tokens: int
    cur_rem_tokens: int
    rem_chunk_tokens: int


#: verdict of a request that cannot be admitted even on an idle node: it is refused for good
NEVER = "NEVER"


@dataclass(frozen=True)
class Rejection:
    request_id: str
    verdict: str  # NO_TOKEN or OTHER (not this round), or NEVER
    reason: str | None = None  # why NEVER


@dataclass(frozen=True)
class Plan:
    round: int
    entries: tuple[Entry, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    marks: tuple[LedgerMark, ...] = ()
    #: why admission stopped: NO_TOKEN, OTHER, or None when the waiting queue ran out
    stop: str | None = None
    baseline: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def batch(self) -> tuple[Entry, ...]:
        """Entries that compute something (deferred ones excluded)."""
        return tuple(e for e in self.entries if e.kind is not EntryKind.DEFERRED)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["entries"] = [{**asdict(e), "kind": e.kind.value} for e in self.entries]
        return out
