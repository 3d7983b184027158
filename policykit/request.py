"""A prefill request and the state it moves through on a prefill node.

On a PD-disaggregated prefill node a request is computed (possibly in chunks over several
rounds), emits its first token, and then *holds* its KV until the transfer to the decode node
completes. Only then are its slots released. Held KV is why memory can run out long after
admission looked fine.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from policykit.host_tier import HostEntry
    from policykit.prefix_cache import Node


#: the page table of a request that holds no pages: one tensor shared by every such request (a
#: page table is replaced, never changed in place), so a trace of thousands of requests does
#: not keep thousands of empty tensors alive for the garbage collector to walk
NO_PAGES = torch.empty(0, dtype=torch.int64)


class State(enum.Enum):
    """Where a request is. Every request is in exactly one state."""

    FUTURE = "future"  # not arrived yet
    WAITING = "waiting"  # in the waiting queue
    CHUNKED = "chunked"  # admitted, truncated: the in-progress chunked request
    HELD = "held"  # prefill finished, KV held while it transfers to decode
    DONE = "done"  # KV released
    REJECTED = "rejected"  # can never fit; refused with a reason
    FAILED = "failed"  # failed cleanly (fault, bad policy decision)


@dataclass(eq=False)
class Request:
    """One prompt to prefill, and the KV it holds on the node."""

    id: str
    #: the prompt's token ids: a tuple, or :class:`~policykit.tokens.TokenRuns` (runs of
    #: consecutive ids, whose memory does not grow with the prompt: what scenarios and traces use)
    tokens: Sequence[int]
    arrival_round: int = 0
    state: State = State.FUTURE
    #: tokens whose KV is on the device for this request (cached prefix + own pages)
    seq_len: int = 0
    #: length of the locked cached prefix (page-aligned); KV in ``prefix_node``'s path
    cached_len: int = 0
    prefix_node: Node | None = field(default=None, repr=False)
    prefix_pages: torch.Tensor = field(default_factory=lambda: NO_PAGES)
    #: pages this request owns: host load-back first, then computed chunks
    own_pages: torch.Tensor = field(default_factory=lambda: NO_PAGES)
    swa_pages: torch.Tensor = field(default_factory=lambda: NO_PAGES)
    host_entry: HostEntry | None = field(default=None, repr=False)
    finished_round: int | None = None
    first_scheduled_round: int | None = None
    reason: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.tokens)

    @property
    def remaining(self) -> int:
        """Prompt tokens whose KV is not on the device yet."""
        return self.prompt_tokens - self.seq_len

    @property
    def pages(self) -> torch.Tensor:
        """The request's page table: cached prefix pages, then its own."""
        return torch.cat([self.prefix_pages, self.own_pages])
